"""Triton nested-KV flash-decoding (docs/contracts.md, KV cache and ops): causal GQA attention of the T <= γ+1 newest queries over one
layer's nested KV cache (KV4, KV8 or Recent-N), split over the context with a deterministic reduction, and the
write path that quantizes new K/V entries into the planes.

Bytes read, and why no more than the format requires: each program owns one KV head and one chunk of CHUNK
positions and serves every query head of that KV head's GQA group and every query (R*T rows) from one read, so
each base byte and each float16 scale of the S visible positions is read once per pass; refinement bytes are
loaded only for positions at or after `kv8_from` (the load is masked off before it: a KV4 position never touches
the refinement plane, so a KV4 or Recent-N pass reads half the plane bytes of a KV8 one). Positions past S are
never loaded. Partial results (m, l and a D-vector per row and chunk, float32) are a few KB per chunk.

Layout: base / refine uint8 [2, Hkv, C, D/2] (K then V; byte j holds dims 2j, 2j+1), scale float16 [2, Hkv, C].
The sequence is main positions [0, main_len) then `scratch_len` draft-time slots of the scratch planes. Codes are
exact in float16 (|16*q4 + qr| <= 136); the float32 queries and probabilities are split into float16 high and low
halves, so two float16 MMAs with float32 accumulation give ~float32 accuracy (one half alone costs ~3e-4 relative,
which INT8 activation rounding downstream amplifies); the KV scale (s/16) is applied to the scores (K) and to the
probabilities (V) in float32. Chunk boundaries are absolute positions
(multiples of CHUNK), and a chunk a query cannot see contributes an exact zero, so a query's result does not
depend on how many later queries share the pass.
"""

import math

import torch
import triton
import triton.language as tl

from plugins.kernels.common import INTERPRET, round_half_even

CHUNK = 128          # positions per program (absolute boundaries): 32K context = 256 chunks per KV head
BLOCK_S = 64         # positions per inner step
MAX_ROWS = 64        # query rows (GQA group x queries) per program; larger groups tile over a grid axis


def warps_for(d: int) -> int:
    """Warps per attention program: 8 for head dim 128 keeps the [rows, D] accumulators out of local memory."""
    return 8 if d >= 128 else 4


@triton.jit
def _codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, plane, pos, main_len, seq_len, kv8_from, cap, scap,
           j, HALF: tl.constexpr):
    """Nested codes 16*q4 (+ qr at KV8 positions) of positions pos [BS] for dims (2j, 2j+1): float16 [BS, HALF] x2.
    plane = kv * Hkv + head. Main positions read the main planes, later ones the scratch planes."""
    in_main = pos < main_len
    in_scr = (pos >= main_len) & (pos < seq_len)
    kv8 = pos >= kv8_from
    moff = (plane * cap + pos)[:, None] * HALF + j[None, :]                               # [BS, HALF]
    soff = (plane * scap + (pos - main_len))[:, None] * HALF + j[None, :]
    full = j[None, :] < HALF
    mm, sm = in_main[:, None] & full, in_scr[:, None] & full
    b = tl.where(mm, tl.load(base_ptr + moff, mask=mm, other=0), tl.load(sbase_ptr + soff, mask=sm, other=0))
    rm, rs = mm & kv8[:, None], sm & kv8[:, None]
    r = tl.where(rm, tl.load(refine_ptr + moff, mask=rm, other=0), tl.load(srefine_ptr + soff, mask=rs, other=0))
    b_lo = (b << 4).to(tl.int8, bitcast=True) >> 4
    b_hi = b.to(tl.int8, bitcast=True) >> 4
    r_lo = (r << 4).to(tl.int8, bitcast=True) >> 4                                       # 0 where not loaded
    r_hi = r.to(tl.int8, bitcast=True) >> 4
    lo = (16 * b_lo.to(tl.int16) + r_lo.to(tl.int16)).to(tl.float16)
    hi = (16 * b_hi.to(tl.int16) + r_hi.to(tl.int16)).to(tl.float16)
    return lo, hi


