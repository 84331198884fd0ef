"""Pure-torch reference semantics of the BitNest ops (the oracle every kernel and plugin is tested against)."""

from typing import Optional

import torch

from plugins.contracts import REFINE_DIVISOR, check_view
from plugins.nesting import dequantize_codes, quantize_activations
from plugins.packing import unpack_nibbles


def dual_plane_linear(
    x: torch.Tensor,
    base: torch.Tensor,
    refine: Optional[torch.Tensor],
    scale: torch.Tensor,
    view: str,
    offset: Optional[torch.Tensor] = None,
    act_int8: bool = False,
) -> torch.Tensor:
    """y[M, N] = x[M, K] @ W_view^T from the packed planes (DESIGN §6).

    base, refine: uint8 [N, K/2]; scale (and optional offset): float16 [N, K/G].
    The draft view reads `base` and `scale` only (and never touches `refine`, which may be None);
    the target view reads both planes. With `act_int8`, x is quantized per token to INT8 and each
    group's integer dot product is exact before the group scale is applied (W4A8 / W8A8).
    Computed in float64 so it is the oracle for float32 kernels.
    """
    check_view(view)
    m, k = x.shape
    n = base.shape[0]
    if base.shape != (n, k // 2) or k % scale.shape[1] or scale.shape[0] != n:
        raise ValueError(f"plane shapes {tuple(base.shape)}, scale {tuple(scale.shape)} do not fit x of K={k}")
    g = k // scale.shape[1]
    codes = unpack_nibbles(base).double()                                      # [N, K]
    step = scale.double()                                                      # [N, K/G]
    if view == "target":
        if refine is None:
            raise ValueError("the target view needs the refinement plane")
        codes = REFINE_DIVISOR * codes + unpack_nibbles(refine).double()
        step = step / REFINE_DIVISOR
    if act_int8:
        xq, sx = quantize_activations(x)
        xs, xscale = xq.double(), sx.double()                                  # [M, K], [M, 1]
    else:
        xs, xscale = x.double(), None
    # Per-group dot products: [M, 1, K/G, G] * [1, N, K/G, G] summed over G -> [M, N, K/G]
    partial = torch.einsum("mcg,ncg->mnc", xs.reshape(m, k // g, g), codes.reshape(n, k // g, g))
    y = (partial * step.unsqueeze(0)).sum(-1)                                  # [M, N]
    if offset is not None:
        xsum = xs.reshape(m, k // g, g).sum(-1)                                # [M, K/G]
        y = y + xsum @ offset.double().T
    if xscale is not None:
        y = y * xscale
    return y


def dequantized_weight(base, refine, scale, view, offset=None) -> torch.Tensor:
    """float32 W_view [N, K] from packed planes: the draft reads base + scale only."""
    qr = unpack_nibbles(refine) if view == "target" else None
    return dequantize_codes(unpack_nibbles(base), qr, scale, view, offset)
