"""Function-preserving rotations (QuaRot/SpinQuant style): fold RMSNorm weights into the linears that read them,
fuse R1 on the residual stream and a per-head R2 between v_proj and o_proj, and an online Hadamard R4 before
down_proj (the runtime applies the online parts). R1 and R2 are randomized Hadamards, or learned from them
(`learned`: export.learned_rotation)."""

from dataclasses import dataclass, field
from typing import Optional

import torch

from edge.model.arch import ModelConfig
from edge.model.checkpoint import R1_TENSOR
from plugins.hadamard import hadamard_factors, hadamard_matrix, randomized_hadamard

ROTATIONS = ("none", "r1r2", "r1r2r4", "r4", "learned")
R1_READERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
R1_WRITERS = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class LearnOptions:
    """Cayley SGD of R1 and the per-layer R2 (export.learned_rotation): `steps` updates, each on `batch` of
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


@dataclass(frozen=True)
class RotationPlan:
    """Which rotations to fuse; `seed` fixes R1 and derives one R2 seed per layer (the learned kind starts there)."""

    kind: str = "none"
    seed: int = 0
    learn: LearnOptions = field(default_factory=LearnOptions)

    def __post_init__(self):
        if self.kind not in ROTATIONS:
            raise ValueError(f"unknown rotation {self.kind!r}: use one of {', '.join(ROTATIONS)}")

    @property
    def r1r2(self) -> bool:
        return self.kind.startswith("r1r2") or self.learned

    @property
    def r4(self) -> bool:
        return self.kind.endswith("r4") or self.learned

    @property
    def learned(self) -> bool:
        return self.kind == "learned"


def fold_norms(t: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """W <- W diag(gamma) for the linears after each block norm; the norm weights become ones.
    The final norm is not folded: the head stays tied and reads the un-rotated stream."""
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for norm, readers in (("input_layernorm", R1_READERS[:3]), ("post_attention_layernorm", R1_READERS[3:])):
            gamma = t[p + norm + ".weight"]
            for r in readers:
                t[p + r + ".weight"] = t[p + r + ".weight"] * gamma.unsqueeze(0)
            t[p + norm + ".weight"] = torch.ones_like(gamma)


def initial_r1r2(cfg: ModelConfig, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The randomized Hadamard R1 [H, H] (float64 of the stored float32) and R2 [D, D] per layer (float64)."""
    r1 = randomized_hadamard(cfg.hidden_size, seed).float().double()
    return r1, [randomized_hadamard(cfg.head_dim, seed + 1 + i) for i in range(cfg.num_layers)]


def apply_r1r2(t: dict[str, torch.Tensor], cfg: ModelConfig, r1: torch.Tensor, r2: list[torch.Tensor]) -> dict:
    """The block linears of (norm-folded) `t` with R1 and R2 fused, as a new dict (differentiable in r1, r2).

    R1 (residual): readers W <- W R1, writers W <- R1^T W. R2 (per layer): v_proj rows of each KV head
    W <- R2^T W (bias too), o_proj columns of each head W <- W R2."""
    out = dict(t)
    h, d = cfg.hidden_size, cfg.head_dim
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for r in R1_READERS:
            out[p + r + ".weight"] = t[p + r + ".weight"] @ r1
        for wr in R1_WRITERS:
            out[p + wr + ".weight"] = r1.T @ t[p + wr + ".weight"]
        wv = out[p + "self_attn.v_proj.weight"].view(cfg.num_kv_heads, d, h)
        out[p + "self_attn.v_proj.weight"] = torch.einsum("ed,hek->hdk", r2[i], wv).reshape(-1, h)
        if p + "self_attn.v_proj.bias" in t:
            out[p + "self_attn.v_proj.bias"] = (t[p + "self_attn.v_proj.bias"].view(-1, d) @ r2[i]).reshape(-1)
        wo = out[p + "self_attn.o_proj.weight"].view(h, cfg.num_heads, d)
        out[p + "self_attn.o_proj.weight"] = (wo @ r2[i]).reshape(h, -1)
    return out


def apply_r4(t: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """down_proj W <- W H (in place); the record of the online R4 the runtime applies to down_proj inputs."""
    n = cfg.intermediate_size
    if hadamard_factors(n) is None:
        raise ValueError(f"no Hadamard of order {n} (intermediate size) for the online R4: use --rotation r1r2")
    hm = hadamard_matrix(n).to(next(iter(t.values())).dtype)
    for i in range(cfg.num_layers):
        name = f"model.layers.{i}.mlp.down_proj.weight"
        t[name] = t[name] @ hm
    return {"kind": "hadamard", "size": n, "factors": list(hadamard_factors(n)), "online_sites": ["down_proj_input"]}


def _kind(n: int) -> str:
    return "randomized_hadamard" if hadamard_factors(n) else "random_orthogonal"


def rotate(tensors: dict[str, torch.Tensor], cfg: ModelConfig, plan: RotationPlan,
           calib: Optional[torch.Tensor] = None, group_for=None):
    """Return (rotated float64 tensors, manifest record, extra tensors to store) for `plan`.

    The runtime computes x = embed(ids) @ R1 and undoes it (x @ R1^T) before the final norm, so the tied
    embedding is stored once. R4 ([I, I] Hadamard): down_proj W <- W H, runtime g <- g H before down_proj.
    The learned kind needs calibration windows `calib` [S, T] and `group_for(K)`, the draft's group size."""
    t = {k: v.double() for k, v in tensors.items()}
    record = {"kind": plan.kind, "seed": plan.seed, "norms_folded": False, "r1": None, "r2": None, "r4_size": None}
    extra = {}
    h, d = cfg.hidden_size, cfg.head_dim
    if plan.r4:
        record["r4"] = apply_r4(t, cfg)
        record["r4_size"] = record["r4"]["size"]
    if plan.r1r2:
        fold_norms(t, cfg)
        record["norms_folded"] = True
        r1, r2 = initial_r1r2(cfg, plan.seed)
        record["r1"] = {"kind": _kind(h), "size": h, "seed": plan.seed, "tensor": R1_TENSOR,
                        "online_sites": ["embedding_output", "final_norm_input_inverse"]}
        record["r2"] = {"kind": _kind(d), "size": d, "seeds": [plan.seed + 1 + i for i in range(cfg.num_layers)]}
        if plan.learned:
            from export.learned_rotation import learn_rotations
            if calib is None or group_for is None:
                raise ValueError("a learned rotation needs calibration windows and the draft's group size")
            r1, r2, training = learn_rotations(t, cfg, r1, r2, calib, group_for, plan.learn, record["r4_size"])
            r1 = r1.float().double()                                   # fuse exactly the stored float32 R1
            for key in ("r1", "r2"):
                record[key] = dict(record[key], kind="learned", init=record[key]["kind"])
            record["learning"] = training
        t = apply_r1r2(t, cfg, r1, r2)
        extra[R1_TENSOR] = r1.float()
        # the embedding keeps its original basis: R1 is applied online after the lookup
    return t, record, extra
