"""Learned rotations (SpinQuant, Liu et al. 2025, as BitNest §A.3 applies them): R1 on the residual stream and one
R2 per layer, optimized on the orthogonal group by Cayley SGD to lower the loss of the rotated model with its draft
view fake-quantized (RTN 4-bit, straight-through rounding), plus the target view's loss as a second term, on
calibration windows only, starting from the randomized Hadamards."""

import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from edge.model.arch import ModelConfig
from edge.model.decoder import Decoder, OnlineRotations, causal_attention
from edge.model.float_store import FloatWeights
from export.rotation.ops import apply_r1r2
from plugins.contracts import Q4_MAX, Q4_MIN, QR_MIN_AT_BASE_MIN, REFINE_DIVISOR

_MIN_SCALE = 2.0 ** -24


@dataclass(frozen=True)
class LearnOptions:
    """Cayley SGD of R1 and the per-layer R2: `steps` updates, each on `batch` of
    `samples` calibration windows of `seq_len` tokens; loss = draft-view loss + `target_weight` x target-view
    loss, each the KL from the float model's next-token distribution (`kl`) or the next-token cross-entropy (`ce`)."""

    steps: int = 32
    samples: int = 33
    seq_len: int = 128
    batch: int = 1
    lr: float = 1.5
    momentum: float = 0.9
    target_weight: float = 0.5
    loss: str = "kl"

    def __post_init__(self):
        if self.steps < 1 or self.samples < 2 or self.seq_len < 16 or not 1 <= self.batch < self.samples:
            raise ValueError("learned rotation needs steps >= 1, samples >= 2 (one is held out), seq_len >= 16 "
                             "and 1 <= batch < samples")
        if self.lr <= 0 or not 0 <= self.momentum < 1 or self.target_weight < 0:
            raise ValueError("learned rotation needs lr > 0, momentum in [0, 1) and target_weight >= 0")
        if self.loss not in ("kl", "ce"):
            raise ValueError(f"unknown rotation loss {self.loss!r}: use kl or ce")


