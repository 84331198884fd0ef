"""The decoder's elementwise steps in one Triton launch each, for the `triton` backend (docs/kernels.md, the whole
step: a decode pass is bound by its launches on a large GPU once the GEMV streams):
- `rms_norm` (and `rms_norm_decode`, which also writes the normed rows' decode-layout INT8 activations: one launch
  where the norm and the quantization for the linears after it took two): `plugins.decoder_math.rms_norm`'s
  semantics in float32, y = x * rsqrt(mean(x^2) + eps) * w, where torch's form takes six launches (pow, mean, add,
  rsqrt, mul, mul) and the float16 weight's cast a seventh. Each row is its own program, reduced in a fixed order
  that depends on H alone (`norm_plan`): a row's result does not depend on the other rows.
- `rotate_decode`: an online rotation (R1) of a decode pass's rows, x [M <= 8, H] @ r or @ r^T, r read once for
  all M tokens where torch's batch-invariant form (`plugins.decoder_math.rotate_rows`, a matmul a token) reads the
  [H, H] float32 matrix once per token (64 MB at 7B: 5 reads at a 5-token verification pass, twice a pass). The
  kernel's shapes do not depend on M (the token tile is always DECODE_MAX_M rows, masked), so a row's sums run in one
  order at any M: a verification pass rotates each token as a single-token step does, bit for bit.
- `rope`: `edge.model.decoder.apply_rope` of q and k together (rotate-half, HF Llama's convention), where torch's
  form takes ten (neg, cat, mul, mul, add, for each); the same float32 operations in the same order, unfused, so
  the same bits.
"""

import torch
import triton
import triton.language as tl

from plugins.kernels.gemv import quantize_decode_buffers
from plugins.kernels.common import dependent_launch, pdl, scale_of
from plugins.kernels.gemv_decode import DECODE_MAX_M, quantize_decode_row, store_decode_codes


NORM_BLOCK_MAX = 8192     # a row up to this long is normed (and quantized) from registers, each byte read once


