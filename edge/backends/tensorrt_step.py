"""`tensorrt` backend: deserializes the decoder-step engine (scripts/export.py --engine), keeps the nested
KV planes in device memory with pycuda (one persistent buffer per plane per layer, bound as the engine's
plane inputs, which the attention plugin updates in place: plugins.step_contract), and runs passes on one
stream; edge.decode.step_engine.StepEngine turns it into speculative rounds. Imports tensorrt and pycuda lazily:
it runs on a Jetson (JetPack 6.1/6.2, TensorRT 10.3) or a CUDA machine with TensorRT, nowhere else."""

from pathlib import Path

import numpy as np

from edge.decode.step_engine import StepEngine
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint
from plugins.contracts import view_code
from plugins.step_contract import (
    ENGINE_FILE,
    INPUT_IDS,
    KV8_FROM,
    LOGITS,
    SEQ_LEN,
    VIEW,
    StepShapes,
    kv_inputs,
    kv_outputs,
)


def tensorrt_backend_unavailable() -> str | None:
    """None where this backend can run here, else the one-line reason."""
    from plugins.trt_plugins import tensorrt_unavailable
    reason = tensorrt_unavailable()
    if reason:
        return reason
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as e:
        return f"pycuda is not installed ({e}): pip install -e .[jetson]"
    return None


class TensorRTStepRunner:
    """One sequence's device KV planes and passes through a deserialized step engine."""

    def __init__(self, engine_path, shapes: StepShapes, capacity: int, max_tokens: int | None = None):
        reason = tensorrt_backend_unavailable()
        if reason:
            raise BitNestError(f"tensorrt backend: {reason}")
        import pycuda.autoprimaryctx  # noqa: F401  (torch and pycuda share the primary context)
        import pycuda.driver as cuda
        import tensorrt as trt

        from plugins.trt_plugins import register_plugins

        path = Path(engine_path)
        if not path.is_file():
            raise BitNestError(f"engine {path} does not exist: build it with `python scripts/export.py --out CKPT "
                               "--existing --engine`")
        register_plugins()  # the engine's plugin nodes resolve to these creators at deserialization
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BitNestError(f"TensorRT could not deserialize {path} (built by another TensorRT version?): rebuild it")
        lo, _, hi = self.engine.get_tensor_profile_shape(kv_inputs(0)[0], 0)
        if not lo[2] <= capacity <= hi[2]:
            raise BitNestError(f"a KV capacity of {capacity} is outside the engine's profile [{lo[2]}, {hi[2]}]: "
                               f"rebuild it with --max-context {capacity} or lower --max-context")
        lo, _, hi = self.engine.get_tensor_profile_shape(INPUT_IDS, 0)
        max_tokens = max_tokens or hi[0]                       # default: the largest pass the engine was built for
        if max_tokens > hi[0]:
            raise BitNestError(f"passes of {max_tokens} tokens exceed the engine's profile ({hi[0]}): lower gamma "
                               f"or rebuild with --max-tokens {max_tokens}")
        self.cuda, self.shapes, self.capacity, self.max_tokens = cuda, shapes, capacity, max_tokens
        self.context = self.engine.create_execution_context()
        self.stream = cuda.Stream()
        plane, scale = shapes.plane_shape(capacity), shapes.scale_shape(capacity)
        entries = shapes.plane_shape(max_tokens)
        self.buffers, self.shapes_in = {}, {}
        for layer in range(shapes.layers):
            for name, shp, item in zip(kv_inputs(layer), (plane, plane, scale), (1, 1, 2)):
                self._alloc(name, int(np.prod(shp)) * item, zero=True)
                self.shapes_in[name] = shp
            for name, item in zip(kv_outputs(layer), (1, 1, 2)):   # entries also land in the planes: unread here
                self._alloc(name, int(np.prod(entries)) * item)
        for name in (SEQ_LEN, KV8_FROM, VIEW):
            self._alloc(name, 8)
        self._alloc(INPUT_IDS, 8 * max_tokens)
        self.logits = cuda.pagelocked_empty((max_tokens, shapes.vocab), np.float32)
        self._alloc(LOGITS, self.logits.nbytes)
        self.host_scalars = cuda.pagelocked_empty(3 + max_tokens, np.int64)

    def _alloc(self, name: str, nbytes: int, zero: bool = False) -> None:
        buf = self.cuda.mem_alloc(max(nbytes, 1))
        if zero:
            self.cuda.memset_d8(buf, 0, nbytes)
        self.buffers[name] = buf

    def execute(self, ids: list[int], view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Pass over `ids` at positions [seq_len - M, seq_len): logits float32 [M, V] (a host copy)."""
        m, cuda, ctx = len(ids), self.cuda, self.context
        if not 1 <= m <= min(self.max_tokens, seq_len) or seq_len > self.capacity:
            raise ValueError(f"a pass of {m} tokens ending at {seq_len} does not fit (max {self.max_tokens} tokens, "
                             f"capacity {self.capacity})")
        h = self.host_scalars
        h[0], h[1], h[2], h[3:3 + m] = seq_len, kv8_from, view_code(view), ids
        for i, name in enumerate((SEQ_LEN, KV8_FROM, VIEW)):
            cuda.memcpy_htod_async(self.buffers[name], h[i:i + 1], self.stream)
        cuda.memcpy_htod_async(self.buffers[INPUT_IDS], h[3:3 + m], self.stream)
        ctx.set_input_shape(INPUT_IDS, (m,))
        for name in (SEQ_LEN, KV8_FROM, VIEW):
            ctx.set_input_shape(name, (1,))
        for name, shp in self.shapes_in.items():
            ctx.set_input_shape(name, shp)
        for name, buf in self.buffers.items():
            ctx.set_tensor_address(name, int(buf))
        if not ctx.execute_async_v3(self.stream.handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see its log)")
        cuda.memcpy_dtoh_async(self.logits[:m], self.buffers[LOGITS], self.stream)
        self.stream.synchronize()
        return self.logits[:m].copy()


def tensorrt_engine(ckpt: Checkpoint, capacity: int, engine_path=None, max_tokens: int | None = None) -> StepEngine:
    """A StepEngine over CHECKPOINT/decoder_step.engine (or `engine_path`) for `generate` and the policies;
    passes of up to `max_tokens` (default: the engine profile's largest M)."""
    runner = TensorRTStepRunner(engine_path or ckpt.path / ENGINE_FILE, StepShapes.of(ckpt.config), capacity, max_tokens)
    return StepEngine(ckpt, runner, "tensorrt")
