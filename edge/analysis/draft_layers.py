"""A shallower draft as a lever on speculation's speed: what the draft view gives up and saves when it skips some
decoder layers (their residual passed on unchanged; the target view still reads every layer, so the output stays the
target's). The draft's cost then falls by the weight bytes of the layers it skips; its acceptance falls by whatever
those layers did for its argmax. Both are measured here, on held-out text, and put together by the rule `auto`
plans with (edge.decode.auto) on this machine's measured pass costs:

- agreement: the share of positions where the draft's argmax equals the target's, teacher-forced on the text
  (the draft as the checkpoint's decode reads it: its draft head and draft vocabulary), for the full draft, for each
  single skipped layer, and along a curve that skips the layers cheapest by that measure first, one more a step;
- draft bytes: the weight bytes a draft pass reads (edge.engine.stats) less the skipped layers' base planes, scales,
  offsets, biases and norms;
- projected speed-up over target decode: speculation's best γ's expected tokens per second at acceptance =
  agreement (each proposal accepted independently, as `auto` assumes), the draft pass's measured time scaled by the
  bytes it still reads (a draft pass streams its weights), over a target step's (below 1, `auto` decodes with the
  target alone).

Real rounds accept in runs (a proposal after an accepted one is likelier accepted), so measured speed-ups run above
the independent model's; the curve is read for its change from the full draft, not for its level. This is analysis: no backend runs a shallower draft, and none will unless a point of the curve wins."""

import sys
import time
from dataclasses import dataclass

import torch

from edge.backends.torch_ref import TorchBackend
from edge.corpora import eval_text
from edge.decode.auto import expected_tokens
from edge.engine.cost_table import CostTable
from edge.engine.costs import MAX_GAMMA
from edge.engine.stats import draft_head_summary, linear_bytes_per_pass, weight_bytes_per_pass
from edge.errors import BitNestError
from edge.llm import LLM
from edge.model.checkpoint import HEAD, Checkpoint, load_checkpoint
from edge.model.decoder import Decoder
from edge.model.tokenizer import load_tokenizer
from plugins.contracts import DRAFT, TARGET

HEAD_ROWS = 128   # positions the head scores at a time


@dataclass(frozen=True)
class DraftLayerOptions:
    checkpoint: str
    corpus: str = "sharegpt"   # held-out text (edge.corpora.eval_text): sharegpt, shakespeare, code or a file
    tokens: int = 1024         # teacher-forced positions (one window: the text's first `tokens` tokens)
    most: int = 6              # layers on the curve (skipped one more a step)
    backend: str = "native"    # the engine whose pass costs are measured (edge.engine.costs, cached per machine)
    gamma_max: int = MAX_GAMMA

    def __post_init__(self):
        if self.tokens < 2 or self.most < 1 or not 1 <= self.gamma_max <= MAX_GAMMA:
            raise ValueError(f"draft-layers needs --tokens >= 2, --most >= 1 and --gamma-max in [1, {MAX_GAMMA}]")


class ShallowDraft(Decoder):
    """The reference decoder whose draft view passes the residual through the layers in `skipped` unchanged."""

    def __init__(self, ckpt: Checkpoint, weights, skipped: frozenset[int] = frozenset()):
        super().__init__(ckpt.config, weights, ckpt.rotations, ckpt.draft_head, ckpt.shortlist_k, ckpt.draft_vocab)
        self.skipped = skipped

    def block(self, layer, x, cos, sin, view, attend):
        if view == DRAFT and layer in self.skipped:
            return x
        return super().block(layer, x, cos, sin, view, attend)


def argmax(dec: Decoder, ids: torch.Tensor, view: str, rows: int = HEAD_ROWS) -> torch.Tensor:
    """ids [T] -> the `view` pass's argmax [T] (causal, no cache), the head run on `rows` positions at a time: its
    [T, V] logits and their copies set the peak (10.8 GB at T = 1,024 on a 151,936-id vocabulary in one go)."""
    h = dec.final_norm(dec.residual(ids, view))                                              # [T, H]
    return torch.cat([dec.head(h[i:i + rows], view).argmax(-1) for i in range(0, h.shape[0], rows)])


