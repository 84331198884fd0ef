"""Transient memory of one pass (docs/memory.md workspace): the passes that end at the last position of a
context, the GPU kernels' buffer formula, and a dry run of this runtime's torch path on meta tensors."""

from dataclasses import dataclass, replace

import torch

from edge.engine.interface import Engine, PassEngine
from edge.engine.kv_cache import ElasticKV, KVRead
from edge.memory.alloc_trace import AllocationTracer
from edge.memory.synthetic import exported_shapes
from edge.model.arch import ModelConfig
from edge.model.checkpoint import Checkpoint, draft_reads_refine

# Flash decoding (plugins.kernels.attention) splits the history of each query row into chunks of FLASH_CHUNK
# positions whose partial outputs (D values, running max and sum, float32) are reduced afterwards; a pass of more
# than SPLIT_QUERIES queries (a prefill chunk) runs the prefill kernel (attention_prefill), which keeps none.
FLASH_CHUNK = 128             # plugins.kernels.attention.CHUNK
SPLIT_QUERIES = 17            # plugins.kernels.attention.SPLIT_QUERIES
PREFILL_MIN_ROWS = 32         # the fewest rows a prefill tile holds (attention_prefill.prefill_rows): a GQA group
                              # wider than a tile (MQA) runs the split kernel, counted here from past 32
GEMM_FROM_TOKENS = 9          # passes this wide run the GEMM (plugins.kernels.gemv_decode.DECODE_MAX_M + 1)


@dataclass(frozen=True)
class Step:
    """One pass at the end of the context: `tokens` ids after `committed` positions (or draft slot)."""

    name: str
    committed: int
    tokens: int
    view: str
    kv: KVRead
    draft_slot: int | None = None
    last_only: bool = False


def steps_at_end(context: int, speculative: bool, gamma: int, prefill_chunk: int, draft_kv: KVRead,
                 view: str = "target") -> list[Step]:
    """The passes with the largest workspace a run at `context` positions makes, each ending at the last
    position: the last prefill chunk, and either an AR step or the last draft pass and the γ+1 verification.
    `view` `draft` (a base-planes run, AR only): the prefill and the AR step run the draft view, the step reading
    `draft_kv`."""
    kv8 = KVRead("kv8")
    chunk = max(1, min(prefill_chunk, context - 1))
    steps = [Step("prefill_chunk", context - chunk, chunk, view, kv8, last_only=True)]
    if speculative:
        base = context - gamma - 1
        steps.append(Step("draft", base, 1, "draft", draft_kv, draft_slot=gamma - 1))
        steps.append(Step("verify", base, gamma + 1, "target", kv8))
    else:
        steps.append(Step("ar_step", context - 1, 1, view, kv8 if view == "target" else draft_kv))
    return steps


def split_prefill_tail(context: int, prefill_chunk: int, view: str = "target") -> list[Step]:
    """The widest prefill pass the GPU kernels split over the context, at its end: a prompt's last chunk or a short
    chat turn of SPLIT_QUERIES tokens (its flash-decoding partials, a row and chunk each, can outweigh a whole chunk's
    workspace at long contexts); none where the prefill chunk itself is that narrow (`steps_at_end` plans it)."""
    tail = min(SPLIT_QUERIES, context - 1)
    if prefill_chunk <= SPLIT_QUERIES or tail < 1:
        return []
    return [Step("prefill_tail", context - tail, tail, view, KVRead("kv8"), last_only=True)]


def run_step(eng: Engine, step: Step):
    """Run one planned pass on an engine whose cache holds at least step.committed positions."""
    eng.commit(step.committed)
    return eng.forward([1] * step.tokens, step.view, step.kv, draft_slot=step.draft_slot, last_only=step.last_only)


