"""Llama-family decoder forward over a weight store (nested views or float), with the manifest's
online rotations applied: R1 at the embedding output and before the final norm, R4 before down_proj."""

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from edge.model.arch import ModelConfig
from edge.model.draft_head import DRAFT_HEAD_SHORTLIST, SHORTLIST_K, head_view, restrict_draft_vocab, shortlist_logits
from plugins.decoder_math import (
    attention,
    gated_r4,
    rms_norm,
    rotate_rows,
)
from plugins.hadamard import check_factors, online_hadamard_factors


class WeightStore(Protocol):
    """What the decoder reads: every linear goes through `linear` with the current view. A store may also have its
    own kernels for some steps (the triton backend has each): `linears(names, x, view)`, the linears that read x as a
    tuple (one launch for q/k/v, one for gate/up); `linear_add(name, x, view, residual)`, residual + linear (the add
    in the GEMV's launch); `gated(names, x, view, r4_size, r4_factors)`, the MLP's silu(gate) * up with R4 applied
    (one launch after gate/up's); `rotate(x, r, transpose)`, an online rotation (R1); `rms_norm(x, name, eps)` and
    `rope(q, k, cos, sin)`, one launch each. Without them the decoder calls `linear` per linear and adds (`_linears`,
    `_linear_add`), applies plugins.decoder_math's gated_r4 (`_gated`), rotate_rows (`_rotate`),
    its rms_norm to `norm(name)` (`_norm`) and `apply_rope` to q and k (`_rope`)."""

    dtype: torch.dtype
    device: Optional[torch.device]                                     # None: the CPU

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...            # [T] -> [T, H]
    def norm(self, name: str) -> torch.Tensor: ...                     # [H]
    def linear(self, name: str, x: torch.Tensor, view: str) -> torch.Tensor: ...  # [M, K] -> [M, N]
    def head(self, x: torch.Tensor, view: str) -> torch.Tensor: ...    # [M, H] -> [M, V]
    # logits [M, K] of the nested head's rows ids[m] for token m, at the target view (the shortlist's re-scoring)
    def head_rows(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor: ...  # [M, H], [M, K] -> [M, K]


@dataclass(frozen=True)
class OnlineRotations:
    """Rotations a backend applies at run time (recorded in the manifest). R4 is the Kronecker product of
    `r4_factors`: a checkpoint passes what its manifest records (edge.model.checkpoint); left out, the online rule
    a new export fuses (plugins.hadamard.online_hadamard_factors), for the export's own passes before any manifest
    exists. A backend applies `r4_factors` and never derives factors from the size itself."""

    r1: Optional[torch.Tensor] = None     # [H, H]: residual stream is x @ r1; undone before the final norm
    r4_size: Optional[int] = None         # Hadamard order applied to down_proj inputs
    r4_factors: Optional[tuple[int, ...]] = None   # orders of its Kronecker factors, first to last

    def __post_init__(self):
        if self.r4_size is None:
            if self.r4_factors is not None:
                raise ValueError("R4 factors without an R4 size")
            return
        factors = online_hadamard_factors(self.r4_size) if self.r4_factors is None else self.r4_factors
        if factors is None:
            raise ValueError(f"no Hadamard construction of order {self.r4_size} for R4")
        object.__setattr__(self, "r4_factors", check_factors(self.r4_size, factors))


def _linears(w: WeightStore, names: tuple, x: torch.Tensor, view: str) -> tuple:
    """The outputs of the linears `names` that read x: the store's `linears` where it has one (the triton backend's
    one launch for the group), else its `linear` for each."""
    many = getattr(w, "linears", None)
    return many(names, x, view) if many is not None else tuple(w.linear(n, x, view) for n in names)


def _linear_add(w: WeightStore, name: str, x: torch.Tensor, view: str, residual: torch.Tensor) -> torch.Tensor:
    """residual + the linear `name` of x: the store's `linear_add` where it has one (the triton backend adds it in
    the GEMV's own launch, the same float32 add), else an add after `linear`."""
    add = getattr(w, "linear_add", None)
    return add(name, x, view, residual) if add is not None else residual + w.linear(name, x, view)


def _gated(w: WeightStore, names: tuple, x: torch.Tensor, view: str, rot: OnlineRotations) -> torch.Tensor:
    """down_proj's input [T, I] from x [T, H]: silu(gate) * up of the linears `names` (gate, up), rotated by R4 where
    the checkpoint records it: the store's `gated` where it has one (the triton backend's one launch), else torch."""
    fused = getattr(w, "gated", None)
    if fused is not None:
        return fused(names, x, view, rot.r4_size, rot.r4_factors)
    return gated_r4(*_linears(w, names, x, view), rot.r4_size, rot.r4_factors)    # [T, I] (@ H)


def _rotate(w: WeightStore, x: torch.Tensor, r: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """x [T, H] @ r (or @ r^T): the store's `rotate` where it has one, else torch's row-wise matmuls."""
    fused = getattr(w, "rotate", None)
    return fused(x, r, transpose) if fused is not None else rotate_rows(x, r, transpose)


def _norm(w: WeightStore, x: torch.Tensor, name: str, eps: float) -> torch.Tensor:
    """RMSNorm of x [T, H] by the store's weight `name`: the store's own kernel where it has one."""
    fused = getattr(w, "rms_norm", None)
    return fused(x, name, eps) if fused is not None else rms_norm(x, w.norm(name), eps)


def _rope(w: WeightStore, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q [Hq, T, D] and k [Hkv, T, D] rotated by position: the store's own kernel where it has one."""
    fused = getattr(w, "rope", None)
    return fused(q, k, cos, sin) if fused is not None else (apply_rope(q, cos, sin), apply_rope(k, cos, sin))


def _rope_attend(w: WeightStore, attend: "Attention", layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Attention [Hq, T, D] of q [Hq, T, D], k, v [Hkv, T, D] with q and k rotated by position: by the attention
    itself where it has `rope_attend` (the triton backend's static passes rotate in the KV write's launch), else by
    `_rope` before it."""
    fused = getattr(attend, "rope_attend", None)
    if fused is not None:
        return fused(layer, q, k, v, cos, sin)
    q, k = _rope(w, q, k, cos, sin)                                   # [Hq, T, D], [Hkv, T, D]
    return attend(layer, q, k, v)


def rope_tables(cfg: ModelConfig, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] for the rotate-half RoPE convention of HF Llama."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # [D/2]
    ang = positions.to(torch.float64).unsqueeze(1) * inv.unsqueeze(0)               # [T, D/2]
    ang = torch.cat((ang, ang), dim=-1)                                             # [T, D]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [Hh, T, D] rotated by position."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class Decoder:
    """Full-sequence causal forward of a Llama/Qwen2 decoder; each linear reads the store at `view`, the head at the
    view `draft_head` gives a pass of that view (edge.model.draft_head; None: a float16 head, read in full)."""

    def __init__(self, cfg: ModelConfig, weights: WeightStore, rotations: OnlineRotations = OnlineRotations(),
                 draft_head: str | None = None, shortlist_k: int = SHORTLIST_K, draft_vocab: int | None = None):
        self.cfg, self.weights, self.rot = cfg, weights, rotations
        self.draft_head, self.shortlist_k, self.draft_vocab = draft_head, shortlist_k, draft_vocab

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.weights.embed(ids)                                   # [T, H]
        if self.rot.r1 is not None:
            x = _rotate(self.weights, x, self.rot.r1)                 # into the rotated residual basis
        return x

    def block(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view: str,
              attend: "Attention") -> torch.Tensor:
        """One decoder block on the residual stream x [T, H]."""
        cfg, w, p = self.cfg, self.weights, f"model.layers.{layer}."
        t = x.shape[0]
        h = _norm(w, x, p + "input_layernorm", cfg.rms_norm_eps)
        q, k, v = _linears(w, (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"), h, view)
        q = q.view(t, cfg.num_heads, cfg.head_dim).transpose(0, 1)                      # [Hq, T, D]
        k = k.view(t, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)                   # [Hkv, T, D]
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        a = _rope_attend(w, attend, layer, q, k, v, cos, sin)         # [Hq, T, D]
        a = a.transpose(0, 1).reshape(t, cfg.num_heads * cfg.head_dim)  # [T, Hq*D]
        x = _linear_add(w, p + "self_attn.o_proj", a, view, x)                        # x + o_proj(a)
        h = _norm(w, x, p + "post_attention_layernorm", cfg.rms_norm_eps)
        g = _gated(w, (p + "mlp.gate_proj", p + "mlp.up_proj"), h, view, self.rot)         # [T, I], R4 applied
        return _linear_add(w, p + "mlp.down_proj", g, view, x)                        # x + down_proj(g)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Residual [T, H] -> the head's input [T, H]: R1 undone, then the final norm."""
        if self.rot.r1 is not None:
            x = _rotate(self.weights, x, self.rot.r1, transpose=True)  # back to the original basis
        return _norm(self.weights, x, "model.norm", self.cfg.rms_norm_eps)

    def final(self, x: torch.Tensor, view: str) -> torch.Tensor:
        """Residual [T, H] -> logits [T, V]."""
        return self.head(self.final_norm(x), view)

    def head(self, h: torch.Tensor, view: str) -> torch.Tensor:
        """The head's logits [T, V] for a pass of `view` on its input h [T, H]: read at the view the draft-head setting
        gives; the shortlist re-scores its base-plane top K at the target view (-inf elsewhere); a draft pass scores
        the draft vocabulary's ids only (-inf past it; this reference computes every row and masks them)."""
        at, w = head_view(self.draft_head, view), self.weights
        vd = self.draft_vocab if view == "draft" else None
        if at != DRAFT_HEAD_SHORTLIST:
            return restrict_draft_vocab(w.head(h, at), vd)
        base = w.head(h, "draft")
        if vd is None:
            return shortlist_logits(base, self.shortlist_k, lambda ids: w.head_rows(h, ids))
        out = torch.full_like(base, float("-inf"))
        out[..., :vd] = shortlist_logits(base[..., :vd], self.shortlist_k, lambda ids: w.head_rows(h, ids))
        return out

    def rope(self, t: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_tables(self.cfg, torch.arange(start, start + t), self.weights.dtype)
        device = self.weights.device
        return (cos, sin) if device is None else (cos.to(device), sin.to(device))

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, view: str, attend: Optional["Attention"] = None, start: int = 0,
                last_only: bool = False, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """ids [T] at positions [start, start + T) -> logits [T, V] ([1, V] with `last_only`).
        Without `attend`, plain causal attention over `ids` alone (no cache). `rope`: the positions' (cos, sin)
        [T, D] already on the weights' device (a pass whose positions live on the device), else computed here."""
        x = self.residual(ids, view, attend, start, rope)
        return self.final(x[-1:] if last_only else x, view)

    @torch.no_grad()
    def residual(self, ids: torch.Tensor, view: str, attend: Optional["Attention"] = None, start: int = 0,
                 rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """ids [T] -> the residual stream [T, H] after the last block (`forward` without the head)."""
        attend = attend or causal_attention
        x = self.embed(ids)
        cos, sin = rope if rope is not None else self.rope(ids.shape[0], start)
        for layer in range(self.cfg.num_layers):
            x = self.block(layer, x, cos, sin, view, attend)
        return x


class Attention(Protocol):
    """Attention of a pass over rotated q, k (and v). One may also have `rope_attend(layer, q, k, v, cos, sin)`, the
    same of q and k before RoPE, which it applies itself (`_rope_attend`)."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a whole sequence over itself (no cache)."""
    return attention(q, k, v, 0)
