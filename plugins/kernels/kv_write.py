"""The nested KV cache's write path (docs/contracts.md, KV cache and ops): new K/V entries quantized into the planes
that `plugins.kernels.attention` reads, with the semantics of `plugins.kv.quantize_kv`: per (K or V, head,
position) s = fp16(max|x|/7), q4 = clip(rne(x/s), -8, 7), qr = clip(rne((x - q4 s)/(s/16)), -8, 7), two dims a
byte (dims 2j and 2j+1 in byte j's low and high nibbles).

- `write_kv_at` / `write_kv`: K and V as the decoder hands them (k already rotated by position).
- `rope_write_kv_at`: RoPE and the write in one launch, for a pass whose attention rotates its own inputs (the
  `triton` backend's static passes): programs of q's rows rotate them (`decoder_ops.rope`'s arithmetic) into a
  contiguous copy for attention, programs of k's rows rotate them and write them to the planes from the registers
  (the rotated k is never stored as floats: the planes are what attention reads), programs of v's rows write them.
  One launch a layer fewer than RoPE's and the write's, and the same bits (tested): a rotated value is the same
  float32 operations on the same inputs (x * cos + rotate_half(x) * sin, unfused), and the quantization reads what
  the write would have loaded.

Positions: the write goes to [end - T, end) with `end` read from a device scalar and clamped to [T, C] (the launcher
checks T <= C), so a pass can be captured once in a CUDA graph and replayed with new lengths, and no value of `end`
makes a kernel write outside its planes.
"""

import torch
import triton
import triton.language as tl

from plugins.kernels.attention import check_planes, device_scalar
from plugins.kernels.common import dependent_launch, pdl, round_half_even


@triton.jit
def _write_pos0(end_ptr, T, cap):
    """The first position a pass of T writes: end - T, end read from the device scalar and clamped to [T, cap]."""
    end = tl.minimum(tl.maximum(tl.load(end_ptr).to(tl.int64), T), cap)
    return (end - T).to(tl.int32)


