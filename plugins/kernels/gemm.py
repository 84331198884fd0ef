"""The tensor-core dual-plane GEMM: y[M, N] = x[M, K] @ W_view^T for passes wider than a decode pass (prefill chunks,
M > DECODE_MAX_M) and for float16 activations, on the canonical planes or on the warp-tiled ones the `triton`
backend holds (plugins.kernels.tiling), giving the decode kernel's rows bit for bit (INT8 activations).

Why this shape (docs/kernels.md, "Prefill: the tensor-core GEMM"):
- A program owns BLOCK_N weight rows and BLOCK_M = 64 tokens (`block_m`; 16 for a pass of 9-16), so a prefill chunk
  reads the planes once per 64 tokens, where the decode kernel reads them once per 8: on Orin NX a 7B prefill is
  then bound by the tensor cores, not by LPDDR5.
- The weights are the MMA's A operand ([BLOCK_N, K] x [K, BLOCK_M]: the output is y^T's tile), so the warps split
  the weight rows and each plane byte is unpacked by one thread once; as the B operand every warp would unpack the
  whole tile again (4x the unpacking at 4 warps, what `sass_proxy` caught).
- Unpacking is four nibbles a 32-bit register (`NIBBLES`: a LOP3, an add and a LOP3 a word and view), not a byte at
  a time (Triton's shifts of int8 lanes cost ~20 instructions a word).
- The activations come per-group de-interleaved (`quantize_rows`: each group's even columns, then its odd ones),
  so x's even and odd halves of a group are two contiguous tiles the compiler streams with cp.async, where a
  stride-2 gather costs a byte load each.
- Each group's dot products are exact int32 sums chained in the MMA accumulator (target: 16 * base part, then the
  refinement part added in the same accumulator), then scaled by s (draft) or s/16 (target) in float32 and added
  to the float32 accumulator, in the decode kernel's order, the groups in the runs of its split of K: the rows are
  the decode kernel's bit for bit, and no split partials are written (a program sums every group of its rows).

Float16 activations (`float_act`): the same program with float16 MMAs over float16 x and the exactly representable
codes, float32 accumulation.
"""

import torch
import triton
import triton.language as tl

from plugins.kernels.common import INTERPRET, dependent_launch, interp_dot, pdl, round_half_even, row_scale

BLOCK_MS = (16, 64)   # tokens a program: 16 up to 16 tokens (a verification pass past 8, float16 activations), else 64
GEMM_WARPS = 4
# Software-pipelining stages: Triton's 3 for one run of K; 2 where K is summed in runs (two accumulators live: at 3
# stages ptxas for sm_87 spilled 16 bytes in 168 registers, at 2 it holds 215 with none and fewer instructions)
GEMM_STAGES = {True: 3, False: 2}
# (lo, hi) int8 lanes of four packed plane bytes: each nibble n as the signed value (n ^ 8) - 8, per byte
# ((n ^ 8) + 0x78) ^ 0x80 with no carry between bytes (n ^ 8 <= 15). LOP3 0x6a is (a & b) ^ c.
NIBBLES = tl.constexpr("""{
.reg .b32 t;
lop3.b32 t, $2, 0x0F0F0F0F, 0x08080808, 0x6a;
add.u32 t, t, 0x78787878;
xor.b32 $0, t, 0x80808080;
shr.u32 t, $2, 4;
lop3.b32 t, t, 0x0F0F0F0F, 0x08080808, 0x6a;
add.u32 t, t, 0x78787878;
xor.b32 $1, t, 0x80808080;
}""")


