"""The device functions both nested-KV attention kernels are built from (`attention`: decode passes split over the
context; `attention_prefill`: a prefill chunk's query tiles over its whole causal range): the lengths read from
device scalars, the nested codes of a step's positions unpacked in registers, and one online-softmax step over them
on float16 MMAs with float32 accumulation (docs/contracts.md, KV cache and ops).

Layout: base / refine uint8 [2, Hkv, C, D/2] (K then V; byte j holds dims 2j, 2j+1), scale float16 [2, Hkv, C];
the kernel reads the planes as int32 words [2, Hkv, C, D/8] (eight nibbles a word, 128-bit loads of a position's
row at d128). The sequence is main positions [0, main_len) then `scratch_len` draft-time slots of the scratch
planes: one pointer per position, chosen between them, so each word is loaded once. Unpacking, per pair of base and
refinement words (eight dims): a few 32-bit bit operations give the bytes 16*q4 + qr + 136 (KV8; 16*q4 + 128 for
KV4), and inline PTX (`halves`: `prmt` under the float16 exponent of 1024, `sub.f16x2`) turns them into exact
float16 codes, two dims a register, in dim order. Codes are exact in float16 (|16*q4 + qr| <= 136); the float32
queries and probabilities are split into float16 high and low halves, so two float16 MMAs with float32
accumulation give ~float32 accuracy (one half alone costs ~3e-4 relative, which INT8 activation rounding
downstream amplifies); the KV scale (s/16) is applied to the scores (K) and to the probabilities (V) in float32.
"""

import triton
import triton.language as tl

from plugins.kernels.common import interp_dot

# Bit patterns of the code unpacking (`codes`): per byte lane of an int32 word of 8 nibbles.
LOW = tl.constexpr(0x0F0F0F0F)        # the low nibble of each byte
HIGH = tl.constexpr(-0x0F0F0F10)      # 0xF0F0F0F0 as int32: the high nibble of each byte
EIGHTS = tl.constexpr(-0x77777778)    # 0x88888888: XOR turns a two's-complement nibble n into n + 8 in [0, 15]
# Byte lanes to float16 codes, eight at a time (`halves`): `lo` holds the even dims' bytes u of 4 dims, `hi` the
# odd dims'. Two `prmt` interleave them into dim order ([lo.b0, hi.b0, lo.b1, hi.b1] and the same of bytes 2, 3);
# four more put each byte under the exponent byte 0x64 (the float16 1024 + u, exact), two dims a register; four
# `sub.f16x2` take 1024 + bias off (exact: integers below 2048). KV8 bytes are u = 16*q4 + qr + 136 (bias 136:
# half 0x6488), KV4 bytes u = 16*q4 + 128 (bias 128: half 0x6480).
_F16_LANES = ("{ .reg .b32 c, k, a, b, p, q, r, s; mov.b32 c, 0x64646464; mov.b32 k, 0x%s; "
              "prmt.b32 a, $8, $9, 0x5140; prmt.b32 b, $8, $9, 0x7362; "
              "prmt.b32 p, a, c, 0x4140; prmt.b32 q, a, c, 0x4342; prmt.b32 r, b, c, 0x4140; prmt.b32 s, b, c, 0x4342; "
              "sub.f16x2 p, p, k; sub.f16x2 q, q, k; sub.f16x2 r, r, k; sub.f16x2 s, s, k; "
              "mov.b32 {$0, $1}, p; mov.b32 {$2, $3}, q; mov.b32 {$4, $5}, r; mov.b32 {$6, $7}, s; }")
F16_LANES_KV8 = tl.constexpr(_F16_LANES % "64886488")
F16_LANES_KV4 = tl.constexpr(_F16_LANES % "64806480")
F16_CONSTRAINTS = tl.constexpr("=h," * 8 + "r,r")