def norm_plan(h: int) -> dict:
    """The norm kernels' launch for rows of h: the whole row in one block where h <= NORM_BLOCK_MAX (ONE: x and the
    weight loaded once, side by side, the quantization made from the registers: a couple of memory round trips a
    launch, where a 1024-wide loop took four per pass over the row and four passes; one program per row is a single
    CTA, so its round trips are the kernel's time), else 8192-wide loops; 16 values a thread at most."""
    block = min(NORM_BLOCK_MAX, triton.next_power_of_2(h))
    return {"BLOCK": block, "ONE": block >= h, "num_warps": max(4, min(16, block // 512))}


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK: tl.constexpr, ONE: tl.constexpr,
                    PDL: tl.constexpr = False):
    """One program per row of x [M, H] (float32): out[m] = x[m] / sqrt(mean(x[m]^2) + eps) * w (w float16 [H]).
    Bytes: the row (twice where it is longer than a block, the second read from L1/L2), the weight once, the row out."""
    dependent_launch(PDL)
    if ONE:
        _rms_norm_block(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK)
    else:
        _rms_norm_loop(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK)


@triton.jit
def rms_norm_decode_kernel(x_ptr, w_ptr, out_ptr, xq_ptr, xsum_ptr, sx_ptr, H, stride_x, eps, BLOCK: tl.constexpr,
                           ONE: tl.constexpr, M: tl.constexpr, G: tl.constexpr, BLOCK_K: tl.constexpr,
                           PDL: tl.constexpr = False):
    """`rms_norm_kernel`, then the normed row's decode-layout INT8 activations at group size G: from the registers
    where the row is one block (ONE; `gemv_decode.store_decode_codes` at `common.scale_of`), else read back from
    what this program stored, after a barrier (`gemv_decode.quantize_decode_row`): the launch the linears that read
    the normed row would otherwise make, the same bits."""
    dependent_launch(PDL)
    m = tl.program_id(0)
    if ONE:
        y = _rms_norm_block(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK)
        s = scale_of(y)
        tl.store(sx_ptr + m, s)
        store_decode_codes(y, 0, s, xq_ptr, xsum_ptr, m, H, M, G, BLOCK)
    else:
        _rms_norm_loop(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK)
        tl.debug_barrier()                   # every thread's stores of the row before any thread reads it back
        quantize_decode_row(out_ptr + m * H, xq_ptr, xsum_ptr, sx_ptr, m, H, M, G, BLOCK_K, False)


@triton.jit
def _rms_norm_block(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK: tl.constexpr):
    """A row no longer than BLOCK: loaded once with its weight, normed, stored; returns the normed row [BLOCK] (0
    past H). The sum of squares is one tree over the block."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < H
    v = tl.load(x_ptr + row * stride_x + offs, mask=live, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=live, other=0.0).to(tl.float32)
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(v * v, axis=0), H.to(tl.float32)) + eps))
    y = v * inv * w
    tl.store(out_ptr + row * H + offs, y, mask=live)
    return y


@triton.jit
def _rms_norm_loop(x_ptr, w_ptr, out_ptr, H, stride_x, eps, BLOCK: tl.constexpr):
    """A row longer than BLOCK: squares summed lane-wise over BLOCK-wide steps, then one tree; a second pass norms."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for h0 in range(0, H, BLOCK):
        v = tl.load(x_ptr + row * stride_x + h0 + offs, mask=h0 + offs < H, other=0.0).to(tl.float32)
        acc += v * v
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(acc, axis=0), H.to(tl.float32)) + eps))
    for h0 in range(0, H, BLOCK):
        live = h0 + offs < H
        v = tl.load(x_ptr + row * stride_x + h0 + offs, mask=live, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + h0 + offs, mask=live, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + h0 + offs, v * inv * w, mask=live)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x float32 [M, H], weight [H] (float16 or float32) -> float32 [M, H] on the device of x."""
    m, h = x.shape
    if weight.shape != (h,) or x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"rms_norm: x {tuple(x.shape)} {x.dtype} and weight {tuple(weight.shape)} do not fit "
                         "(x float32 [M, H] with unit column stride, weight [H])")
    out = torch.empty(m, h, dtype=torch.float32, device=x.device)
    rms_norm_kernel[(m,)](x, weight, out, h, x.stride(0), float(eps), **norm_plan(h), enable_fp_fusion=False,
                          **pdl(x.device))
    return out


def rms_norm_decode(x: torch.Tensor, weight: torch.Tensor, eps: float, g: int) -> tuple:
    """`rms_norm` of x [M <= DECODE_MAX_M, H] and the normed rows' decode-layout activations at group size g (what
    `gemv.quantize_decode` of the result gives, bit for bit) in one launch: (out, (x_q words, group sums, s_x))."""
    m, h = x.shape
    if weight.shape != (h,) or x.dtype != torch.float32 or x.stride(1) != 1 or m > DECODE_MAX_M or h % g:
        raise ValueError(f"rms_norm_decode: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)}, group {g} "
                         f"do not fit (x float32 [M <= {DECODE_MAX_M}, H], H a multiple of the group size)")
    out = torch.empty(m, h, dtype=torch.float32, device=x.device)
    xq, xsum, sx = quantize_decode_buffers(m, h, g, x.device)
    plan = norm_plan(h)
    rms_norm_decode_kernel[(m,)](x, weight, out, xq.view(torch.int8), xsum, sx, h, x.stride(0), float(eps), M=m, G=g,
                                 BLOCK_K=max(g, plan["BLOCK"]), **plan, enable_fp_fusion=False, **pdl(x.device))
    return out, (xq, xsum, sx)


ROTATE_BN, ROTATE_BK = 32, 8      # a program's output columns and its k step: [8, 8, 32] products, 16 a thread


@triton.jit(do_not_specialize=["M"])
def rotate_decode_kernel(x_ptr, r_ptr, out_ptr, M, H, TRANS: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, PDL: tl.constexpr = False):
    """One program per BN output columns of y [M, H] = x [M, H] @ r [H, H] (TRANS: @ r^T), every token against one
    read of those columns of r. The token tile is MP rows whatever M (masked past M; M not specialized), so each
    output's sum has one order: BK-wide tree sums added in k order."""
    dependent_launch(PDL)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, MP)
    kk = tl.arange(0, BK)
    acc = tl.zeros([MP, BN], tl.float32)
    for k0 in range(0, H, BK):
        k = k0 + kk
        xv = tl.load(x_ptr + m[:, None] * H + k[None, :], mask=(m[:, None] < M) & (k[None, :] < H), other=0.0)
        live = (k[:, None] < H) & (n[None, :] < H)
        if TRANS:
            rv = tl.load(r_ptr + n[None, :] * H + k[:, None], mask=live, other=0.0)       # [BK, BN]: r[n, k]
        else:
            rv = tl.load(r_ptr + k[:, None] * H + n[None, :], mask=live, other=0.0)       # [BK, BN]: r[k, n]
        acc += tl.sum(xv[:, :, None] * rv[None, :, :], axis=1)                           # [MP, BN]
    tl.store(out_ptr + m[:, None] * H + n[None, :], acc, mask=(m[:, None] < M) & (n[None, :] < H))


