"""Triton nested-KV flash-decoding (docs/contracts.md, KV cache and ops): causal GQA attention of the T newest
queries of a decode pass (T <= SPLIT_QUERIES: γ+1 of a verification) over one layer's nested KV cache (KV4, KV8 or
Recent-N), split over the context with a deterministic reduction; the launchers here run a prefill chunk's longer
passes on `attention_prefill`'s kernel. The code unpacking and softmax step both kernels share are `kv_codes`; the
write path that quantizes new K/V entries into the planes is `plugins.kernels.kv_write`.

Bytes read, and why no more than the format requires: each program owns one KV head and one chunk of CHUNK
positions and serves every query head of that KV head's GQA group and every query (R*T rows) from one read, so
each base byte and each float16 scale of the S visible positions is read once per pass. A chunk runs two loops:
its positions before `kv8_from` in a KV4 loop whose program holds no load of the refinement plane, then its
positions from `kv8_from` on in a KV8 loop that loads both planes (a KV4 or Recent-N pass reads half the plane
bytes of a KV8 one, and spends no instruction on the other half). Each view's steps run in two loops: whole steps
(every position a main one that every query of the pass sees: no clamp, no choice of planes, no mask) then edge
steps; the same steps, codes and sums either way (`whole_end`). Positions past S are never loaded: an edge step's
positions past its loop's end load the loop's last position (no masked load) and score -inf. Partial results (m, l
and a D-vector per row and chunk, float32) are a few KB per chunk.

Batch invariance by construction (what makes a verification pass equal single-query steps bit for bit): a query's
arithmetic does not depend on how many queries share the pass. The row tile (`rows_per_tile`) depends on the GQA
ratio only, never on T, so every pass of a layer runs the same compiled program on the same tile shape; each row's
scores and outputs are reductions of that row alone in a fixed order (tensor-core MMAs on the GPU; in the
interpreter a broadcast product and a sum, `common.interp_dot`, never numpy's BLAS, whose AVX2 kernels make a
row's result depend on its position); chunk boundaries are absolute positions (multiples of CHUNK), a chunk's
steps start at the chunk and at kv8_from, chunks are reduced in a fixed order set by seq_len alone; positions a
query cannot see contribute exact zeros.

Lengths on the device: the kernels read main_len, seq_len, kv8_from (attention) and the write's end position
(`kv_write`) from device scalars, so a pass can be captured once in a CUDA graph and replayed with new lengths
(`nested_kv_attention_at`, `write_kv_at`: the grid then covers the planes' whole capacity, and a chunk past seq_len
runs no iteration, stores nothing and is not reduced), and a TensorRT plugin never reads them to the host. Garbage
lengths are clamped inside the kernels (0 <= main_len <= C, main_len <= seq_len <= main_len + scratch capacity,
T <= write end <= C), so no value of them makes a kernel touch memory outside its planes.
"""

import math

import torch
import triton
import triton.language as tl

from plugins.kernels.attention_prefill import (
    flash_prefill_kernel,
    prefill_fits,
    prefill_grid,
    prefill_register_cap,
    prefill_rows,
    prefill_warps,
)
from plugins.kernels.common import INTERPRET, dependent_launch, device_cc, pdl
from plugins.kernels.gemv import quantize_decode_buffers, split_counters
from plugins.kernels.gemv_decode import DECODE_MAX_M, MAX_SLOTS, last_quantizes, tail_block
from plugins.kernels.kv_codes import attend_range, lengths, split16

CHUNK = 128          # positions per program (absolute boundaries): 32K context = 256 chunks per KV head
MAX_ROWS = 64        # query rows (GQA group x queries) per program; larger groups tile over a grid axis
STAGES = 1           # software-pipelining stages of the attention loops: with 16-byte-aligned planes (what the
                     # launcher specializes) 3 stages staged 94-106 KB of shared memory per program on sm_87 and
                     # spilled the d128 MHA tile; one stage: 16-41 KB, no spill (`bitnest compile-kernels`)
