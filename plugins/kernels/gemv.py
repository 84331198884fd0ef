"""Triton dual-plane GEMV/GEMM launchers (docs/contracts.md, weights, activations, ops): y[M, N] = x[M, K] @ W_view^T
straight from the packed planes. `dual_plane_linear` launches the decode kernel of `plugins.kernels.gemv_decode`
(CUDA cores, 128-bit plane loads, dp4a) for M <= DECODE_MAX_M tokens with INT8 activations, and the tensor-core
kernel of `plugins.kernels.gemm` for larger M (prefill chunks, 64 tokens a program) and for float16 activations;
both give the same rows bit for bit (INT8 activations).

Bytes read, and why no more than the format requires: each program owns a tile of rows and a contiguous range of
whole groups; it reads every byte of `base` (and, for the target view only, of `refine`) in that tile exactly once,
one float16 scale per (row, group), and the M x K int8 activations (kilobytes, shared through L2). The draft view
never issues a load of the refinement plane: its pointer is not even dereferenced (the branch is a compile-time
constant). With split-K the partial sums ([SPLIT, M, N] float32, M*N*4 bytes per split, tiny next to the planes)
are reduced in a fixed order (by the decode launch's last program, or by `split_reduce_kernel`).

Arithmetic (W4A8 draft / W8A8 target): activations are quantized per token to INT8 (s_x = max|x|/127, round half
to even, as `plugins.nesting.quantize_activations`); each group's dot product is an exact int32 sum of int8 x int8
products (the nibbles sign-extended to int8, the activations split into the even and odd columns that the low and
high nibbles hold); the target code 16*q4 + qr is formed as 16*dot(x, q4) + dot(x, qr), so it is exact even where
it leaves int8 (top-4-of-8: [-136, 119]). The group sum is then scaled by s (draft) or s/16 (target) in float32,
and by s_x at the end. Results do not depend on M or on the other rows of x (the split depends only on N, K and
the device), so a verification pass computes bit for bit what single-token steps compute.

A float-activation variant (`act="float16"`) feeds float16 activations and the exactly representable codes to
float16 MMAs with float32 accumulation, and skips the quantization launch.

The view is a compile-time constant (`dual_plane_linear`: one compiled kernel per view, what a CUDA graph of one
view captures) or read from a device scalar at run time (`dual_plane_linear_coded`: code 1 = target, anything else
the draft, so a TensorRT plugin serves both views of one engine without reading the view to the host); in the
run-time form the refinement loads sit inside a branch on that code, so a draft pass still never issues them.
"""

import torch
import triton
import triton.language as tl

import plugins.kernels.gemm as gemm
from plugins.kernels.common import INTERPRET, capture_sms, dependent_launch, pdl
import plugins.kernels.gemv_decode as gemv_decode
from plugins.kernels.gemv_decode import DECODE_MAX_M, XSUM_SLOTS, decode_gemv_kernel, quantize_decode_kernel

PLAN_ROWS = 128       # rows per program in the split plan (plan_split)
# Prefill chunks (M > DECODE_MAX_M) on tiled planes run the tensor-core kernel (`plugins.kernels.gemm`: the planes
# read once per 64 tokens); False runs the decode kernel in passes of DECODE_MAX_M tokens (the same bits): what
# `bitnest device-check` times against it.
PREFILL_GEMM = True
DECODE_WARPS = 4      # the decode kernel's warps: one row per thread, BLOCK_S = 32 * DECODE_WARPS rows per row tile
# The decode launch reduces its split-K partials itself (the last program of a row tile; gemv_decode
# `_last_split_reduces`) instead of in a launch of its own: one kernel a linear where there were two. False runs the
# separate reduction (the same bits).
FUSED_SPLIT_REDUCE = True
COUNTER_SLOTS = 4096  # row tiles the counters cover at first (a 262,144-row head at 64 rows a tile); grown on demand
_COUNTERS: dict = {}
_RETIRED: list = []   # counters outgrown, kept alive for the graphs that captured them
ACTS = ("int8", "float16")