@triton.jit
def halves(lo, hi, KV8: tl.constexpr, INTERP: tl.constexpr):
    """The byte lanes of lo, hi (int32 [BS, W]: dims 8w + 2i and 8w + 2i + 1 in byte i) as float16 codes (u - 136
    for KV8, u - 128 for KV4): a tuple of eight [BS, W] tensors, dims 8w .. 8w + 7 in order."""
    if INTERP:                      # the interpreter has no inline PTX: the same values, lane by lane
        out = ()
        for i in tl.static_range(4):
            for word in tl.static_range(2):
                u = (((hi if word else lo) >> (8 * i)) & 0xFF)
                out = out + ((u - (136 if KV8 else 128)).to(tl.float16),)
        return out
    if KV8:
        return tl.inline_asm_elementwise(F16_LANES_KV8, F16_CONSTRAINTS, [lo, hi], dtype=(tl.float16,) * 8,
                                         is_pure=True, pack=1)
    return tl.inline_asm_elementwise(F16_LANES_KV4, F16_CONSTRAINTS, [lo, hi], dtype=(tl.float16,) * 8,
                                     is_pure=True, pack=1)


@triton.jit
def codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, plane, at, main_len, cap, scap, W: tl.constexpr,
          KV8: tl.constexpr, INTERP: tl.constexpr, MAIN: tl.constexpr = False):
    """Nested codes of positions `at` [BS] (each inside the sequence): float16 [BS, D], dims in order, 16*q4 + qr
    (KV8) or 16*q4 (KV4, the refinement plane never loaded). plane = kv * Hkv + head; main positions read the main
    planes, later ones the scratch planes: one pointer per position, so one 128-bit load per 16 bytes whatever
    the position's plane (MAIN: every position is a main one, no choice made). base/refine are int32 words [.., W]
    of the uint8 [.., D/2] rows (8 nibbles a word)."""
    w = tl.arange(0, W)
    moff = (plane * cap + at)[:, None] * W + w[None, :]                                    # [BS, W]
    if MAIN:
        bptr = base_ptr + moff
        rptr = refine_ptr + moff
    else:
        in_main = (at < main_len)[:, None]                                                 # [BS, 1]
        soff = (plane * scap + (at - main_len))[:, None] * W + w[None, :]
        bptr = tl.where(in_main, base_ptr + moff, sbase_ptr + soff)
        rptr = tl.where(in_main, refine_ptr + moff, srefine_ptr + soff)
    bx = tl.load(bptr) ^ EIGHTS                                                            # nibbles q4 + 8
    if KV8:
        qx = tl.load(rptr) ^ EIGHTS                                                        # nibbles qr + 8
        lo = ((bx << 4) & HIGH) | (qx & LOW)         # even dims: bytes 16*(q4 + 8) + qr + 8 = code + 136
        hi = (bx & HIGH) | ((qx >> 4) & LOW)         # odd dims
    else:
        lo = (bx << 4) & HIGH                        # bytes 16*(q4 + 8) = code + 128
        hi = bx & HIGH
    t0, t1, t2, t3, t4, t5, t6, t7 = halves(lo, hi, KV8, INTERP)                     # [BS, W] dims 8w + j
    # [BS, W, 8] -> [BS, D]: the outermost join pairs neighbours (dim 8w + j: j = 4a + 2b + c, c outermost)
    x = tl.join(tl.join(tl.join(t0, t4), tl.join(t2, t6)), tl.join(tl.join(t1, t5), tl.join(t3, t7)))
    return tl.reshape(x, [at.shape[0], W * 8])


@triton.jit
def scales(scale_ptr, sscale_ptr, plane, at, main_len, cap, scap, MAIN: tl.constexpr = False):
    """KV scales / 16 of positions `at` [BS] (each inside the sequence; MAIN: each a main one) as float32."""
    if MAIN:
        s = tl.load(scale_ptr + plane * cap + at)
    else:
        in_main = at < main_len
        s = tl.load(tl.where(in_main, scale_ptr + plane * cap + at, sscale_ptr + plane * scap + (at - main_len)))
    return s.to(tl.float32) * 0.0625                 # s/16, exactly (a division would call a slow path)


