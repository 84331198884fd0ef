"""Quality of the nested views: perplexity of the float reference, the draft view and the target view on
held-out text, and teacher-forced draft/target argmax agreement. A draft reading the shortlist head is scored
through the 8-bit head it re-scores with (`draft_ppl_head`; its own logits are -inf past its K rows), its
agreement through the shortlist itself."""

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from edge.backends import make_backend
from edge.backends.torch_ref import TorchBackend
from edge.corpora import CORPORA, eval_text
from edge.engine.stats import draft_head_summary
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint, load_checkpoint, set_draft_head
from edge.model.arch import ModelConfig
from edge.model.decoder import Decoder
from edge.model.draft_head import DRAFT_HEAD_8BIT, DRAFT_HEAD_SHORTLIST, head_view
from edge.model.float_store import FloatWeights
from edge.model.hf_folder import load_hf_folder
from edge.model.tokenizer import load_tokenizer


ReferenceLoader = Callable[[str], tuple[ModelConfig, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class EvalOptions:
    checkpoint: str
    corpora: tuple[str, ...] = CORPORA
    tokens: int = 8192
    window: int = 1024
    act_int8: bool = False
    reference: str | None = None   # the float reference's source; default: the model the checkpoint was exported from
    with_reference: bool = True    # False: views only (a caller that already has the reference's figures)
    backend: str = "torch"         # torch (reference semantics, activations per act_int8) or cpu
    draft_head: str | None = None  # what the draft reads of a nested head (None: the checkpoint's setting)
    shortlist_k: int | None = None
    reference_loader: ReferenceLoader | None = field(default=None, compare=False)   # see reference_decoder

    def __post_init__(self):
        if self.tokens < 2 or self.window < 2:
            raise ValueError("--tokens and --window must be at least 2")


def reference_decoder(ckpt: Checkpoint, reference: str | None, loader: ReferenceLoader | None = None) -> Decoder:
    """Decoder over the float source model the checkpoint was exported from (`reference`: another source). `loader`
    (spec -> config, float32 tensors) reads any source the export reads (a GGUF, a preset, an HF folder; the `bitnest`
    command hands it in from the export's readers); without one, only an HF folder with safetensors weights."""
    source = ckpt.manifest.get("source", {})
    spec = reference or source.get("path") or source.get("model")
    if loader is not None and spec:
        cfg, tensors = loader(spec)
    else:
        folder = Path(reference or source.get("folder", ""))
        if not (folder / "config.json").is_file():
            raise BitNestError(f"float reference {folder} is gone: re-run the export or pass --reference HF_FOLDER")
        src = load_hf_folder(folder, str(folder))
        cfg, tensors = src.config, src.tensors
    return Decoder(cfg, FloatWeights(tensors, cfg.tie_word_embeddings))


def _windows(ids: torch.Tensor, window: int):
    for start in range(0, ids.numel() - 1, window):
        chunk = ids[start:start + window]
        if chunk.numel() >= 2:
            yield chunk


def _scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(summed negative log-likelihood of targets [T-1], argmax [T-1]) of logits [T, V]."""
    return F.cross_entropy(logits[:-1].float(), targets, reduction="sum").item(), logits[:-1].argmax(-1)


def _draft_scores(nested: Decoder, chunk: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The draft's (NLL, argmax): for the shortlist, whose logits are -inf past its K rows (an infinite perplexity by
    construction), the NLL through the 8-bit head it re-scores its rows with, from the same residual, and the argmax
    (its agreement) through the shortlist itself; one [T, V] tensor alive at a time."""
    if nested.draft_head != DRAFT_HEAD_SHORTLIST:
        return _scores(nested.forward(chunk, "draft"), targets)
    h = nested.final_norm(nested.residual(chunk, "draft"))
    nll, _ = _scores(nested.weights.head(h, head_view(DRAFT_HEAD_8BIT, "draft")), targets)
    return nll, nested.head(h, "draft")[:-1].argmax(-1)


@torch.no_grad()
def evaluate(opts: EvalOptions) -> dict:
    """{"ppl": {"reference"|"draft"|"target": {corpus: x}}, "agreement": {corpus: x}, ...}."""
    t0 = time.time()
    ckpt = set_draft_head(load_checkpoint(opts.checkpoint), opts.draft_head, opts.shortlist_k)
    ckpt.draft_vocab = None   # perplexity and agreement of the views over every id: a draft vocabulary shapes the
    # proposals of a decode (the ids past it are -inf: the draft's perplexity would be infinite), not the model
    tok = load_tokenizer(ckpt.path)
    weights = TorchBackend(ckpt, act_int8=opts.act_int8) if opts.backend == "torch" \
        else make_backend(opts.backend, ckpt)
    nested = Decoder(ckpt.config, weights, ckpt.rotations, ckpt.draft_head, ckpt.shortlist_k)
    ref = reference_decoder(ckpt, opts.reference, opts.reference_loader) if opts.with_reference else None
    ppl = {"reference": {}, "draft": {}, "target": {}} if ref else {"draft": {}, "target": {}}
    agreement, target_vs_ref, counted = {}, {}, {}
    for corpus in opts.corpora:
        ids = torch.tensor(tok(eval_text(corpus))["input_ids"][: opts.tokens], dtype=torch.long)
        nll = {k: 0.0 for k in ppl}
        agree = tref = n = 0
        for chunk in _windows(ids, opts.window):
            targets = chunk[1:]
            # {view: (NLL, argmax)}: each view's logits [T, V] scored and dropped before the next view's are made
            scores = {"draft": _draft_scores(nested, chunk, targets),
                      "target": _scores(nested.forward(chunk, "target"), targets)}
            if ref is not None:
                scores["reference"] = _scores(ref.forward(chunk, "target"), targets)
            for k, (loss, _) in scores.items():
                nll[k] += loss
            am = {k: argmax for k, (_, argmax) in scores.items()}
            agree += int((am["draft"] == am["target"]).sum())
            if ref is not None:
                tref += int((am["target"] == am["reference"]).sum())
            n += targets.numel()
        for k in ppl:
            ppl[k][corpus] = round(math.exp(nll[k] / n), 4)
        agreement[corpus] = round(agree / n, 4)
        if ref is not None:
            target_vs_ref[corpus] = round(tref / n, 4)
        counted[corpus] = n
    return {"checkpoint": str(ckpt.path), "method": ckpt.method, "refine": ckpt.manifest.get("refine"),
            "rotation": ckpt.manifest["rotation"]["kind"], "backend": opts.backend, **draft_head_summary(ckpt),
            "draft_ppl_head": DRAFT_HEAD_8BIT if ckpt.draft_head == DRAFT_HEAD_SHORTLIST else ckpt.draft_head,
            "activations": getattr(weights, "activations", "float32"),
            "ppl": ppl, "agreement": agreement, "target_reference_agreement": target_vs_ref,
            "tokens": counted, "window": opts.window, "seconds": round(time.time() - t0, 1)}
