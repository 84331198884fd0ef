"""GPTQ (Frantar et al. 2023) with pluggable per-column quantizers: the symmetric W4 base with group
scales, and the fixed-base refinement (codes qr on the s4/16 grid, base held fixed), each with
second-order error compensation, dampening, optional act-order and static groups."""

import torch

from plugins.contracts import Q4_MAX, Q4_MIN, REFINE_DIVISOR
from plugins.nesting import refine_lower_bound, symmetric_scale


class BaseQuantizer:
    """Symmetric 4-bit codes on per-group float16 scales chosen at the start of each group from the
    error-updated weights (or up front from the original weights when static).

    With `trust` = d (and the original weights), a code may sit at most 0.5 + d base steps from the
    original weight. The refinement reaches about half a base step either side of the base code, so
    d bounds how far the target can be left from the original weight (d = 0 is RTN; None is plain GPTQ).
    """

    def __init__(self, n: int, k: int, group_size: int, static_from: torch.Tensor | None = None,
                 trust: float | None = None, original: torch.Tensor | None = None):
        self.g = group_size
        self.scale = torch.zeros(n, k // group_size, dtype=torch.float16)
        self.static = static_from is not None
        if self.static:
            self.scale = symmetric_scale(static_from, group_size)
        self.trust, self.original = trust, None if original is None else original.double()

    def begin_group(self, group: int, w_cols: torch.Tensor) -> None:
        if not self.static:
            self.scale[:, group] = symmetric_scale(w_cols, w_cols.shape[1])[:, 0]

    def __call__(self, col: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """w [N] (column `col`) -> (codes [N], dequantized [N])."""
        s = self.scale[:, col // self.g].double()
        q = torch.round(w / s)
        if self.trust is not None:
            u = self.original[:, col] / s
            q = torch.minimum(torch.maximum(q, torch.ceil(u - 0.5 - self.trust)), torch.floor(u + 0.5 + self.trust))
        q = torch.clamp(q, Q4_MIN, Q4_MAX)
        return q, q * s


class RefineQuantizer:
    """Refinement codes for a fixed base: value = (16 q4 + qr) s4/16, qr in [lo, 7] (paper eq. 9 bounds)."""

    def __init__(self, q4: torch.Tensor, scale: torch.Tensor, group_size: int):
        self.q4, self.scale, self.g = q4.double(), scale, group_size
        self.lo = refine_lower_bound(q4).double()

    def begin_group(self, group: int, w_cols: torch.Tensor) -> None:
        pass

    def __call__(self, col: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.scale[:, col // self.g].double() / REFINE_DIVISOR
        base = self.q4[:, col] * REFINE_DIVISOR
        qr = torch.minimum(torch.maximum(torch.round(w / s - base), self.lo[:, col]), torch.tensor(float(Q4_MAX)))
        return qr, (base + qr) * s


def prepare_hessian(h: torch.Tensor, w: torch.Tensor, damp: float) -> torch.Tensor:
    """Dampened upper Cholesky factor of H^-1 (dead inputs get H_ii = 1 and zero weights, in place on w)."""
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    mean_diag = torch.mean(torch.diag(h))
    for attempt in range(6):
        hd = h + (damp * 10 ** attempt) * mean_diag * torch.eye(h.shape[0], dtype=h.dtype)
        try:
            l = torch.linalg.cholesky(hd)
            return torch.linalg.cholesky(torch.cholesky_inverse(l), upper=True)
        except torch.linalg.LinAlgError:
            continue
    raise RuntimeError("Hessian is not positive definite even with heavy dampening")


def gptq(w: torch.Tensor, h: torch.Tensor, quantizer, group_size: int, act_order: bool = False,
         damp: float = 0.01, block: int = 128) -> torch.Tensor:
    """Quantize w [N, K] column by column under Hessian h [K, K]; returns integer codes [N, K] (float64).

    Rule: after quantizing column i, the error e = (w_i - q_i) / [H^-1]_ii is spread onto the columns
    not yet quantized, w_j -= e [H^-1]_ij, which minimises the layer's output error to second order.
    """
    w = w.double().clone()
    h = h.double()
    n, k = w.shape
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    hinv = prepare_hessian(h, w, damp)
    codes = torch.zeros_like(w)
    block = max(block, group_size)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1, err1 = w[:, i1:i2].clone(), torch.zeros(n, i2 - i1, dtype=w.dtype)
        hb = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            if not act_order and col % group_size == 0:
                quantizer.begin_group(col // group_size, w1[:, i:i + group_size])
            q, deq = quantizer(col, w1[:, i])
            codes[:, i1 + i] = q
            e = (w1[:, i] - deq) / hb[i, i]
            w1[:, i:] -= e.unsqueeze(1) * hb[i, i:].unsqueeze(0)
            err1[:, i] = e
        w[:, i1:i2] = w1
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    out = torch.empty_like(codes)
    out[:, perm] = codes
    return out


def gptq_base(w: torch.Tensor, h: torch.Tensor, group_size: int, act_order: bool, damp: float = 0.01,
              trust: float | None = None):
    """W4 base by GPTQ: (q4 int8 [N, K], scale float16 [N, K/G]). Act-order uses static group scales;
    `trust` bounds each code's distance from the original weight (see BaseQuantizer)."""
    n, k = w.shape
    quant = BaseQuantizer(n, k, group_size, static_from=w.float() if act_order else None, trust=trust, original=w)
    q4 = gptq(w, h, quant, group_size, act_order, damp)
    return q4.to(torch.int8), quant.scale


def gptq_refine(w: torch.Tensor, h: torch.Tensor, q4: torch.Tensor, scale: torch.Tensor, group_size: int,
                act_order: bool, damp: float = 0.01) -> torch.Tensor:
    """Refinement codes qr int8 [N, K] fitted by GPTQ error compensation with the base held fixed."""
    return gptq(w, h, RefineQuantizer(q4, scale, group_size), group_size, act_order, damp).to(torch.int8)