@triton.jit
def _scales(scale_ptr, sscale_ptr, plane, pos, main_len, seq_len, cap, scap):
    """KV scales / 16 of positions pos [BS] as float32 (0 past the sequence)."""
    in_main = pos < main_len
    in_scr = (pos >= main_len) & (pos < seq_len)
    s = tl.where(in_main, tl.load(scale_ptr + plane * cap + pos, mask=in_main, other=0.0),
                 tl.load(sscale_ptr + plane * scap + (pos - main_len), mask=in_scr, other=0.0))
    return s.to(tl.float32) / 16.0


@triton.jit
def _split16(a):
    """float32 a = hi + lo with both halves float16: two float16 MMAs then carry ~22 bits of a."""
    hi = a.to(tl.float16)
    return hi, (a - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def _dot(a_hi, a_lo, b, INTERP: tl.constexpr):
    """(a_hi + a_lo) @ b for float16 codes b (exact), accumulated in float32."""
    if INTERP:   # the interpreter's low-precision dots are not IEEE: go through float32 (exact operands)
        return tl.dot(a_hi.to(tl.float32), b.to(tl.float32), input_precision="ieee") + \
            tl.dot(a_lo.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a_hi, b, out_dtype=tl.float32) + tl.dot(a_lo, b, out_dtype=tl.float32)


@triton.jit
def flash_decode_kernel(
    q_ptr, base_ptr, refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr,
    m_ws, l_ws, acc_ws,
    T, main_len, seq_len, kv8_from, cap, scap, n_chunks, sm_scale,
    HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr,
):
    """Program (kv head h, chunk c, row tile): rows i = r*T + t (query head h*R + r, query t at position
    seq_len - T + t). Writes per row and chunk the running max m, the sum l and the unnormalized output [D].
    Bytes: the chunk's K and V base bytes and scales once for all R*T rows, refinement bytes only at positions
    >= kv8_from, nothing past seq_len; q once per program (L2-resident across chunks)."""
    h = tl.program_id(0)
    c = tl.program_id(1)
    tile = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                     # [BM]
    live = rows < R * T
    head = h * R + rows // T
    qpos = seq_len - T + rows % T                                      # [BM] position of each query
    j = tl.arange(0, HALF)
    qoff = (head * T + rows % T)[:, None] * D + 2 * j[None, :]        # q [Hq, T, D]
    qm = live[:, None] & (j[None, :] < HALF)
    qe_hi, qe_lo = _split16(tl.load(q_ptr + qoff, mask=qm, other=0.0).to(tl.float32))    # [BM, HALF] x2
    qo_hi, qo_lo = _split16(tl.load(q_ptr + qoff + 1, mask=qm, other=0.0).to(tl.float32))
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_e = tl.zeros([BLOCK_M, HALF], tl.float32)
    acc_o = tl.zeros([BLOCK_M, HALF], tl.float32)
    k_plane = h
    v_plane = HKV + h
    for s0 in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK_S):
        pos = s0 + tl.arange(0, BLOCK_S)                                # [BS]
        k_lo, k_hi = _codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, k_plane, pos, main_len, seq_len,
                            kv8_from, cap, scap, j, HALF)
        sk = _scales(scale_ptr, sscale_ptr, k_plane, pos, main_len, seq_len, cap, scap)
        scores = _dot(qe_hi, qe_lo, tl.trans(k_lo), INTERP) + _dot(qo_hi, qo_lo, tl.trans(k_hi), INTERP)  # [BM, BS]
        scores = scores * (sk * sm_scale)[None, :]
        visible = (pos[None, :] <= qpos[:, None]) & (pos[None, :] < seq_len) & live[:, None]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])                            # [BM, BS], 0 where masked
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_lo, v_hi = _codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, v_plane, pos, main_len, seq_len,
                            kv8_from, cap, scap, j, HALF)
        sv = _scales(scale_ptr, sscale_ptr, v_plane, pos, main_len, seq_len, cap, scap)
        pv_hi, pv_lo = _split16(p * sv[None, :])
        acc_e = acc_e * alpha[:, None] + _dot(pv_hi, pv_lo, v_lo, INTERP)
        acc_o = acc_o * alpha[:, None] + _dot(pv_hi, pv_lo, v_hi, INTERP)
        m_i = m_new
    slot = (h * R * T + rows) * n_chunks + c                             # [BM]
    tl.store(m_ws + slot, m_i, mask=live)
    tl.store(l_ws + slot, l_i, mask=live)
    am = live[:, None] & (j[None, :] < HALF)
    tl.store(acc_ws + slot[:, None] * D + 2 * j[None, :], acc_e, mask=am)
    tl.store(acc_ws + slot[:, None] * D + 2 * j[None, :] + 1, acc_o, mask=am)


