"""Nested checkpoints built in memory from a model config alone: random planes (memory checks at shapes
no export reaches here) or meta tensors (the planner's dry runs). Never written to disk."""

from pathlib import Path

import torch

from edge.model.arch import BLOCK_NORMS, ModelConfig
from edge.model.checkpoint import EMBED_HEAD_TARGET, HEAD, Checkpoint, LinearSpec, draft_reads_refine, expected_linears
from edge.model.decoder import OnlineRotations
from edge.model.draft_head import DRAFT_HEAD_EXPORT_DEFAULT
from plugins.contracts import group_size_for


def synthetic_checkpoint(cfg: ModelConfig, device: str = "meta", seed: int = 0, head_nested: bool = False,
                         draft_head: str | None = None, weights: str = "nested") -> Checkpoint:
    """A checkpoint of `cfg`'s shapes (docs/contracts.md, weights tensors, canonical dtypes): on "meta", shapes only; on
    "cpu" (or "cuda", made there: no host copy of a 7B model), random planes and scales (a model that computes
    garbage at the real byte counts). `weights` `base`: as a `--weights base` load, without the refinement planes the
    draft does not read."""
    gen = torch.Generator(device=device if device != "meta" else "cpu").manual_seed(seed)
    on = {} if device == "meta" else {"device": device}
    manifest = {"method": "synthetic", "head": "nested" if head_nested else "float16", "rotation": {}}
    from_head = head_nested and cfg.tie_word_embeddings     # as an export: the embedding read from the head's planes
    if from_head:
        manifest["embedding"] = EMBED_HEAD_TARGET
    if head_nested and draft_head is not None:
        manifest["draft_head"] = draft_head
    specs, tensors = {}, {}

    def make(shape, dtype, fill):
        if device == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        return fill(shape).to(dtype)

    shapes = cfg.linear_shapes()
    for name in expected_linears(cfg, manifest):
        n, k = shapes[name.split(".", 3)[-1]] if name != HEAD else (cfg.vocab_size, cfg.hidden_size)
        g = group_size_for(k)
        specs[name] = LinearSpec((n, k), g)
        both = weights == "nested" or draft_reads_refine(manifest, name)
        for plane in (".base", ".refine") if both else (".base",):
            tensors[name + plane] = make((n, k // 2), torch.uint8,
                                         lambda s: torch.randint(0, 256, s, dtype=torch.uint8, generator=gen, **on))
        if device != "meta" and both:   # the symmetric nest's rule (qr >= 0 where q4 = -8): the 8-bit code fits int8
            base, refine = tensors[name + ".base"], tensors[name + ".refine"]
            refine &= ~(((base & 0x0F) == 0x08).to(torch.uint8) * 0x08 | ((base & 0xF0) == 0x80).to(torch.uint8) * 0x80)
        tensors[name + ".scale"] = make((n, k // g), torch.float16,
                                        lambda s: torch.rand(s, generator=gen, **on) * 1e-3 + 1e-4)
        if cfg.attention_bias and name.endswith(("q_proj", "k_proj", "v_proj")):
            tensors[name + ".bias"] = make((n,), torch.float16, lambda s: torch.zeros(s, **on))
    h = cfg.hidden_size
    rand = lambda s: torch.randn(s, generator=gen, **on) * 0.02
    if not from_head:
        tensors["model.embed_tokens.weight"] = make((cfg.vocab_size, h), torch.float16, rand)
    if not cfg.tie_word_embeddings and not head_nested:
        tensors["lm_head.weight"] = make((cfg.vocab_size, h), torch.float16, rand)
    ones = lambda s: torch.ones(s, **on)
    tensors["model.norm.weight"] = make((h,), torch.float16, ones)
    for i in range(cfg.num_layers):
        for norm in BLOCK_NORMS:
            tensors[f"model.layers.{i}.{norm}.weight"] = make((h,), torch.float16, ones)
    return Checkpoint(Path(f"<synthetic {device}>"), manifest, cfg, specs, tensors, OnlineRotations(), weights=weights)


R4_LAYOUTS = ("online", "legacy", "none")   # R4 of a synthetic checkpoint: the online rule's factors, the legacy's, none


def with_online_rotations(ckpt: Checkpoint, r4: str = "online", seed: int = 0) -> Checkpoint:
    """`ckpt` (random planes, on any device: R1 is made on the CPU and a backend moves it with the tensors) with the
    online rotations a default export (`--rotation r1r2r4`) records: a random orthogonal R1 [H, H] float32 (applied
    at the embedding and undone before the head) and R4 of the intermediate size with the online rule's factors
    (plugins.hadamard.online_hadamard_factors; `legacy`: the legacy rule's, as checkpoints exported before issue 34
    record them; `none`: no R4), so a pass costs what a real export's does. The weights are random either way."""
    from dataclasses import replace

    from edge.model.checkpoint import R1_TENSOR
    from plugins.hadamard import hadamard_factors, online_hadamard_factors, random_orthogonal
    if r4 not in R4_LAYOUTS:
        raise ValueError(f"unknown R4 layout {r4!r}: use one of {', '.join(R4_LAYOUTS)}")
    cfg, n = ckpt.config, ckpt.config.intermediate_size
    factors = None if r4 == "none" else (online_hadamard_factors(n) if r4 == "online" else hadamard_factors(n))
    if r4 != "none" and factors is None:
        raise ValueError(f"the {r4} rule has no Hadamard of order {n}")
    r1 = random_orthogonal(cfg.hidden_size, seed).float()                             # [H, H]
    record = {"r1": {"kind": "random_orthogonal", "size": cfg.hidden_size, "seed": seed, "tensor": R1_TENSOR},
              "r4_size": None if factors is None else n}
    if factors is not None:
        record["r4"] = {"kind": "hadamard", "size": n, "factors": list(factors), "online_sites": ["down_proj_input"]}
    return replace(ckpt, manifest=dict(ckpt.manifest, rotation=record), tensors=dict(ckpt.tensors, **{R1_TENSOR: r1}),
                   rotations=OnlineRotations(r1=r1, r4_size=None if factors is None else n, r4_factors=factors))


def exported_shapes(cfg: ModelConfig, device: str = "meta", weights: str = "nested") -> Checkpoint:
    """`synthetic_checkpoint` with the head as the default export writes it (export.quantize.QuantOptions: the head
    nested, the embedding read from it where tied, the draft head DRAFT_HEAD_EXPORT_DEFAULT): what the planner and
    its check count for a model known by its shapes alone."""
    return synthetic_checkpoint(cfg, device, head_nested=True, draft_head=DRAFT_HEAD_EXPORT_DEFAULT, weights=weights)
