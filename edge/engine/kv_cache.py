"""Nested KV cache (docs/contracts.md, KV cache): preallocated KV4 base and KV4 refinement planes plus float16 scales for a
fixed capacity and a scratch area for draft-time entries; the KV read views; elastic KV (a refinement ring and a
per-query KV8 window, docs/memory.md); bytes per cached position.
The committed length (commit / rollback) belongs to the engine that drives the cache (edge.engine.interface)."""

from dataclasses import dataclass
from typing import Protocol

import torch

from edge.model.arch import ModelConfig
from plugins.contracts import KV_READS
from plugins.decoder_math import attention, attention_mixed
from plugins.kv import dequantize_kv, quantize_kv


def kv_bytes_per_position(cfg: ModelConfig, kv: str) -> int:
    """Bytes per cached position over all layers, K and V. fp16: 2 bytes per value. nested (docs/contracts.md, KV cache): two
    packed 4-bit planes (D/2 bytes each) and one float16 scale per (layer, K/V, KV head). kv4: what a KV4 read
    touches of the nested cache (the base plane and the scale)."""
    per_vector = {"fp16": cfg.head_dim * 2, "nested": cfg.head_dim + 2, "kv4": cfg.head_dim // 2 + 2}[kv]
    return cfg.num_layers * 2 * cfg.num_kv_heads * per_vector


class AttentionOps(Protocol):
    """Kernels that write and attend straight from the planes (a backend's `attention_ops`, e.g. the Triton
    kernels of plugins.kernels); without them the cache dequantizes and attends with SDPA."""

    def write_kv(self, k, v, base, refine, scale, start: int) -> None: ...
    def nested_kv_attention(self, q, base, refine, scale, seq_len: int, kv8_from: int, scratch=None,
                            scratch_len: int = 0) -> torch.Tensor: ...


@dataclass(frozen=True)
class KVRead:
    """How a pass reads the history: kv8, kv4, or recent (KV8 for the last `recent` positions, KV4 before)."""

    view: str = "kv8"
    recent: int = 0

    def __post_init__(self):
        if self.view not in KV_READS:
            raise ValueError(f"unknown KV view {self.view!r}: use one of {', '.join(KV_READS)}")
        if self.view == "recent" and self.recent < 1:
            raise ValueError("the recent-N KV view needs N >= 1")

    def kv8_from(self, end: int) -> int:
        """First position (of `end`) read at KV8; positions before it are read at KV4."""
        return {"kv8": 0, "kv4": end}.get(self.view, max(0, end - self.recent))


KV8 = KVRead("kv8")   # what verification, prefill and target steps read


@dataclass(frozen=True)
class ElasticKV:
    """Elastic KV (docs/memory.md): the query at position t reads KV8 for positions >= t + 1 - `window` and KV4 (the
    base plane) before them, whatever view its pass asks for; the refinement plane holds `ring` slots, position p's in
    slot p mod ring. A pass of at most G tokens that writes KV destroys only refinements no later query reads when
    ring >= window + G (engine.check_elastic)."""

    window: int
    ring: int

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"the elastic KV window must be at least 1 position, got {self.window}")
        if self.ring <= self.window:
            raise ValueError(f"the refinement ring ({self.ring} slots) must exceed the window ({self.window})")

    def kv8_from(self, kv: KVRead, total: int, row: int) -> int:
        """First position the query at position `row` reads at KV8 in a pass of view `kv` over `total` positions:
        where both its view and the window allow."""
        return max(kv.kv8_from(total), row + 1 - self.window)