@triton.jit
def split16(a):
    """float32 a = hi + lo with both halves float16: two float16 MMAs then carry ~22 bits of a."""
    hi = a.to(tl.float16)
    return hi, (a - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def split_dot(a_hi, a_lo, b, acc, INTERP: tl.constexpr):
    """acc + (a_hi + a_lo) @ b for float16 codes b (exact), accumulated in float32 by the MMAs themselves (the high
    half's products into acc, then the low half's: no float add of a result tile a step)."""
    if INTERP:   # numpy's matmul is neither IEEE for float16 nor row-invariant on every CPU: a fixed-order sum
        return (acc + interp_dot(a_hi, b)) + interp_dot(a_lo, b)
    return tl.dot(a_lo, b, acc=tl.dot(a_hi, b, acc=acc, out_dtype=tl.float32), out_dtype=tl.float32)


@triton.jit
def lengths(main_ptr, seq_ptr, kv8_ptr, cap, scap):
    """(main_len, seq_len, kv8_from) read from device scalars (int32 or int64) and clamped into the planes."""
    main_len = tl.minimum(tl.maximum(tl.load(main_ptr).to(tl.int64), 0), cap)
    seq_len = tl.minimum(tl.maximum(tl.load(seq_ptr).to(tl.int64), main_len), main_len + scap)
    kv8_from = tl.minimum(tl.maximum(tl.load(kv8_ptr).to(tl.int64), 0), seq_len)
    return main_len.to(tl.int32), seq_len.to(tl.int32), kv8_from.to(tl.int32)


@triton.jit
def softmax_step(m_i, l_i, acc, q_hi, q_lo, qpos, live, s0, end, h, base_ptr, refine_ptr, scale_ptr, sbase_ptr,
                 srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV: tl.constexpr, W: tl.constexpr,
                 BLOCK_S: tl.constexpr, KV8: tl.constexpr, INTERP: tl.constexpr, WHOLE: tl.constexpr = False):
    """One online-softmax step over positions [s0, s0 + BLOCK_S) of a range ending at `end` (one view: KV8 or
    KV4): returns the new (m, l, acc). Positions at or past `end` load position end - 1 (no masked load) and
    score -inf, so they add exact zeros. WHOLE: the caller knows every position of the step is a main one, before
    `end` and visible to every query of the pass: no clamp, no choice of planes, no mask (the same codes, scores and
    sums as the general step's; the rows of no query, never stored, then score their zero q)."""
    pos = s0 + tl.arange(0, BLOCK_S)                                    # [BS]
    at = pos if WHOLE else tl.minimum(pos, end - 1)
    k = codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, h, at, main_len, cap, scap, W, KV8, INTERP,
              WHOLE)                                                                                 # [BS, D]
    sk = scales(scale_ptr, sscale_ptr, h, at, main_len, cap, scap, WHOLE)
    scores = split_dot(q_hi, q_lo, tl.trans(k), tl.zeros([q_hi.shape[0], BLOCK_S], tl.float32), INTERP) * \
        (sk * sm_scale)[None, :]                                                                   # [BM, BS]
    if not WHOLE:
        visible = (pos[None, :] <= qpos[:, None]) & (pos < end)[None, :] & live[:, None]
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = m_new if WHOLE else tl.where(m_new == float("-inf"), 0.0, m_new)      # (every row scored: finite)
    p = tl.exp(scores - m_safe[:, None])                                # [BM, BS], 0 where masked
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = codes(base_ptr, refine_ptr, sbase_ptr, srefine_ptr, HKV + h, at, main_len, cap, scap, W, KV8, INTERP,
              WHOLE)
    sv = scales(scale_ptr, sscale_ptr, HKV + h, at, main_len, cap, scap, WHOLE)
    pv_hi, pv_lo = split16(p * sv[None, :])
    acc = split_dot(pv_hi, pv_lo, v, acc * alpha[:, None], INTERP)          # [BM, D]
    return m_new, l_i, acc


