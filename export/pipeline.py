"""The export job: source model -> rotations -> nesting (GPTQ/RTN/top4of8) -> validated nested checkpoint."""

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from edge.errors import BitNestError
from edge.model.arch import ModelConfig
from edge.model.checkpoint import EMBED_FLOAT16, EMBED_HEAD_TARGET, HEAD, R1_TENSOR, check_checkpoint
from edge.model.decoder import OnlineRotations
from export.calibration import calibration_windows
from export.export_plan import HEAD_BLOCK_ROWS, available_bytes, check_plan, plan_export
from export.quantize import LayerNester, QuantOptions
from export.rotation.learned import LearnOptions
from export.rotation.plan import RotationPlan, plan_rotations
from export.source_spec import resolve_spec
from export.stages import block_stage, embed_stage, head_stage
from export.workdir import JOB, PROGRESS, WorkFolder, work_folder
from edge.model.draft_head import (DRAFT_HEAD_EXPORT_DEFAULT, DRAFT_HEAD_SHORTLIST, DRAFT_HEAD_SOURCE_DEFAULT,
                                   SHORTLIST_K, check_draft_head, check_draft_vocab, check_shortlist_k,
                                   graph_draft_head)
from export.sources import load_source, open_source
from export.writer import assemble_checkpoint, check_output_dir
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
    head_block_rows: int = HEAD_BLOCK_ROWS   # rows of the head / embedding handled at a time (memory, not result)
    device: str = "auto"                  # where GPTQ and the calibration passes run: auto | cpu | cuda

    def __post_init__(self):
        check_draft_head(self.draft_head)
        if not isinstance(self.shortlist_k, int) or self.shortlist_k < 1:
            raise ValueError(f"--shortlist-k must be a positive integer, got {self.shortlist_k!r}")
        if self.draft_vocab is not None and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 1):
            raise ValueError(f"--draft-vocab must be a positive integer, got {self.draft_vocab!r}")
        if not isinstance(self.head_block_rows, int) or self.head_block_rows < 1:
            raise ValueError(f"--head-block-rows must be a positive integer, got {self.head_block_rows!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")


def _progress():
    try:
        from tqdm import tqdm
        return tqdm
    except ImportError:
        return lambda it, **kw: it


