"""Triton decode GEMV of the dual-plane format (docs/kernels.md, decode GEMV): y[M, N] = x[M, K] @ W_view^T for the
M <= DECODE_MAX_M tokens of a draft step (1) or a verification pass (γ+1), on CUDA cores, built to stream the planes
at the memory roofline. `plugins.kernels.gemv` launches it for small M and keeps the tensor-core kernel for prefill.

Why this shape (decode is bandwidth-bound: a 7B target step reads ~6.8 GB of planes to do ~14 GFLOP):
- one thread owns one weight row of a ROWS x 32 x num_warps-row tile and walks whole groups of its row; each 16-byte
  chunk of a plane row is one 128-bit load (`LDG.E.128`), and every plane byte is loaded once per pass whatever M
  (the M tokens' activations, kilobytes, come from L1/L2);
- the nibbles are unpacked in registers with 32-bit bit operations, four lanes at a time, into signed int8 lanes
  that dp4a consumes: draft lane = 16*q4 (`(b << 4) & 0xF0F0F0F0` and `b & 0xF0F0F0F0`: the nibble in the high half
  of a byte is 16*q4 in two's complement), target lane = 16*q4 + qr + 8 (the high nibble from the base byte, the low
  one `qr ^ 8` from the refinement byte: always in [-128, 127], even for top-4-of-8 codes, whose 16*q4 + qr reaches
  -136);
- dot products are dp4a (four int8 x int8 products into int32 per instruction) on per-token INT8 activations that
  `quantize_decode` lays out per 32-column chunk as [token][4 words of even columns, 4 words of odd columns], so the
  words of a chunk pair with the base words' low and high nibbles without any shuffle;
- no tensor cores: at M = 1 an MMA tile would compute 16 tokens to use one, and its operand tiles hold the
  registers that the old kernel spent (254 on sm_87); here no shared memory, no barriers, no shuffles.

Exact arithmetic, and why it equals the tensor-core kernel bit for bit: each (token, row, group) sum is an exact
int32: the draft's dp4a sum is 16*dot(x, q4), shifted down by 4; the target's is 16*dot(x, q4) + dot(x, qr) +
8*sum(x), less 8*sum(x) (the group sums of x that `quantize_decode` writes beside it). The float32 steps are then
those of `plugins.kernels.gemm.gemm_kernel`, in the same order: acc += sum * s (draft) or sum * (s/16)
(target), plus sum(x) * offset where there is one, groups in index order, the same split of K (`gemv.plan_split`),
the same ordered reduction and s_x at the end. So a row's result depends on neither M nor which kernel ran it, and
a verification pass computes bit for bit what single-token steps compute.
"""

import triton
import triton.language as tl

from plugins.kernels.common import (
    dependent_launch, load_row, prefetch_l2, round_half_even, row_scale, scale_for_max,
)

DECODE_MAX_M = 8                      # tokens a decode launch serves; larger M runs the tensor-core kernel
# The interpreter's two forms of the group sums (the kernel's INTERP): INTERP_GROUPS, whole-group numpy operations
# (the default: whole model passes in the interpreter stay seconds), or INTERP_CHAINS, the compiled form's dp4a
# chains emulated lane by lane (the tests run it on small shapes, so the code the GPU compiles runs here too).
INTERP_GROUPS = tl.constexpr(1)
INTERP_CHAINS = tl.constexpr(2)
interp_form = 1                       # what the launcher passes in the interpreter (a test sets INTERP_CHAINS)
XSUM_SLOTS = tl.constexpr(DECODE_MAX_M)   # group sums of x_q per group: one slot per token, unused ones 0
MAX_SLOTS = tl.constexpr(DECODE_MAX_M)    # `last_quantizes`: the counters' slots past the tokens' own hold their max
CHUNK_COLS = tl.constexpr(32)         # columns per 16-byte chunk of a plane row (one 128-bit load per plane)
TILE_ROWS = tl.constexpr(32)          # rows of a block of the warp-tiled layout (plugins.kernels.tiling.WARP_ROWS)
LOW = tl.constexpr(0x0F0F0F0F)        # the low nibble of each byte lane
HIGH = tl.constexpr(-0x0F0F0F10)      # 0xF0F0F0F0 as int32: the high nibble of each byte lane
EIGHTS = tl.constexpr(-0x77777778)    # 0x88888888: each nibble's qr ^ 8 = qr + 8 in [0, 15]
DRAFT_REFINE = EIGHTS                 # the refinement word a draft view reads instead: every qr ^ 8 is 0


