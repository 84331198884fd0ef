"""One sequence's decoding state: the decoder over a backend's weights, its preallocated nested KV cache,
chunked prefill, and single passes (real or draft-time) with their weight and KV bytes counted."""

import time

import torch

from edge.model.checkpoint import Checkpoint
from edge.errors import BitNestError
from edge.decode.kv_cache import CachedAttention, KVRead, NestedKVCache
from edge.model.decoder import Decoder
from edge.decode.stats import DecodeStats, weight_bytes_per_pass

KV8 = KVRead("kv8")


class Engine:
    """Runs passes of the nested model for one sequence; `stats` accumulates what they read."""

    def __init__(self, ckpt: Checkpoint, weights, capacity: int, scratch: int = 8, prefill_chunk: int = 256):
        cfg = ckpt.config
        if prefill_chunk < 1:
            raise ValueError("prefill chunk must be at least 1 token")
        self.ckpt, self.weights, self.prefill_chunk = ckpt, weights, prefill_chunk
        self.decoder = Decoder(cfg, weights, ckpt.rotations)
        self.cache = NestedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, scratch,
                                   device=getattr(weights, "device", None), ops=getattr(weights, "kernel_ops", None))
        self.pass_weight_bytes = {v: weight_bytes_per_pass(ckpt, v) for v in ("draft", "target")}
        self.embed_row_bytes = cfg.hidden_size * 2
        self.stats = DecodeStats(policy="", backend=getattr(weights, "name", type(weights).__name__))

    def reset(self) -> None:
        self.cache.commit(0)

    def _kv_bytes(self, positions: int, kv: KVRead) -> int:
        kv8 = positions - min(kv.kv8_from(positions), positions)
        c = self.cache
        return kv8 * c.bytes_per_position(True) + (positions - kv8) * c.bytes_per_position(False)

    def run(self, ids: list[int], view: str, kv: KVRead = KV8, draft_slot: int | None = None,
            last_only: bool = False) -> torch.Tensor:
        """One pass over `ids` at the next positions: real entries (committed length + i) or, with
        `draft_slot`, draft-time scratch slots. Returns logits [T, V] (or [1, V]). Counts bytes read."""
        c = self.cache
        start = c.length + (draft_slot or 0)
        c.check_room(start + len(ids))
        att = CachedAttention(c, start, kv, draft_slot)
        logits = self.decoder.forward(torch.tensor(ids, dtype=torch.long), view, att, start, last_only)
        s = self.stats
        s.weight_bytes += self.pass_weight_bytes[view] + len(ids) * self.embed_row_bytes
        s.kv_bytes += self._kv_bytes(start + len(ids), kv)
        if view == "draft":
            s.draft_passes += 1
        else:
            s.target_passes += 1
        return logits

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Commit the prompt in chunks of `prefill_chunk` (bounded workspace); logits [V] of its last token.
        Prefill traffic is not counted in the decode-phase bytes."""
        if len(ids) + 1 > self.cache.capacity:
            raise BitNestError(f"prompt of {len(ids)} tokens does not fit the KV cache of {self.cache.capacity} "
                               "positions: raise --max-context or shorten the prompt")
        t0 = time.perf_counter()
        saved = (self.stats.weight_bytes, self.stats.kv_bytes, self.stats.target_passes)
        logits = None
        for i in range(0, len(ids), self.prefill_chunk):
            chunk = ids[i:i + self.prefill_chunk]
            logits = self.run(chunk, "target", KV8, last_only=True)
            self.cache.commit(self.cache.length + len(chunk))
        self.stats.weight_bytes, self.stats.kv_bytes, self.stats.target_passes = saved
        self.stats.prefill_tokens += len(ids)
        self.stats.prefill_seconds += time.perf_counter() - t0
        return logits[-1]
