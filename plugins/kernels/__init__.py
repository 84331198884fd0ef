"""Triton kernels of the BitNest ops (docs/contracts.md, ops): the dual-plane GEMV/GEMM (`gemv`), nested-KV
flash-decoding (`attention`) and its KV write path (`kv_write`, with RoPE in the same launch), the decoder's RMSNorm and RoPE in one launch each (`decoder_ops`),
SwiGLU with R4 and down_proj's quantization in one (`swiglu`), ahead-of-time compilation for Orin (`aot`) and a
self-check (`selfcheck`).

Importing this package does not import triton: the launchers below load their module on first call, so CPU-only
code paths never need it. Set TRITON_INTERPRET=1 before the first call to run the kernels on CPU tensors.
The `*_at` / `*_coded` launchers read their lengths or view from device scalars (CUDA graphs, TensorRT plugins).
"""


def dual_plane_linear(x, base, refine, scale, view, offset=None, out=None, act="int8", acts=None):
    """y float32 [M, N] = x [M, K] @ W_view^T from the packed planes (see `plugins.kernels.gemv`); `acts`: x's
    decode-layout INT8 activations from `quantize_decode`, shared by linears that read the same x."""
    from plugins.kernels.gemv import dual_plane_linear as launch
    return launch(x, base, refine, scale, view, offset, out, act, acts)


def dual_plane_linear_tiled(x, planes, view, out=None, acts=None, residual=None):
    """`dual_plane_linear` from planes in the warp-tiled layout (`plugins.kernels.tiling.tile_planes`), any M, INT8
    activations: the rows the canonical launch computes, bit for bit, read in 512-byte warp loads; `residual`
    [M, N] float32 is added in the same launch (residual + y, torch's bits)."""
    from plugins.kernels.gemv import dual_plane_linear_tiled as launch
    return launch(x, planes, view, out, acts, residual)


def dual_plane_linear_tiled_coded(x, planes, view_code, out=None):
    """`dual_plane_linear_tiled` with the view read from the device scalar `view_code` (1 = target, else draft)."""
    from plugins.kernels.gemv import dual_plane_linear_tiled_coded as launch
    return launch(x, planes, view_code, out)


def reserve(device):
    """Allocate the decode GEMV's split-K counters on `device` (a backend does at load, before any graph capture)."""
    from plugins.kernels.gemv import reserve as launch
    return launch(device)


def quantize_decode(x, g):
    """x [M <= 8, K]'s per-token INT8 activations in the decode GEMV's layout for group size g."""
    from plugins.kernels.gemv import quantize_decode as launch
    return launch(x, g)


def rms_norm(x, weight, eps):
    """float32 [M, H]: plugins.decoder_math.rms_norm in one launch (see `plugins.kernels.decoder_ops`)."""
    from plugins.kernels.decoder_ops import rms_norm as launch
    return launch(x, weight, eps)


def rms_norm_decode(x, weight, eps, g):
    """`rms_norm` of x [M <= 8, H] and the result's decode-layout INT8 activations at group size g, in one launch:
    (out, (x_q, group sums, s_x)) as `quantize_decode(out, g)` gives them (`plugins.kernels.decoder_ops`)."""
    from plugins.kernels.decoder_ops import rms_norm_decode as launch
    return launch(x, weight, eps, g)


def rotate_decode(x, r, transpose=False):
    """x [M <= 8, H] @ r (or @ r^T), r [H, H] float32 read once for every token, each row's bits independent of M
    (`plugins.kernels.decoder_ops`)."""
    from plugins.kernels.decoder_ops import rotate_decode as launch
    return launch(x, r, transpose)


def swiglu_decode(gate, up, factors, g):
    """silu(gate) * up [M <= 8, I] rotated by the Hadamard of `factors` (at most two; () for none) and its
    decode-layout INT8 activations at group size g, in one launch: (y, (x_q, group sums, s_x))
    (`plugins.kernels.swiglu`)."""
    from plugins.kernels.swiglu import swiglu_decode as launch
    return launch(gate, up, factors, g)


def rope(q, k, cos, sin):
    """(q, k) rotated by position in one launch, bit for bit the decoder's apply_rope
    (`plugins.kernels.decoder_ops`)."""
    from plugins.kernels.decoder_ops import rope as launch
    return launch(q, k, cos, sin)


def dual_plane_linear_coded(x, base, refine, scale, view_code, offset=None, out=None, act="int8"):
    """`dual_plane_linear` with the view in a device scalar (1 = target, else draft)."""
    from plugins.kernels.gemv import dual_plane_linear_coded as launch
    return launch(x, base, refine, scale, view_code, offset, out, act)


def nested_kv_attention(q, base, refine, scale, main_len, kv8_from, scratch=None, scratch_len=0, out=None,
                        quantize=None):
    """out float32 [Hq, T, D] over one layer's nested KV planes (see `plugins.kernels.attention`); with `quantize`
    = g, (out, its [T, Hq*D] rows' decode-layout INT8 activations at group size g) from the same launches."""
    from plugins.kernels.attention import nested_kv_attention as launch
    return launch(q, base, refine, scale, main_len, kv8_from, scratch, scratch_len, out, quantize)


def nested_kv_attention_at(q, base, refine, scale, main_len, seq_len, kv8_from, scratch=None, out=None,
                           quantize=None):
    """`nested_kv_attention` with main_len, seq_len and kv8_from in device scalars."""
    from plugins.kernels.attention import nested_kv_attention_at as launch
    return launch(q, base, refine, scale, main_len, seq_len, kv8_from, scratch, out, quantize)


def write_kv(k, v, base, refine, scale, pos):
    """Quantize k, v [Hkv, T, D] into positions [pos, pos + T) of one layer's KV planes in place."""
    from plugins.kernels.kv_write import write_kv as launch
    return launch(k, v, base, refine, scale, pos)


def write_kv_at(k, v, base, refine, scale, end):
    """`write_kv` into positions [end - T, end), `end` a device scalar."""
    from plugins.kernels.kv_write import write_kv_at as launch
    return launch(k, v, base, refine, scale, end)


def rope_write_kv_at(q, k, v, cos, sin, base, refine, scale, end):
    """RoPE of q and k and `write_kv_at` of the rotated k and v in one launch: returns q rotated ([Hq, T, D],
    contiguous), bit for bit `rope`'s (`plugins.kernels.kv_write`)."""
    from plugins.kernels.kv_write import rope_write_kv_at as launch
    return launch(q, k, v, cos, sin, base, refine, scale, end)