@triton.jit(do_not_specialize=["SPLIT"])   # one compiled reduction for every split count
def split_reduce_kernel(part_ptr, sx_ptr, out_ptr, M, N, SPLIT, SCALE_X: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = False):
    """out[m, n] = s_x[m] * sum over splits in index order (deterministic) of part[split, m, n].
    Bytes: SPLIT * M * N * 4 partials in and M * N * 4 out: no weight bytes."""
    dependent_launch(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(SPLIT):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    if SCALE_X:
        acc = acc * tl.load(sx_ptr + offs // N, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc, mask=mask)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return capture_sms() or 8  # a launch capture: its GPU's; the interpreter: Orin NX's 8 SMs (tests see the split)


def plan_split(n: int, k: int, g: int, sms: int, rows: int = PLAN_ROWS, per_sm: float = 4) -> tuple[int, int]:
    """(split, groups per split) for an N x K layer: enough programs of PLAN_ROWS rows (the decode kernel's at
    M <= 4) to give every SM ~4 of them, never splitting below 2 groups of K per program. Depends on the shape and
    device only, never on M or on which kernel runs: both kernels sum the same runs of groups in the same order
    (the decode kernel in split partials, the tensor-core kernel in one program), which is what makes their rows
    equal bit for bit. `rows` and `per_sm` other than these: what `bitnest gemv-sweep` tries."""
    groups = k // g
    split = max(1, min(triton.cdiv(int(per_sm * sms), triton.cdiv(n, rows)), groups // 2 or 1, 32))
    per = triton.cdiv(groups, split)
    return triton.cdiv(groups, per), per


def _check(x, base, scale, act):
    """(m, k, n, g) of a call, or ValueError naming what does not fit."""
    if act not in ACTS:
        raise ValueError(f"unknown activation mode {act!r}: use one of {', '.join(ACTS)}")
    m, k = x.shape
    n = base.shape[0]
    g = k // scale.shape[1]
    if base.shape != (n, k // 2) or scale.shape[0] != n or k % g or g < 32 or g & (g - 1):
        raise ValueError(f"planes {tuple(base.shape)} / scale {tuple(scale.shape)} do not fit x [{m}, {k}] "
                         "(the kernel needs a power-of-two group size >= 32)")
    return m, k, n, g


def decode_rows(m: int) -> int:
    """Row tiles per thread of the decode kernel for m tokens: 2 from 5 tokens on (each activation word loaded
    serves two rows: fewer instructions per weight byte where the dp4a work grows with m), else 1 (more programs)."""
    return 2 if m >= 5 else 1


def _reduce(dest, sx, y, m, n, split, scale_x):
    """y = (s_x *) the ordered sum of the split partials dest [split, m, n] (no-op where split == 1)."""
    if split > 1:
        block = 256
        split_reduce_kernel[(triton.cdiv(m * n, block),)](dest, sx, y, m, n, SPLIT=split, SCALE_X=scale_x,
                                                          BLOCK=block, enable_fp_fusion=False, **pdl(y.device))


def _launch_decode(x, base, refine, scale, offset, y, target, view_code, split, per, acts=None, n=None, g=None,
                   tiled=False, warps=DECODE_WARPS, rows=None, res=None):
    """One decode launch (M <= DECODE_MAX_M, INT8 activations): plugins.kernels.gemv_decode; `acts`, x already
    quantized by `quantize_decode` at this group size (shared by the linears that read x), else quantized here.
    `tiled`: the planes in the warp-tiled layout (plugins.kernels.tiling), N and G given. `warps` and `rows` (row
    tiles a thread; None: `decode_rows`) other than the launcher's: what `bitnest gemv-sweep` tries. `res` (float32
    [M, N], contiguous): y = res + x @ W^T, added in the launch that finishes each row (torch's `res + y` bits)."""
    m, k = x.shape
    if not tiled:
        n, g = base.shape[0], k // scale.shape[1]
    xq, xsum, sx = acts if acts is not None else quantize_decode(x.contiguous(), g)
    rows = rows or decode_rows(m)
    tiles = triton.cdiv(n, rows * 32 * warps)
    dest = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    fused = split > 1 and FUSED_SPLIT_REDUCE
    counters = split_counters(x.device, tiles) if fused else sx
    in_launch = res is not None and (split == 1 or fused)          # else added after the separate reduction
    words = base.view(torch.int32)
    decode_gemv_kernel[(tiles, split)](
        xq, xsum, sx, words, refine.view(torch.int32) if refine is not None else words, scale,
        offset if offset is not None else scale, dest, view_code if view_code is not None else scale, y, counters,
        res if in_launch else sx, n, k, per, M=m, TARGET=bool(target), HAS_OFFSET=offset is not None,
        PARTIAL=split > 1, G=g, ROWS=rows, BLOCK_S=32 * warps, INTERP=gemv_decode.interp_form if INTERPRET else 0,
        RUNTIME_VIEW=view_code is not None, TILED=tiled, FUSED_REDUCE=fused, HAS_RES=in_launch, num_warps=warps,
        enable_fp_fusion=False, **pdl(x.device, prefetch=True))
    if not fused:
        _reduce(dest, sx, y, m, n, split, True)
    if res is not None and not in_launch:
        torch.add(res, y, out=y)
    return y


def split_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The decode GEMV's split-K counters on `device` (int32, one per row tile, zero between launches: each launch's
    last program of a tile zeroes its own). Allocated once per device, before any CUDA graph captures a launch
    (`reserve`); launches on one device share them, so two decode GEMVs must not run at once on two streams of it
    (the runtime's passes run on one stream)."""
    key = (device.type, device.index)
    if key not in _COUNTERS or _COUNTERS[key].numel() < tiles:
        if key in _COUNTERS:         # a graph captured earlier may hold the old buffer's address: never free it
            _RETIRED.append(_COUNTERS[key])
        _COUNTERS[key] = torch.zeros(max(tiles, COUNTER_SLOTS), dtype=torch.int32, device=device)
    return _COUNTERS[key]


def reserve(device: torch.device) -> None:
    """Allocate the split-K counters of `device` now (a backend does at load: never inside a graph's capture)."""
    split_counters(device, COUNTER_SLOTS)


def quantize_decode_buffers(m: int, k: int, g: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty (x_q words [M*K/4], group sums [K/g, XSUM_SLOTS], s_x [M]) for M tokens' decode activations."""
    return (torch.empty(m * k // 4, dtype=torch.int32, device=device),
            torch.empty(k // g, XSUM_SLOTS, dtype=torch.int32, device=device),    # slots past M are never read
            torch.empty(m, dtype=torch.float32, device=device))


def quantize_decode(x: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int32 words of the decode layout [K/32, M, 8], int32 group sums [K/g, XSUM_SLOTS], float32
    scales [M]): per-token INT8 activations as `quantize_rows`, laid out for `decode_gemv_kernel`."""
    m, k = x.shape
    xq, xsum, sx = quantize_decode_buffers(m, k, g, x.device)
    quantize_decode_kernel[(m,)](x, xq.view(torch.int8), xsum, sx, k, x.stride(0), M=m, G=g,
                                 BLOCK_K=max(g, min(1024, triton.next_power_of_2(k))), enable_fp_fusion=False,
                                 **pdl(x.device))
    return xq, xsum, sx


def _check_acts(acts, m: int, k: int, g: int, act: str = "int8") -> None:
    """ValueError unless shared activations `acts` (None: none) fit a decode pass of x [m, k] at group size g."""
    if acts is not None and (m > DECODE_MAX_M or act != "int8" or acts[1].shape[0] != k // g or acts[2].shape != (m,)):
        raise ValueError(f"shared activations fit a decode pass of x [{m}, {k}] at group size {g} with INT8 "
                         "activations only: quantize x for this group size (quantize_decode)")


def _tiles(x, base, refine, scale, offset, out, act, target, view_code, acts=None):
    """y [M, N] over canonical planes, of the view `target` (bool) or of the view in device scalar `view_code`, in
    one launch: the decode kernel for M <= DECODE_MAX_M with INT8 activations (on `acts` where given), the
    tensor-core kernel (`plugins.kernels.gemm`) otherwise."""
    m, k, n, g = _check(x, base, scale, act)
    _check_acts(acts, m, k, g, act)
    y = out if out is not None else torch.empty(m, n, dtype=torch.float32, device=x.device)
    split, per = plan_split(n, k, g, _sm_count(x.device))
    if act == "int8" and m <= DECODE_MAX_M:
        return _launch_decode(x, base, refine, scale, offset, y, target, view_code, split, per, acts)
    return gemm.launch_gemm(x, base, refine, scale, offset, y, view_code, n, g, split, per, target, act == "float16",
                            False)


def dual_plane_linear(x: torch.Tensor, base: torch.Tensor, refine, scale: torch.Tensor, view: str,
                      offset=None, out=None, act: str = "int8", acts=None) -> torch.Tensor:
    """y float32 [M, N] = x [M, K] @ W_view^T, reading only the planes of `view` (see the module docstring).
    `acts`: x's activations from `quantize_decode` at this layer's group size, for a decode pass (M <= DECODE_MAX_M)
    whose x several linears read (q/k/v, gate/up): one quantization launch for all of them, the same bits."""
    if view not in ("draft", "target"):
        raise ValueError(f"unknown weight view {view!r}: use draft or target")
    if view == "target" and refine is None:
        raise ValueError("the target view needs the refinement plane")
    return _tiles(x, base, refine, scale, offset, out, act, view == "target", None, acts)


def dual_plane_linear_coded(x: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                            view_code: torch.Tensor, offset=None, out=None, act: str = "int8") -> torch.Tensor:
    """`dual_plane_linear` with the view read by the kernel from the device scalar `view_code` (int32 or int64;
    1 = target, anything else the draft, which never loads `refine`)."""
    if refine is None or refine.shape != base.shape:
        raise ValueError("the run-time view needs the refinement plane beside the base plane")
    return _tiles(x, base, refine, scale, offset, out, act, False, view_code)


def dual_plane_linear_tiled(x: torch.Tensor, planes, view: str, out=None, acts=None, residual=None) -> torch.Tensor:
    """y float32 [M, N] = x [M, K] @ W_view^T from planes in the warp-tiled layout (`plugins.kernels.tiling.
    TiledPlanes`: what the `triton` backend holds), INT8 activations, any M: the decode kernel up to DECODE_MAX_M
    tokens, the tensor-core kernel for a prefill chunk (the planes read once per 64 tokens; `PREFILL_GEMM`). Each
    row is bit for bit what `dual_plane_linear` computes from the canonical planes at M <= 8.
    `acts`: x's activations from `quantize_decode` at the planes' group size (M <= DECODE_MAX_M). `residual`
    (float32 [M, N]): returns residual + x @ W^T, the add done in the GEMV's own launch (torch's bits)."""
    if view not in ("draft", "target"):
        raise ValueError(f"unknown weight view {view!r}: use draft or target")
    if view == "target" and planes.refine is None:
        raise ValueError("the target view needs the refinement plane")
    return _tiled(x, planes, view == "target", None, out, acts, residual)


def dual_plane_linear_tiled_coded(x: torch.Tensor, planes, view_code: torch.Tensor, out=None) -> torch.Tensor:
    """`dual_plane_linear_tiled` with the view read by the kernel from the device scalar `view_code` (int32 or
    int64; 1 = target, anything else the draft, which never loads `refine`): the TensorRT plugin's launch over an
    engine's tiled planes."""
    if planes.refine is None:
        raise ValueError("the run-time view needs the refinement plane beside the base plane")
    return _tiled(x, planes, False, view_code, out, None)


def _tiled(x, planes, target: bool, view_code, out, acts, residual=None) -> torch.Tensor:
    m, k = x.shape
    if k != planes.k:
        raise ValueError(f"x [{m}, {k}] does not fit tiled planes of K = {planes.k}")
    _check_acts(acts, m, k, planes.g)
    if residual is not None:
        if residual.shape != (m, planes.n) or residual.dtype != torch.float32:
            raise ValueError(f"a residual [{m}, {planes.n}] float32 is added to y, not {tuple(residual.shape)} "
                             f"{residual.dtype}")
        residual = residual.contiguous()
    y = out if out is not None else torch.empty(m, planes.n, dtype=torch.float32, device=x.device)
    split, per = plan_split(planes.n, k, planes.g, _sm_count(x.device))
    refine = planes.refine if target or view_code is not None else None
    if m > DECODE_MAX_M and PREFILL_GEMM:
        gemm.launch_gemm(x, planes.base, refine, planes.scale, planes.offset, y, view_code, planes.n, planes.g, split,
                         per, target, False, True)
        return y if residual is None else torch.add(residual, y, out=y)
    for i in range(0, m, DECODE_MAX_M):
        _launch_decode(x[i:i + DECODE_MAX_M], planes.base, refine, planes.scale, planes.offset,
                       y[i:i + DECODE_MAX_M], target, view_code, split, per, acts, planes.n, planes.g, tiled=True,
                       res=None if residual is None else residual[i:i + DECODE_MAX_M])
    return y
