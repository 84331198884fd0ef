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
probabilities (V) in float32.

Batch invariance by construction (what makes a verification pass equal single-query steps bit for bit): a query's
arithmetic does not depend on how many queries share the pass. The row tile (`rows_per_tile`) depends on the GQA
ratio only, never on T, so every pass of a layer runs the same compiled program on the same tile shape; each row's
scores and outputs are reductions of that row alone in a fixed order (tensor-core MMAs on the GPU; in the
interpreter a broadcast product and a sum, `common.interp_dot`, never numpy's BLAS, whose AVX2 kernels make a
row's result depend on its position); chunk boundaries are absolute positions (multiples of CHUNK) and chunks are
reduced in index order; positions a query cannot see contribute exact zeros.

Lengths on the device: the kernels read main_len, seq_len, kv8_from (attention) and the write's end position
(write_kv) from device scalars, so a pass can be captured once in a CUDA graph and replayed with new lengths
(`nested_kv_attention_at`, `write_kv_at`: the grid then covers the planes' whole capacity, and a chunk past seq_len
runs no iteration), and a TensorRT plugin never reads them to the host. Garbage lengths are clamped inside the
kernels (0 <= main_len <= C, main_len <= seq_len <= main_len + scratch capacity, T <= write end <= C), so no value of
them makes a kernel touch memory outside its planes.
"""

import math

import torch
import triton
import triton.language as tl

from plugins.kernels.common import INTERPRET, interp_dot, round_half_even

CHUNK = 128          # positions per program (absolute boundaries): 32K context = 256 chunks per KV head
BLOCK_S = 64         # positions per inner step
MAX_ROWS = 64        # query rows (GQA group x queries) per program; larger groups tile over a grid axis
STAGES = 1           # software-pipelining stages of the attention loop: with 16-byte-aligned planes (what the
                     # launcher specializes) 3 stages staged 94-106 KB of shared memory per program on sm_87 and
                     # spilled the d128 MHA tile; one stage: 28-41 KB, no spill (`bitnest compile-kernels`)
QUERY_SLOTS = 5      # queries per row tile for any GQA ratio (γ + 1 <= 5, the default γ = 4, verifies in one read
                     # of the KV; 8 slots gave d64 GQA 3 a 32-row tile that spills on sm_87 at 4 or 8 warps)


def rows_per_tile(r: int) -> int:
    """Query rows per program for GQA ratio r: a function of r alone, never of the number of queries T, so a
    single-query step and a verification pass run the same program on the same tile shape."""
    return min(MAX_ROWS, max(16, triton.next_power_of_2(r * QUERY_SLOTS)))


def warps_for(d: int, r: int) -> int:
    """Warps per attention program: 8 for a [rows, D] tile of 2048 or more keeps its accumulators out of local
    memory on sm_87 (`bitnest compile-kernels`: d128 at 16 or 32 rows); 4 below (d64 GQA 3, 16 rows: 199 regs)."""
    return 8 if rows_per_tile(r) * d >= 2048 else 4


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
    if INTERP:   # numpy's matmul is neither IEEE for float16 nor row-invariant on every CPU: a fixed-order sum
        return interp_dot(a_hi, b) + interp_dot(a_lo, b)
    return tl.dot(a_hi, b, out_dtype=tl.float32) + tl.dot(a_lo, b, out_dtype=tl.float32)


@triton.jit
def _lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap):
    """(main_len, seq_len, kv8_from) read from device scalars (int32 or int64) and clamped into the planes."""
    main_len = tl.minimum(tl.maximum(tl.load(main_ptr).to(tl.int64), 0), cap)
    seq_len = tl.minimum(tl.maximum(tl.load(seq_ptr).to(tl.int64), main_len), main_len + scap)
    kv8_from = tl.minimum(tl.maximum(tl.load(kv8_ptr).to(tl.int64), 0), seq_len)
    return main_len.to(tl.int32), seq_len.to(tl.int32), kv8_from.to(tl.int32)


@triton.jit(do_not_specialize=["T"])   # T == 1 would otherwise compile a program of its own
def flash_decode_kernel(
    q_ptr, base_ptr, refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr,
    m_ws, l_ws, acc_ws, main_ptr, seq_ptr, kv8_ptr,
    T, cap, scap, n_chunks, sm_scale,
    HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr,
):
    """Program (kv head h, chunk c, row tile): rows i = r*T + t (query head h*R + r, query t at position
    seq_len - T + t). Writes per row and chunk the running max m, the sum l and the unnormalized output [D].
    Bytes: the chunk's K and V base bytes and scales once for all R*T rows, refinement bytes only at positions
    >= kv8_from, nothing past seq_len; q once per program (L2-resident across chunks). A chunk at or past seq_len
    runs no iteration and stores m = -inf, l = 0, acc = 0 (an exact zero in the reduction)."""
    h = tl.program_id(0)
    c = tl.program_id(1)
    tile = tl.program_id(2)
    main_len, seq_len, kv8_from = _lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap)
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
    for s0 in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, seq_len), BLOCK_S):
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
def write_kv_kernel(x_ptr, base_ptr, refine_ptr, scale_ptr, end_ptr, T, cap, HKV: tl.constexpr, D: tl.constexpr):
    """One program per (K-or-V, head, token) of x [2, Hkv, T, D]: s = fp16(max|x|/7), q4 = clip(rne(x/s)),
    qr = clip(rne((x - q4 s)/(s/16))) written at position end - T + t (the semantics of `plugins.kv.quantize_kv`),
    `end` read from a device scalar and clamped to [T, cap] (the launcher checks T <= cap).
    Bytes: the D floats of the vector in, D/2 bytes per plane and one float16 scale out; nothing is read back."""
    end = tl.minimum(tl.maximum(tl.load(end_ptr).to(tl.int64), T), cap)
    pos0 = (end - T).to(tl.int32)
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


def device_scalar(value: int, device) -> torch.Tensor:
    """An int32 [1] device tensor holding `value` (the eager launchers' lengths)."""
    return torch.tensor([value], dtype=torch.int32, device=device)


def _attend(q, base, refine, scale, scratch, main_ptr, seq_ptr, kv8_ptr, n_chunks, out):
    """Check shapes, allocate the chunk workspace and launch (lengths are device scalars)."""
    hq, t, d = q.shape
    hkv = base.shape[1]
    _check_planes(base, refine, scale, d)
    if hq % hkv or d & (d - 1) or d < 32:
        raise ValueError(f"q [{hq}, {t}, {d}] does not fit {hkv} KV heads (head dim must be a power of two >= 32)")
    sb, sr, ss = scratch if scratch is not None else (base, refine, scale)
    scap = 0
    if scratch is not None:
        _check_planes(sb, sr, ss, d)
        scap = sb.shape[2]
    r = hq // hkv
    block_m = rows_per_tile(r)                                          # never a function of t
    tiles = triton.cdiv(r * t, block_m)
    dev = q.device
    m_ws = torch.empty(hkv * r * t * n_chunks, dtype=torch.float32, device=dev)
    l_ws = torch.empty_like(m_ws)
    acc_ws = torch.empty(hkv * r * t * n_chunks, d, dtype=torch.float32, device=dev)
    flash_decode_kernel[(hkv, n_chunks, tiles)](
        q.contiguous(), base, refine, scale, sb, sr, ss, m_ws, l_ws, acc_ws, main_ptr, seq_ptr, kv8_ptr,
        t, base.shape[2], scap, n_chunks, 1.0 / math.sqrt(d),
        HKV=hkv, R=r, D=d, CHUNK=CHUNK, BLOCK_S=BLOCK_S, BLOCK_M=block_m, INTERP=INTERPRET,
        num_warps=warps_for(d, r), num_stages=STAGES, enable_fp_fusion=False,
    )
    y = out if out is not None else torch.empty(hq, t, d, dtype=torch.float32, device=dev)
    chunk_reduce_kernel[(hkv, r * t)](m_ws, l_ws, acc_ws, y, t, n_chunks, R=r, D=d, enable_fp_fusion=False)
    return y


def nested_kv_attention(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                        main_len: int, kv8_from: int, scratch=None, scratch_len: int = 0, out=None) -> torch.Tensor:
    """out float32 [Hq, T, D]: the semantics of `plugins.reference.nested_kv_attention` (see the module docstring)."""
    t = q.shape[1]
    seq = main_len + scratch_len
    scap = scratch[0].shape[2] if scratch is not None else 0
    if not 0 < t <= seq or main_len > base.shape[2] or scratch_len > scap:
        raise ValueError(f"{t} queries over {main_len} + {scratch_len} positions do not fit the planes")
    lens = torch.tensor([main_len, seq, kv8_from], dtype=torch.int32, device=q.device)
    return _attend(q, base, refine, scale, scratch, lens[0:], lens[1:], lens[2:], triton.cdiv(seq, CHUNK), out)


def nested_kv_attention_at(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                           main_len: torch.Tensor, seq_len: torch.Tensor, kv8_from: torch.Tensor, scratch=None,
                           out=None) -> torch.Tensor:
    """`nested_kv_attention` with its lengths in device scalars (int32 or int64, read by the kernel, clamped): the
    grid covers every position of the planes (and scratch), so one launch serves any lengths (CUDA graphs,
    TensorRT plugins). seq_len counts main positions plus scratch slots; main_len may be the same tensor."""
    scap = scratch[0].shape[2] if scratch is not None else 0
    return _attend(q, base, refine, scale, scratch, main_len, seq_len, kv8_from,
                   triton.cdiv(base.shape[2] + scap, CHUNK), out)


def write_kv_at(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                end: torch.Tensor) -> None:
    """Quantize k, v [Hkv, T, D] into positions [end - T, end) of the planes in place; `end` is a device scalar
    (int32 or int64), clamped by the kernel to [T, C]."""
    hkv, t, d = k.shape
    _check_planes(base, refine, scale, d)
    if v.shape != k.shape or base.shape[1] != hkv or not 0 < t <= base.shape[2]:
        raise ValueError(f"K/V {tuple(k.shape)} do not fit planes {tuple(base.shape)}")
    x = torch.stack((k, v)).contiguous()                                # [2, Hkv, T, D]
    write_kv_kernel[(2 * hkv * t,)](x, base, refine, scale, end, t, base.shape[2], HKV=hkv, D=d,
                                    enable_fp_fusion=False)   # x - q4*s rounded as torch rounds it


def write_kv(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
             pos: int) -> None:
    """Quantize k, v [Hkv, T, D] into positions [pos, pos + T) of the planes, in place."""
    t = k.shape[1]
    if not 0 <= pos <= base.shape[2] - t:
        raise ValueError(f"K/V {tuple(k.shape)} at position {pos} do not fit planes {tuple(base.shape)}")
    write_kv_at(k, v, base, refine, scale, device_scalar(pos + t, k.device))