@triton.jit
def chunk_reduce_kernel(m_ws, l_ws, acc_ws, out_ptr, T, n_chunks, R: tl.constexpr, D: tl.constexpr):
    """One program per (kv head, row): combine the chunks in index order (deterministic) into out [Hq, T, D].
    Bytes: (2 + D) * 4 per chunk and row of partials, D * 4 out: no KV bytes."""
    h = tl.program_id(0)
    row = tl.program_id(1)
    base = (h * R * T + row) * n_chunks
    d = tl.arange(0, D)
    one = tl.zeros([1], tl.int32)
    m = tl.full([1], float("-inf"), tl.float32)
    for c in range(n_chunks):
        m = tl.maximum(m, tl.load(m_ws + base + c + one))
    m_safe = tl.where(m == float("-inf"), 0.0, m)                      # [1]
    num = tl.zeros([D], tl.float32)
    den = tl.zeros([1], tl.float32)
    for c in range(n_chunks):
        w = tl.exp(tl.load(m_ws + base + c + one) - m_safe)           # [1]; exactly 0 for an unseen chunk
        den += w * tl.load(l_ws + base + c + one)
        num += w * tl.load(acc_ws + (base + c) * D + d)
    head = h * R + row // T
    tl.store(out_ptr + (head * T + row % T) * D + d, num / den)


@triton.jit
def write_kv_kernel(x_ptr, base_ptr, refine_ptr, scale_ptr, T, pos0, cap, HKV: tl.constexpr, D: tl.constexpr):
    """One program per (K-or-V, head, token) of x [2, Hkv, T, D]: s = fp16(max|x|/7), q4 = clip(rne(x/s)),
    qr = clip(rne((x - q4 s)/(s/16))) written at position pos0 + t (the semantics of `plugins.kv.quantize_kv`).
    Bytes: the D floats of the vector in, D/2 bytes per plane and one float16 scale out; nothing is read back."""
    pid = tl.program_id(0)
    kv = pid // (HKV * T)
    h = (pid // T) % HKV
    t = pid % T
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF)
    src = ((kv * HKV + h) * T + t) * D + 2 * j
    x_e = tl.load(x_ptr + src).to(tl.float32)                           # [HALF] dims 2j
    x_o = tl.load(x_ptr + src + 1).to(tl.float32)                       # [HALF] dims 2j+1
    amax = tl.maximum(tl.max(tl.abs(x_e), axis=0), tl.max(tl.abs(x_o), axis=0))
    s = tl.maximum(tl.math.div_rn(amax, 7.0), 2.0 ** -24).to(tl.float16).to(tl.float32)
    q_e = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_e, s)), -8.0), 7.0)
    q_o = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_o, s)), -8.0), 7.0)
    step = s / 16.0
    r_e = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_e - q_e * s, step)), -8.0), 7.0)
    r_o = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_o - q_o * s, step)), -8.0), 7.0)
    plane = kv * HKV + h
    dst = (plane * cap + pos0 + t) * HALF + j
    tl.store(base_ptr + dst, ((q_e.to(tl.int32) & 15) | ((q_o.to(tl.int32) & 15) << 4)).to(tl.uint8))
    tl.store(refine_ptr + dst, ((r_e.to(tl.int32) & 15) | ((r_o.to(tl.int32) & 15) << 4)).to(tl.uint8))
    tl.store(scale_ptr + plane * cap + pos0 + t, s.to(tl.float16))


