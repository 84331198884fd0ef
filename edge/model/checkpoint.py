"""Nested checkpoint reader (docs/contracts.md, weights): the manifest and its files checked (edge.model.manifest), then
the tensors read and their names, dtypes and shapes validated into a Checkpoint."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from edge.errors import BitNestError, CheckpointError
from edge.model.arch import ARCHITECTURES, BLOCK_LINEARS, BLOCK_NORMS, ModelConfig
from edge.model.decoder import OnlineRotations
from edge.model.draft_head import (
    DRAFT_HEAD_SHORTLIST,
    DRAFT_HEAD_UNRECORDED,
    SHORTLIST_K,
    check_draft_head,
    check_draft_vocab,
    check_shortlist_k,
    head_view,
)
from edge.model.manifest import MANIFEST, read_manifest, verify_files, weight_files
from edge.model.tensor_file import read_tensors
from plugins.hadamard import check_factors, hadamard_factors

R1_TENSOR = "rotation.r1"
HEAD = "lm_head"
EMBED = "model.embed_tokens.weight"
# Where the input embedding rows come from (manifest field "embedding", absent = float16): the float16 tensor
# EMBED, or the rows of the nested tied head at the target view, (16 q4 + qr) s/16, with no float16 copy.
EMBED_FLOAT16, EMBED_HEAD_TARGET = "float16", "head_target"
EMBEDDINGS = (EMBED_FLOAT16, EMBED_HEAD_TARGET)
# What a load reads of the weights (docs/contracts.md, weights: loading the base planes only): `nested`, every tensor
# (both views); `base`, the 4-bit model the draft view reads and nothing else: no refinement plane but those the
# draft itself reads (the head's, where the draft head reads it at 8 bits or the embedding comes from it).
WEIGHTS_NESTED, WEIGHTS_BASE = "nested", "base"
WEIGHT_SETS = (WEIGHTS_NESTED, WEIGHTS_BASE)


@dataclass(frozen=True)
class LinearSpec:
    """One nested linear: shape [N, K], group size, and whether it carries a per-group offset (top4of8)."""

    shape: tuple[int, int]
    group_size: int
    offset: bool = False


@dataclass
class Checkpoint:
    """A validated nested checkpoint, tensors loaded (planes stay packed).

    `draft_head` is what the draft pass reads of a nested head (edge.model.draft_head: `8bit`, `4bit` or
    `shortlist`; None for a float16 head) and `shortlist_k` the rows the shortlist re-scores: the manifest's
    (`draft_head` absent: `4bit`), or a runtime's override (`set_draft_head`) made before any engine is built;
    `draft_vocab` the ids the draft scores, [0, draft_vocab) (None: all). Every engine reads these three attributes
    and nothing else."""

    path: Path
    manifest: dict[str, Any]
    config: ModelConfig
    linears: dict[str, LinearSpec]
    tensors: dict[str, torch.Tensor]
    rotations: OnlineRotations
    draft_head: Optional[str] = None
    shortlist_k: int = SHORTLIST_K
    weights: str = WEIGHTS_NESTED
    draft_vocab: Optional[int] = None

    def __post_init__(self):
        if self.draft_head is None and self.head_nested:    # built in memory (edge.memory.synthetic): as a manifest
            self.draft_head = self.manifest.get("draft_head", DRAFT_HEAD_UNRECORDED)

    @property
    def method(self) -> str:
        return self.manifest["method"]

    @property
    def has_target(self) -> bool:
        """Both views run: the refinement planes were loaded (False: `--weights base`, the draft view only)."""
        return self.weights == WEIGHTS_NESTED

    @property
    def head_nested(self) -> bool:
        return HEAD in self.linears

    @property
    def embedding_from_head(self) -> bool:
        """The input embedding is read from the nested head's planes at the target view (no float16 copy)."""
        return self.manifest.get("embedding", EMBED_FLOAT16) == EMBED_HEAD_TARGET

    def planes(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(base, refine, scale, offset-or-None) of one nested linear."""
        t = self.tensors
        return t[name + ".base"], t.get(name + ".refine"), t[name + ".scale"], t.get(name + ".offset")


def draft_reads_refine(manifest: dict[str, Any], linear: str) -> bool:
    """Whether the draft view reads the refinement plane of `linear`: only a nested head's, where the draft head reads
    it at 8 bits (`8bit`, `shortlist`) or the input embedding is its target view (manifest `embedding` head_target).
    Every other refinement plane is the target's alone."""
    if linear != HEAD or manifest.get("head") != "nested":
        return False
    return manifest.get("embedding", EMBED_FLOAT16) == EMBED_HEAD_TARGET or \
        head_view(manifest.get("draft_head", DRAFT_HEAD_UNRECORDED), "draft") != "draft"


def check_weights(weights: str) -> str:
    """`weights` if it names what a load reads (WEIGHT_SETS), else the one-line error naming them."""
    if weights not in WEIGHT_SETS:
        raise BitNestError(f"unknown weights {weights!r}: use one of {', '.join(WEIGHT_SETS)}")
    return weights


def expected_linears(cfg: ModelConfig, manifest: dict[str, Any]) -> list[str]:
    names = [f"model.layers.{i}.{s}" for i in range(cfg.num_layers) for s in BLOCK_LINEARS]
    return names + ([HEAD] if manifest.get("head") == "nested" else [])


def _read_weights(path: Path, files: list[str], wanted, digests: Optional[dict[str, str]] = None
                  ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Every tensor of the weight `files` that `wanted(name)` accepts (None: all), and the bytes of those left unread; a
    tensor in two files is a defect. Each tensor is read by positioned reads straight into its own buffer: no file is
    mapped, so the load holds the weights once (a mapped file's touched pages would count as resident beside the
    copies until it is closed: +1 GB at Llama-3-8B's head or embedding shard). With `digests` ({file: sha256}; only
    with wanted None) each file is checked against its digest as it is read: every byte is read once."""
    tensors, skipped = {}, {}
    for name in files:
        got, skip = read_tensors(path / name, wanted or (lambda _: True), digests and digests[name])
        twice = (set(got) | set(skip)) & (set(tensors) | set(skipped))
        if twice:
            raise CheckpointError(f"{path}: tensor {sorted(twice)[0][:80]} is in two weight files: re-export it")
        tensors.update(got)
        skipped.update(skip)
    return tensors, skipped


def _linear_specs(cfg: ModelConfig, m: dict[str, Any]) -> dict[str, LinearSpec]:
    specs = {}
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
    for name in expected_linears(cfg, m):
        entry = m["linears"].get(name)
        if entry is None:
            raise CheckpointError(f"manifest lists no entry for linear {name}: re-export the checkpoint")
        shape = entry.get("shape") if isinstance(entry, dict) else None
        g = entry.get("group_size") if isinstance(entry, dict) else None
        offset = entry.get("offset", False) if isinstance(entry, dict) else None
        if not (isinstance(shape, list) and len(shape) == 2 and all(is_int(v) and v > 0 for v in shape)
                and is_int(g) and isinstance(offset, bool)):
            raise CheckpointError(f"manifest entry of linear {name} is malformed ({str(entry)[:80]}): re-export the "
                                  "checkpoint")
        n, k = shape
        if g <= 0 or k % g or k % 2:
            raise CheckpointError(f"{name}: group size {g} does not divide K={k} (or K is odd): re-export the checkpoint")
        specs[name] = LinearSpec((n, k), g, offset)
    return specs


def _rotations(m: dict[str, Any], tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> OnlineRotations:
    """The online rotations the manifest records. R4's Kronecker factors are the recorded `rotation.r4.factors`
    (what the export multiplied down_proj by), or, where a manifest records none, the legacy rule's
    (plugins.hadamard.hadamard_factors); never the online rule of this version, which may differ."""
    rot = m["rotation"]
    r4 = rot.get("r4_size")
    if r4 is not None and (not isinstance(r4, int) or isinstance(r4, bool) or r4 != cfg.intermediate_size):
        raise CheckpointError(f"manifest rotation r4_size {r4!r} is not the intermediate size "
                              f"{cfg.intermediate_size}: re-export the checkpoint")
    factors = None
    if r4 is not None:
        record = rot.get("r4")
        factors = record.get("factors") if isinstance(record, dict) else None
        if factors is None:
            factors = hadamard_factors(r4)
            if factors is None:
                raise CheckpointError(f"manifest rotation r4 records no factors and order {r4} has no legacy "
                                      "construction: re-export the checkpoint")
        try:
            factors = check_factors(r4, factors)
        except ValueError as e:
            raise CheckpointError(f"manifest rotation r4: {e}: re-export the checkpoint") from None
    return OnlineRotations(r1=tensors.get(R1_TENSOR) if rot.get("r1") else None, r4_size=r4, r4_factors=factors)


def _check_tensor(tensors, name, dtype, shape):
    t = tensors.get(name)
    if t is None:
        raise CheckpointError(f"the checkpoint's weights lack tensor {name}: re-export the checkpoint")
    if t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise CheckpointError(
            f"tensor {name} is {t.dtype} {tuple(t.shape)}, expected {dtype} {tuple(shape)}: re-export the checkpoint"
        )


def _check_embedding(cfg: ModelConfig, tensors: dict[str, torch.Tensor], m: dict[str, Any]) -> None:
    """The float16 embedding, or (embedding `head_target`) a nested tied head and no float16 copy beside it."""
    kind = m.get("embedding", EMBED_FLOAT16)
    if kind not in EMBEDDINGS:
        raise CheckpointError(f"manifest embedding {kind!r} is not one of {', '.join(EMBEDDINGS)}: re-export it")
    if kind == EMBED_FLOAT16:
        _check_tensor(tensors, EMBED, torch.float16, (cfg.vocab_size, cfg.hidden_size))
        return
    if m.get("head") != "nested" or not cfg.tie_word_embeddings:
        raise CheckpointError("embedding head_target needs a nested head tied to the embedding: re-export the checkpoint")
    if EMBED in tensors:
        raise CheckpointError(f"embedding head_target, yet the weights hold a float16 {EMBED} beside the head's "
                              "planes: re-export the checkpoint")


def validate_tensors(cfg: ModelConfig, specs: dict[str, LinearSpec], tensors: dict[str, torch.Tensor], m,
                     weights: str = WEIGHTS_NESTED) -> None:
    """Names, dtypes and shapes of every tensor against the config and linear specs (`base`: of the tensors such a
    load reads; a refinement plane it leaves out is checked in the file's header instead)."""
    for name, s in specs.items():
        n, k = s.shape
        _check_tensor(tensors, name + ".base", torch.uint8, (n, k // 2))
        if weights == WEIGHTS_NESTED or draft_reads_refine(m, name):
            _check_tensor(tensors, name + ".refine", torch.uint8, (n, k // 2))
        _check_tensor(tensors, name + ".scale", torch.float16, (n, k // s.group_size))
        if s.offset:
            _check_tensor(tensors, name + ".offset", torch.float16, (n, k // s.group_size))
    shapes = cfg.linear_shapes()
    for name, s in specs.items():
        short = name.split(".", 3)[-1] if name != HEAD else None
        want = shapes[short] if short else (cfg.vocab_size, cfg.hidden_size)
        if s.shape != want:
            raise CheckpointError(f"{name} has shape {s.shape}, the model config implies {want}: re-export the checkpoint")
    h = cfg.hidden_size
    _check_embedding(cfg, tensors, m)
    _check_tensor(tensors, "model.norm.weight", torch.float16, (h,))
    for i in range(cfg.num_layers):
        for norm in BLOCK_NORMS:
            _check_tensor(tensors, f"model.layers.{i}.{norm}.weight", torch.float16, (h,))
    if m.get("head") == "float16" and not cfg.tie_word_embeddings:
        _check_tensor(tensors, "lm_head.weight", torch.float16, (cfg.vocab_size, h))
    if m["rotation"].get("r1"):
        _check_tensor(tensors, R1_TENSOR, torch.float32, (h, h))


def _draft_head(cfg: ModelConfig, m: dict[str, Any]) -> tuple[Optional[str], int, Optional[int]]:
    """(draft head, shortlist size, draft vocabulary) the manifest records: None for a float16 head, `4bit` where a
    nested head's manifest predates the field, the whole vocabulary (None) where it records none."""
    if m.get("head") != "nested":
        if "draft_head" in m or "shortlist_k" in m or "draft_vocab" in m:
            raise CheckpointError("the manifest sets a draft head but the head is float16: re-export the checkpoint")
        return None, SHORTLIST_K, None
    try:
        draft_head = check_draft_head(m.get("draft_head", DRAFT_HEAD_UNRECORDED))
        k = check_shortlist_k(m.get("shortlist_k", SHORTLIST_K), cfg.vocab_size)
        return draft_head, k, check_draft_vocab(m.get("draft_vocab"), cfg.vocab_size, _shortlist_rows(draft_head, k))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"manifest: {str(e)[:120]}: re-export the checkpoint") from None


def runs_as_recorded(ckpt: Checkpoint) -> bool:
    """Whether `ckpt` runs the draft head and draft vocabulary its manifest records (no set_draft_head override of
    either)."""
    head, _, vocab = _draft_head(ckpt.config, ckpt.manifest)
    return ckpt.draft_head == head and ckpt.draft_vocab == vocab


def _shortlist_rows(draft_head: Optional[str], shortlist_k: int) -> int:
    """Rows a draft vocabulary must hold for this setting: the shortlist's K, else 1."""
    return shortlist_k if draft_head == DRAFT_HEAD_SHORTLIST else 1


def set_draft_head(ckpt: Checkpoint, draft_head: Optional[str] = None, shortlist_k: Optional[int] = None,
                   draft_vocab: Optional[int] = None) -> Checkpoint:
    """Override what the draft reads of the head (before any engine is built from `ckpt`); None keeps the
    manifest's. BitNestError in one line for a float16 head or a bad value."""
    if draft_head is None and shortlist_k is None and draft_vocab is None:
        return ckpt
    if not ckpt.head_nested:
        raise BitNestError(f"--draft-head (as --shortlist-k, --draft-vocab) needs a nested LM head, and {ckpt.path} "
                           "has a float16 head (both views read "
                           "it in full): export the checkpoint with the nested head (the default)")
    if draft_head is not None and HEAD + ".refine" not in ckpt.tensors and head_view(draft_head, "draft") != "draft":
        raise BitNestError(f"--draft-head {draft_head} reads the head's refinement plane, which --weights base did not "
                           f"load from {ckpt.path}: use --draft-head 4bit, or --weights nested")
    try:
        ckpt.draft_head = check_draft_head(draft_head) if draft_head is not None else ckpt.draft_head
        ckpt.shortlist_k = check_shortlist_k(shortlist_k, ckpt.config.vocab_size) if shortlist_k is not None \
            else ckpt.shortlist_k
        ckpt.draft_vocab = check_draft_vocab(draft_vocab if draft_vocab is not None else ckpt.draft_vocab,
                                             ckpt.config.vocab_size, _shortlist_rows(ckpt.draft_head, ckpt.shortlist_k))
    except ValueError as e:
        raise BitNestError(str(e)) from None
    return ckpt


def _unread_planes(specs: dict[str, LinearSpec], skipped: dict[str, int], path: Path) -> None:
    """A `base` load left out exactly the refinement planes, each of the size its linear's spec implies."""
    for name, s in specs.items():
        if name + ".refine" in skipped and skipped[name + ".refine"] != s.shape[0] * s.shape[1] // 2:
            raise CheckpointError(f"tensor {name}.refine in {path} is not [{s.shape[0]}, {s.shape[1] // 2}] uint8: "
                                  "re-export the checkpoint")
    extra = sorted(n for n in skipped if not n.endswith(".refine") or n[:-len(".refine")] not in specs)
    if extra:
        raise CheckpointError(f"{path} holds {extra[0][:80]}, which this checkpoint's manifest does not describe: "
                              "re-export the checkpoint")


def check_checkpoint(path) -> int:
    """Validate a checkpoint folder as `load_checkpoint` does (manifest, every file's sha256, every tensor's name,
    dtype and shape from the shards' headers) without holding any tensor: what an exporter checks its artifact with,
    in the memory of one file read at a time. Returns the bytes of its tensors."""
    from edge.model.tensor_file import read_header
    path = Path(path)
    m = read_manifest(path)
    files = weight_files(path, m)
    verify_files(path, m)
    cfg = _config(path, m)
    specs = _linear_specs(cfg, m)
    _draft_head(cfg, m)
    tensors = {}
    for name in files:
        with open(path / name, "rb", buffering=0) as f:
            entries, _ = read_header(f, path / name)
        twice = set(entries) & set(tensors)
        if twice:
            raise CheckpointError(f"{path}: tensor {sorted(twice)[0][:80]} is in two weight files: re-export it")
        tensors.update({n: torch.empty(shape, dtype=dtype, device="meta") for n, (dtype, shape, _, _) in entries.items()})
    validate_tensors(cfg, specs, tensors, m)
    _rotations(m, tensors, cfg)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _config(path: Path, m: dict[str, Any]) -> ModelConfig:
    """The manifest's model config, checked: known architecture, a head the reader knows."""
    try:
        cfg = ModelConfig.from_dict(m["config"])
    except (TypeError, KeyError, BitNestError) as e:
        raise CheckpointError(f"{path}/{MANIFEST} has an invalid model config ({str(e)[:160]}): re-export it")
    if m.get("head", "float16") not in ("float16", "nested"):
        raise CheckpointError(f"{path}/{MANIFEST}: unknown head {m.get('head')!r}: re-export it")
    if cfg.architecture not in ARCHITECTURES:
        raise CheckpointError(f"{path}: unknown architecture {cfg.architecture!r}")
    return cfg


def load_checkpoint(path, verify: bool = True, weights: str = WEIGHTS_NESTED) -> Checkpoint:
    """Read and validate a nested checkpoint folder; raises CheckpointError (one line) on any defect.

    `weights` `base` reads the base planes and what the draft view reads besides (norms, scales, offsets, biases,
    the embedding, the head as the draft reads it) and never a refinement plane it does not read: each tensor is
    read by byte range (edge.model.tensor_file), and the weights file's sha256 is not checked, since that would
    read every byte; its header, the tensors' shapes and the other files' hashes are. `nested` checks each weight
    file's sha256 as it reads it (one read of every byte)."""
    from safetensors import SafetensorError

    path = Path(path)
    check_weights(weights)
    m = read_manifest(path)
    files = weight_files(path, m)
    if verify:   # the weight files' sha256 is checked as they are read (nested), or not at all (base: by byte range)
        verify_files(path, m, skip=tuple(files))
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing {missing[0]}: re-export it")
    cfg = _config(path, m)
    specs = _linear_specs(cfg, m)
    draft_head, shortlist_k, draft_vocab = _draft_head(cfg, m)
    try:
        if weights == WEIGHTS_BASE:
            tensors, skipped = _read_weights(path, files, lambda n: not n.endswith(".refine") or
                                             draft_reads_refine(m, n[:-len(".refine")]))
            _unread_planes(specs, skipped, path)
        else:
            tensors, _ = _read_weights(path, files, None, {f: m["files"][f] for f in files} if verify else None)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}'s weights cannot be read ({str(e).splitlines()[0][:120]}): re-export it")
    validate_tensors(cfg, specs, tensors, m, weights)
    return Checkpoint(path, m, cfg, specs, tensors, _rotations(m, tensors, cfg), draft_head, shortlist_k, weights,
                      draft_vocab)
