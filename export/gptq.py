"""GPTQ (Frantar et al. 2023) with pluggable per-column quantizers: the symmetric W4 base with group
scales, and the fixed-base refinement (codes qr on the s4/16 grid, base held fixed), each with
second-order error compensation, dampening, optional act-order and static groups.

Working precision is float32 (GPTQ's reference and GPTQModel's): at Llama-3-8B's shapes the down_proj Hessian is
14,336^2 entries, 0.82 GB in float32 and 1.64 GB in float64, and its inverse factor needs two such matrices at once.
A prepared Hessian (`prepare_gptq`) serves any number of row blocks of one weight (the head, 128,256 rows)."""

import math
from dataclasses import dataclass

import torch

from plugins.contracts import Q4_MAX, Q4_MIN, REFINE_DIVISOR
from plugins.nesting import refine_lower_bound, symmetric_scale

GPTQ_DTYPE = torch.float32
# Columns whose errors are spread one at a time within a block (elementwise, N x SUB_BLOCK^2 / 2 a sub-block) before
# one product spreads them over the rest of the block: a quarter of the elementwise work of spreading each column
# over its whole 128-column block, the same arithmetic in another order (Llama-3-8B's 14,336 x 4,096 gate_proj on
# 2 cores: base 15.3 s to 5.8 s, refinement 17.3 s to 7.0 s; 0.01-0.03% of codes differ, ties rounded the other way).
SUB_BLOCK = 32


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
        device = None if original is None else original.device
        self.scale = torch.zeros(n, k // group_size, dtype=torch.float16, device=device)
        self.static = static_from is not None
        if self.static:
            self.scale = symmetric_scale(static_from, group_size)
        self.trust, self.original = trust, None if original is None else original.to(GPTQ_DTYPE)

    def begin_group(self, group: int, w_cols: torch.Tensor) -> None:
        if not self.static:
            self.scale[:, group] = symmetric_scale(w_cols, w_cols.shape[1])[:, 0]

    def __call__(self, col: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """w [N] (column `col`) -> (codes [N], dequantized [N])."""
        s = self.scale[:, col // self.g].to(w.dtype)
        q = torch.round(w / s)
        if self.trust is not None:
            u = self.original[:, col] / s
            q = torch.minimum(torch.maximum(q, torch.ceil(u - 0.5 - self.trust)), torch.floor(u + 0.5 + self.trust))
        q = torch.clamp(q, Q4_MIN, Q4_MAX)
        return q, q * s


class RefineQuantizer:
    """Refinement codes for a fixed base: value = (16 q4 + qr) s4/16, qr in [lo, 7] (paper eq. 9 bounds)."""

    def __init__(self, q4: torch.Tensor, scale: torch.Tensor, group_size: int):
        self.q4, self.scale, self.g = q4.to(GPTQ_DTYPE), scale, group_size
        self.lo = refine_lower_bound(q4).to(GPTQ_DTYPE)

    def begin_group(self, group: int, w_cols: torch.Tensor) -> None:
        pass

    def __call__(self, col: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.scale[:, col // self.g].to(w.dtype) / REFINE_DIVISOR
        base = self.q4[:, col] * REFINE_DIVISOR
        qr = torch.clamp(torch.maximum(torch.round(w / s - base), self.lo[:, col]), max=float(Q4_MAX))
        return qr, (base + qr) * s


@dataclass(frozen=True)
class PreparedHessian:
    """What GPTQ needs of H [K, K], made once per weight: the column order, the dead inputs, and the dampened upper
    Cholesky factor of H^-1 in that order."""

    perm: torch.Tensor       # [K] column order (act-order: descending diag(H))
    dead: torch.Tensor       # [K] bool: inputs never active (their weights are zeroed)
    hinv: torch.Tensor       # [K, K] upper Cholesky factor of the dampened H^-1, permuted


def prepare_gptq(h: torch.Tensor, damp: float = 0.01, act_order: bool = False) -> PreparedHessian:
    """Prepare H (consumed: the caller's float32 tensor is written in place) with at most two K x K matrices alive at
    once besides it."""
    h = h.to(GPTQ_DTYPE)
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(h.shape[0], device=h.device)
    if act_order:
        h = h.index_select(0, perm)
        h = h.index_select(1, perm)
    diag = torch.diag(h).clone()
    mean_diag = torch.mean(diag)
    # H^-1 = R^T R with R upper: with J the order reversal and J H J = L L^T (lower Cholesky), R = J L^-1 J: one
    # factorization and one triangular solve instead of a Cholesky, its inverse and a second Cholesky of H^-1 (30 s to
    # 24 s for Llama-3-8B's 14,336-wide down_proj Hessian on 2 cores).
    h = h.flip(0, 1)
    diag = diag.flip(0)
    for attempt in range(6):
        h.diagonal().copy_(diag + (damp * 10 ** attempt) * mean_diag)     # H + damp mean(diag) I, reversed
        l, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            del h
            inv = torch.eye(l.shape[0], dtype=l.dtype, device=l.device)
            torch.linalg.solve_triangular(l, inv, upper=False, out=inv)     # L^-1 (lower), in place
            del l
            return PreparedHessian(perm, dead, inv.flip(0, 1))
        del l
    raise RuntimeError("Hessian is not positive definite even with heavy dampening")


def gptq(w: torch.Tensor, h, quantizer, group_size: int, act_order: bool = False,
         damp: float = 0.01, block: int = 128) -> torch.Tensor:
    """Quantize w [N, K] column by column under Hessian h [K, K] (or its PreparedHessian); returns integer codes
    [N, K] (GPTQ_DTYPE).

    Rule: after quantizing column i, the error e = (w_i - q_i) / [H^-1]_ii is spread onto the columns
    not yet quantized, w_j -= e [H^-1]_ij, which minimises the layer's output error to second order.
    """
    prep = h if isinstance(h, PreparedHessian) else prepare_gptq(h.clone(), damp, act_order)
    perm, hinv = prep.perm, prep.hinv
    w = w.to(GPTQ_DTYPE).clone()
    w[:, prep.dead] = 0.0
    w = w[:, perm]
    n, k = w.shape
    codes = torch.zeros_like(w)
    block = max(block, group_size)
    sub = math.gcd(SUB_BLOCK, group_size)          # a group starts on a sub-block's first column, fully updated
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1, err1 = w[:, i1:i2].clone(), torch.zeros(n, i2 - i1, dtype=w.dtype, device=w.device)
        hb = hinv[i1:i2, i1:i2]
        for j1 in range(0, i2 - i1, sub):
            j2 = min(j1 + sub, i2 - i1)
            for i in range(j1, j2):
                col = int(perm[i1 + i])
                if not act_order and col % group_size == 0:
                    quantizer.begin_group(col // group_size, w1[:, i:i + group_size])
                q, deq = quantizer(col, w1[:, i])
                codes[:, i1 + i] = q
                e = (w1[:, i] - deq) / hb[i, i]
                w1[:, i:j2] -= e.unsqueeze(1) * hb[i, i:j2].unsqueeze(0)
                err1[:, i] = e
            w1[:, j2:] -= err1[:, j1:j2] @ hb[j1:j2, j2:]          # the sub-block's errors on the rest of the block
        w[:, i1:i2] = w1
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    del w
    out = torch.empty_like(codes)
    out[:, perm] = codes
    return out


def gptq_base(w: torch.Tensor, h, group_size: int, act_order: bool, damp: float = 0.01,
              trust: float | None = None):
    """W4 base by GPTQ under h (H [K, K] or its PreparedHessian): (q4 int8 [N, K], scale float16 [N, K/G]).
    Act-order uses static group scales; `trust` bounds each code's distance from the original weight (see
    BaseQuantizer)."""
    n, k = w.shape
    quant = BaseQuantizer(n, k, group_size, static_from=w.float() if act_order else None, trust=trust, original=w)
    q4 = gptq(w, h, quant, group_size, act_order, damp)
    return q4.to(torch.int8), quant.scale


def gptq_refine(w: torch.Tensor, h, q4: torch.Tensor, scale: torch.Tensor, group_size: int,
                act_order: bool, damp: float = 0.01) -> torch.Tensor:
    """Refinement codes qr int8 [N, K] fitted by GPTQ error compensation with the base held fixed."""
    return gptq(w, h, RefineQuantizer(q4, scale, group_size), group_size, act_order, damp).to(torch.int8)