@triton.jit
def _dp4a(a, b, c, INTERP: tl.constexpr):
    """c + the sum of the four signed int8 lanes of a times those of b (int32 tensors; PTX dp4a.s32.s32)."""
    if INTERP:                       # the interpreter has no inline PTX: the same sum, lane by lane, in int32
        for i in tl.static_range(4):
            c += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
        return c
    return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def quantize_decode_row(x_row, xq_ptr, xsum_ptr, sx_ptr, m, K, M: tl.constexpr, G: tl.constexpr,
                        BLOCK_K: tl.constexpr, CG: tl.constexpr):
    """Token m's row of K floats at x_row: s_x = max|x|/127 (at least 1e-12), x_q = clip(rne(x/s_x), -127, 127), as
    `gemm.quantize_rows_kernel`, written in the decode layout (`store_decode_codes`). The bits do not depend on
    BLOCK_K (a max, elementwise codes, exact integer sums). CG: the row read past L1 (`common.load_row`)."""
    write_decode_row(x_row, row_scale(x_row, K, BLOCK_K, CG), xq_ptr, xsum_ptr, sx_ptr, m, K, M, G, BLOCK_K, CG)


@triton.jit
def write_decode_row(x_row, s, xq_ptr, xsum_ptr, sx_ptr, m, K, M: tl.constexpr, G: tl.constexpr,
                     BLOCK_K: tl.constexpr, CG: tl.constexpr):
    """Token m's row of K floats at x_row quantized at scale s: s to sx[m], the codes and group sums
    (`store_decode_codes`) BLOCK_K columns a step (CG: the row read past L1, `common.load_row`)."""
    tl.store(sx_ptr + m, s)
    offs = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        store_decode_codes(load_row(x_row + k0 + offs, k0 + offs < K, CG), k0, s, xq_ptr, xsum_ptr, m, K, M, G,
                           BLOCK_K)


TAIL_BLOCK = 2048     # floats a `last_quantizes` step reads: 6 steps for a 7B MLP row (11008), 2 for o_proj's (4096);
#                       at 4096 the gated product's 8B variant took 159 registers on sm_87 (128 at 2048, no spill)


def tail_block(k: int, g: int) -> int:
    """`last_quantizes`' BLOCK_K for rows of k values at group size g."""
    return max(g, min(TAIL_BLOCK, triton.next_power_of_2(k)))