MAXNREG = 128        # registers a thread may hold (ptxas's cap) on Orin (sm_87) and below: d128 GQA 4 takes 153
                     # uncapped, 120 capped, with no spill and the same instructions (`bitnest compile-kernels`); 128
                     # keeps 4 programs of 4 warps (or 2 of 8) resident on an SM for the loads in flight
MAXNREG_SM90 = 168   # from Hopper on: Triton 3.6 for sm_90 spills the d128 MHA tile 68 + 72 bytes and d64 GQA 3's
                     # 16 + 16 at 128, nothing at 168 (166 / 144 / 149 held, the same instructions a byte within 2%:
                     # `bitnest compile-kernels --arch sm_90`); 3 programs of 4 warps still fit an SM's registers
REDUCE_CHUNKS = 16   # chunks the reduction combines a step ([16, D] partials in one load: a 4K context's 32
                     # chunks in 2 steps where a chunk a step made 64 dependent loads a row; its sums' order is fixed)
QUERY_SLOTS = 5      # queries per row tile for any GQA ratio (γ + 1 <= 5, the default γ = 4, verifies in one read
                     # of the KV; 8 slots gave d64 GQA 3 a 32-row tile that spills on sm_87 at 4 or 8 warps)
SPLIT_QUERIES = 17   # the most queries a pass splits over the context (this kernel, batch invariant): every
                     # verification pass (γ + 1 <= 17, edge.engine's MAX_PROPOSALS + 1), so it equals single-query
                     # steps bit for bit; wider passes (prefill chunks) run `attention_prefill`, which keeps no
                     # partials (a split pass's grow with its queries: 17 of them at Llama-2-7B's 25K positions hold
                     # 56 MB, which the memory plan counts)


def register_cap(cc: int) -> int:
    """ptxas's register cap for flash decoding at compute capability cc (87: sm_87)."""
    return MAXNREG_SM90 if cc >= 90 else MAXNREG


def _register_cap(dev: torch.device, prefill: bool = False) -> int:
    """The launch's ptxas register cap on `dev` (a CUDA device; a launch capture: its architecture's; the
    interpreter: sm_87's)."""
    cc = device_cc(dev) or 87
    return prefill_register_cap(cc) if prefill else register_cap(cc)


