"""The one engine interface every backend implements: one sequence's committed length over its nested KV
cache, chunked prefill, commit / rollback, and the bytes each pass reads (docs/runtime.md, metrics), with the
PyTorch-pass engine that runs the decoder op by op over a backend's linear and attention ops."""

import time
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch

from edge.engine.kv_cache import (
    KV8,
    AttentionOps,
    CachedAttention,
    ElasticKV,
    KVRead,
    NestedKVCache,
    kv_bytes_per_position,
)
from edge.engine.stats import DecodeStats, embedding_row_bytes, head_row_bytes_per_token, weight_bytes_per_pass
from edge.errors import BitNestError
from edge.model.checkpoint import R1_TENSOR, Checkpoint
from edge.model.decoder import Decoder, OnlineRotations, WeightStore
from plugins.contracts import DRAFT, TARGET, check_view

if TYPE_CHECKING:
    from edge.engine.cost_table import CostTable


def to_host(logits: torch.Tensor) -> torch.Tensor:
    """A pass's logits on the CPU: from a CUDA device through page-locked memory (torch's caching host allocator, no
    allocation a pass once warm), one DMA at the link's rate where `.cpu()` staged through pageable memory
    (Qwen2.5-1.5B's 151,936-token rows are 0.6 MB a token, 3 MB a verification pass); CPU and meta tensors (the
    planner's shape-only dry run) as they are."""
    if logits.device.type != "cuda":
        return logits
    host = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
    host.copy_(logits, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    return host


class Engine(ABC):
    """Runs passes of the nested model for one sequence. `length` is the committed length: a real pass writes
    its entries at [length, length + T), a draft-time pass (`draft_slot`) at draft slots past it; `commit`
    moves the length forward over accepted entries or back over rejected ones. `stats` counts what passes read.

    Subclasses implement `_forward`; everything else (room checks, prefill, accounting) lives here once."""

    def __init__(self, ckpt: Checkpoint, capacity: int, backend: str, activations: str,
                 max_pass_tokens: int | None = None, prefill_chunk: int = 256, embed_row_bytes: int | None = None,
                 elastic: ElasticKV | None = None):
        if capacity < 1:
            raise ValueError("KV cache capacity must be at least one position")
        if prefill_chunk < 1:
            raise ValueError("prefill chunk must be at least 1 token")
        cfg = ckpt.config
        self.ckpt, self.capacity, self.name, self.activations = ckpt, capacity, backend, activations
        self.max_pass_tokens = max_pass_tokens
        self.prefill_chunk = min(prefill_chunk, max_pass_tokens or prefill_chunk)
        self.length = 0
        self.elastic = elastic     # elastic KV (each query reads KV8 for its last `window` positions), or None
        # bytes a pass reads whatever its width, and per token of it (its embedding row, the shortlist's head rows)
        self.pass_weight_bytes = {v: weight_bytes_per_pass(ckpt, v, tokens=0) for v in (DRAFT, TARGET)}
        self.embed_row_bytes = embedding_row_bytes(ckpt) if embed_row_bytes is None else embed_row_bytes
        self.token_weight_bytes = {v: self.embed_row_bytes + head_row_bytes_per_token(ckpt, v) for v in (DRAFT, TARGET)}
        self.kv_position_bytes = {True: kv_bytes_per_position(cfg, "nested"), False: kv_bytes_per_position(cfg, "kv4")}
        self.stats = DecodeStats(policy="", backend=backend)
        # called with the phase each pass belongs to ("prefill", "draft", "verify": a pass of the target view in
        # the decode phase) before it runs: an energy log tags power samples with it (edge.energy.session)
        self.on_phase: Optional[Callable[[str], None]] = None
        # the nested KV cache, where the engine holds it (a step runner holds its own planes and has no scratch area)
        self.cache: Optional[NestedKVCache] = None
        # the auto policy's pass costs on this engine, read or measured once (edge.engine.costs.engine_costs)
        self.costs: Optional["CostTable"] = None

    # -- the committed length -------------------------------------------------------------------------------
    def check_room(self, end: int) -> None:
        if end > self.capacity:
            raise ValueError(f"sequence of {end} positions exceeds the KV cache capacity {self.capacity}")

    def commit(self, length: int) -> None:
        """Set the committed length (forward over verified entries, or back to roll rejected ones off)."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"committed length {length} outside [0, {self.capacity}]")
        self.length = length

    def room(self) -> int:
        """Positions left past the committed length."""
        return self.capacity - self.length

    def draft_slots(self) -> Optional[int]:
        """Draft-time entries a round may hold: the cache's scratch slots (None: bounded by the room only)."""
        return self.cache.scratch_slots if self.cache is not None else None

    def check_elastic(self, widest_pass: int) -> None:
        """Elastic KV is sound when no pass that writes KV (at most `widest_pass` tokens) overwrites a refinement a
        later query still reads: a pass ending at e overwrites positions <= e - 1 - ring, and every later query, at
        t >= e - widest_pass, reads refinements of positions >= t + 1 - window (docs/memory.md)."""
        e = self.elastic
        if e is not None and e.ring < min(e.window + widest_pass, self.capacity):
            raise BitNestError(f"a refinement ring of {e.ring} slots is too small for a KV window of {e.window} and "
                               f"passes of {widest_pass} tokens: use at least {e.window + widest_pass} slots")

    def kv_summary(self) -> dict:
        """Elastic KV's figures for the stats (empty without it): the window, and how many positions the last query
        read at KV4 (their refinement is gone)."""
        if self.elastic is None:
            return {}
        return {"kv_window": self.elastic.window, "kv4_positions": max(0, self.length - self.elastic.window)}

    def reset(self, policy: str = "") -> DecodeStats:
        """Start a new sequence: empty history and fresh statistics (returned)."""
        self.commit(0)
        self.stats = DecodeStats(policy=policy, backend=self.name)
        return self.stats

    # -- passes -----------------------------------------------------------------------------------------------
    def kv_bytes(self, positions: int, kv: KVRead) -> int:
        """Bytes a pass reads from a history of `positions` through the read view `kv`."""
        first = kv.kv8_from(positions) if self.elastic is None else self.elastic.kv8_from(kv, positions, positions - 1)
        kv8 = positions - min(first, positions)
        return kv8 * self.kv_position_bytes[True] + (positions - kv8) * self.kv_position_bytes[False]

    def forward(self, ids: list[int], view: str, kv: KVRead = KV8, draft_slot: int | None = None,
                last_only: bool = False, on_device: bool = False) -> torch.Tensor:
        """One counted pass over `ids` at positions length + (draft_slot or 0) + i: real entries or, with
        `draft_slot`, draft-time ones. Returns logits [T, V] ([1, V] with `last_only`) on the CPU, or with
        `on_device` where the engine computed them (a GPU engine's device: for a caller that takes only their
        argmaxes, which then cross to the host as a few ids where a row of V floats would)."""
        start = self._check_pass(ids, view, draft_slot)
        if self.on_phase is not None:
            self.on_phase("draft" if view == DRAFT else "verify")
        logits = self._forward(ids, view, start, kv, draft_slot, last_only)
        self.stats.record_pass(view, self.pass_weight_bytes[view] + len(ids) * self.token_weight_bytes[view],
                               self.kv_bytes(start + len(ids), kv))
        return logits if on_device else to_host(logits)

    def _check_pass(self, ids: list[int], view: str, draft_slot: int | None) -> int:
        check_view(view)
        if view == TARGET and not self.ckpt.has_target:
            raise BitNestError("the target view needs the refinement planes, and this checkpoint was loaded with "
                               "--weights base (the draft view only): use --policy draft, or --weights nested")
        if not ids:
            raise ValueError("a pass needs at least one token")
        if self.max_pass_tokens is not None and len(ids) > self.max_pass_tokens:
            raise BitNestError(f"a pass of {len(ids)} tokens exceeds this engine's {self.max_pass_tokens}: "
                               "lower gamma")
        start = self.length + (draft_slot or 0)
        self.check_room(start + len(ids))
        return start

    def prefill(self, ids: list[int], view: str = TARGET) -> torch.Tensor:
        """Commit the prompt in chunks of at most `prefill_chunk` tokens (bounded workspace) run with `view`; logits
        [V] of its last token. Prefill traffic is not part of the decode-phase bytes: it is recorded apart."""
        if len(ids) + 1 > self.capacity:
            raise BitNestError(f"prompt of {len(ids)} tokens does not fit the KV cache of {self.capacity} "
                               "positions: raise --max-context or shorten the prompt")
        if not ids:
            raise BitNestError("the prompt is empty: give at least one token")
        t0 = time.perf_counter()
        if self.on_phase is not None:
            self.on_phase("prefill")
        logits = None
        for i in range(0, len(ids), self.prefill_chunk):
            chunk = ids[i:i + self.prefill_chunk]
            logits = self._forward(chunk, view, self._check_pass(chunk, view, None), KV8, None, True)
            self.commit(self.length + len(chunk))
        self.stats.record_prefill(len(ids), time.perf_counter() - t0)
        return to_host(logits[-1])

    def numerics(self) -> dict:
        """What the stats report about the engine's arithmetic beyond its activations (e.g. GEMMs run row by row)."""
        return {}

    @abstractmethod
    def _forward(self, ids: list[int], view: str, start: int, kv: KVRead, draft_slot: int | None,
                 last_only: bool) -> torch.Tensor:
        """The pass itself (room already checked): write its KV entries, return logits [T, V] or [1, V] on the CPU
        or the engine's device, in a tensor no later pass overwrites."""


class PassBackend(WeightStore, Protocol):
    """What a per-op backend declares beside the decoder's weight reads (embed, norm, linear, head)."""

    name: str                                  # in stats and reports
    activations: str                           # int8 (the reference semantics), bfloat16, float32 ...
    device: Optional[torch.device]             # where its tensors and the KV cache live (None: the CPU)
    attention_ops: Optional[AttentionOps]      # kernels over the nested planes, or None for dequantize + SDPA


def _rotations(ckpt: Checkpoint) -> OnlineRotations:
    """The checkpoint's online rotations with R1 the tensor its store holds now: a GPU backend moved it with the other
    tensors, and the manifest's CPU copy would cost a host-to-device copy of [H, H] float32 at every pass (64 MB at
    7B) and refuse a CUDA graph's capture."""
    rot, r1 = ckpt.rotations, ckpt.tensors.get(R1_TENSOR)
    return rot if rot.r1 is None or r1 is None else replace(rot, r1=r1)


class PassEngine(Engine):
    """The decoder run op by op in PyTorch over a backend (`torch`, `cpu`, `triton`): the backend's linears
    read the nested planes, its declared attention ops (or dequantize + SDPA) read the nested KV cache."""

    def __init__(self, ckpt: Checkpoint, backend: PassBackend, capacity: int, scratch: int = 8,
                 prefill_chunk: int = 256, elastic: ElasticKV | None = None):
        super().__init__(ckpt, capacity, backend.name, backend.activations, prefill_chunk=prefill_chunk,
                         elastic=elastic)
        if elastic is not None and backend.attention_ops is not None:
            raise BitNestError(f"elastic KV (--kv-window) runs on the native, cpu and torch backends, not {backend.name}")
        self.check_elastic(max(self.prefill_chunk, scratch + 1))
        cfg = ckpt.config
        self.backend = backend
        self.decoder = Decoder(cfg, backend, _rotations(ckpt), ckpt.draft_head, ckpt.shortlist_k, ckpt.draft_vocab)
        self.cache = NestedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, scratch,
                                   device=backend.device, ops=backend.attention_ops, elastic=elastic)

    def numerics(self) -> dict:
        report = getattr(self.backend, "numerics", None)
        return report() if report is not None else {}

    def _forward(self, ids, view, start, kv, draft_slot, last_only):
        att = CachedAttention(self.cache, start, kv, draft_slot)
        return self.decoder.forward(torch.tensor(ids, dtype=torch.long), view, att, start, last_only)