def fused_workspace(cfg: ModelConfig, step: Step, act_bytes: int, int8_acts: bool, scratch: int = 0) -> int:
    """Bytes the GPU kernels need for one pass of T tokens (buffers reused layer after layer): the residual
    and normed stream, the larger of q/k/v + attention output and the MLP's gate/up/product, the int8 copy of
    a linear's input (W8A8 / W4A8; a prefill chunk's GEMM also its group sums, int32 [T, K/G]), attention
    partials, RoPE tables, float32 logits of the rows kept. The nested KV is read in place by the attention
    kernel: no dequantized copy of the history. A decode pass's partials cover every chunk of the context and
    the `scratch` draft slots (what the CUDA graphs' launch, sized for the whole capacity, allocates)."""
    t, h, i, d = step.tokens, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attn = (cfg.num_heads + 2 * cfg.num_kv_heads) * d + cfg.num_heads * d
    act = t * (2 * h + max(3 * i, attn)) * act_bytes
    quant = t * max(h, i) if int8_acts else 0
    if int8_acts and t >= GEMM_FROM_TOKENS:     # the group sums of the widest input, at the default export's
        k = max(h, i)                           # group size (128, or 64 where 128 does not divide K)
        quant += t * (k // (128 if k % 128 == 0 else 64)) * 4
    # decode-sized passes split the history (flash-decoding partials, a row and chunk each); a prefill chunk's
    # query tiles each run their whole causal range in registers and keep none
    chunks = -(-(step.committed + t + scratch) // FLASH_CHUNK)
    split = t <= SPLIT_QUERIES or cfg.num_heads // cfg.num_kv_heads > PREFILL_MIN_ROWS
    partials = t * cfg.num_heads * chunks * (d + 2) * 4 if split else 0
    rope = 2 * t * d * 4
    logits = (1 if step.last_only else t) * cfg.vocab_size * 4
    return act + quant + partials + rope + logits


def one_layer_meta(ckpt: Checkpoint, weights: str | None = None) -> Checkpoint:
    """`ckpt` cut to its first decoder block, every tensor on the meta device (same specs and rotations); `weights`
    `base` leaves out the refinement planes a `--weights base` load leaves out (None: as `ckpt` holds them)."""
    cfg = replace(ckpt.config, num_layers=1)
    weights = weights or ckpt.weights
    unread = lambda n: weights == "base" and n.endswith(".refine") and not draft_reads_refine(ckpt.manifest, n[:-7])
    keep = lambda n: (not n.startswith("model.layers.") or n.startswith("model.layers.0.")) and not unread(n)
    meta = lambda t: None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")
    rot = replace(ckpt.rotations, r1=meta(ckpt.rotations.r1))
    return Checkpoint(ckpt.path, ckpt.manifest, cfg, {n: s for n, s in ckpt.linears.items() if keep(n)},
                      {n: meta(t) for n, t in ckpt.tensors.items() if keep(n)}, rot, ckpt.draft_head, ckpt.shortlist_k,
                      weights)


class DryRun:
    """This runtime's passes (backend `backend`) on meta tensors, to count the bytes each allocates beyond
    the engine's own buffers. One decoder block is enough: a block's transients are freed before the next
    one starts and every block sees the same history. The meta engine is built once for `capacity`
    positions; a pass's workspace depends on the positions it reads, not on the capacity."""

    def __init__(self, ckpt: Checkpoint | None, cfg: ModelConfig, backend: str, capacity: int, scratch: int,
                 prefill_chunk: int = 256, elastic: ElasticKV | None = None, weights: str = "nested"):
        from edge.backends import make_backend
        meta = one_layer_meta(ckpt, weights) if ckpt is not None else \
            exported_shapes(replace(cfg, num_layers=1), "meta", weights=weights)
        with torch.device("meta"):
            self.engine = PassEngine(meta, make_backend(backend, meta), capacity, scratch=scratch,
                                     prefill_chunk=prefill_chunk, elastic=elastic)

    def workspace(self, steps: list[Step]) -> dict[str, int]:
        """Peak bytes of live storages each step allocates."""
        out = {}
        for step in steps:
            with torch.device("meta"), AllocationTracer() as tr:
                run_step(self.engine, step)
            out[step.name] = tr.peak
        return out
