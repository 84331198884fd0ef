"""`tensorrt` backend: deserializes the decoder-step engine (scripts/export.py --engine), keeps the nested KV
planes in persistent device buffers (torch tensors: one per plane per layer, bound to both the engine's plane
input and its aliased plane output, so the attention plugin's in-place writes are the KV cache:
plugins.step_contract; or, for an engine built for ping-pong KV binding, two sets swapped each pass:
edge.backends.tensorrt_kv, the binding read from the engine's build record), binds every address once, and runs
passes on one stream;
edge.engine.step_engine.StepEngine turns it into speculative rounds. Imports tensorrt lazily: it runs on a Jetson
(JetPack 6.1/6.2, TensorRT 10.3) or a CUDA machine with TensorRT, nowhere else.

Device memory and the stream come from torch.cuda (the plugins launch their kernels through torch in the same
primary context), so no other CUDA binding is needed (pycuda has no wheel and builds from source only with CUDA on
PATH). Per pass the host writes the token ids and three scalars into one pinned buffer and copies it in one
transfer; only the token count M changes an input shape; logits come back in one copy. By default each width M has
its own execution context (per width and parity with ping-pong KV) whose enqueue is captured in a CUDA graph after
its first pass and replayed (edge.backends.tensorrt_graphs; eager, with the reason, where capture fails);
`graphs=False` runs one context eagerly, setting the shape when M changes (and the plane addresses each pass with
ping-pong KV)."""

from pathlib import Path

import numpy as np

from edge.backends.tensorrt_kv import ALIASED, PINGPONG, PingPong
from edge.backends.tensorrt_record import REBUILD, check_version, read_record
from edge.engine.step_engine import StepEngine, check_graph_draft_head
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint
from plugins.contracts import view_code
from plugins.step_contract import (
    ENGINE_FILE,
    INPUT_IDS,
    KV8_FROM,
    LOGITS,
    ONNX_FILE,
    SEQ_LEN,
    VIEW,
    StepShapes,
    kv_inputs,
    kv_outputs,
)


_SLOT = 32              # int64 elements per 256 bytes: the staging row's scalars start 256-byte aligned
_IDS = 3 * _SLOT


def tensorrt_backend_unavailable() -> str | None:
    """None where this backend can run here, else the one-line reason."""
    from plugins.trt.plugins import tensorrt_unavailable
    return tensorrt_unavailable()