class _NestViews(torch.autograd.Function):
    """Both views of the RTN nest (plugins.nesting.nest_rtn) of w [N, K], same op order, so bit for bit:
    s = float16(max|w|/7) per group, q4 = clamp(round(w/s), -8, 7), draft = q4 s; qr = clip(round((w - q4 s) /
    (s/16)), lo, 7) (paper eq. 9), target = (16 q4 + qr) s/16.

    Backward: straight-through rounding (dy/dw = 1) plus the gradient through each group's scale, which depends
    on the group's largest |w| only: dy/ds = (y - w)/s, so dL/dw_max += sign(w_max)/7 sum_group dL/dy (y - w)/s.
    It saves w, the int8 codes and the group scales, not autograd's intermediates (a whole model's would not fit)."""

    @staticmethod
    def forward(ctx, w, group_size: int):
        n, k = w.shape
        wg = w.detach().reshape(n, k // group_size, group_size)                       # [N, K/G, G]
        amax, arg = wg.abs().max(-1, keepdim=True)                                     # [N, K/G, 1]
        s = (amax / Q4_MAX).clamp_min(_MIN_SCALE).to(torch.float16).float()
        q4 = torch.clamp(torch.round(wg / s), Q4_MIN, Q4_MAX)
        draft = q4 * s
        lo = torch.where(q4 == Q4_MIN, float(QR_MIN_AT_BASE_MIN), float(Q4_MIN))
        qr = torch.clamp_max(torch.maximum(torch.round((wg - draft) / (s / REFINE_DIVISOR)), lo), float(Q4_MAX))
        code = REFINE_DIVISOR * q4 + qr                                                # [-128, 127]
        target = code * (s / REFINE_DIVISOR)
        ctx.save_for_backward(w, q4.to(torch.int8), code.to(torch.int8), s, arg)
        ctx.group_size = group_size
        return draft.reshape(n, k), target.reshape(n, k)

    @staticmethod
    def backward(ctx, g_draft, g_target):
        w, q4, code, s, arg = ctx.saved_tensors
        n, k = w.shape
        shape = (n, k // ctx.group_size, ctx.group_size)
        wg = w.reshape(shape)
        grad = torch.zeros(shape, dtype=w.dtype)
        ds = torch.zeros_like(s)                                                        # dL/ds [N, K/G, 1]
        for g, c, step in ((g_draft, q4, s), (g_target, code, s / REFINE_DIVISOR)):
            if g is None:
                continue
            gg = g.reshape(shape)
            grad += gg
            ds += (gg * (c.float() * step - wg)).sum(-1, keepdim=True) / s
        grad.scatter_add_(-1, arg, torch.sign(wg.gather(-1, arg)) * ds / Q4_MAX)
        return grad.reshape(n, k), None


def nest_views(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft, target) float32 [N, K] of the RTN nest of w [N, K] with group size `group_size`, differentiable."""
    return _NestViews.apply(w, group_size)


class FakeQuantWeights(FloatWeights):
    """The decoder's weight store over rotated float tensors whose block linears are fake-quantized at the
    pass's view (the head and embedding stay float, as in the default export)."""

    def __init__(self, tensors: dict[str, torch.Tensor], tied: bool, group_for: Callable[[int], int]):
        super().__init__(tensors, tied)
        self.group_for, self._views = group_for, {}

    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor:
        if name not in self._views:
            w = self.t[name + ".weight"]
            self._views[name] = dict(zip(("draft", "target"), nest_views(w, self.group_for(w.shape[1]))))
        y = x @ self._views[name][view].T
        bias = self.t.get(name + ".bias")
        return y if bias is None else y + bias


def _logits(dec: Decoder, ids: torch.Tensor, view: str) -> torch.Tensor:
    """Differentiable full-sequence forward (Decoder.forward runs without gradients): ids [T] -> logits [T, V]."""
    x = dec.embed(ids)
    cos, sin = dec.rope(ids.shape[0])
    for layer in range(dec.cfg.num_layers):
        x = dec.block(layer, x, cos, sin, view, causal_attention)
    return dec.final(x, view)


def view_loss(logits: torch.Tensor, ids: torch.Tensor, teacher_logp: Optional[torch.Tensor], loss: str) -> torch.Tensor:
    """Mean per-token loss of logits [T, V]: KL(teacher || model) (`kl`) or next-token cross-entropy (`ce`)."""
    if loss == "ce":
        return F.cross_entropy(logits[:-1], ids[1:])
    logp = torch.log_softmax(logits, dim=-1)                                          # [T, V]
    return (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean()


def cayley_step(r: torch.Tensor, grad: torch.Tensor, momentum: torch.Tensor, lr: float, beta: float) -> torch.Tensor:
    """One Cayley SGD step on the orthogonal group (Li et al. 2020, as SpinQuant); updates `momentum` in place.

    Rule: A = G R^T - R G^T is the skew-symmetric (Riemannian) gradient; M <- beta M + A; with the step
    alpha = min(lr, 1/|M|_F) the Cayley transform R <- (I + alpha/2 M)^-1 (I - alpha/2 M) R stays exactly
    orthogonal and its derivative at alpha = 0, -M R, is a descent direction."""
    a = grad @ r.T - r @ grad.T                                                       # [n, n], skew
    momentum.mul_(beta).add_(a)
    alpha = min(lr, 1.0 / (float(momentum.norm()) + 1e-12))
    eye = torch.eye(r.shape[0], dtype=r.dtype)
    return torch.linalg.solve(eye + 0.5 * alpha * momentum, (eye - 0.5 * alpha * momentum) @ r)


class _Objective:
    """The loss of the rotated, fake-quantized model on one calibration window (and its float teacher)."""

    def __init__(self, t, cfg, group_for, opts: LearnOptions, r4_size):
        self.t32 = {k: v.float() for k, v in t.items()}
        self.cfg, self.group_for, self.opts, self.r4 = cfg, group_for, opts, r4_size
        self.teacher = Decoder(cfg, FloatWeights(self.t32, cfg.tie_word_embeddings), OnlineRotations(r4_size=r4_size))

    def teacher_logp(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """log-probabilities [T, V] of the float model (rotation-free: R1 and R2 do not change its function)."""
        if self.opts.loss != "kl":
            return None
        with torch.no_grad():
            return torch.log_softmax(self.teacher.forward(ids, "target"), dim=-1)

    def __call__(self, r1: torch.Tensor, r2: list[torch.Tensor], windows: list[torch.Tensor],
                 teachers: list) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        store = FakeQuantWeights(apply_r1r2(self.t32, cfg, r1, r2), cfg.tie_word_embeddings, self.group_for)
        dec = Decoder(cfg, store, OnlineRotations(r1=r1, r4_size=self.r4))
        parts = {"draft": 0.0, "target": 0.0}
        total = 0.0
        for ids, tl in zip(windows, teachers):
            for view, w in (("draft", 1.0), ("target", self.opts.target_weight)):
                if w == 0:
                    continue
                lv = view_loss(_logits(dec, ids, view), ids, tl, self.opts.loss) / len(windows)
                total = total + w * lv
                parts[view] += float(lv.detach())
        return total, parts


def learn_rotations(t: dict[str, torch.Tensor], cfg: ModelConfig, r1: torch.Tensor, r2: list[torch.Tensor],
                    calib: torch.Tensor, group_for: Callable[[int], int], opts: LearnOptions,
                    r4_size: Optional[int], log=sys.stderr) -> tuple[torch.Tensor, list[torch.Tensor], dict]:
    """Optimized (R1, [R2]) from the initial ones over the norm-folded (and R4-fused) float64 tensors `t`, and a
    record of the run. Window 0 of `calib` [S, T] is held out: its loss before and after is recorded."""
    t0 = time.time()
    obj = _Objective(t, cfg, group_for, opts, r4_size)
    windows = [w for w in calib[:, : opts.seq_len]]
    held_out, train = windows[0], windows[1:]
    held_teacher = obj.teacher_logp(held_out)
    r1, r2 = r1.double().clone(), [r.double().clone() for r in r2]
    m1, m2 = torch.zeros_like(r1), [torch.zeros_like(r) for r in r2]

    def evaluate() -> dict:
        with torch.no_grad():
            return obj(r1.float(), [r.float() for r in r2], [held_out], [held_teacher])[1]

    before = evaluate()
    curve = []
    for step in range(opts.steps):
        batch = [train[(step * opts.batch + j) % len(train)] for j in range(opts.batch)]
        teachers = [obj.teacher_logp(ids) for ids in batch]
        p1 = r1.float().requires_grad_(True)
        p2 = [r.float().requires_grad_(True) for r in r2]
        loss, parts = obj(p1, p2, batch, teachers)
        loss.backward()
        r1 = cayley_step(r1, p1.grad.double(), m1, opts.lr, opts.momentum)
        r2 = [cayley_step(r, p.grad.double(), m, opts.lr, opts.momentum) for r, p, m in zip(r2, p2, m2)]
        curve.append({k: round(v, 5) for k, v in parts.items()})
        print(f"learned rotation step {step + 1}/{opts.steps}: draft {parts['draft']:.4f} target {parts['target']:.4f} "
              f"({time.time() - t0:.0f} s)", file=log, flush=True)
    after = evaluate()
    orth = float((r1.float().double() @ r1.float().double().T - torch.eye(r1.shape[0], dtype=torch.float64)).abs().max())
    return r1, r2, {"optimizer": "cayley_sgd", "loss": opts.loss, "steps": opts.steps, "samples": opts.samples,
                    "seq_len": opts.seq_len, "batch": opts.batch, "lr": opts.lr, "momentum": opts.momentum,
                    "target_weight": opts.target_weight, "fake_quant": "rtn draft and target views, straight-through",
                    "held_out_before": before, "held_out_after": after, "curve": curve,
                    "r1_orthogonality_error": orth, "seconds": round(time.time() - t0, 1)}
