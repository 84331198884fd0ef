"""The rotation transforms on float weights, each function-preserving: fold RMSNorm weights into the linears that
read them, the initial R1 and per-layer R2 (randomized Hadamards where one exists), fusing R1/R2 into the linears,
and the Hadamard R4 on down_proj. export.rotation.plan plans and applies them; export.rotation.learned trains R1/R2."""

from typing import Iterable, Optional

import torch

from edge.model.arch import ModelConfig
from plugins.hadamard import apply_hadamard, hadamard_factors, online_hadamard_factors, randomized_hadamard

R1_READERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
R1_WRITERS = ("self_attn.o_proj", "mlp.down_proj")


def _layers(cfg: ModelConfig, layers: Optional[Iterable[int]]) -> Iterable[int]:
    """The block indices a transform visits: `layers` (one layer of a streamed export), else every block."""
    return range(cfg.num_layers) if layers is None else layers


def fold_norms(t: dict[str, torch.Tensor], cfg: ModelConfig, layers: Optional[Iterable[int]] = None) -> None:
    """W <- W diag(gamma) for the linears after each block norm (of `layers`, default all); the norm weights become
    ones. The final norm is not folded: the head stays tied and reads the un-rotated stream."""
    for i in _layers(cfg, layers):
        p = f"model.layers.{i}."
        for norm, readers in (("input_layernorm", R1_READERS[:3]), ("post_attention_layernorm", R1_READERS[3:])):
            gamma = t.get(p + norm + ".weight")
            if gamma is None:                  # a part of a block (a streamed export rotates a linear at a time)
                continue
            for r in readers:
                if p + r + ".weight" in t:
                    t[p + r + ".weight"] = t[p + r + ".weight"] * gamma.unsqueeze(0)
            t[p + norm + ".weight"] = torch.ones_like(gamma)


def initial_r1r2(cfg: ModelConfig, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The randomized Hadamard R1 [H, H] (float64 of the stored float32) and R2 [D, D] per layer (float64)."""
    r1 = randomized_hadamard(cfg.hidden_size, seed).float().double()
    return r1, [randomized_hadamard(cfg.head_dim, seed + 1 + i) for i in range(cfg.num_layers)]


def apply_r1r2(t: dict[str, torch.Tensor], cfg: ModelConfig, r1: torch.Tensor, r2: list[torch.Tensor],
               layers: Optional[Iterable[int]] = None) -> dict:
    """The block linears of (norm-folded) `t` (of `layers`, default all) with R1 and R2 fused, as a new dict
    (differentiable in r1, r2).

    R1 (residual): readers W <- W R1, writers W <- R1^T W. R2 (per layer): v_proj rows of each KV head
    W <- R2^T W (bias too), o_proj columns of each head W <- W R2."""
    out = dict(t)
    h, d = cfg.hidden_size, cfg.head_dim
    for i in _layers(cfg, layers):
        p = f"model.layers.{i}."
        for r in (r for r in R1_READERS if p + r + ".weight" in t):     # absent: a part of a block
            out[p + r + ".weight"] = t[p + r + ".weight"] @ r1
        for wr in (wr for wr in R1_WRITERS if p + wr + ".weight" in t):
            out[p + wr + ".weight"] = r1.T @ t[p + wr + ".weight"]
        if p + "self_attn.v_proj.weight" in t:
            wv = out[p + "self_attn.v_proj.weight"].view(cfg.num_kv_heads, d, h)
            out[p + "self_attn.v_proj.weight"] = torch.einsum("ed,hek->hdk", r2[i], wv).reshape(-1, h)
        if p + "self_attn.v_proj.bias" in t:
            out[p + "self_attn.v_proj.bias"] = (t[p + "self_attn.v_proj.bias"].view(-1, d) @ r2[i]).reshape(-1)
        if p + "self_attn.o_proj.weight" in t:
            wo = out[p + "self_attn.o_proj.weight"].view(h, cfg.num_heads, d)
            out[p + "self_attn.o_proj.weight"] = (wo @ r2[i]).reshape(h, -1)
    return out


def apply_r4(t: dict[str, torch.Tensor], cfg: ModelConfig, layers: Optional[Iterable[int]] = None) -> dict:
    """down_proj W <- W H (in place, of `layers`, default all), each row contracted factor by factor (H_n is never
    formed: 8,960^2 float64 would be 642 MB); the record of the online R4 the runtime applies to down_proj inputs.
    H is the Kronecker product of the online rule's factors (plugins.hadamard.online_hadamard_factors: cheap at run
    time), and the record names them: the runtime applies the recorded factors, never a rule of its own."""
    n = cfg.intermediate_size
    factors = online_hadamard_factors(n)
    if factors is None:
        raise ValueError(f"no Hadamard of order {n} (intermediate size) for the online R4: use --rotation r1r2")
    for i in _layers(cfg, layers):
        name = f"model.layers.{i}.mlp.down_proj.weight"
        if name in t:
            t[name] = apply_hadamard(t[name], n, factors)                 # [H, I] @ H_I
    return {"kind": "hadamard", "size": n, "factors": list(factors), "online_sites": ["down_proj_input"]}


def rotation_kind(n: int) -> str:
    """The initial R1/R2 of size n: a randomized Hadamard where one of order n exists, else random orthogonal."""
    return "randomized_hadamard" if hadamard_factors(n) else "random_orthogonal"