@triton.jit
def last_quantizes(row_ptr, amax, count_ptr, xq_ptr, xsum_ptr, sx_ptr, m, programs, K, M: tl.constexpr,
                   G: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tail of a launch whose `programs` programs each store part of token m's row of K floats at row_ptr (the
    gated product's, attention's reduction's): each, after a barrier, raises token m's running max|x| (amax: the max
    of what it stored, float32 >= 0, as int32 bits: their order is the floats' order) and counts itself in (one
    gpu-scope acq_rel atomic); the last to arrive takes the max (zeroing its slot), so s_x = `common.scale_of` of
    the whole row with no pass over it, and writes the row's decode activations (`store_decode_codes`, the row read
    past L1), as `quantize_decode_row` would, bit for bit; then zeroes the counter for the next launch.
    count_ptr: `gemv.split_counters`, zero between launches: token m's counter at m, its max at MAX_SLOTS + m."""
    tl.debug_barrier()                    # every thread's stores before this program counts itself in
    tl.atomic_max(count_ptr + MAX_SLOTS + m, amax.to(tl.int32, bitcast=True), sem="relaxed", scope="gpu")
    if tl.atomic_add(count_ptr + m, 1, sem="acq_rel", scope="gpu") == programs - 1:
        bits = tl.atomic_xchg(count_ptr + MAX_SLOTS + m, 0, sem="relaxed", scope="gpu")
        s = scale_for_max(bits.to(tl.float32, bitcast=True))
        write_decode_row(row_ptr, s, xq_ptr, xsum_ptr, sx_ptr, m, K, M, G, BLOCK_K, True)
        tl.atomic_xchg(count_ptr + m, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_decode_codes(v, k0, s, xq_ptr, xsum_ptr, m, K, M: tl.constexpr, G: tl.constexpr, BLOCK_K: tl.constexpr):
    """Token m's columns [k0, k0 + BLOCK_K) of a row (v [BLOCK_K] float32, 0 past K; k0 a multiple of G) quantized
    at scale s: x_q = clip(rne(v/s), -127, 127), column k of chunk c = k // 32 to byte c*M*32 + m*32 + 4*(4*(k % 2) +
    (k // 8) % 4) + (k // 2) % 4 (even columns in the chunk's first four words, odd ones in the last four), and each
    group's sum of x_q to xsum[group, m] (int32 [K/G, XSUM_SLOTS], the other slots left as they are)."""
    k = k0 + tl.arange(0, BLOCK_K)
    q = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(v, s)), -127.0), 127.0)
    dst = (k // CHUNK_COLS) * (M * 32) + m * 32 + 4 * (4 * (k % 2) + (k // 8) % 4) + (k // 2) % 4
    tl.store(xq_ptr + dst, q.to(tl.int8), mask=k < K)
    sums = tl.sum(tl.reshape(q.to(tl.int32), [BLOCK_K // G, G]), axis=1)                    # [BLOCK_K / G]
    g = k0 // G + tl.arange(0, BLOCK_K // G)
    tl.store(xsum_ptr + g * XSUM_SLOTS + m, sums, mask=g < K // G)


@triton.jit
def quantize_decode_kernel(x_ptr, xq_ptr, xsum_ptr, sx_ptr, K, stride_x, M: tl.constexpr, G: tl.constexpr,
                           BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """One program per token m of x [M, K]: `quantize_decode_row`. Bytes: the row of x twice, K bytes of codes, 4
    per group and 4 of scale out."""
    dependent_launch(PDL)
    m = tl.program_id(0)
    quantize_decode_row(x_ptr + m * stride_x, xq_ptr, xsum_ptr, sx_ptr, m, K, M, G, BLOCK_K, False)


@triton.jit
def _words(t):
    """The four words of a [..., 4] tensor as a tuple of [...] tensors (in-thread: each thread holds all four)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))     # words (0, 2) and (1, 3)
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def _eight(t):
    """The eight entries of an [8] tensor as a tuple of scalars (in-thread)."""
    e, o = tl.split(tl.reshape(t, [4, 2]))              # t[0::2], t[1::2]
    ee, eo = tl.split(tl.reshape(e, [2, 2]))            # (t0, t4), (t2, t6)
    oe, oo = tl.split(tl.reshape(o, [2, 2]))            # (t1, t5), (t3, t7)
    t0, t4 = tl.split(ee)
    t2, t6 = tl.split(eo)
    t1, t5 = tl.split(oe)
    t3, t7 = tl.split(oo)
    return t0, t1, t2, t3, t4, t5, t6, t7


@triton.jit
def _lanes(t):
    """The four signed int8 lanes of each int32 word of t [R, W] as int32 [R, W, 4]."""
    shift = 24 - 8 * tl.arange(0, 4)
    return (t[:, :, None] << shift[None, None, :]) >> 24


@triton.jit
def _group_sums_interp(isum, x_ptr, base_ptr, refine_ptr, wp, g, M: tl.constexpr, TARGET: tl.constexpr,
                       ROWS: tl.constexpr, CH: tl.constexpr, CHUNK_WORDS: tl.constexpr):
    """The interpreter's form of one group's dp4a chains: the same lanes (16*q4, or 16*q4 + qr + 8) times the same
    activation lanes, summed exactly in int32, as whole-group numpy operations (the chains' thousands of scalar
    steps take the interpreter seconds a launch). Reads the same words at the same addresses as the GPU form."""
    cw = tl.arange(0, CH * 4)
    words = (cw // 4) * CHUNK_WORDS + cw % 4                                         # [W] the group's words of a row
    xw = g * (CH * M * 8) + tl.arange(0, CH)[:, None] * (M * 8) + tl.arange(0, 4)[None, :]   # [CH, 4] token 0, even
    lanes = ()                                         # each row tile's weight lanes, unpacked once for all M
    for r in tl.static_range(ROWS):
        row = tl.max(wp[r] - tl.arange(0, 4)[None, :], axis=1)[:, None] + words[None, :]   # [BS, W]
        b = tl.load(base_ptr + row)
        if TARGET:
            q = tl.load(refine_ptr + row) ^ EIGHTS
            lo, hi = ((b << 4) & HIGH) | (q & LOW), (b & HIGH) | ((q >> 4) & LOW)
        else:
            lo, hi = (b << 4) & HIGH, b & HIGH
        lanes = lanes + ((_lanes(lo), _lanes(hi)),)                                   # [BS, W, 4] each
    MP: tl.constexpr = triton.next_power_of_2(M)
    mi = tl.arange(0, MP)
    xm = tl.reshape(xw, [1, CH * 4]) + tl.minimum(mi, M - 1)[:, None] * 8                 # [MP, W] even words
    xe = _lanes(tl.load(x_ptr + xm))[:, None, :, :]                                    # [MP, 1, W, 4] even columns
    xo = _lanes(tl.load(x_ptr + xm + 4))[:, None, :, :]                                # [MP, 1, W, 4] odd columns
    sums = ()
    for r in tl.static_range(ROWS):                    # every token at once: [MP, BS] exact int32 sums
        dot = lanes[r][0][None, :, :, :] * xe + lanes[r][1][None, :, :, :] * xo         # [MP, BS, W, 4]
        sums = sums + (tl.sum(tl.sum(dot, axis=3), axis=2),)
    out = ()
    for m in tl.static_range(M):
        for r in tl.static_range(ROWS):
            own = tl.sum(tl.where(mi[:, None] == m, sums[r], 0), axis=0)                  # [BS] token m's row
            out = out + (isum[m * ROWS + r] + own,)
    return out


@triton.jit
def _zeros(n: tl.constexpr, shape: tl.constexpr, dtype: tl.constexpr):
    """A tuple of n zero tensors (one accumulator per (row tile, token))."""
    out = ()
    for _ in tl.static_range(n):
        out = out + (tl.zeros(shape, dtype),)
    return out


@triton.jit
def _offsets(N, K, GROUPS_PER_SPLIT, G: tl.constexpr, ROWS: tl.constexpr, BLOCK_S: tl.constexpr,
             TILED: tl.constexpr):
    """The program's rows and where its weights start: (rows, wp, sp), ROWS-tuples of its row tiles' rows [BS], plane
    word offsets [BS, 4] of their first chunk at the split's first group g0, and scale offsets [BS] there. Rows past
    N address row N-1 (no masked load)."""
    CH: tl.constexpr = G // CHUNK_COLS
    CHUNK_WORDS: tl.constexpr = 4 * TILE_ROWS if TILED else 4
    n_groups = K // G
    g0 = tl.program_id(1) * GROUPS_PER_SPLIT
    w = tl.arange(0, 4)                                  # [4] words of a 16-byte chunk
    # TILED: word (((n // 32) * K/G + g) * CH + c) * 128 + (n % 32) * 4 + w, scale ((n // 32) * K/G + g) * 32 + n % 32
    # (a warp's 32 chunks side by side: 512 contiguous bytes); canonical: word n * K/8 + (g * CH + c) * 4 + w, scale
    # n * K/G + g
    rows = ()
    wp = ()
    sp = ()
    for r in tl.static_range(ROWS):
        n = tl.program_id(0) * (ROWS * BLOCK_S) + r * BLOCK_S + tl.arange(0, BLOCK_S)
        rows = rows + (n,)
        n = tl.minimum(n, N - 1)
        if TILED:
            blk = ((n // TILE_ROWS) * n_groups + g0)
            wp = wp + ((blk * (CH * CHUNK_WORDS) + (n % TILE_ROWS) * 4)[:, None] + w[None, :],)
            sp = sp + (blk * TILE_ROWS + n % TILE_ROWS,)
        else:
            row_words = tl.multiple_of(K // 8, 4)       # K is a multiple of G >= 32: rows start 16-byte aligned
            wp = wp + ((n * row_words)[:, None] + g0 * (CH * 4) + w[None, :],)
            sp = sp + (n * n_groups + g0,)
    return rows, wp, sp


PREFETCH_CHUNKS = tl.constexpr(8)     # 16-byte chunks of each row and plane `_prefetch` asks L2 for: the first two
#                                       groups at G = 128 (all a program of a 4096-row matrix reads on a 132-SM GPU)


@triton.jit
def _prefetch(base_ptr, refine_ptr, scale_ptr, wp, sp, groups, G: tl.constexpr, ROWS: tl.constexpr,
              REFINE: tl.constexpr, TILED: tl.constexpr):
    """Before the program's PDL wait: ask L2 for the first PREFETCH_CHUNKS chunks of each of its rows' base plane (and
    refinement plane where REFINE) and their scales, from the split's first group on, within its `groups` (>= 1)
    groups (later chunks clamped to its last group: a repeated prefetch costs an instruction, nothing else). Each
    thread prefetches the chunks it will load; no value is loaded, so nothing the launch before this one writes is
    read before the wait (the planes and scales are written by no launch)."""
    CH: tl.constexpr = G // CHUNK_COLS
    CHUNK_WORDS: tl.constexpr = 4 * TILE_ROWS if TILED else 4
    SCALE_STEP: tl.constexpr = TILE_ROWS if TILED else 1
    firsts = ()
    for r in tl.static_range(ROWS):
        firsts = firsts + (tl.min(wp[r], axis=1),)              # [BS] each row's first chunk word: one a thread
    for j in tl.static_range(PREFETCH_CHUNKS):
        gi = tl.minimum(j // CH, groups - 1)
        at = gi * (CH * CHUNK_WORDS) + (j % CH) * CHUNK_WORDS
        for r in tl.static_range(ROWS):
            prefetch_l2(base_ptr + firsts[r] + at)
            if REFINE:
                prefetch_l2(refine_ptr + firsts[r] + at)
            if j % CH == 0:
                prefetch_l2(scale_ptr + sp[r] + gi * SCALE_STEP)


@triton.jit
def _tile(x_ptr, xsum_ptr, sx_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, res_ptr, N, K,
          GROUPS_PER_SPLIT, rows, wp, sp, M: tl.constexpr, TARGET: tl.constexpr, HAS_OFFSET: tl.constexpr,
          PARTIAL: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, BLOCK_S: tl.constexpr, INTERP: tl.constexpr,
          TILED: tl.constexpr, HAS_RES: tl.constexpr):
    """The program of `decode_gemv_kernel` for one view, from its rows and weight offsets (`_offsets`). No load is
    masked (a masked load costs a move per register for its `other`): rows past N read row N-1 and are not stored,
    and the last split runs only its own groups. TILED: the planes and scales in the warp-tiled layout
    (plugins.kernels.tiling), else canonical; the two differ in their addresses only."""
    CH: tl.constexpr = G // CHUNK_COLS
    n_groups = K // G
    g0 = tl.program_id(1) * GROUPS_PER_SPLIT
    w = tl.arange(0, 4)                                  # [4] words of a 16-byte chunk
    CHUNK_WORDS: tl.constexpr = 4 * TILE_ROWS if TILED else 4
    SCALE_STEP: tl.constexpr = TILE_ROWS if TILED else 1
    xp = x_ptr + g0 * (CH * M * 8) + w                   # [4] the group's first activation words
    acc = _zeros(ROWS * M, [BLOCK_S], tl.float32)
    for gi in range(0, tl.minimum(GROUPS_PER_SPLIT, n_groups - g0)):
        xs = _eight(tl.load(xsum_ptr + (g0 + gi) * XSUM_SLOTS + tl.arange(0, XSUM_SLOTS)))   # sums of x_q
        isum = ()
        for m in tl.static_range(M):       # the target's dp4a sums carry 8*sum(x): they start from -8*sum(x)
            for r in tl.static_range(ROWS):
                isum = isum + (tl.full([BLOCK_S], -8 * xs[m] if TARGET else 0, tl.int32),)
        if INTERP == INTERP_GROUPS:
            isum = _group_sums_interp(isum, x_ptr, base_ptr, refine_ptr, wp, g0 + gi, M, TARGET, ROWS, CH,
                                      CHUNK_WORDS)
        else:
            for c in tl.static_range(CH):
                lo = ()
                hi = ()
                for r in tl.static_range(ROWS):
                    b = tl.load(base_ptr + wp[r] + c * CHUNK_WORDS)                            # [BS, 4] int32
                    if TARGET:
                        q = tl.load(refine_ptr + wp[r] + c * CHUNK_WORDS) ^ EIGHTS             # qr + 8 per nibble
                        lo = lo + (_words(((b << 4) & HIGH) | (q & LOW)),)                     # 16*q4 + qr + 8
                        hi = hi + (_words((b & HIGH) | ((q >> 4) & LOW)),)
                    else:
                        lo = lo + (_words((b << 4) & HIGH),)                                   # 16*q4
                        hi = hi + (_words(b & HIGH),)
                new = ()
                for m in tl.static_range(M):
                    xe = _words(tl.load(xp + (c * M + m) * 8))                                 # 4 x [] even columns
                    xo = _words(tl.load(xp + (c * M + m) * 8 + 4))                             # 4 x [] odd columns
                    for r in tl.static_range(ROWS):
                        a = isum[m * ROWS + r]
                        for i in tl.static_range(4):
                            a = _dp4a(hi[r][i], xo[i], _dp4a(lo[r][i], xe[i], a, INTERP), INTERP)
                        new = new + (a,)
                isum = new
        out = ()
        for r in tl.static_range(ROWS):
            step = tl.load(scale_ptr + sp[r] + gi * SCALE_STEP).to(tl.float32)             # [BS]
            if TARGET:
                step = step * 0.0625                                                        # s/16, exactly
            if HAS_OFFSET:
                off = tl.load(offset_ptr + sp[r] + gi * SCALE_STEP).to(tl.float32)
            for m in tl.static_range(M):
                total = isum[m * ROWS + r]                                                  # [BS] exact int32
                if not TARGET:
                    total = total >> 4                                                      # 16*dot(x, q4) / 16
                a = acc[r * M + m] + total.to(tl.float32) * step
                if HAS_OFFSET:
                    a = a + xs[m].to(tl.float32) * off
                out = out + (a,)
        acc = out
        adv = ()
        for r in tl.static_range(ROWS):
            adv = adv + (wp[r] + CH * CHUNK_WORDS,)
        wp = adv
        xp += CH * M * 8
    for r in tl.static_range(ROWS):
        live = rows[r] < N
        for m in tl.static_range(M):
            if not PARTIAL:
                y = acc[r * M + m] * tl.load(sx_ptr + m)
                if HAS_RES:                                  # the residual stream's row: one float32 add, as torch's
                    y = y + tl.load(res_ptr + m * N + rows[r], mask=live, other=0.0)
                tl.store(out_ptr + m * N + rows[r], y, mask=live)
            else:
                tl.store(out_ptr + (tl.program_id(1) * M + m) * N + rows[r], acc[r * M + m], mask=live)


@triton.jit
def _last_split_reduces(sx_ptr, part_ptr, y_ptr, count_ptr, res_ptr, N, M: tl.constexpr, ROWS: tl.constexpr,
                        BLOCK_S: tl.constexpr, HAS_RES: tl.constexpr):
    """The split-K reduction inside the GEMV launch: each program of a row tile counts itself in (one gpu-scope
    acq_rel atomic, after a barrier so every thread's partial store precedes it); the last to arrive sums the tile's
    partials over the splits in index order, scales by s_x and stores y, as `gemv.split_reduce_kernel` did in a
    launch of its own (the same float32 additions in the same order: the same bits), then zeroes its counter for
    the next launch. Partials are read past L1 (.cg): a replayed graph's SM may hold the last replay's lines. The
    loads of SB splits are issued together before their adds (one memory round trip for SB splits, where a split a
    step waited on each load: at M = 1, 16 splits in one, 64 partials a thread at most)."""
    tl.debug_barrier()
    tile = tl.program_id(0)
    splits = tl.num_programs(1)
    if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
        MP: tl.constexpr = triton.next_power_of_2(M)
        SB: tl.constexpr = max(1, min(16, 32 // (MP * ROWS)))
        m = tl.arange(0, MP)
        n = tile * (ROWS * BLOCK_S) + tl.arange(0, ROWS * BLOCK_S)                       # the tile's rows
        at = m[:, None] * N + n[None, :]                                                 # [MP, ROWS * BS]
        live = (m[:, None] < M) & (n[None, :] < N)
        total = tl.zeros([MP, ROWS * BLOCK_S], tl.float32)
        for s0 in range(0, splits, SB):
            parts = ()
            for j in tl.static_range(SB):
                ok = at * 0 + s0 + j < splits          # [MP, ROWS * BS] (a tensor: the interpreter's masks)
                parts = parts + ((tl.load(part_ptr + (s0 + j) * M * N + at, mask=live & ok, other=0.0,
                                          cache_modifier=".cg"), ok),)
            for j in tl.static_range(SB):
                total = tl.where(parts[j][1], total + parts[j][0], total)               # in split order, exactly
        sx = tl.load(sx_ptr + m, mask=m < M, other=0.0)
        total = total * sx[:, None]
        if HAS_RES:
            total = total + tl.load(res_ptr + at, mask=live, other=0.0)
        tl.store(y_ptr + at, total, mask=live)
        tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["GROUPS_PER_SPLIT"])
def decode_gemv_kernel(
    x_ptr, xsum_ptr, sx_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, view_ptr, y_ptr, count_ptr,
    res_ptr, N, K, GROUPS_PER_SPLIT,
    M: tl.constexpr, TARGET: tl.constexpr, HAS_OFFSET: tl.constexpr, PARTIAL: tl.constexpr, G: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_S: tl.constexpr, INTERP: tl.constexpr, RUNTIME_VIEW: tl.constexpr = False,
    TILED: tl.constexpr = False, FUSED_REDUCE: tl.constexpr = False, HAS_RES: tl.constexpr = False,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):
    """Program (n-tile, split): rows [n0, n0 + ROWS*BLOCK_S) as ROWS sub-tiles of BLOCK_S (one row per thread),
    groups [split*GPS, min((split+1)*GPS, K/G)) of K, all M tokens.
    x: int32 words of the decode layout [K/32, M, 8]; xsum int32 [K/G, XSUM_SLOTS]; sx float32 [M]; base/refine:
    int32 words [N, K/8] (the canonical uint8 [N, K/2] planes viewed as words); scale/offset float16 [N, K/G].
    out: float32 [M, N], or with PARTIAL (K split over the grid's second axis) partials [splits, M, N] unscaled
    by s_x (a flag, not the split count: one compiled program serves every split of a shape family).
    Bytes: each plane byte of the tile once in 128-bit loads, the refinement plane only for the target (the draft's
    program holds no load of it), one scale per row and group; x and xsum are L1/L2-resident.
    RUNTIME_VIEW: the view is read from the device scalar view_ptr (1 = target, else the draft) and the program of
    that view runs (a uniform branch: the TensorRT plugin's form, one kernel for both views of an engine).
    FUSED_REDUCE (with PARTIAL): the last program of each row tile reduces the partials into y [M, N]
    (`_last_split_reduces`; count_ptr: int32 counters, one per row tile, zero before and after the launch).
    HAS_RES (not with a PARTIAL launch reduced elsewhere): y = res + x @ W^T, res float32 [M, N] (the residual stream a
    block's o_proj and down_proj add to), added to each finished row in one float32 add: torch's `res + y` bits.
    PDL: programmatic dependent launch (`common.dependent_launch`); with it PREFETCH asks L2 for the program's first
    weight bytes before the wait (`_prefetch`): the planes stream from DRAM while the launch before this one drains."""
    rows, wp, sp = _offsets(N, K, GROUPS_PER_SPLIT, G, ROWS, BLOCK_S, TILED)
    if PDL and PREFETCH:           # the refinement plane only where the view is known here (a runtime view reads
        _prefetch(base_ptr, refine_ptr, scale_ptr, wp, sp,     # its device scalar after the wait)
                  tl.minimum(GROUPS_PER_SPLIT, K // G - tl.program_id(1) * GROUPS_PER_SPLIT), G, ROWS,
                  TARGET and not RUNTIME_VIEW, TILED)
    dependent_launch(PDL)
    if RUNTIME_VIEW:
        if tl.load(view_ptr) == 1:
            _tile(x_ptr, xsum_ptr, sx_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, res_ptr, N, K,
                  GROUPS_PER_SPLIT, rows, wp, sp, M, True, HAS_OFFSET, PARTIAL, G, ROWS, BLOCK_S, INTERP, TILED,
                  HAS_RES)
        else:
            _tile(x_ptr, xsum_ptr, sx_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, res_ptr, N, K,
                  GROUPS_PER_SPLIT, rows, wp, sp, M, False, HAS_OFFSET, PARTIAL, G, ROWS, BLOCK_S, INTERP, TILED,
                  HAS_RES)
    else:
        _tile(x_ptr, xsum_ptr, sx_ptr, base_ptr, refine_ptr, scale_ptr, offset_ptr, out_ptr, res_ptr, N, K,
              GROUPS_PER_SPLIT, rows, wp, sp, M, TARGET, HAS_OFFSET, PARTIAL, G, ROWS, BLOCK_S, INTERP, TILED, HAS_RES)
    if PARTIAL and FUSED_REDUCE:
        _last_split_reduces(sx_ptr, out_ptr, y_ptr, count_ptr, res_ptr, N, M, ROWS, BLOCK_S, HAS_RES)
