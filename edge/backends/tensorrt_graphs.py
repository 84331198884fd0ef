"""The tensorrt backend's passes as CUDA-graph replays: per pass width M an execution context of its own (one
scratch buffer shared by all: they run one at a time on one stream) with every address and its input shape bound
once, an eager first pass (the real one, so TensorRT's and Triton's first-launch work stays out of the graph), then
a graph of that context's enqueue, replayed by later passes of that width: one launch per pass instead of ~240
Python plugin calls. A width whose capture fails runs eagerly, its one-line reason kept in `reasons`. The weight
view and the lengths are device inputs (the plugins' kernels read them there), so one graph serves both views.

From TensorRT v10.3.0 (NVIDIA/TensorRT at that tag):
- samples/common/sampleInference.cpp, trtexec's --useCudaGraph: enqueue once and synchronize before capturing
  ("Avoid capturing initialization calls"); capture enqueueV3 on the stream; an engine may hold "operations that are
  not permitted under CUDA graph capture mode", in which case enqueue fails under capture: end the capture, clear the
  error and launch without a graph;
- include/NvInferRuntime.h: ExecutionContextAllocationStrategy::kUSER_MANAGED with IExecutionContext::
  setDeviceMemoryV2 (the memory is in use "from the invocation of enqueueV3() until network execution is complete";
  only a context "running in parallel" may not share it) and ICudaEngine::getDeviceMemorySizeV2, the size for
  every profile;
- a captured graph holds the addresses and shapes of its capture: a context's are bound once and never change.
Untested on TensorRT (none was available): the `trt` tests compare replayed and eager passes where it is."""

from typing import Callable


class GraphedPasses:
    """Runs passes of width M on `stream` through per-key contexts of `engine` (the key: the width M, or (M, parity)
    where the KV planes ping-pong between two buffer sets), replaying a CUDA graph of each after its first pass.
    `bind(context, key)` binds every address and shape of a pass of that key."""

    def __init__(self, trt, engine, bind: Callable, stream, torch):
        self.trt, self.engine, self.bind, self.stream, self.torch = trt, engine, bind, stream, torch
        size = int(engine.device_memory_size_v2)
        self.scratch = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")    # shared by every context
        self.contexts: dict[int, object] = {}
        self.graphs: dict[int, object] = {}
        self.reasons: dict[int, str] = {}

    def _context(self, m):
        ctx = self.engine.create_execution_context(self.trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if ctx is None:
            raise RuntimeError(f"TensorRT could not create an execution context for passes of {m} tokens")
        ctx.set_device_memory(self.scratch.data_ptr(), self.scratch.numel())
        self.bind(ctx, m)
        return ctx

    def _enqueue(self, ctx) -> None:
        if not ctx.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see its log)")

    def _capture(self, m, ctx) -> None:
        """A graph of ctx's enqueue, or the one-line reason it could not be captured (eager from then on)."""
        torch = self.torch
        self.stream.synchronize()                     # the eager first pass has finished: nothing pending is captured
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                if not ctx.execute_async_v3(self.stream.cuda_stream):
                    raise RuntimeError("execute_async_v3 returned false under capture")
        except Exception as e:                        # trtexec's fallback: launch without a graph
            torch.cuda.synchronize()
            self.reasons[m] = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return
        self.graphs[m] = graph

    def run(self, m) -> None:
        """Enqueue one pass of key m (a width, or (width, parity)) on the stream (its inputs already staged in the
        bound buffers)."""
        graph = self.graphs.get(m)
        if graph is not None:
            with self.torch.cuda.stream(self.stream):
                graph.replay()
            return
        ctx = self.contexts.get(m)
        if ctx is None:
            ctx = self.contexts[m] = self._context(m)
            self._enqueue(ctx)                        # the real first pass, eager
            self._capture(m, ctx)
            return
        self._enqueue(ctx)

    def summary(self) -> dict:
        return {"graphs": sorted(self.graphs), "eager": {m: r for m, r in sorted(self.reasons.items())}}