@triton.jit
def quantize_rows_kernel(x_ptr, xq_ptr, sx_ptr, xsum_ptr, K, stride_x, G: tl.constexpr, BLOCK_K: tl.constexpr,
                         PDL: tl.constexpr = False):
    """One program per token: s_x = max|x|/127 (at least 1e-12), x_q = clip(round(x/s_x), -127, 127), column k
    stored at (k // G) * G + (k % 2) * G/2 + (k % G) // 2 (a group's even columns, then its odd ones), and each
    group's sum of x_q (int32 [M, K/G]: what a nest's offsets multiply). BLOCK_K is a multiple of G.
    Bytes: the row of x twice (max, then quantize; the second read hits L1/L2), K bytes of codes, K/G sums and the
    scale out."""
    dependent_launch(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    s = row_scale(x_ptr + row * stride_x, K, BLOCK_K, False)
    tl.store(sx_ptr + row, s)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs
        m = k < K
        v = tl.load(x_ptr + row * stride_x + k, mask=m, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(v, s)), -127.0), 127.0)
        at = (k // G) * G + (k % 2) * (G // 2) + (k % G) // 2
        tl.store(xq_ptr + row * K + at, q.to(tl.int8), mask=m)
        sums = tl.sum(tl.reshape(q.to(tl.int32), [BLOCK_K // G, G]), axis=1)               # [BLOCK_K / G]
        groups = k0 // G + tl.arange(0, BLOCK_K // G)
        tl.store(xsum_ptr + row * (K // G) + groups, sums, mask=groups < K // G)


@triton.jit
def _nibbles(p, INTERP: tl.constexpr):
    """uint8 [R, C] -> (low, high) int8 nibbles sign-extended (two's complement, docs/contracts.md, weights)."""
    if INTERP:
        return (p << 4).to(tl.int8, bitcast=True) >> 4, p.to(tl.int8, bitcast=True) >> 4
    return tl.inline_asm_elementwise(NIBBLES, "=r,=r,r", [p], dtype=(tl.int8, tl.int8), is_pure=True, pack=4)


@triton.jit
def _dot(a, b, acc, INTERP: tl.constexpr):
    """acc + a [R, C] @ b [C, S]: int32 accumulation of int8 operands, float32 of float16 ones. The interpreter wraps
    int8 products and mis-rounds low-precision dots, so there the operands go through float32, where every product
    and group sum here is exact (|x| <= 127, |code| <= 136, C <= 128: sums < 2^24), in a fixed order (`interp_dot`)
    so that float16 activations are row-invariant too."""
    if INTERP:
        return acc + interp_dot(a, b)
    return tl.dot(a, b, acc=acc, out_dtype=acc.dtype)


@triton.jit
def _run(x_ptr, xsum_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, target, g0, groups, n_groups, K, m_offs,
         m_mask, n_offs, n_mask, j, xm, wm, wrow, wcol, srow, wstep, sstep, HAS_OFFSET: tl.constexpr,
         FLOAT_ACT: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
         INTERP: tl.constexpr):
    """y^T's tile [BN, BM] over groups [g0, g0 + groups) of K (unscaled by s_x), each group's exact int32 sum
    scaled and added in group order (`gemm_kernel`)."""
    HALF: tl.constexpr = G // 2
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for gi in range(0, tl.minimum(groups, n_groups - g0)):       # a split's last run may hold fewer groups
        g = g0 + gi
        xrow = x_ptr + m_offs[:, None] * K + g * G + j[None, :]                              # [BM, DOT_K]
        x_even = tl.load(xrow, mask=xm, other=0)
        x_odd = tl.load(xrow + HALF, mask=xm, other=0)
        byte = wrow[:, None] + g * wstep + wcol[None, :]                                     # [BN, DOT_K]
        lo, hi = _nibbles(tl.load(base_ptr + byte, mask=wm, other=0), INTERP)
        if FLOAT_ACT:
            lo, hi = lo.to(tl.float16), hi.to(tl.float16)
            part = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            part = tl.zeros([BLOCK_N, BLOCK_M], tl.int32)
        part = _dot(hi, tl.trans(x_odd), _dot(lo, tl.trans(x_even), part, INTERP), INTERP)  # [BN, BM]
        step = tl.load(scale_ptr + srow + g * sstep, mask=n_mask, other=0.0).to(tl.float32)     # [BN]
        if target:
            rlo, rhi = _nibbles(tl.load(refine_ptr + byte, mask=wm, other=0), INTERP)
            if FLOAT_ACT:
                rlo, rhi = rlo.to(tl.float16), rhi.to(tl.float16)
            part = _dot(rhi, tl.trans(x_odd), _dot(rlo, tl.trans(x_even), 16 * part, INTERP), INTERP)
            step = step * 0.0625                                # s/16, exactly (the decode kernel's)
        acc += part.to(tl.float32) * step[:, None]
        if HAS_OFFSET:
            if FLOAT_ACT:
                xsum = tl.sum(x_even.to(tl.float32) + x_odd.to(tl.float32), axis=1)          # [BM]
            else:           # exact either way: the same float32 value
                xsum = tl.load(xsum_ptr + m_offs * n_groups + g, mask=m_mask, other=0).to(tl.float32)
            off = tl.load(offset_ptr + srow + g * sstep, mask=n_mask, other=0.0).to(tl.float32)
            acc += xsum[None, :] * off[:, None]
    return acc


@triton.jit(do_not_specialize=["M", "SPLITS"])   # M == 1 or one split would otherwise compile a program of its own
def gemm_kernel(
    x_ptr, sx_ptr, xsum_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, view_ptr,
    M, N, K, GROUPS_PER_SPLIT, SPLITS,
    TARGET: tl.constexpr, HAS_OFFSET: tl.constexpr, FLOAT_ACT: tl.constexpr,
    G: tl.constexpr, DOT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr,
    TILED: tl.constexpr = False, RUNTIME_VIEW: tl.constexpr = False, ONE_RUN: tl.constexpr = True,
                PDL: tl.constexpr = False,
):
    """Program (n-tile, m-tile): rows [n0, n0+BLOCK_N), tokens [m0, m0+BLOCK_M), every group of K, summed as the
    decode launch sums them: in SPLITS runs of GROUPS_PER_SPLIT groups (its split of K, `plan_split`), each run's
    sum added to the total in run order, what the decode kernel's split partials and their ordered reduction give,
    with no partials written. x: int8 [M, K] per-group de-interleaved (`quantize_rows`) with scales sx float32 [M]
    and group sums xsum int32 [M, K/G] (HAS_OFFSET; or x float16 with FLOAT_ACT, its sums summed here). Planes
    canonical (uint8 [N, K/2], float16 [N, K/G]) or with TILED warp-tiled (uint8 [N/32, K/G, G/32, 32, 16], float16
    [N/32, K/G, 32]). out: float32 [M, N]. Bytes: each plane byte of the tile once per m-tile (the refinement plane
    only for the target view), one scale per row and group, the tile's x columns (L2-resident), the output tile
    once. RUNTIME_VIEW: the view read from view_ptr (1 = target). DOT_K (`dot_k`): a group's G/2 bytes, padded with
    masked lanes (no load issued) up to the int8 MMA's minimum K of 32. ONE_RUN: SPLITS == 1 (the loop alone)."""
    dependent_launch(PDL)
    if RUNTIME_VIEW:
        target = tl.load(view_ptr) == 1
    else:
        target = TARGET
    HALF: tl.constexpr = G // 2
    n_offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)           # [BN]
    m_offs = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)           # [BM]
    j = tl.arange(0, DOT_K)                                              # [DOT_K] byte of a group's row
    n_mask = n_offs < N
    m_mask = m_offs < M
    n_groups = K // G
    if DOT_K > HALF:                                                     # a 16-byte group (G = 32)
        xm = m_mask[:, None] & (j < HALF)[None, :]                       # [BM, DOT_K]
        wm = n_mask[:, None] & (j < HALF)[None, :]                       # [BN, DOT_K]
    else:
        xm = m_mask[:, None]
        wm = n_mask[:, None]
    if TILED:               # block n // 32, lane n % 32; chunk j // 16 of a group: 512 bytes a chunk of a block
        wrow = (n_offs // 32) * (n_groups * 16 * G) + (n_offs % 32) * 16
        wcol = (j // 16) * 512 + j % 16
        srow = (n_offs // 32) * (n_groups * 32) + n_offs % 32
        wstep, sstep = 16 * G, 32                                        # a group of a block: G/32 chunks
    else:
        wrow, wcol, srow = n_offs * (K // 2), j, n_offs * n_groups
        wstep, sstep = HALF, 1
    if ONE_RUN:             # one run of every group (no split of K): the loop alone
        total = _run(x_ptr, xsum_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, target, 0, n_groups, n_groups, K,
                     m_offs, m_mask, n_offs, n_mask, j, xm, wm, wrow, wcol, srow, wstep, sstep, HAS_OFFSET, FLOAT_ACT,
                     G, BLOCK_N, BLOCK_M, INTERP)
    else:                   # runs summed in order, as the decode launch's split partials and their reduction
        total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)                 # y^T's tile
        for split in range(0, SPLITS):
            total += _run(x_ptr, xsum_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, target,
                          split * GROUPS_PER_SPLIT, GROUPS_PER_SPLIT, n_groups, K, m_offs, m_mask, n_offs, n_mask, j,
                          xm, wm, wrow, wcol, srow, wstep, sstep, HAS_OFFSET, FLOAT_ACT, G, BLOCK_N, BLOCK_M, INTERP)
    if not FLOAT_ACT:
        total = total * tl.load(sx_ptr + m_offs, mask=m_mask, other=0.0)[None, :]
    tl.store(out_ptr + m_offs[None, :] * N + n_offs[:, None], total, mask=m_mask[None, :] & n_mask[:, None])


def dot_k(g: int) -> int:
    """The MMAs' K for group size g: its G/2 bytes, at least 32 (int8 MMA's minimum K on sm_80+, Orin's sm_87 and
    Hopper: a group of 32 is padded with masked lanes)."""
    return max(g // 2, 32)


def block_n_for(n: int) -> int:
    return 64 if n >= 64 else max(16, triton.next_power_of_2(n))


def block_m(m: int) -> int:
    """Tokens a program for a pass of m tokens (BLOCK_MS): two compiled widths, whatever the chunk's length."""
    return BLOCK_MS[0] if m <= BLOCK_MS[0] else BLOCK_MS[1]


def quantize_rows(x: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K] each group's columns de-interleaved, float32 [M] scales, int32 [M, K/g] group sums):
    per-token INT8 activations as plugins.nesting.quantize_activations, on the device of x, laid out for
    `gemm_kernel` at group size g."""
    m, k = x.shape
    xq = torch.empty(m, k, dtype=torch.int8, device=x.device)
    sx = torch.empty(m, dtype=torch.float32, device=x.device)
    xsum = torch.empty(m, k // g, dtype=torch.int32, device=x.device)
    quantize_rows_kernel[(m,)](x, xq, sx, xsum, k, x.stride(0), G=g,
                               BLOCK_K=max(g, min(1024, triton.next_power_of_2(k))), enable_fp_fusion=False,
                               **pdl(x.device))
    return xq, sx, xsum


def deinterleave(x: torch.Tensor, g: int) -> torch.Tensor:
    """x [M, K] float -> float16 [M, K], each group's even columns then its odd ones (`gemm_kernel`'s FLOAT_ACT)."""
    m, k = x.shape
    return x.to(torch.float16).view(m, k // g, g // 2, 2).transpose(2, 3).reshape(m, k)


def launch_gemm(x, base, refine, scale, offset, y, view_code, n: int, g: int, split: int, per: int, target: bool,
                float_act: bool, tiled: bool) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T in one `gemm_kernel` launch, its groups summed in the decode launch's `split` runs
    of `per` groups (`plan_split`): the decode kernel's rows bit for bit (INT8 activations)."""
    m, k = x.shape
    if float_act:
        xk, sx, xsum = deinterleave(x, g), y, y                 # sx and xsum unread
    else:
        xk, sx, xsum = quantize_rows(x.contiguous(), g)
    bn, bm = block_n_for(n), block_m(m)
    gemm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
        xk, sx, xsum, base, refine if refine is not None else base, scale,
        offset if offset is not None else scale, y, view_code if view_code is not None else scale, m, n, k, per, split,
        TARGET=bool(target), HAS_OFFSET=offset is not None, FLOAT_ACT=float_act, G=g, DOT_K=dot_k(g),
        BLOCK_N=bn, BLOCK_M=bm, INTERP=INTERPRET, TILED=tiled, RUNTIME_VIEW=view_code is not None,
        ONE_RUN=split == 1, num_warps=GEMM_WARPS, num_stages=GEMM_STAGES[split == 1], enable_fp_fusion=False,
        **pdl(y.device))
    return y
