"""Function-preserving rotations (QuaRot/SpinQuant style): fold RMSNorm weights into the linears that read them,
fuse R1 on the residual stream and a per-head R2 between v_proj and o_proj, and an online Hadamard R4 before
down_proj (the runtime applies the online parts). R1 and R2 are randomized Hadamards, or learned from them
(`learned`: export.rotation.learned)."""

from dataclasses import dataclass, field
from typing import Optional

import torch

from edge.model.arch import ModelConfig
from edge.model.checkpoint import R1_TENSOR
from export.rotation.learned import LearnOptions, learn_rotations
from export.rotation.ops import R1_READERS, apply_r1r2, apply_r4, fold_norms, initial_r1r2, rotation_kind

ROTATIONS = ("none", "r1r2", "r1r2r4", "r4", "learned")


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


def plan_rotations(cfg: ModelConfig, plan: RotationPlan, tensors: Optional[dict[str, torch.Tensor]] = None,
                   calib: Optional[torch.Tensor] = None, group_for=None):
    """(manifest record, R1 [H, H] float64 or None, R2 per layer or None, extra tensors to store) of `plan`.

    Only the learned kind reads the model: `tensors` (the whole float model), calibration windows `calib` [S, T] and
    `group_for(K)`, the draft's group size; every other kind is made from the config and the seed."""
    record = {"kind": plan.kind, "seed": plan.seed, "norms_folded": False, "r1": None, "r2": None, "r4_size": None}
    extra, r1, r2 = {}, None, None
    h, d = cfg.hidden_size, cfg.head_dim
    if plan.r4:
        record["r4"] = apply_r4({}, cfg)
        record["r4_size"] = record["r4"]["size"]
    if plan.r1r2:
        record["norms_folded"] = True
        r1, r2 = initial_r1r2(cfg, plan.seed)
        record["r1"] = {"kind": rotation_kind(h), "size": h, "seed": plan.seed, "tensor": R1_TENSOR,
                        "online_sites": ["embedding_output", "final_norm_input_inverse"]}
        record["r2"] = {"kind": rotation_kind(d), "size": d,
                        "seeds": [plan.seed + 1 + i for i in range(cfg.num_layers)]}
        if plan.learned:
            if tensors is None or calib is None or group_for is None:
                raise ValueError("a learned rotation needs the model, calibration windows and the draft's group size")
            t = {k: v.double() for k, v in tensors.items()}
            if plan.r4:
                apply_r4(t, cfg)
            fold_norms(t, cfg)
            r1, r2, training = learn_rotations(t, cfg, r1, r2, calib, group_for, plan.learn, record["r4_size"])
            r1 = r1.float().double()                                   # fuse exactly the stored float32 R1
            r2 = [r.detach() for r in r2]
            for key in ("r1", "r2"):
                record[key] = dict(record[key], kind="learned", init=record[key]["kind"])
            record["learning"] = training
        extra[R1_TENSOR] = r1.float()
        # the embedding keeps its original basis: R1 is applied online after the lookup
    return record, r1, r2, extra


def rotate_block(t: dict[str, torch.Tensor], cfg: ModelConfig, plan: RotationPlan, r1, r2, layer: int) -> dict:
    """Block `layer`'s tensors `t` (float, HF names, this block only) with `plan`'s rotations fused, float32: one
    linear at a time in float64 (at Llama-3-8B's shapes a whole block in float64 is 1.75 GB, one down_proj 0.47 GB),
    its norm folded in (the norms become ones)."""
    out = dict(t)
    p = f"model.layers.{layer}."
    norm_of = {r: "input_layernorm" if r.startswith("self_attn") else "post_attention_layernorm" for r in R1_READERS}
    for name in [n for n in t if n.endswith(".weight") and "layernorm" not in n]:
        short = name[len(p):-len(".weight")]
        part = {name: t[name].double()}
        bias = name[:-len(".weight")] + ".bias"
        if bias in t:
            part[bias] = t[bias].double()
        if plan.r4:
            apply_r4(part, cfg, [layer])
        if plan.r1r2:
            if short in norm_of:
                part[p + norm_of[short] + ".weight"] = t[p + norm_of[short] + ".weight"].double()
                fold_norms(part, cfg, [layer])
            part = apply_r1r2(part, cfg, r1, r2, [layer])
        out[name] = part[name].float()
        if bias in part:
            out[bias] = part[bias].float()
    if plan.r1r2:
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[p + norm + ".weight"] = torch.ones_like(t[p + norm + ".weight"], dtype=torch.float32)
    return out


def rotate(tensors: dict[str, torch.Tensor], cfg: ModelConfig, plan: RotationPlan,
           calib: Optional[torch.Tensor] = None, group_for=None):
    """Return (rotated float32 tensors, manifest record, extra tensors to store) for `plan`, the whole model at once
    (an export rotates block by block: `plan_rotations` then `rotate_block`).

    The runtime computes x = embed(ids) @ R1 and undoes it (x @ R1^T) before the final norm, so the tied
    embedding is stored once. R4 ([I, I] Hadamard): down_proj W <- W H, runtime g <- g H before down_proj.
    The learned kind needs calibration windows `calib` [S, T] and `group_for(K)`, the draft's group size."""
    record, r1, r2, extra = plan_rotations(cfg, plan, tensors, calib, group_for)
    out = {k: v.float() for k, v in tensors.items()}
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        block = {k: v for k, v in out.items() if k.startswith(p)}
        out.update(rotate_block(block, cfg, plan, r1, r2, layer))
    return out, record, extra