def layer_draft_bytes(ckpt: Checkpoint, layer: int) -> int:
    """Bytes a draft pass reads of decoder layer `layer`: its linears' base planes, scales and offsets, its biases and
    norms (as edge.engine.stats counts a pass)."""
    prefix = f"model.layers.{layer}."
    total = sum(linear_bytes_per_pass(spec, DRAFT) for name, spec in ckpt.linears.items()
                if name != HEAD and name.startswith(prefix))
    for name, tensor in ckpt.tensors.items():
        if name.startswith(prefix) and (name.endswith(".bias") or "layernorm" in name):
            total += tensor.numel() * tensor.element_size()
    return total


def projected_speedup(alpha: float, t_draft: float, costs: CostTable, most: int) -> tuple[int, float]:
    """(γ, expected tokens per second over a target step's) for speculation's best γ in 1..`most`: a round of γ
    proposals costs γ·t_draft + t_target(γ + 1) and emits (1 − α^(γ+1)) / (1 − α) tokens (edge.decode.auto's rule;
    `auto` itself takes target steps wherever this is below 1)."""
    rate = lambda g: expected_tokens(alpha, g) / (g * t_draft + costs.target[g])
    g = max(range(1, min(most, len(costs.target) - 1) + 1), key=rate)
    return g, rate(g) * costs.target[0]


def measured_costs(ckpt_path: str, backend: str) -> CostTable:
    """This machine's pass costs on `backend`, as `auto` reads them at load (from the cache where measured before,
    else measured now). The native engine sets torch to one thread for its own (edge.backends.native): restored."""
    threads = torch.get_num_threads()
    llm = LLM(ckpt_path, policy="auto", backend=backend, meter="none")
    try:
        return llm.engine.costs
    finally:
        llm.close()
        torch.set_num_threads(threads)


@torch.no_grad()
def draft_layers(opts: DraftLayerOptions) -> dict:
    """{"full": the full draft, "single": each layer skipped alone, "curve": the cheapest layers skipped together}, each
    with its agreement, draft bytes and projected speed-up (see the module's docstring)."""
    t0 = time.time()
    costs = measured_costs(opts.checkpoint, opts.backend)
    ckpt = load_checkpoint(opts.checkpoint)
    layers = ckpt.config.num_layers
    if opts.most >= layers:
        raise BitNestError(f"--most {opts.most}: the draft of this model keeps at least one of its {layers} layers; "
                           f"use --most {layers - 1} or less")
    ids = torch.tensor(load_tokenizer(ckpt.path)(eval_text(opts.corpus))["input_ids"][: opts.tokens])
    if ids.numel() < 2:
        raise BitNestError(f"corpus {opts.corpus} has fewer than 2 tokens: pass a longer text")
    weights = TorchBackend(ckpt)
    want = argmax(ShallowDraft(ckpt, weights), ids, TARGET)                                  # [T]
    full_bytes = weight_bytes_per_pass(ckpt, DRAFT)
    per_layer = [layer_draft_bytes(ckpt, l) for l in range(layers)]

    done, points = [], 1 + layers + opts.most

    def point(skipped: frozenset[int]) -> dict:
        done.append(skipped)
        print(f"draft-layers: point {len(done)} of {points}, skipping {sorted(skipped) or 'none'}", file=sys.stderr,
              flush=True)
        got = argmax(ShallowDraft(ckpt, weights, skipped), ids, DRAFT)
        alpha = float((got == want).float().mean())
        kept = full_bytes - sum(per_layer[l] for l in skipped)
        gamma, speedup = projected_speedup(alpha, costs.draft * kept / full_bytes, costs, opts.gamma_max)
        return {"skipped": sorted(skipped), "agreement": round(alpha, 4), "draft_bytes": kept,
                "draft_bytes_share": round(kept / full_bytes, 4), "gamma": gamma, "projected_speedup": round(speedup, 4)}

    full = point(frozenset())
    single = [point(frozenset({l})) for l in range(layers)]
    order = sorted(range(layers), key=lambda l: (-single[l]["agreement"], l))
    curve = [point(frozenset(order[:k])) for k in range(1, opts.most + 1)]
    best = max([full] + curve, key=lambda p: p["projected_speedup"])
    return {"checkpoint": str(ckpt.path), "corpus": opts.corpus, "positions": int(ids.numel()), "layers": layers,
            **draft_head_summary(ckpt), "costs": {"backend": opts.backend, **costs.summary()},
            "acceptance_model": "independent proposals at the draft's teacher-forced agreement (edge.decode.auto)",
            "full": full, "single": single, "curve": curve, "best_skipped": best["skipped"],
            "best_vs_full": round(best["projected_speedup"] / full["projected_speedup"], 4),
            "seconds": round(time.time() - t0, 1)}