class _Planes:
    """Planes for `slots` positions: base uint8 [L, 2, Hkv, slots, D/2], scale float16 [L, 2, Hkv, slots], and refine
    uint8 [L, 2, Hkv, R, D/2]: a ring of R <= slots slots (position p's refinement in slot p mod R; R = slots: no
    wrap). With kernel `ops` (AttentionOps, no ring) writes go through its write kernel."""

    def __init__(self, layers: int, heads: int, slots: int, head_dim: int, device=None, ops=None,
                 refine_slots: int | None = None):
        self.base = torch.zeros(layers, 2, heads, slots, head_dim // 2, dtype=torch.uint8, device=device)
        self.ring = slots if refine_slots is None else refine_slots
        self.refine = torch.zeros(layers, 2, heads, self.ring, head_dim // 2, dtype=torch.uint8, device=device)
        self.scale = torch.zeros(layers, 2, heads, slots, dtype=torch.float16, device=device)
        self.ops = ops

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's planes [2, Hkv, slots, D/2] x2 and scales [2, Hkv, slots] (views, contiguous)."""
        return self.base[layer], self.refine[layer], self.scale[layer]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize k, v [Hkv, T, D] into positions [start, start + T)."""
        if self.ops is not None:
            self.ops.write_kv(k, v, *self.layer(layer), start)
            return
        b, r, s = quantize_kv(torch.stack((k, v)))                      # [2, Hkv, T, D/2], ..., [2, Hkv, T]
        t = k.shape[1]
        self.base[layer, :, :, start:start + t] = b
        if self.ring == self.base.shape[3]:
            self.refine[layer, :, :, start:start + t] = r
        else:
            self.refine[layer].index_copy_(2, torch.arange(start, start + t, device=r.device) % self.ring, r)
        self.scale[layer, :, :, start:start + t] = s

    def refinement(self, layer: int, start: int, end: int) -> torch.Tensor:
        """The refinement of positions [start, end): [2, Hkv, end - start, D/2] (their ring slots)."""
        if self.ring == self.base.shape[3]:
            return self.refine[layer, :, :, start:end]
        return self.refine[layer].index_select(2, torch.arange(start, end, device=self.refine.device) % self.ring)

    def read(self, layer: int, start: int, end: int, kv8_from: int) -> torch.Tensor:
        """Dequantized [2, Hkv, end - start, D]: KV4 before position `kv8_from`, KV8 from it on (plugins.kv
        dequantize_kv_mixed's semantics, over the ring). KV4 positions never touch the refinement plane."""
        split = min(max(kv8_from, start), end)
        out = []
        if split > start:
            out.append(dequantize_kv(self.base[layer, :, :, start:split], None, self.scale[layer, :, :, start:split],
                                     "kv4"))
        if end > split:
            out.append(dequantize_kv(self.base[layer, :, :, split:end], self.refinement(layer, split, end),
                                     self.scale[layer, :, :, split:end], "kv8"))
        return torch.cat(out, dim=-2) if len(out) > 1 else out[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.base, self.refine, self.scale))


class NestedKVCache:
    """KV storage for one sequence of up to `capacity` positions, plus `scratch` draft-time slots.

    Positions at or past the engine's committed length are not part of the sequence: verification writes
    real entries there and the engine commits the accepted ones; rejected entries are dropped by never
    committing them (rollback = a smaller committed length), and the next pass overwrites them.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, scratch: int = 8, device=None,
                 ops=None, elastic: ElasticKV | None = None):
        if capacity < 1:
            raise ValueError("KV cache capacity must be at least one position")
        if elastic is not None and ops is not None:
            raise ValueError("elastic KV is read by dequantize + SDPA or the native step, not by attention kernels")
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.capacity, self.scratch_slots = capacity, scratch
        self.ops = ops   # kernels that attend straight from the planes (triton backend); None: dequantize + SDPA
        self.elastic = elastic
        ring = None if elastic is None else min(elastic.ring, capacity)
        self.main = _Planes(layers, kv_heads, capacity, head_dim, device, ops, refine_slots=ring)
        self.draft = _Planes(layers, kv_heads, scratch, head_dim, device, ops)

    def nbytes(self) -> int:
        """Bytes allocated for planes and scales (main and scratch)."""
        return self.main.nbytes() + self.draft.nbytes()

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Real entries for positions [start, start + T)."""
        if start < 0 or start + k.shape[1] > self.capacity:
            raise ValueError(f"positions [{start}, {start + k.shape[1]}) lie outside the KV cache capacity {self.capacity}")
        self.main.write(layer, start, k, v)

    def write_scratch(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Draft-time entries for scratch slots [slot, slot + T) (positions committed + slot, ...)."""
        if slot + k.shape[1] > self.scratch_slots:
            raise ValueError(f"draft scratch holds {self.scratch_slots} positions: lower gamma")
        self.draft.write(layer, slot, k, v)

    def read(self, layer: int, end: int, kv: KVRead, scratch_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [Hkv, end + scratch_len, D]: main positions [0, end) then scratch slots [0, scratch_len),
        with the KV view applied over the whole sequence."""
        total = end + scratch_len
        kv8_from = kv.kv8_from(total)
        kvs = self.main.read(layer, 0, end, kv8_from) if end else None
        if scratch_len:
            s = self.draft.read(layer, 0, scratch_len, kv8_from - end)
            kvs = s if kvs is None else torch.cat((kvs, s), dim=2)
        return kvs[0], kvs[1]

    def span(self, layer: int, start: int, end: int, main_len: int, kv8: bool) -> torch.Tensor:
        """Dequantized [2, Hkv, end - start, D] of positions [start, end) of the sequence main [0, main_len) then
        scratch slots, all at KV8 (`kv8`) or all at KV4."""
        parts = []
        if start < min(end, main_len):
            parts.append(self.main.read(layer, start, min(end, main_len), start if kv8 else end))
        if end > max(start, main_len):
            a, b = max(start, main_len) - main_len, end - main_len
            parts.append(self.draft.read(layer, a, b, a if kv8 else b))
        if not parts:
            return torch.zeros(2, self.kv_heads, 0, self.head_dim, device=self.main.base.device)
        return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


class CachedAttention:
    """The decoder's attention over a nested cache for one pass of T tokens at positions [start, start+T).

    A real pass (prefill, verification, AR) first writes its entries at [start, start+T), then attends
    over [0, start+T) through the cache's view, so a token sees the same quantized history however the
    sequence was chunked. A draft pass (`draft_slot` set) writes scratch slots instead and attends over
    the committed history plus the scratch entries drafted so far.
    """

    def __init__(self, cache: NestedKVCache, start: int, kv: KVRead, draft_slot: int | None = None):
        self.cache, self.start, self.kv, self.slot = cache, start, kv, draft_slot

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c, t = self.cache, q.shape[1]
        if self.slot is None:
            c.write(layer, self.start, k, v)
            main_len, scratch_len = self.start + t, 0
        else:
            c.write_scratch(layer, self.slot, k, v)
            main_len, scratch_len = self.start - self.slot, self.slot + t   # committed history + drafts so far
        if c.ops is not None:   # flash-decoding from the planes: KV4 positions never touch the refinement plane
            kv8_from = self.kv.kv8_from(main_len + scratch_len)
            return c.ops.nested_kv_attention(q, *c.main.layer(layer), main_len, kv8_from,
                                             scratch=c.draft.layer(layer), scratch_len=scratch_len)
        if c.elastic is not None:
            return self._elastic(layer, q, main_len, main_len + scratch_len)
        keys, values = c.read(layer, main_len, self.kv, scratch_len=scratch_len)
        return attention(q, keys, values, self.start)

    def _elastic(self, layer: int, q: torch.Tensor, main_len: int, total: int) -> torch.Tensor:
        """Attention where query i reads KV8 from its own first KV8 position on (ElasticKV.kv8_from), KV4 before."""
        c = self.cache
        froms = [c.elastic.kv8_from(self.kv, total, self.start + i) for i in range(q.shape[1])]   # nondecreasing
        kv4 = c.span(layer, 0, froms[-1], main_len, kv8=False)          # [2, Hkv, froms[-1], D]
        kv8 = c.span(layer, froms[0], total, main_len, kv8=True)         # [2, Hkv, total - froms[0], D]
        return attention_mixed(q, kv4, kv8, froms, self.start)