def rotate_decode(x: torch.Tensor, r: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """x float32 [M <= DECODE_MAX_M, H] @ r (or @ r^T) for r float32 [H, H] -> float32 [M, H], each row the same bits
    whatever M (module docstring)."""
    m, h = x.shape
    if r.shape != (h, h) or x.dtype != torch.float32 or r.dtype != torch.float32 or m > DECODE_MAX_M:
        raise ValueError(f"rotate_decode: x {tuple(x.shape)} {x.dtype} and r {tuple(r.shape)} {r.dtype} do not fit "
                         f"(float32 [M <= {DECODE_MAX_M}, H] and [H, H])")
    out = torch.empty(m, h, dtype=torch.float32, device=x.device)
    rotate_decode_kernel[(triton.cdiv(h, ROTATE_BN),)](x.contiguous(), r.contiguous(), out, m, h, TRANS=transpose,
                                                       MP=DECODE_MAX_M, BN=ROTATE_BN, BK=ROTATE_BK,
                                                       enable_fp_fusion=False, **pdl(x.device))
    return out


@triton.jit
def rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T, HQ, sq_h, sq_t, sk_h, sk_t, D: tl.constexpr,
                PDL: tl.constexpr = False):
    """One program per (head, token) row of q [HQ, T, D] then of k [HKV, T, D] (strided; unit stride along D):
    out = x * cos + rotate_half(x) * sin with cos, sin [T, D], into contiguous [H, T, D]. Bytes: each row in and
    out once, its position's cos and sin."""
    dependent_launch(PDL)
    pid = tl.program_id(0)
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF)
    if pid < HQ * T:
        t = pid % T
        src = q_ptr + (pid // T) * sq_h + t * sq_t
        dst = qo_ptr + pid * D
    else:
        r = pid - HQ * T
        t = r % T
        src = k_ptr + (r // T) * sk_h + t * sk_t
        dst = ko_ptr + r * D
    x1 = tl.load(src + j)
    x2 = tl.load(src + HALF + j)
    c1, c2 = tl.load(cos_ptr + t * D + j), tl.load(cos_ptr + t * D + HALF + j)
    s1, s2 = tl.load(sin_ptr + t * D + j), tl.load(sin_ptr + t * D + HALF + j)
    tl.store(dst + j, x1 * c1 + (-x2) * s1)                     # rotate_half(x) = cat(-x2, x1)
    tl.store(dst + HALF + j, x2 * c2 + x1 * s2)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Hq, T, D], k [Hkv, T, D] float32 (any strides but a unit one along D), cos/sin [T, D] -> rotated
    contiguous copies of q and k, bit for bit `apply_rope`'s."""
    hq, t, d = q.shape
    hk = k.shape[0]
    if k.shape[1:] != (t, d) or q.stride(2) != 1 or k.stride(2) != 1 or cos.shape != (t, d) or sin.shape != (t, d) \
            or d % 2 or q.dtype != torch.float32 or k.dtype != torch.float32:
        raise ValueError(f"rope: q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)} do not fit")
    qo = torch.empty(hq, t, d, dtype=torch.float32, device=q.device)
    ko = torch.empty(hk, t, d, dtype=torch.float32, device=q.device)
    rope_kernel[((hq + hk) * t,)](q, k, cos.contiguous(), sin.contiguous(), qo, ko, t, hq, q.stride(0), q.stride(1),
                                  k.stride(0), k.stride(1), D=d, enable_fp_fusion=False, **pdl(q.device))
    return qo, ko
