"""An Engine for backends that run whole decoder steps (the exported step graph through onnxruntime or a
TensorRT engine): the runner owns the nested KV planes, this class keeps the committed length and the
statistics, so edge.decode.generate and the speculative policy drive it exactly like edge.decode.engine.Engine."""

import time

import torch

from edge.model.checkpoint import Checkpoint
from edge.errors import BitNestError
from edge.decode.kv_cache import KVRead
from edge.decode.stats import DecodeStats, weight_bytes_per_pass

KV8 = KVRead("kv8")


class StepCursor:
    """The committed length of a runner-owned KV cache (the part of NestedKVCache a policy uses)."""

    def __init__(self, capacity: int):
        self.capacity, self.length = capacity, 0

    def check_room(self, end: int) -> None:
        if end > self.capacity:
            raise ValueError(f"sequence of {end} positions exceeds the KV cache capacity {self.capacity}")

    def commit(self, length: int) -> None:
        if not 0 <= length <= self.capacity:
            raise ValueError(f"committed length {length} outside [0, {self.capacity}]")
        self.length = length


class StepEngine:
    """Passes through a step runner (`run(ids, view, seq_len, kv8_from) -> logits [M, V]`, which writes the
    pass's KV entries at [seq_len - M, seq_len)). Draft passes write past the committed length; the
    verification pass overwrites those positions and a rollback is a smaller committed length."""

    def __init__(self, ckpt: Checkpoint, runner, capacity: int, name: str, max_tokens: int = 5):
        if max_tokens < 1:
            raise ValueError("a step engine needs passes of at least one token")
        self.ckpt, self.runner, self.max_tokens = ckpt, runner, max_tokens
        self.cache = StepCursor(capacity)
        self.pass_weight_bytes = {v: weight_bytes_per_pass(ckpt, v) for v in ("draft", "target")}
        self.stats = DecodeStats(policy="", backend=name)

    def reset(self) -> None:
        self.cache.commit(0)

    def run(self, ids: list[int], view: str, kv: KVRead = KV8, draft_slot: int | None = None,
            last_only: bool = False) -> torch.Tensor:
        start = self.cache.length + (draft_slot or 0)
        end = start + len(ids)
        self.cache.check_room(end)
        if len(ids) > self.max_tokens:
            raise BitNestError(f"a pass of {len(ids)} tokens exceeds this engine's {self.max_tokens}: lower gamma")
        logits = torch.from_numpy(self.runner.run(ids, view, end, kv.kv8_from(end)))     # [T, V]
        self.stats.weight_bytes += self.pass_weight_bytes[view]
        if view == "draft":
            self.stats.draft_passes += 1
        else:
            self.stats.target_passes += 1
        return logits[-1:] if last_only else logits

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Commit the prompt in passes of at most `max_tokens`; logits [V] of its last token (not counted)."""
        if len(ids) + 1 > self.cache.capacity:
            raise BitNestError(f"prompt of {len(ids)} tokens does not fit the KV cache of {self.cache.capacity} positions")
        t0 = time.perf_counter()
        saved = (self.stats.weight_bytes, self.stats.target_passes)
        logits = None
        for i in range(0, len(ids), self.max_tokens):
            chunk = ids[i:i + self.max_tokens]
            logits = self.run(chunk, "target", KV8, last_only=True)
            self.cache.commit(self.cache.length + len(chunk))
        self.stats.weight_bytes, self.stats.target_passes = saved
        self.stats.prefill_tokens += len(ids)
        self.stats.prefill_seconds += time.perf_counter() - t0
        return logits[-1]