def default_checkpoint_path(opts: "ExportOptions | None" = None) -> Path:
    """Where a model's export with every default option lives: $BITNEST_CACHE/checkpoints/STEM-KEY, STEM
    `smollm2-135m-instruct-bitnest` for the embedded default model and `PRESET-bitnest` for a packaged preset, KEY a
    digest of every export option (of `opts`, else the defaults), so a cached export made under other defaults (a
    float16 head until issue 21) is never reused as the default after a default changed."""
    from edge.cache import cache_root
    opts = opts or ExportOptions(out="")
    settings = asdict(opts)
    for key in ("out", "head_block_rows", "device"):   # how the work is done, not what it makes
        settings.pop(key)
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
    choice; DRAFT_HEAD_EXPORT_DEFAULT for the default model; DRAFT_HEAD_SOURCE_DEFAULT (the shortlist) for a model
    from its own files. An export that also writes the step graph (--onnx, --engine) records what the graph serves of
    it (graph_draft_head: the 8-bit head for the shortlist)."""
    from edge.model.packaged import PACKAGED_MODELS
    if model in PACKAGED_MODELS:
        head = PACKAGED_MODELS[model].draft_head
    else:
        head = DRAFT_HEAD_EXPORT_DEFAULT if model == "default" else DRAFT_HEAD_SOURCE_DEFAULT
    return graph_draft_head(head) if step_graph else head


def default_export_options(model: str = "default") -> ExportOptions:
    """The options of `model`'s default export (every default, the preset's draft head), its `out` left empty."""
    return ExportOptions(out="", model=model, draft_head=default_draft_head(model),
                         draft_vocab=default_draft_vocab(model))


def ensure_default_checkpoint(model: str = "default") -> Path:
    """The export of `model` (`default` or a packaged preset) with every default option, made first if it is absent
    (once: a few minutes for the default model, ~16 min on 2 cores for qwen2.5-coder-0.5b)."""
    from edge.model.manifest import is_checkpoint_dir
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


def _job(opts: ExportOptions, src) -> dict:
    """What makes two runs the same export (a resumed run must match the one it carries on): every option that
    changes the result, the source file and its size and mtime, the format version."""
    settings = asdict(opts)
    for key in ("out", "device"):
        settings.pop(key)
    path = resolve_spec(opts.model)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) + [path / "config.json"]
    return {"options": settings, "source": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
            "format_version": FORMAT_VERSION, "threads": torch.get_num_threads()}


def _device(choice: str) -> Optional[torch.device]:
    """--device: None for the CPU (the export's tensors stay where they are), else a CUDA device."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return None
    if not torch.cuda.is_available():
        raise BitNestError("--device cuda: torch sees no CUDA GPU here: use --device cpu (or auto)")
    return torch.device("cuda")


def _peak_rss() -> int:
    """This process's peak resident bytes so far (VmHWM of /proc/self/status; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_export(opts: ExportOptions) -> dict:
    """Export and validate one checkpoint, one decoder block at a time from the source to its shard (resumable: the
    same command carries on from the last finished stage); returns the summary the command prints."""
    t0 = time.time()
    out = Path(opts.out)
    check_output_dir(out)  # fail before minutes of work
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = open_source(opts.model)
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
    sequential = opts.quant.method == "bitnest"
    views = 2 if sequential and opts.quant.refine == "gptq" else 1
    memory = plan_export(cfg, opts.calib_samples, opts.calib_seq_len, views, sequential, opts.quant.quantize_head,
                         opts.head_block_rows)
    if plan.learned:   # learning R1/R2 reads the whole float model (float64) at once
        whole = sum(math.prod(src.shape(n)) for n in src.names()) * 8 * 3
        memory = replace(memory, block=max(memory.block, whole))
    print(f"export plan: peak {memory.peak / (1 << 30):.2f} GiB resident (streams {memory.streams / (1 << 30):.2f}, "
          f"largest block {memory.block / (1 << 30):.2f}, head {memory.head / (1 << 30):.2f})", file=sys.stderr)
    check_plan(memory, available_bytes())
    device = _device(opts.device)
    tok = None
    if sequential or plan.learned:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(src.folder)
    rot_calib = calibration_windows(tok, plan.learn.samples, plan.learn.seq_len) if plan.learned else None
    whole_model = load_source(opts.model).tensors if plan.learned else None
    rot_record, r1, r2, extra = plan_rotations(cfg, plan, whole_model, rot_calib, opts.quant.group_for)
    del whole_model
    rotations = OnlineRotations(r1=extra.get(R1_TENSOR), r4_size=rot_record["r4_size"])
    calib = calibration_windows(tok, opts.calib_samples, opts.calib_seq_len) if sequential else None
    nester = LayerNester(cfg, rotations, opts.quant, device)
    wd = WorkFolder(work_folder(out), _job(opts, src))
    resumed = wd.open()
    if resumed:
        print(f"resuming the export in {wd.path}: {len(resumed)} stage(s) already finished", file=sys.stderr)
    nested_head = opts.quant.quantize_head
    store_embedding = not (nested_head and cfg.tie_word_embeddings)   # else read from the head's planes
    if not wd.done("embed"):
        embed_stage(src, wd, nester, rotations, extra, store_embedding, calib, opts.head_block_rows)
    seconds = []
    todo = [i for i in range(cfg.num_layers) if not wd.done(f"layer-{i:03d}")]
    if todo and sequential:
        nester.streams = wd.streams()
    for layer in _progress()(todo, desc="layers", file=sys.stderr, unit="layer"):
        t = time.time()
        block_stage(src, wd, nester, plan, r1, r2, layer)
        seconds.append(round(time.time() - t, 1))
    if not wd.done("head"):
        if sequential and not nester.streams:
            nester.streams = wd.streams()
        head_stage(src, wd, nester, nested_head, opts.head_block_rows)
    manifest = {
        "format": "bitnest-nested",
        "format_version": FORMAT_VERSION,
        "config": cfg.to_dict(),
        "method": opts.quant.method,
        "refine": opts.quant.refine if opts.quant.method == "bitnest" else "closed",
        "quant": asdict(opts.quant),
        "head": "nested" if nested_head else "float16",
        "embedding": EMBED_FLOAT16 if store_embedding else EMBED_HEAD_TARGET,
        **({"draft_head": opts.draft_head, "shortlist_k": opts.shortlist_k} if nested_head else {}),
        **({"draft_vocab": opts.draft_vocab} if nested_head and opts.draft_vocab is not None else {}),
        "linears": _linear_records(cfg, opts.quant),
        "rotation": rot_record,
        "calibration": None if calib is None else {"corpus": "sharegpt", "samples": opts.calib_samples,
                                                    "seq_len": opts.calib_seq_len},
        "source": {"model": opts.model, "path": str(resolve_spec(opts.model).resolve()), "folder": str(src.folder)},
        "activations": "per-token symmetric int8 on quantized-activation backends (docs/contracts.md, activations)",
        "export": {"streamed": True, "threads": torch.get_num_threads()},
    }
    tokenizer = src.tokenizer_files()
    n_params = sum(math.prod(src.shape(n)) for n in src.names())
    src.close()
    wd.drop_streams()
    assemble_checkpoint(wd.path, out, wd.files(), manifest, tokenizer, drop=(JOB, PROGRESS))
    total_bytes = check_checkpoint(out)  # the written artifact must validate (its headers: no tensor is held)
    return {
        "checkpoint": str(out),
        "method": opts.quant.method,
        "refine": manifest["refine"],
        "rotation": opts.rotation,
        "head": manifest["head"],
        **({"draft_head": opts.draft_head} if nested_head else {}),
        "bits_per_weight": {"linear": _linear_bits(cfg, opts.quant), "total": 8.0 * total_bytes / n_params},
        "bytes": total_bytes,
        "layers": cfg.num_layers,
        "resumed_stages": len(resumed),
        "seconds_per_layer": seconds,
        "memory": {"planned_peak": memory.peak, "measured_peak": _peak_rss(), "plan": memory.to_dict()},
        "seconds": round(time.time() - t0, 1),
    }


def _linear_records(cfg: ModelConfig, quant: QuantOptions) -> dict:
    """The manifest's `linears`: shape, group size and offset of every nested linear (the head included)."""
    shapes = {f"model.layers.{i}.{s}": nk for i in range(cfg.num_layers) for s, nk in cfg.linear_shapes().items()}
    if quant.quantize_head:
        shapes[HEAD] = (cfg.vocab_size, cfg.hidden_size)
    return {n: {"shape": list(nk), "group_size": quant.group_for(nk[1]), "offset": quant.method == "top4of8"}
            for n, nk in shapes.items()}


def _linear_bits(cfg: ModelConfig, quant: QuantOptions) -> float:
    """Stored bits per weight of the nested linears."""
    recs = _linear_records(cfg, quant).values()
    n = sum(math.prod(r["shape"]) for r in recs)
    return sum(math.prod(r["shape"]) * bits_per_weight(r["group_size"], r["offset"]) for r in recs) / n