def _check_planes(base, refine, scale, d):
    if base.dtype != torch.uint8 or refine.dtype != torch.uint8 or scale.dtype != torch.float16:
        raise ValueError("KV planes must be uint8 and their scales float16")
    if base.dim() != 4 or base.shape[0] != 2 or base.shape[-1] * 2 != d or refine.shape != base.shape \
            or scale.shape != base.shape[:3] or not (base.is_contiguous() and refine.is_contiguous()):
        raise ValueError(f"KV planes {tuple(base.shape)} / scale {tuple(scale.shape)} are not contiguous "
                         f"[2, Hkv, C, {d // 2}] / [2, Hkv, C]")


def nested_kv_attention(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                        main_len: int, kv8_from: int, scratch=None, scratch_len: int = 0, out=None) -> torch.Tensor:
    """out float32 [Hq, T, D]: the semantics of `plugins.reference.nested_kv_attention` (see the module docstring)."""
    hq, t, d = q.shape
    hkv = base.shape[1]
    _check_planes(base, refine, scale, d)
    if hq % hkv or d & (d - 1) or d < 32:
        raise ValueError(f"q [{hq}, {t}, {d}] does not fit {hkv} KV heads (head dim must be a power of two >= 32)")
    sb, sr, ss = scratch if scratch is not None else (base, refine, scale)
    if scratch is not None:
        _check_planes(sb, sr, ss, d)
    seq = main_len + scratch_len
    if not 0 < t <= seq or main_len > base.shape[2] or scratch_len > sb.shape[2]:
        raise ValueError(f"{t} queries over {main_len} + {scratch_len} positions do not fit the planes")
    r = hq // hkv
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(r * t)))
    tiles = triton.cdiv(r * t, block_m)
    n_chunks = triton.cdiv(seq, CHUNK)
    dev = q.device
    m_ws = torch.empty(hkv * r * t * n_chunks, dtype=torch.float32, device=dev)
    l_ws = torch.empty_like(m_ws)
    acc_ws = torch.empty(hkv * r * t * n_chunks, d, dtype=torch.float32, device=dev)
    flash_decode_kernel[(hkv, n_chunks, tiles)](
        q.contiguous(), base, refine, scale, sb, sr, ss, m_ws, l_ws, acc_ws,
        t, main_len, seq, kv8_from, base.shape[2], sb.shape[2], n_chunks, 1.0 / math.sqrt(d),
        HKV=hkv, R=r, D=d, CHUNK=CHUNK, BLOCK_S=BLOCK_S, BLOCK_M=block_m, INTERP=INTERPRET,
        num_warps=warps_for(d), enable_fp_fusion=False,
    )
    y = out if out is not None else torch.empty(hq, t, d, dtype=torch.float32, device=dev)
    chunk_reduce_kernel[(hkv, r * t)](m_ws, l_ws, acc_ws, y, t, n_chunks, R=r, D=d, enable_fp_fusion=False)
    return y


def write_kv(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
             pos: int) -> None:
    """Quantize k, v [Hkv, T, D] into positions [pos, pos + T) of the planes, in place."""
    hkv, t, d = k.shape
    _check_planes(base, refine, scale, d)
    if v.shape != k.shape or base.shape[1] != hkv or not 0 <= pos <= base.shape[2] - t:
        raise ValueError(f"K/V {tuple(k.shape)} at position {pos} do not fit planes {tuple(base.shape)}")
    x = torch.stack((k, v)).contiguous()                                # [2, Hkv, T, D]
    write_kv_kernel[(2 * hkv * t,)](x, base, refine, scale, t, pos, base.shape[2], HKV=hkv, D=d,
                                    enable_fp_fusion=False)   # x - q4*s rounded as torch rounds it
