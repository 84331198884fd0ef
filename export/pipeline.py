"""The export job: source model -> rotations -> nesting (GPTQ/RTN/top4of8) -> validated nested checkpoint."""

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from edge.errors import BitNestError
from edge.model.checkpoint import EMBED, EMBED_FLOAT16, EMBED_HEAD_TARGET, HEAD, load_checkpoint
from edge.model.decoder import OnlineRotations
from export.calibration import calibration_windows
from export.quantize import QuantOptions, nest_model
from export.learned_rotation import LearnOptions
from export.rotation import RotationPlan, rotate
from edge.model.draft_head import (DRAFT_HEAD_EXPORT_DEFAULT, DRAFT_HEAD_SHORTLIST, SHORTLIST_K, check_draft_head,
                                   check_draft_vocab, check_shortlist_k)
from export.sources import load_source
from export.writer import check_output_dir, nested_tensors, write_checkpoint
from plugins.contracts import FORMAT_VERSION, bits_per_weight

DEFAULT_ROTATION = "r1r2r4"  # measured on SmolLM2-135M: see docs/quality.md


@dataclass(frozen=True)
class ExportOptions:
    """Everything `scripts/export.py` can set."""

    out: str
    model: str = "default"
    rotation: str = DEFAULT_ROTATION
    seed: int = 0
    calib_samples: int = 64
    calib_seq_len: int = 512
    quant: QuantOptions = field(default_factory=QuantOptions)
    learn: LearnOptions = field(default_factory=LearnOptions)   # --rotation learned
    draft_head: str = DRAFT_HEAD_EXPORT_DEFAULT   # recorded in the manifest of a nested head (edge.model.draft_head)
    shortlist_k: int = SHORTLIST_K
    draft_vocab: Optional[int] = None   # the ids the draft scores, [0, N), recorded where set (None: all of them)

    def __post_init__(self):
        check_draft_head(self.draft_head)
        if not isinstance(self.shortlist_k, int) or self.shortlist_k < 1:
            raise ValueError(f"--shortlist-k must be a positive integer, got {self.shortlist_k!r}")
        if self.draft_vocab is not None and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 1):
            raise ValueError(f"--draft-vocab must be a positive integer, got {self.draft_vocab!r}")


def _progress():
    try:
        from tqdm import tqdm
        return tqdm
    except ImportError:
        return lambda it, **kw: it


def _bits(codes) -> dict:
    """Stored bits per weight: linear layers alone, and everything stored (embeddings, norms, head...)."""
    linear_bits = sum(c.q4.numel() * bits_per_weight(c.group_size, c.offset is not None) for c in codes.values())
    linear_n = sum(c.q4.numel() for c in codes.values())
    return {"linear": linear_bits / linear_n}


def default_checkpoint_path(opts: "ExportOptions | None" = None) -> Path:
    """Where a model's export with every default option lives: $BITNEST_CACHE/checkpoints/STEM-KEY, STEM
    `smollm2-135m-instruct-bitnest` for the embedded default model and `PRESET-bitnest` for a packaged preset, KEY a
    digest of every export option (of `opts`, else the defaults), so a cached export made under other defaults (a
    float16 head until issue 21) is never reused as the default after a default changed."""
    from edge.cache import cache_root
    opts = opts or ExportOptions(out="")
    settings = asdict(opts)
    settings.pop("out")
    if settings["draft_vocab"] is None:   # added after exports were keyed: their keys stay what they were
        settings.pop("draft_vocab")
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    stem = "smollm2-135m-instruct-bitnest" if opts.model == "default" else f"{opts.model}-bitnest"
    return cache_root() / "checkpoints" / f"{stem}-{key}"


def default_draft_vocab(model: str, step_graph: bool = False, nested_head: bool = True) -> Optional[int]:
    """The draft vocabulary an export of `model` records unless told otherwise: a packaged preset's own measured
    choice, else None (every id); none where the export also writes the step graph, which does not serve one, or
    keeps a float16 head, which both views read whole."""
    from edge.model.packaged import PACKAGED_MODELS
    if step_graph or not nested_head or model not in PACKAGED_MODELS:
        return None
    return PACKAGED_MODELS[model].draft_vocab


def default_draft_head(model: str, step_graph: bool = False) -> str:
    """What an export of `model` records as its draft head unless told otherwise: a packaged preset's own measured
    choice, else DRAFT_HEAD_EXPORT_DEFAULT; an export that also writes the step graph (--onnx, --engine) records the
    8-bit head where the preset's choice is the shortlist, which the graph does not serve."""
    from edge.model.packaged import PACKAGED_MODELS
    head = PACKAGED_MODELS[model].draft_head if model in PACKAGED_MODELS else DRAFT_HEAD_EXPORT_DEFAULT
    return DRAFT_HEAD_EXPORT_DEFAULT if step_graph and head == DRAFT_HEAD_SHORTLIST else head


def default_export_options(model: str = "default") -> ExportOptions:
    """The options of `model`'s default export (every default, the preset's draft head), its `out` left empty."""
    return ExportOptions(out="", model=model, draft_head=default_draft_head(model),
                         draft_vocab=default_draft_vocab(model))