class TensorRTStepRunner:
    """One sequence's device KV planes and passes through a deserialized step engine."""

    def __init__(self, engine_path, shapes: StepShapes, capacity: int, max_tokens: int | None = None,
                 graphs: bool = True):
        reason = tensorrt_backend_unavailable()
        if reason:
            raise BitNestError(f"tensorrt backend: {reason}")
        import tensorrt as trt
        import torch

        from plugins.trt.plugins import register_plugins

        path = Path(engine_path)
        if not path.is_file():
            raise BitNestError(f"engine {path} does not exist: build it with `python scripts/export.py --out CKPT "
                               "--existing --engine`")
        record = read_record(path)
        check_version(record, path, trt.__version__)
        self.kv_binding = record.get("kv_binding", ALIASED)
        register_plugins()  # the engine's plugin nodes resolve to these creators at deserialization
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BitNestError(f"TensorRT {trt.__version__} could not deserialize {path} (built by another TensorRT "
                               f"version, or not an engine): {REBUILD}")
        lo, _, hi = self.engine.get_tensor_profile_shape(kv_inputs(0)[0], 0)
        if not lo[2] <= capacity <= hi[2]:
            raise BitNestError(f"a KV capacity of {capacity} is outside the engine's profile [{lo[2]}, {hi[2]}]: "
                               f"rebuild it with --max-context {capacity} or lower --max-context")
        lo, _, hi = self.engine.get_tensor_profile_shape(INPUT_IDS, 0)
        max_tokens = max_tokens or hi[0]                       # default: the largest pass the engine was built for
        if max_tokens > hi[0] or max_tokens > capacity:
            raise BitNestError(f"passes of {max_tokens} tokens exceed the engine's profile ({hi[0]}) or the capacity "
                               f"({capacity}): lower gamma or rebuild with --max-tokens {max_tokens}")
        self.torch, self.shapes, self.capacity, self.max_tokens = torch, shapes, capacity, max_tokens
        self.stream = torch.cuda.Stream()
        self.bindings = []    # (I/O tensor name, buffer, shape to set or None): bound once in every context
        dev = torch.device("cuda")
        # per buffer set (one aliased, two ping-pong), per layer: (base, refine, scale), the KV cache itself
        self.planes = [[(torch.zeros(shapes.plane_shape(capacity), dtype=torch.int32, device=dev),
                         torch.zeros(shapes.plane_shape(capacity), dtype=torch.int32, device=dev),
                         torch.zeros(shapes.scale_shape(capacity), dtype=torch.float16, device=dev))
                        for _ in range(shapes.layers)] for _ in range(2 if self.kv_binding == PINGPONG else 1)]
        self.pingpong = PingPong() if self.kv_binding == PINGPONG else None
        # one pinned host staging row: seq_len, kv8_from, view, then the ids, each at a multiple of 256 bytes (the
        # alignment set_tensor_address requires, NvInferRuntime.h); one device copy of its used prefix per pass
        self.host = torch.zeros(_IDS + max_tokens, dtype=torch.int64).pin_memory()
        self.staged = torch.zeros(_IDS + max_tokens, dtype=torch.int64, device=dev)
        for i, name in enumerate((SEQ_LEN, KV8_FROM, VIEW)):
            self.bindings.append((name, self.staged[i * _SLOT:i * _SLOT + 1], (1,)))
        self.logits = torch.empty(max_tokens, shapes.vocab, dtype=torch.float32, device=dev)
        self.logits_host = torch.empty(max_tokens, shapes.vocab, dtype=torch.float32).pin_memory()
        self.bindings += [(INPUT_IDS, self.staged[_IDS:], None), (LOGITS, self.logits, None)]
        self.width, self.context, self.passes = None, None, None
        if graphs:
            from edge.backends.tensorrt_graphs import GraphedPasses
            self.passes = GraphedPasses(trt, self.engine, self._bind_all, self.stream, torch)
        else:
            self.context = self.engine.create_execution_context()
            self._bind_all(self.context, None)

    def plane_bindings(self, parity: int) -> list:
        """(name, buffer, shape or None) of every KV plane input and output for a pass reading set `parity`: the
        same buffer for both where aliased, set parity in and set 1 - parity out with ping-pong."""
        src, dst = self.planes[parity], self.planes[(1 - parity) % len(self.planes)]
        out = []
        for layer in range(self.shapes.layers):
            for i, o, a, b in zip(kv_inputs(layer), kv_outputs(layer), src[layer], dst[layer]):
                out += [(i, a, tuple(a.shape)), (o, b, None)]
        return out

    def _bind_all(self, context, key) -> None:
        """Bind every I/O tensor's address and fixed shape in `context` (once: they never change), and the pass
        width where given. `key`: None, a width, or (width, parity) with ping-pong KV (GraphedPasses' keys)."""
        width, parity = key if isinstance(key, tuple) else (key, 0)
        for name, t, shape in self.bindings + self.plane_bindings(parity):
            if shape is not None and not context.set_input_shape(name, shape):
                raise BitNestError(f"TensorRT refused shape {shape} for {name}")
            if not context.set_tensor_address(name, t.data_ptr()):
                raise BitNestError(f"TensorRT refused the address of {name}")
        if width is not None and not context.set_input_shape(INPUT_IDS, (width,)):
            raise BitNestError(f"TensorRT refused a pass of {width} tokens")

    def execute(self, ids: list[int], view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Pass over `ids` at positions [seq_len - M, seq_len): logits float32 [M, V] (a host copy)."""
        m = len(ids)
        if not 1 <= m <= min(self.max_tokens, seq_len) or seq_len > self.capacity:
            raise ValueError(f"a pass of {m} tokens ending at {seq_len} does not fit (max {self.max_tokens} tokens, "
                             f"capacity {self.capacity})")
        parity = self.pingpong.next(seq_len, m) if self.pingpong is not None else 0
        h = self.host
        h[0], h[_SLOT], h[2 * _SLOT] = seq_len, kv8_from, view_code(view)
        h[_IDS:_IDS + m] = self.torch.tensor(ids, dtype=self.torch.int64)
        if self.passes is None and m != self.width:           # the only shape that changes between passes
            if not self.context.set_input_shape(INPUT_IDS, (m,)):
                raise BitNestError(f"TensorRT refused a pass of {m} tokens")
            self.width = m
        if self.passes is None and self.pingpong is not None:     # the planes this pass reads and writes
            for name, t, _ in self.plane_bindings(parity):
                if not self.context.set_tensor_address(name, t.data_ptr()):
                    raise BitNestError(f"TensorRT refused the address of {name}")
        with self.torch.cuda.stream(self.stream):
            self.staged[:_IDS + m].copy_(h[:_IDS + m], non_blocking=True)
            if self.passes is not None:
                self.passes.run((m, parity) if self.pingpong is not None else m)
            elif not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see its log)")
            self.logits_host[:m].copy_(self.logits[:m], non_blocking=True)
        self.stream.synchronize()
        return self.logits_host[:m].numpy().copy()


def tensorrt_engine(ckpt: Checkpoint, capacity: int, engine_path=None, max_tokens: int | None = None,
                    graphs: bool = True) -> StepEngine:
    """A StepEngine over CHECKPOINT/decoder_step.engine (or `engine_path`) for `generate` and the policies;
    passes of up to `max_tokens` (default: the engine profile's largest M), replayed as CUDA graphs (`graphs`)."""
    path = Path(engine_path or ckpt.path / ENGINE_FILE)
    graph = path.with_name(ONNX_FILE)          # the graph the engine was built from, where it sits beside it
    if graph.is_file():
        import onnx
        meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
        check_graph_draft_head(meta, ckpt, graph)
    runner = TensorRTStepRunner(path, StepShapes.of(ckpt.config), capacity, max_tokens, graphs)
    return StepEngine(ckpt, runner, "tensorrt")
