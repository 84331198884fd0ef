"""Triton nested-KV attention of a prefill chunk (docs/contracts.md, KV cache and ops): the causal GQA attention of
more than `attention.SPLIT_QUERIES` newest queries over one layer's nested cache (KV4, KV8 or Recent-N), one program
per KV head and tile of queries, each running its tile's whole causal range with no split and no partials.

Why a kernel of its own. The split kernel (`attention.flash_decode_kernel`) serves every query of a decode pass from
one read of each chunk of the context. A prefill chunk of T queries is R*T rows: tiled at 16-64 rows, every tile read
every chunk of the context (the chunks wholly past its queries too) and wrote (D + 2) float32 partials a row and
chunk. At Llama-2-7B's shapes a 256-token chunk at 4K positions read each layer's KV 16 times and wrote 136 MB of
partials; at 32K positions the partials alone were 1 GB, which no Orin plan held. Here:
- rows are query-major (row i: query t0 + i // R of head h*R + i % R), so a tile of BLOCK_M rows (`prefill_rows`: 64
  at d128) serves BLOCK_M // R queries of every head of the GQA group: each KV byte is read once per BLOCK_M // R
  queries, for all R heads (at d128: 64 queries at MHA, 16 at GQA 4);
- a tile's loop ends at its last query's position (causal): the steps of a triangle, none wholly masked; the tiles
  run latest first (the longest ranges start first, the short ones fill the tail);
- the online softmax runs to the end in registers and the program stores its rows' out = acc / l: no workspace.
The steps are decoding's (`kv_codes.attend_range`): a KV4 loop that holds no refinement load before kv8_from, a KV8
loop from it; whole steps (main positions every query of the tile sees) with no clamp or mask, then the edge steps
of the diagonal. Positions past seq_len are never loaded.

Numerics: the reference's, within the split kernel's tolerance; not bit for bit the split kernel's rows (one range,
so another order of the softmax sums). Nothing needs them to be: a prompt's prefill is the same pass whatever the
decoding mode, and every verification pass (at most γ + 1 = 17 queries) stays on the batch-invariant split kernel,
so speculative output still equals the target's own. Lengths come from device scalars (clamped as in decoding) and
the grid depends on T alone, so one launch serves any lengths (CUDA graphs, TensorRT plugins).
"""

import triton
import triton.language as tl

from plugins.kernels.common import dependent_launch
from plugins.kernels.kv_codes import attend_range, lengths, split16

PREFILL_MAXNREG = 192        # ptxas's register cap on Orin (sm_87) and below: a program of 8 warps (what a d128 tile
                             # needs: 168-171 registers on sm_87) or two of 4 resident on an SM; the tiles below hold
                             # 168-192 with no spill (`bitnest compile-kernels`), where the decode kernel's cap of
                             # 128 spilled them
PREFILL_MAXNREG_SM90 = 255   # from Hopper on: Triton 3.6 for sm_90 spilled the d128 tile 260 + 276 bytes at 192 and
                             # d64's 20 + 20 at 224; it holds 237 and 249 with none uncapped (one program an SM)


def prefill_register_cap(cc: int) -> int:
    """ptxas's register cap for a prefill tile at compute capability cc (87: sm_87)."""
    return PREFILL_MAXNREG_SM90 if cc >= 90 else PREFILL_MAXNREG


def prefill_rows(d: int) -> int:
    """Rows (queries x GQA heads) a program at head dim d: 64 at d128 (8 warps: 168-171 registers on sm_87, 15.1 lane
    instructions per KV8 byte, 0.24 a row), 32 otherwise (d64 at 64 rows took 255 registers and spilled at 4 or 8
    warps; at 32, 4 warps hold 192 with no spill, 9.1 per KV8 byte, 0.28 a row)."""
    return 64 if d == 128 else 32


def prefill_warps(d: int) -> int:
    """Warps a prefill program: 8 where its [rows, D] float32 accumulator is 8192 values or more, 4 below."""
    return 8 if prefill_rows(d) * d >= 8192 else 4


def prefill_fits(r: int, d: int) -> bool:
    """Whether a tile at head dim d holds all r heads of a GQA group (MQA with more heads than rows: split kernel)."""
    return r <= prefill_rows(d)


def prefill_grid(hkv: int, r: int, d: int, t: int) -> tuple[int, int]:
    """The launch's programs for t queries: one per KV head and tile of prefill_rows(d) // r queries."""
    return hkv, triton.cdiv(t, prefill_rows(d) // r)


# T: one program for any chunk width. The output strides: specialized as multiples of 16 (what every real launch
# has), Triton 3.9 vectorized the tile's one output store and the d64 tile spilled 4 bytes at sm_87's cap of 192
# (`bitnest compile-kernels --launches` on the default model); unspecialized, no spill and the same loops
@triton.jit(do_not_specialize=["T", "s_h", "s_t"])
def flash_prefill_kernel(
    q_ptr, base_ptr, refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, out_ptr,
    main_ptr, seq_ptr, kv8_ptr,
    T, cap, scap, s_h, s_t, sm_scale,
    HKV: tl.constexpr, R: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
    INTERP: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (kv head h, query tile): rows i = (t - t0) * R + r for the tile's queries t (query t at position
    seq_len - T + t) and heads h*R + r; out [Hq, T, D] at strides s_h, s_t. q is float32 [Hq, T, D]; base/refine
    (and the scratch planes) int32 words [2, Hkv, C, D/8].
    Bytes: the K and V base words and scales of positions [0, the tile's last query] once for the tile's BQ queries
    and R heads, refinement words only at positions >= kv8_from; q and out once."""
    dependent_launch(PDL)
    BQ: tl.constexpr = BLOCK_M // R
    W: tl.constexpr = D // 8
    h = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)                  # the latest queries (longest range) first
    main_len, seq_len, kv8_from = lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap)
    i = tl.arange(0, BLOCK_M)
    t = tile * BQ + i // R                                              # [BM] query of each row
    live = (i < BQ * R) & (t < T)
    head = h * R + i % R
    qpos = seq_len - T + t                                              # [BM] position of each query
    d = tl.arange(0, D)
    q_hi, q_lo = split16(tl.load(q_ptr + (head * T + t)[:, None] * D + d[None, :], mask=live[:, None],
                                 other=0.0).to(tl.float32))            # [BM, D] x2
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    first = seq_len - T + tile * BQ                                     # the tile's first query's position
    end = tl.minimum(first + BQ, seq_len)                               # one past its last query's
    seen = tl.minimum(main_len, first + 1)              # positions before it: main ones every query of the tile sees
    m_i, l_i, acc = attend_range(m_i, l_i, acc, q_hi, q_lo, qpos, live, 0, end, kv8_from, seen, h, base_ptr,
                                 refine_ptr, scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap,
                                 sm_scale, HKV, W, BLOCK_S, INTERP)
    l_safe = tl.where(live, l_i, 1.0)                                   # rows of no query: never stored
    tl.store(out_ptr + head[:, None] * s_h + t[:, None] * s_t + d[None, :], acc / l_safe[:, None],
             mask=live[:, None])
