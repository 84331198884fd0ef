"""Function-preserving rotations (QuaRot/SpinQuant style, no training): fold RMSNorm weights into the
linears that read them, fuse a randomized Hadamard R1 on the residual stream, a per-head R2 between
v_proj and o_proj, and an online Hadamard R4 before down_proj (the runtime applies the online parts)."""

from dataclasses import dataclass

import torch

from edge.model.arch import ModelConfig
from edge.model.checkpoint import R1_TENSOR
from plugins.hadamard import hadamard_factors, hadamard_matrix, randomized_hadamard

ROTATIONS = ("none", "r1r2", "r1r2r4", "r4")


@dataclass(frozen=True)
class RotationPlan:
    """Which rotations to fuse; `seed` fixes R1 and derives one R2 seed per layer."""

    kind: str = "none"
    seed: int = 0

    def __post_init__(self):
        if self.kind not in ROTATIONS:
            raise ValueError(f"unknown rotation {self.kind!r}: use one of {', '.join(ROTATIONS)}")

    @property
    def r1r2(self) -> bool:
        return self.kind.startswith("r1r2")

    @property
    def r4(self) -> bool:
        return self.kind.endswith("r4")


def _fold_norms(t: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """W <- W diag(gamma) for the linears after each block norm; the norm weights become ones.
    The final norm is not folded: the head stays tied and reads the un-rotated stream."""
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for norm, readers in (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                              ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))):
            gamma = t[p + norm + ".weight"]
            for r in readers:
                t[p + r + ".weight"] = t[p + r + ".weight"] * gamma.unsqueeze(0)
            t[p + norm + ".weight"] = torch.ones_like(gamma)


def rotate(tensors: dict[str, torch.Tensor], cfg: ModelConfig, plan: RotationPlan):
    """Return (rotated float64 tensors, manifest record, extra tensors to store) for `plan`.

    R1 (residual, [H, H]): readers W <- W R1, writers W <- R1^T W; the runtime computes
    x = embed(ids) @ R1 and undoes it (x @ R1^T) before the final norm, so the tied embedding is stored once.
    R2 (per layer, [D, D]): v_proj rows of each KV head W <- R2^T W (bias too), o_proj columns of each
    head W <- W R2. R4 ([I, I] Hadamard): down_proj W <- W H, runtime g <- g H before down_proj.
    """
    t = {k: v.double() for k, v in tensors.items()}
    record = {"kind": plan.kind, "seed": plan.seed, "norms_folded": False, "r1": None, "r2": None, "r4_size": None}
    extra = {}
    h, d = cfg.hidden_size, cfg.head_dim
    if plan.r1r2:
        _fold_norms(t, cfg)
        r1 = randomized_hadamard(h, plan.seed).float().double()  # fuse exactly the stored float32 R1
        record["norms_folded"] = True
        record["r1"] = {"kind": "randomized_hadamard" if hadamard_factors(h) else "random_orthogonal",
                        "size": h, "seed": plan.seed, "tensor": R1_TENSOR,
                        "online_sites": ["embedding_output", "final_norm_input_inverse"]}
        record["r2"] = {"kind": "randomized_hadamard" if hadamard_factors(d) else "random_orthogonal",
                        "size": d, "seeds": [plan.seed + 1 + i for i in range(cfg.num_layers)]}
        extra[R1_TENSOR] = r1.float()
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            for r in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
                t[p + r + ".weight"] = t[p + r + ".weight"] @ r1
            for wr in ("self_attn.o_proj", "mlp.down_proj"):
                t[p + wr + ".weight"] = r1.T @ t[p + wr + ".weight"]
            r2 = randomized_hadamard(d, plan.seed + 1 + i)
            wv = t[p + "self_attn.v_proj.weight"].view(cfg.num_kv_heads, d, h)
            t[p + "self_attn.v_proj.weight"] = torch.einsum("ed,hek->hdk", r2, wv).reshape(-1, h)
            if p + "self_attn.v_proj.bias" in t:
                t[p + "self_attn.v_proj.bias"] = (t[p + "self_attn.v_proj.bias"].view(-1, d) @ r2).reshape(-1)
            wo = t[p + "self_attn.o_proj.weight"].view(h, cfg.num_heads, d)
            t[p + "self_attn.o_proj.weight"] = (wo @ r2).reshape(h, -1)
        # the embedding keeps its original basis: R1 is applied online after the lookup
    if plan.r4:
        n = cfg.intermediate_size
        if hadamard_factors(n) is None:
            raise ValueError(f"no Hadamard of order {n} (intermediate size) for the online R4: use --rotation r1r2")
        hm = hadamard_matrix(n)
        record["r4_size"] = n
        record["r4"] = {"kind": "hadamard", "size": n, "factors": list(hadamard_factors(n)),
                        "online_sites": ["down_proj_input"]}
        for i in range(cfg.num_layers):
            name = f"model.layers.{i}.mlp.down_proj.weight"
            t[name] = t[name] @ hm
    return t, record, extra
