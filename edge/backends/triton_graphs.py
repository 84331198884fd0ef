"""The `triton` backend's engine: every pass runs a static form of the decoder whose per-pass values (token ids,
lengths, the KV read, positions) live in one device buffer and whose KV cache, scratch slots and RoPE tables are
preallocated, so on a CUDA GPU each decode-pass shape (weight view, pass width, real or draft-slot pass) is
captured once as a CUDA graph and replayed with new values: one graph launch per pass instead of the hundreds of
kernel launches a 135M model's pass holds (launch-bound on any GPU, more so on an Orin). Prefill chunks (wide,
compute-bound, of varying width) run the same static form without a graph. Without a GPU (the Triton interpreter)
the static form runs eagerly: the code a graph captures is the code the tests run here."""

import torch

from edge.engine import MAX_PROPOSALS
from edge.engine.interface import PassEngine
from edge.model.checkpoint import Checkpoint
from edge.model.decoder import rope_tables

# passes up to this wide are captured (a draft token, γ + 1 <= 16 verified); wider ones run eagerly
GRAPH_MAX_TOKENS = MAX_PROPOSALS
MAIN_LEN, SEQ_LEN, KV8_FROM, WRITE_END, IDS = range(5)   # the device buffer: four lengths, then the token ids


class StaticAttention:
    """Attention of one pass whose lengths are device scalars: the pass's K/V entries go to positions
    [write_end - T, write_end) of the main planes (a real pass) or of the scratch slots (a draft pass), and
    attention reads main positions [0, main_len) then scratch slots up to seq_len, KV8 from kv8_from."""

    def __init__(self, cache, staged: torch.Tensor, draft: bool, ops):
        self.cache, self.draft, self.ops = cache, draft, ops
        self.lens = [staged[i:i + 1] for i in (MAIN_LEN, SEQ_LEN, KV8_FROM, WRITE_END)]
        if hasattr(ops, "rope_write_kv_at"):          # the decoder hands q and k unrotated (decoder._rope_attend)
            self.rope_attend = self._rope_attend

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.ops.write_kv_at(k, v, *self._written(layer), self.lens[WRITE_END])
        return self._attend(layer, q)

    def _rope_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
        """`__call__` of q and k before RoPE: rotated in the KV write's launch (plugins.kernels.kv_write)."""
        q = self.ops.rope_write_kv_at(q, k, v, cos, sin, *self._written(layer), self.lens[WRITE_END])
        return self._attend(layer, q)

    def _written(self, layer: int) -> tuple:
        """The planes this pass's K/V entries go to: the scratch slots' (a draft pass) or the main cache's."""
        return (self.cache.draft if self.draft else self.cache.main).layer(layer)

    def _attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        main_len, seq_len, kv8_from, _ = self.lens
        return self.ops.nested_kv_attention_at(q, *self.cache.main.layer(layer), main_len, seq_len, kv8_from,
                                               scratch=self.cache.draft.layer(layer))                 # [Hq, T, D]


class GraphedEngine(PassEngine):
    """PassEngine over the triton backend with static passes, captured as CUDA graphs where a GPU is present
    (`graphs` None: on a CUDA device). `graph_count` says how many shapes were captured."""

    def __init__(self, ckpt: Checkpoint, backend, capacity: int, scratch: int = 8, prefill_chunk: int = 256,
                 graphs: bool | None = None):
        super().__init__(ckpt, backend, capacity, scratch=scratch, prefill_chunk=prefill_chunk)
        dev = backend.device                    # (the decoder's R1 is the copy the backend moved there: PassEngine)
        cos, sin = rope_tables(ckpt.config, torch.arange(capacity + scratch), torch.float32)   # [P, D]
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        width = max(self.prefill_chunk, GRAPH_MAX_TOKENS)
        self.steps = torch.arange(width, device=dev)                                           # [W]
        self.staged = torch.zeros(IDS + width, dtype=torch.int64, device=dev)
        cuda = dev is not None and dev.type == "cuda"
        self.host = torch.zeros(IDS + width, dtype=torch.int64, pin_memory=cuda)
        self.host_np = self.host.numpy()          # its memory: a pass's values set by numpy (~0.5 µs, not ~13)
        self.copied = torch.cuda.Event() if cuda else None      # recorded after each copy out of the staging row
        self.use_graphs = cuda if graphs is None else graphs
        self.graphs: dict[tuple, tuple] = {}

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    def _forward(self, ids, view, start, kv, draft_slot, last_only):
        t, end = len(ids), start + len(ids)
        draft = draft_slot is not None
        if self.copied is not None:           # a pass whose logits stayed on the device may not have waited for
            self.copied.synchronize()         # its copy out of the row: it must be done before the row is rewritten
        h = self.host_np
        h[MAIN_LEN] = start - draft_slot if draft else end        # committed history a draft pass reads
        h[SEQ_LEN], h[KV8_FROM] = end, kv.kv8_from(end)
        h[WRITE_END] = draft_slot + t if draft else end
        h[IDS:IDS + t] = ids
        self.staged[:IDS + t].copy_(self.host[:IDS + t], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        key = (view, t, draft, last_only)
        if not (self.use_graphs and t <= GRAPH_MAX_TOKENS and not last_only):
            return self._pass(*key)
        if key not in self.graphs:
            return self._capture(key)
        graph, out = self.graphs[key]
        graph.replay()
        return out.clone()                  # the graph's buffer is the next replay's: ~1 µs on the device, 3 MB

    def _pass(self, view: str, t: int, draft: bool, last_only: bool) -> torch.Tensor:
        """The pass, reading everything that changes between passes from `self.staged` (logits on the device)."""
        pos = self.steps[:t] + (self.staged[SEQ_LEN] - t)                                      # [T]
        att = StaticAttention(self.cache, self.staged, draft, self.backend.attention_ops)
        return self.decoder.forward(self.staged[IDS:IDS + t], view, att, last_only=last_only,
                                    rope=(self.cos[pos], self.sin[pos]))

    def _capture(self, key: tuple) -> torch.Tensor:
        """Run the pass once for real on a side stream (compiles every kernel, fills every cache: nothing may
        compile or copy from the host inside a capture), then capture it; returns the real run's logits."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self._pass(*key)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._pass(*key)                                  # recorded, not run: the KV is written once
        self.graphs[key] = (graph, out)
        return logits
