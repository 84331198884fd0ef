"""Weight nesting rules (docs/contracts.md, weights): group scales, RTN base, fixed-base refinement (paper eq. 9),
the top-4-of-8 decomposition, and dequantization of the draft and target views."""

from dataclasses import dataclass
from typing import Optional

import torch

from plugins.contracts import (
    ACT_QMAX,
    Q4_MAX,
    Q4_MIN,
    QR_MIN_AT_BASE_MIN,
    REFINE_DIVISOR,
    check_view,
)

_MIN_SCALE = 2.0 ** -24  # smallest positive float16 (subnormal); keeps codes finite for all-zero groups


@dataclass(frozen=True)
class NestedCodes:
    """Codes of one nested linear: q4, qr int8 [N, K]; scale float16 [N, K/G]; optional offset float16 [N, K/G]."""

    q4: torch.Tensor
    qr: torch.Tensor
    scale: torch.Tensor
    offset: Optional[torch.Tensor] = None

    @property
    def group_size(self) -> int:
        return self.q4.shape[1] // self.scale.shape[1]


def expand_groups(t: torch.Tensor, k: int) -> torch.Tensor:
    """Per-group values [N, K/G] -> per-column values [N, K] (float32)."""
    g = k // t.shape[1]
    return t.float().repeat_interleave(g, dim=1)


def symmetric_scale(w: torch.Tensor, group_size: int, qmax: int = Q4_MAX) -> torch.Tensor:
    """float16 group scales [N, K/G] of a symmetric grid: max|w| / qmax per row and group."""
    n, k = w.shape
    amax = w.float().reshape(n, k // group_size, group_size).abs().amax(dim=-1)  # [N, K/G]
    return (amax / qmax).clamp_min(_MIN_SCALE).to(torch.float16)


def quantize_base(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest 4-bit codes [N, K] int8 of `w` on the stored (float16) group scales."""
    s = expand_groups(scale, w.shape[1])
    return torch.clamp(torch.round(w.float() / s), Q4_MIN, Q4_MAX).to(torch.int8)


def refine_lower_bound(q4: torch.Tensor) -> torch.Tensor:
    """Lowest refinement code per weight: 0 where q4 = -8 (eq. 9), else -8."""
    return torch.where(q4 == Q4_MIN, QR_MIN_AT_BASE_MIN, Q4_MIN).to(torch.float32)


def refine_codes(w: torch.Tensor, q4: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Closed-form refinement from a fixed base (paper eq. 9): clip(round((w - q4 s4) / (s4/16)), lo, 7)."""
    s = expand_groups(scale, w.shape[1])
    r = torch.round((w.float() - q4.float() * s) / (s / REFINE_DIVISOR))
    return torch.minimum(torch.maximum(r, refine_lower_bound(q4)), torch.tensor(float(Q4_MAX))).to(torch.int8)


def nest_rtn(w: torch.Tensor, group_size: int) -> NestedCodes:
    """RTN base plus closed-form refinement on symmetric group scales."""
    scale = symmetric_scale(w, group_size)
    q4 = quantize_base(w, scale)
    return NestedCodes(q4, refine_codes(w, q4, scale), scale)


def nest_top4of8(w: torch.Tensor, group_size: int = 64) -> NestedCodes:
    """Precision on Demand's construction: asymmetric RTN 8-bit per group, draft = top 4 bits.

    With 8-bit step s, zero point z and code c = 16h + l in [0, 255], store q4 = h - 8, qr = l - 8,
    scale = 16 s and offset = s (136 - z), so that target = (16 q4 + qr) scale/16 + offset = s (c - z)
    exactly and draft = q4 scale + offset = s (16h + 8 - z): the middle code of the dropped cell
    (the paper's midpoint 16h + 7.5, moved half an 8-bit step onto the code grid so that one offset
    serves both views). The composed code 16 q4 + qr spans [-136, 119]: kernels must not form it as int8.
    """
    n, k = w.shape
    wg = w.float().reshape(n, k // group_size, group_size)  # [N, K/G, G]
    lo, hi = wg.amin(-1), wg.amax(-1)
    step = ((hi - lo) / 255.0).clamp_min(_MIN_SCALE)
    scale16 = (step * REFINE_DIVISOR).to(torch.float16)     # stored 4-bit step, float16
    step = scale16.float() / REFINE_DIVISOR                  # the 8-bit step actually stored
    zero = torch.clamp(torch.round(-lo / step), 0, 255)
    c = torch.clamp(torch.round(wg / step.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 255)  # [N, K/G, G]
    h, l = torch.div(c, 16, rounding_mode="floor"), torch.remainder(c, 16)
    offset = (step * (136.0 - zero)).to(torch.float16)
    return NestedCodes((h - 8).reshape(n, k).to(torch.int8), (l - 8).reshape(n, k).to(torch.int8), scale16, offset)


def dequantize_codes(q4, qr, scale, view: str, offset=None) -> torch.Tensor:
    """float32 weights [N, K] of a view from int codes [N, K]: draft = q4 s4 (+ offset),
    target = (16 q4 + qr) s4/16 (+ offset). The draft never reads `qr` (it may be None)."""
    check_view(view)
    k = q4.shape[1]
    s = expand_groups(scale, k)
    if view == "draft":
        w = q4.float() * s
    else:
        w = (REFINE_DIVISOR * q4.float() + qr.float()) * (s / REFINE_DIVISOR)
    if offset is not None:
        w = w + expand_groups(offset, k)
    return w


def dequantize(codes: NestedCodes, view: str) -> torch.Tensor:
    """float32 weights [N, K] of one view of `codes`."""
    return dequantize_codes(codes.q4, codes.qr, codes.scale, view, codes.offset)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric INT8 (docs/contracts.md, activations): x [M, K] -> codes int8 [M, K], scales float32 [M, 1]."""
    s = (x.float().abs().amax(dim=-1, keepdim=True) / ACT_QMAX).clamp_min(1e-12)  # [M, 1]
    q = torch.clamp(torch.round(x.float() / s), -ACT_QMAX, ACT_QMAX).to(torch.int8)
    return q, s