@triton.jit
def _quantize_store(x_e, x_o, base_ptr, refine_ptr, scale_ptr, plane, pos, cap, HALF: tl.constexpr):
    """One vector's even dims x_e and odd dims x_o [HALF] (float32) quantized and stored at position `pos` of plane
    `plane` (K or V, head): D/2 bytes per plane and one float16 scale."""
    j = tl.arange(0, HALF)
    amax = tl.maximum(tl.max(tl.abs(x_e), axis=0), tl.max(tl.abs(x_o), axis=0))
    s = tl.maximum(tl.math.div_rn(amax, 7.0), 2.0 ** -24).to(tl.float16).to(tl.float32)
    q_e = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_e, s)), -8.0), 7.0)
    q_o = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_o, s)), -8.0), 7.0)
    step = s / 16.0
    r_e = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_e - q_e * s, step)), -8.0), 7.0)
    r_o = tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x_o - q_o * s, step)), -8.0), 7.0)
    dst = (plane * cap + pos) * HALF + j
    tl.store(base_ptr + dst, ((q_e.to(tl.int32) & 15) | ((q_o.to(tl.int32) & 15) << 4)).to(tl.uint8))
    tl.store(refine_ptr + dst, ((r_e.to(tl.int32) & 15) | ((r_o.to(tl.int32) & 15) << 4)).to(tl.uint8))
    tl.store(scale_ptr + plane * cap + pos, s.to(tl.float16))


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, base_ptr, refine_ptr, scale_ptr, end_ptr, T, cap, sk_h, sk_t, sv_h, sv_t,
                    HKV: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (K-or-V, head, token) of k and v [Hkv, T, D] (strided, unit stride along D: the views the
    decoder splits out of the projections, read in place), written at position end - T + t.
    Bytes: the D floats of the vector in, D/2 bytes per plane and one float16 scale out; nothing is read back."""
    dependent_launch(PDL)
    pos0 = _write_pos0(end_ptr, T, cap)
    pid = tl.program_id(0)
    kv = pid // (HKV * T)
    h = (pid // T) % HKV
    t = pid % T
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF)
    if kv == 0:
        src = k_ptr + h * sk_h + t * sk_t + 2 * j
    else:
        src = v_ptr + h * sv_h + t * sv_t + 2 * j
    x_e = tl.load(src).to(tl.float32)                                   # [HALF] dims 2j
    x_o = tl.load(src + 1).to(tl.float32)                               # [HALF] dims 2j+1
    _quantize_store(x_e, x_o, base_ptr, refine_ptr, scale_ptr, kv * HKV + h, pos0 + t, cap, HALF)


@triton.jit
def _rotated(row, cos_row, sin_row, d, D: tl.constexpr):
    """Dims d of a row rotated by position: x[d] * cos[d] + rotate_half(x)[d] * sin[d], rotate_half(x)[d] =
    -x[d + D/2] below D/2 and x[d - D/2] from it (`edge.model.decoder.apply_rope`'s float32 operations)."""
    HALF: tl.constexpr = D // 2
    low = d < HALF
    partner = tl.load(row + tl.where(low, d + HALF, d - HALF))
    rot = tl.where(low, -partner, partner)
    return tl.load(row + d) * tl.load(cos_row + d) + rot * tl.load(sin_row + d)


@triton.jit
def rope_write_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qo_ptr, base_ptr, refine_ptr, scale_ptr, end_ptr,
                         T, cap, HQ, sq_h, sq_t, sk_h, sk_t, sv_h, sv_t, HKV: tl.constexpr, D: tl.constexpr,
                         PDL: tl.constexpr = False):
    """One program per row: (head, token) of q [HQ, T, D] rotated into qo [HQ, T, D] (contiguous), then (K-or-V,
    head, token) of k and v [HKV, T, D] as `write_kv_kernel`, k rotated first (strided inputs, unit stride along
    D; cos, sin [T, D]). Bytes: each row in once, q's out once, the planes' bytes and scale out."""
    dependent_launch(PDL)
    pid = tl.program_id(0)
    HALF: tl.constexpr = D // 2
    if pid < HQ * T:
        t = pid % T
        d = tl.arange(0, D)
        src = q_ptr + (pid // T) * sq_h + t * sq_t
        tl.store(qo_ptr + pid * D + d, _rotated(src, cos_ptr + t * D, sin_ptr + t * D, d, D))
    else:
        r = pid - HQ * T
        kv = r // (HKV * T)
        h = (r // T) % HKV
        t = r % T
        e = 2 * tl.arange(0, HALF)                                      # [HALF] even dims
        if kv == 0:
            src = k_ptr + h * sk_h + t * sk_t
            x_e = _rotated(src, cos_ptr + t * D, sin_ptr + t * D, e, D)
            x_o = _rotated(src, cos_ptr + t * D, sin_ptr + t * D, e + 1, D)
        else:
            src = v_ptr + h * sv_h + t * sv_t
            x_e = tl.load(src + e).to(tl.float32)
            x_o = tl.load(src + e + 1).to(tl.float32)
        _quantize_store(x_e, x_o, base_ptr, refine_ptr, scale_ptr, kv * HKV + h, _write_pos0(end_ptr, T, cap) + t,
                        cap, HALF)


def _check_kv(k, v, base, refine, scale):
    hkv, t, d = k.shape
    check_planes(base, refine, scale, d)
    if v.shape != k.shape or base.shape[1] != hkv or not 0 < t <= base.shape[2]:
        raise ValueError(f"K/V {tuple(k.shape)} do not fit planes {tuple(base.shape)}")


def write_kv_at(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                end: torch.Tensor) -> None:
    """Quantize k, v [Hkv, T, D] into positions [end - T, end) of the planes in place; `end` is a device scalar
    (int32 or int64), clamped by the kernel to [T, C]."""
    _check_kv(k, v, base, refine, scale)
    hkv, t, d = k.shape
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    write_kv_kernel[(2 * hkv * t,)](k, v, base, refine, scale, end, t, base.shape[2], k.stride(0), k.stride(1),
                                    v.stride(0), v.stride(1), HKV=hkv, D=d,
                                    enable_fp_fusion=False, **pdl(k.device))   # x - q4*s rounded as torch rounds it


def write_kv(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
             pos: int) -> None:
    """Quantize k, v [Hkv, T, D] into positions [pos, pos + T) of the planes, in place."""
    t = k.shape[1]
    if not 0 <= pos <= base.shape[2] - t:
        raise ValueError(f"K/V {tuple(k.shape)} at position {pos} do not fit planes {tuple(base.shape)}")
    write_kv_at(k, v, base, refine, scale, device_scalar(pos + t, k.device))


def rope_write_kv_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """q [Hq, T, D], k, v [Hkv, T, D] float32 (any strides but a unit one along D), cos/sin [T, D]: k rotated by
    position and v quantized into positions [end - T, end) of the planes (`write_kv_at`'s), and q rotated, returned
    as a contiguous [Hq, T, D] copy, bit for bit `decoder_ops.rope`'s, in one launch."""
    _check_kv(k, v, base, refine, scale)
    hq, t, d = q.shape
    hkv = k.shape[0]
    if q.shape[1:] != (t, d) or cos.shape != (t, d) or sin.shape != (t, d) or d % 2 or \
            {x.dtype for x in (q, k, v)} != {torch.float32}:
        raise ValueError(f"rope_write_kv: q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)} do not fit "
                         "(float32 q [Hq, T, D], k, v [Hkv, T, D], cos and sin [T, D])")
    q, k, v = (x if x.stride(2) == 1 else x.contiguous() for x in (q, k, v))
    qo = torch.empty(hq, t, d, dtype=torch.float32, device=q.device)
    rope_write_kv_kernel[((hq + 2 * hkv) * t,)](
        q, k, v, cos.contiguous(), sin.contiguous(), qo, base, refine, scale, end, t, base.shape[2], hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), HKV=hkv, D=d,
        enable_fp_fusion=False, **pdl(q.device))
    return qo