@triton.jit
def whole_end(start, end, seen, BLOCK_S: tl.constexpr):
    """Where a view's steps from `start` (a step a BLOCK_S positions, the last ending at `end`) stop being whole
    (`softmax_step`'s WHOLE: every position before `end` and before `seen`): start plus the whole steps' positions. The
    steps themselves start where they would anyway: the whole ones are a prefix of the same sequence."""
    return start + tl.maximum(tl.minimum(end, seen) - start, 0) // BLOCK_S * BLOCK_S


@triton.jit
def _steps(m_i, l_i, acc, q_hi, q_lo, qpos, live, lo, hi, end, h, base_ptr, refine_ptr, scale_ptr, sbase_ptr,
           srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV: tl.constexpr, W: tl.constexpr,
           BLOCK_S: tl.constexpr, KV8: tl.constexpr, INTERP: tl.constexpr, WHOLE: tl.constexpr):
    """One loop of `softmax_step`s, a step at each of lo, lo + BLOCK_S, .. below hi, of a view's range ending at
    `end`."""
    for s0 in range(lo, hi, BLOCK_S):
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, q_hi, q_lo, qpos, live, s0, end, h, base_ptr, refine_ptr,
                                     scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale,
                                     HKV, W, BLOCK_S, KV8, INTERP, WHOLE)
    return m_i, l_i, acc


@triton.jit
def attend_range(m_i, l_i, acc, q_hi, q_lo, qpos, live, start, end, kv8_from, seen, h, base_ptr, refine_ptr,
                 scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV: tl.constexpr,
                 W: tl.constexpr, BLOCK_S: tl.constexpr, INTERP: tl.constexpr):
    """The online softmax over positions [start, end) in four loops (what both kernels run, one range each): the
    positions before kv8_from in KV4 steps that never load the refinement plane, then those from it in KV8 steps;
    each view's whole steps (main positions before `seen`, which every query sees: `whole_end`) then its edge steps.
    Steps start at `start` and at kv8_from. Returns the new (m, l, acc)."""
    kv4_end = tl.minimum(end, kv8_from)
    k0 = tl.maximum(start, kv8_from)
    whole4 = whole_end(start, kv4_end, seen, BLOCK_S)
    whole8 = whole_end(k0, end, seen, BLOCK_S)
    # KV4 positions (base plane only): whole steps, then edge steps; KV8 positions (both planes) likewise
    m_i, l_i, acc = _steps(m_i, l_i, acc, q_hi, q_lo, qpos, live, start, whole4, kv4_end, h, base_ptr, refine_ptr,
                           scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV, W,
                           BLOCK_S, INTERP=INTERP, KV8=False, WHOLE=True)
    m_i, l_i, acc = _steps(m_i, l_i, acc, q_hi, q_lo, qpos, live, whole4, kv4_end, kv4_end, h, base_ptr, refine_ptr,
                           scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV, W,
                           BLOCK_S, INTERP=INTERP, KV8=False, WHOLE=False)
    m_i, l_i, acc = _steps(m_i, l_i, acc, q_hi, q_lo, qpos, live, k0, whole8, end, h, base_ptr, refine_ptr,
                           scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV, W,
                           BLOCK_S, INTERP=INTERP, KV8=True, WHOLE=True)
    m_i, l_i, acc = _steps(m_i, l_i, acc, q_hi, q_lo, qpos, live, whole8, end, end, h, base_ptr, refine_ptr,
                           scale_ptr, sbase_ptr, srefine_ptr, sscale_ptr, main_len, cap, scap, sm_scale, HKV, W,
                           BLOCK_S, INTERP=INTERP, KV8=True, WHOLE=False)
    return m_i, l_i, acc