def block_s_for(d: int) -> int:
    """Positions per loop step for head dim d: 8 KB of each plane of K and V a step (64 positions at d128, 128 at
    d64): the softmax and MMA work of a step is paid per position, so fewer positions a step cost more
    instructions per KV byte (sm_87: d128 at 32 / 64 / 128 positions, 8.2 / 6.6 / 6.0 per KV8 byte at 4 warps, the
    last at 208 registers)."""
    return min(CHUNK, 8192 // d)


def rows_per_tile(r: int) -> int:
    """Query rows per program for GQA ratio r: a function of r alone, never of the number of queries T, so a
    single-query step and a verification pass run the same program on the same tile shape."""
    return min(MAX_ROWS, max(16, triton.next_power_of_2(r * QUERY_SLOTS)))


def warps_for(d: int, r: int) -> int:
    """Warps per attention program: 4 up to a [rows, D] tile of 2048 (d128 MHA, d64 GQA 3: 6.6-8.1 lane instructions
    per KV8 byte, against 8.1-10.6 at 8 warps), 8 above (d128 GQA 4's 32 rows: 4 warps need 190 registers)."""
    return 8 if rows_per_tile(r) * d > 2048 else 4


@triton.jit(do_not_specialize=["T"])   # T == 1 would otherwise compile a program of its own
def flash_decode_kernel(
    q_ptr, base_ptr, refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr,
    m_ws, l_ws, acc_ws, main_ptr, seq_ptr, kv8_ptr,
    T, cap, scap, n_chunks, sm_scale,
    HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (kv head h, chunk c, row tile): rows i = r*T + t (query head h*R + r, query t at position
    seq_len - T + t). Writes per row and chunk the running max m, the sum l and the unnormalized output [D].
    base/refine (and the scratch planes) are int32 words [2, Hkv, C, D/8]. The chunk's KV4 positions (before
    kv8_from) run a loop that never loads the refinement plane, its KV8 positions a loop that loads both.
    Bytes: the chunk's K and V base words and scales once for all R*T rows, refinement words only at positions
    >= kv8_from, nothing past seq_len; q once per program (L2-resident across chunks). A chunk at or past seq_len
    runs no iteration and stores m = -inf, l = 0, acc = 0 (an exact zero in the reduction)."""
    dependent_launch(PDL)
    h = tl.program_id(0)
    c = tl.program_id(1)
    tile = tl.program_id(2)
    main_len, seq_len, kv8_from = lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap)
    W: tl.constexpr = D // 8
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                     # [BM]
    live = rows < R * T
    head = h * R + rows // T
    qpos = seq_len - T + rows % T                                      # [BM] position of each query
    d = tl.arange(0, D)
    qoff = (head * T + rows % T)[:, None] * D + d[None, :]            # q [Hq, T, D]
    q_hi, q_lo = split16(tl.load(q_ptr + qoff, mask=live[:, None], other=0.0).to(tl.float32))    # [BM, D] x2
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    c0 = c * CHUNK
    c1 = tl.minimum(c0 + CHUNK, seq_len)
    seen = tl.minimum(main_len, seq_len - T + 1)       # positions before it: main ones every query of the pass sees
    m_i, l_i, acc = attend_range(m_i, l_i, acc, q_hi, q_lo, qpos, live, c0, c1, kv8_from, seen, h, base_ptr,
                                 refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap,
                                 sm_scale, HKV, W, BLOCK_S, INTERP)
    slot = (h * R * T + rows) * n_chunks + c                             # [BM]
    kept = live & (rows * 0 + c0 < seq_len)       # a chunk past seq_len stores nothing: the reduction never reads
    #                                               it (the test a [BM] tensor: the interpreter takes no scalar)
    tl.store(m_ws + slot, m_i, mask=kept)
    tl.store(l_ws + slot, l_i, mask=kept)
    tl.store(acc_ws + slot[:, None] * D + d[None, :], acc, mask=kept[:, None])


@triton.jit
def chunk_reduce_kernel(m_ws, l_ws, acc_ws, out_ptr, main_ptr, seq_ptr, kv8_ptr, T, n_chunks, cap, scap, s_h, s_t,
                        xq_ptr, xsum_ptr, sx_ptr, count_ptr, R: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr,
                        NC: tl.constexpr, QUANT: tl.constexpr, M: tl.constexpr, G: tl.constexpr,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (kv head, row): combine the chunks before seq_len (the lengths as `flash_decode_kernel` reads
    them; the chunks past it hold nothing) into out [Hq, T, D] (strides s_h, s_t: the launcher's token-major buffer,
    or a caller's), NC chunks a step in one load each of m, l and the [NC, D] partial outputs: a step's sums are trees
    over its NC lanes (chunk c in lane c % NC), added in step order, so the order depends on seq_len alone, never on
    T or on how many chunks the grid covered. With QUANT (out token-major, T = M <= 8), each program counts itself
    in on its token's counter, with the max of its D values, and the token's last (of Hq) quantizes the token's row
    of Hq*D values into the decode layout at group size G (`gemv_decode.last_quantizes`): o_proj's activations, what
    `quantize_decode` of the row gives, bit for bit, where a launch of its own made them.
    Bytes: (2 + D) * 4 per visible chunk and row of partials, D * 4 out: no KV bytes."""
    dependent_launch(PDL)
    h = tl.program_id(0)
    row = tl.program_id(1)
    _, seq_len, _ = lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap)
    chunks = tl.minimum((seq_len + CHUNK - 1) // CHUNK, n_chunks)
    base = (h * R * T + row) * n_chunks
    d = tl.arange(0, D)
    lane = tl.arange(0, NC)
    m = float("-inf")
    for c0 in range(0, chunks, NC):
        m = tl.maximum(m, tl.max(tl.load(m_ws + base + c0 + lane, mask=c0 + lane < chunks, other=float("-inf")),
                                 axis=0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    num = tl.zeros([D], tl.float32)
    den = 0.0
    for c0 in range(0, chunks, NC):
        c = c0 + lane
        seen = c < chunks
        w = tl.exp(tl.load(m_ws + base + c, mask=seen, other=float("-inf")) - m_safe)   # [NC]; 0 for an unseen chunk
        den += tl.sum(w * tl.load(l_ws + base + c, mask=seen, other=0.0), axis=0)
        part = tl.load(acc_ws + (base + c)[:, None] * D + d[None, :], mask=seen[:, None], other=0.0)   # [NC, D]
        num += tl.sum(w[:, None] * part, axis=0)
    head = h * R + row // T
    t = row % T
    y = num / den
    tl.store(out_ptr + head * s_h + t * s_t + d, y)
    if QUANT:
        hq = tl.num_programs(0) * R
        last_quantizes(out_ptr + t * s_t, tl.max(tl.abs(y), axis=0), count_ptr, xq_ptr, xsum_ptr, sx_ptr, t, hq,
                       hq * D, M, G, BLOCK_K)


def check_planes(base, refine, scale, d):
    if base.dtype != torch.uint8 or refine.dtype != torch.uint8 or scale.dtype != torch.float16:
        raise ValueError("KV planes must be uint8 and their scales float16")
    if base.dim() != 4 or base.shape[0] != 2 or base.shape[-1] * 2 != d or refine.shape != base.shape \
            or scale.shape != base.shape[:3] or not (base.is_contiguous() and refine.is_contiguous()):
        raise ValueError(f"KV planes {tuple(base.shape)} / scale {tuple(scale.shape)} are not contiguous "
                         f"[2, Hkv, C, {d // 2}] / [2, Hkv, C]")


def device_scalar(value: int, device) -> torch.Tensor:
    """An int32 [1] device tensor holding `value` (the eager launchers' lengths)."""
    return torch.tensor([value], dtype=torch.int32, device=device)


def _attend(q, base, refine, scale, scratch, main_ptr, seq_ptr, kv8_ptr, n_chunks, out, quantize=None):
    """Check shapes, allocate the chunk workspace and launch (lengths are device scalars); the output, where the
    caller gives none, is a token-major buffer's [Hq, T, D] view (so [T, Hq*D] is a view of it, no copy); with
    `quantize` (a group size; T <= 8) also its rows' decode-layout activations (module docstring). A pass of more
    than SPLIT_QUERIES queries (a prefill chunk) runs `attention_prefill` instead: no workspace."""
    hq, t, d = q.shape
    hkv = base.shape[1]
    check_planes(base, refine, scale, d)
    if hq % hkv or d & (d - 1) or d < 32:
        raise ValueError(f"q [{hq}, {t}, {d}] does not fit {hkv} KV heads (head dim must be a power of two >= 32)")
    sb, sr, ss = scratch if scratch is not None else (base, refine, scale)
    scap = 0
    if scratch is not None:
        check_planes(sb, sr, ss, d)
        scap = sb.shape[2]
    r = hq // hkv
    dev = q.device
    words = [p.view(torch.int32) for p in (base, refine, sb, sr)]        # [2, Hkv, C, D/8] words of 8 nibbles
    y = out if out is not None else torch.empty(t, hq, d, dtype=torch.float32, device=dev).transpose(0, 1)
    dependent = pdl(dev)
    options = {"INTERP": INTERPRET, "num_stages": STAGES, "enable_fp_fusion": False} | dependent
    if t > SPLIT_QUERIES and quantize is None and prefill_fits(r, d):   # a prefill chunk: no split, no partials
        rows = prefill_rows(d)
        flash_prefill_kernel[prefill_grid(hkv, r, d, t)](
            q.contiguous(), words[0], words[1], scale, words[2], words[3], ss, y, main_ptr, seq_ptr, kv8_ptr,
            t, base.shape[2], scap, y.stride(0), y.stride(1), 1.0 / math.sqrt(d),
            HKV=hkv, R=r, D=d, BLOCK_S=block_s_for(d), BLOCK_M=rows, num_warps=prefill_warps(d),
            maxnreg=_register_cap(dev, prefill=True), **options)
        return y
    block_m = rows_per_tile(r)                                          # never a function of t
    tiles = triton.cdiv(r * t, block_m)
    m_ws = torch.empty(hkv * r * t * n_chunks, dtype=torch.float32, device=dev)
    l_ws = torch.empty_like(m_ws)
    acc_ws = torch.empty(hkv * r * t * n_chunks, d, dtype=torch.float32, device=dev)
    flash_decode_kernel[(hkv, n_chunks, tiles)](
        q.contiguous(), words[0], words[1], scale, words[2], words[3], ss, m_ws, l_ws, acc_ws, main_ptr, seq_ptr,
        kv8_ptr,
        t, base.shape[2], scap, n_chunks, 1.0 / math.sqrt(d),
        HKV=hkv, R=r, D=d, CHUNK=CHUNK, BLOCK_S=block_s_for(d), BLOCK_M=block_m, num_warps=warps_for(d, r),
        maxnreg=_register_cap(dev), **options)
    lens = (main_ptr, seq_ptr, kv8_ptr, t, n_chunks, base.shape[2], scap, y.stride(0), y.stride(1))
    fixed = {"R": r, "D": d, "CHUNK": CHUNK, "NC": REDUCE_CHUNKS, "enable_fp_fusion": False} | dependent
    if quantize is None:
        chunk_reduce_kernel[(hkv, r * t)](m_ws, l_ws, acc_ws, y, *lens, y, y, y, y, QUANT=False, M=1, G=1, BLOCK_K=1,
                                          **fixed)
        return y
    if out is not None or t > DECODE_MAX_M or (hq * d) % quantize:
        raise ValueError(f"attention's fused quantization serves T <= {DECODE_MAX_M} queries into its own output "
                         f"with Hq*D a multiple of the group ({t} queries, Hq*D {hq * d}, group {quantize})")
    acts = quantize_decode_buffers(t, hq * d, quantize, dev)
    chunk_reduce_kernel[(hkv, r * t)](m_ws, l_ws, acc_ws, y, *lens, acts[0].view(torch.int8), acts[1], acts[2],
                                      split_counters(dev, MAX_SLOTS + t), QUANT=True, M=t, G=quantize,
                                      BLOCK_K=tail_block(hq * d, quantize), **fixed)
    return y, acts


def nested_kv_attention(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                        main_len: int, kv8_from: int, scratch=None, scratch_len: int = 0, out=None, quantize=None):
    """out float32 [Hq, T, D]: the semantics of `plugins.reference.nested_kv_attention` (see the module docstring);
    with `quantize` = g, (out, its [T, Hq*D] rows' decode-layout INT8 activations at group size g) from the same
    launches (`chunk_reduce_kernel`)."""
    t = q.shape[1]
    seq = main_len + scratch_len
    scap = scratch[0].shape[2] if scratch is not None else 0
    if not 0 < t <= seq or main_len > base.shape[2] or scratch_len > scap:
        raise ValueError(f"{t} queries over {main_len} + {scratch_len} positions do not fit the planes")
    lens = torch.tensor([main_len, seq, kv8_from], dtype=torch.int32, device=q.device)
    return _attend(q, base, refine, scale, scratch, lens[0:], lens[1:], lens[2:], triton.cdiv(seq, CHUNK), out,
                   quantize)


def nested_kv_attention_at(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                           main_len: torch.Tensor, seq_len: torch.Tensor, kv8_from: torch.Tensor, scratch=None,
                           out=None, quantize=None):
    """`nested_kv_attention` with its lengths in device scalars (int32 or int64, read by the kernel, clamped): the
    grid covers every position of the planes (and scratch), so one launch serves any lengths (CUDA graphs,
    TensorRT plugins). seq_len counts main positions plus scratch slots; main_len may be the same tensor."""
    scap = scratch[0].shape[2] if scratch is not None else 0
    return _attend(q, base, refine, scale, scratch, main_len, seq_len, kv8_from,
                   triton.cdiv(base.shape[2] + scap, CHUNK), out, quantize)