def ensure_default_checkpoint(model: str = "default") -> Path:
    """The export of `model` (`default` or a packaged preset) with every default option, made first if it is absent
    (once: a few minutes for the default model, ~16 min on 2 cores for qwen2.5-coder-0.5b)."""
    from edge.model.checkpoint import is_checkpoint_dir
    from edge.model.packaged import PACKAGED_MODELS
    if model != "default" and model not in PACKAGED_MODELS:
        raise BitNestError(f"--model {model}: not a model preset: use default or {', '.join(PACKAGED_MODELS)} "
                           "(or --checkpoint DIR of an export)")
    opts = default_export_options(model)
    path = default_checkpoint_path(opts)
    if not is_checkpoint_dir(path):
        print(f"exporting the {model} model to {path} (once, minutes)...", file=sys.stderr)
        run_export(replace(opts, out=str(path)))
    return path


def run_export(opts: ExportOptions) -> dict:
    """Export and validate one checkpoint; returns the summary the command prints."""
    t0 = time.time()
    out = Path(opts.out)
    check_output_dir(out)  # fail before minutes of work
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = load_source(opts.model)
    cfg = src.config
    if opts.quant.quantize_head:
        check_shortlist_k(opts.shortlist_k, cfg.vocab_size)
        check_draft_vocab(opts.draft_vocab, cfg.vocab_size,
                          opts.shortlist_k if opts.draft_head == DRAFT_HEAD_SHORTLIST else 1)
    elif opts.draft_vocab is not None:
        raise ValueError("--draft-vocab sets what the draft reads of a nested head: drop it or drop --head float16")
    for k in {k for n, (_, k) in cfg.linear_shapes().items()}:
        opts.quant.group_for(k)
    plan = RotationPlan(opts.rotation, opts.seed, opts.learn)
    tok = None
    if opts.quant.method == "bitnest" or plan.learned:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(src.folder)
    rot_calib = calibration_windows(tok, plan.learn.samples, plan.learn.seq_len) if plan.learned else None
    rotated, rot_record, extra = rotate(src.tensors, cfg, plan, rot_calib, opts.quant.group_for)
    rotated = {k: v.float() for k, v in rotated.items()}
    rotations = OnlineRotations(r1=extra.get("rotation.r1"), r4_size=rot_record["r4_size"])
    calib = None
    if opts.quant.method == "bitnest":
        calib = calibration_windows(tok, opts.calib_samples, opts.calib_seq_len)
    codes = nest_model(rotated, cfg, rotations, opts.quant, calib, progress=_progress())
    tensors = nested_tensors(codes)
    skip = {n + ".weight" for n in codes}
    for name, t in rotated.items():
        if name not in skip and not name.startswith("rotation."):
            tensors[name] = t.to(torch.float16)
    embedding = EMBED_FLOAT16
    if HEAD in codes:
        tensors.pop("lm_head.weight", None)
        if cfg.tie_word_embeddings:   # the embedding rows are read from the head's planes: no float16 copy
            tensors.pop(EMBED)
            embedding = EMBED_HEAD_TARGET
    for name, t in extra.items():
        tensors[name] = t.float()
    manifest = {
        "format": "bitnest-nested",
        "format_version": FORMAT_VERSION,
        "config": cfg.to_dict(),
        "method": opts.quant.method,
        "refine": opts.quant.refine if opts.quant.method == "bitnest" else "closed",
        "quant": asdict(opts.quant),
        "head": "nested" if HEAD in codes else "float16",
        "embedding": embedding,
        **({"draft_head": opts.draft_head, "shortlist_k": opts.shortlist_k} if HEAD in codes else {}),
        **({"draft_vocab": opts.draft_vocab} if HEAD in codes and opts.draft_vocab is not None else {}),
        "linears": {n: {"shape": list(c.q4.shape), "group_size": c.group_size, "offset": c.offset is not None}
                    for n, c in codes.items()},
        "rotation": rot_record,
        "calibration": None if calib is None else {"corpus": "sharegpt", "samples": opts.calib_samples,
                                                    "seq_len": opts.calib_seq_len},
        "source": {"model": opts.model, "folder": str(src.folder)},
        "activations": "per-token symmetric int8 on quantized-activation backends (docs/contracts.md, activations)",
        "export": {"seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads()},
    }
    write_checkpoint(out, tensors, manifest, src.tokenizer_files())
    load_checkpoint(out)  # the written artifact must read back and validate
    total_bytes = sum(t.numel() * t.element_size() for n, t in tensors.items())
    n_params = sum(t.numel() for n, t in src.tensors.items())
    return {
        "checkpoint": str(out),
        "method": opts.quant.method,
        "refine": manifest["refine"],
        "rotation": opts.rotation,
        "head": manifest["head"],
        **({"draft_head": opts.draft_head} if HEAD in codes else {}),
        "bits_per_weight": {**_bits(codes), "total": 8.0 * total_bytes / n_params},
        "bytes": total_bytes,
        "seconds": round(time.time() - t0, 1),
    }
