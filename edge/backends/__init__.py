"""Backends, chosen by name. Per-op backends (`torch`, `cpu`, `triton`) give the PyTorch-pass engine its linear
and attention ops; whole-step backends (`native`: the C++ step; `onnxruntime`, `tensorrt`: the exported step graph)
run a decoder pass in one call. `make_engine` is the one factory: every engine implements
edge.engine.interface.Engine. `auto` is `native` where it builds and runs here, else `cpu`."""

from edge.engine.interface import Engine, PassBackend, PassEngine
from edge.engine.kv_cache import ElasticKV
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint

PASS_BACKENDS = ("cpu", "torch", "triton")
STEP_BACKENDS = ("native", "onnxruntime", "tensorrt")
BACKENDS = ("auto",) + STEP_BACKENDS[:1] + PASS_BACKENDS + STEP_BACKENDS[1:]


def check_backend(name: str) -> str:
    """`name` if it names a backend, else the one-line error listing them."""
    if name not in BACKENDS:
        raise BitNestError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    return name


def resolve_backend(name: str) -> str:
    """The backend `name` stands for: `auto` is `native` where it runs here, else `cpu`."""
    if check_backend(name) != "auto":
        return name
    from edge.backends.native import native_unavailable
    from plugins import native
    if native.requested_isa() and native.unavailable() is None and native.isa_problem():
        raise BitNestError(native.isa_problem())      # a kernel set forced by hand that cannot run: never silently cpu
    return "native" if native_unavailable() is None else "cpu"


def make_backend(name: str, ckpt: Checkpoint) -> PassBackend:
    """The per-op backend `name` over a loaded checkpoint (it may re-lay or move the planes in place)."""
    if check_backend(name) == "torch":
        from edge.backends.torch_ref import TorchBackend
        return TorchBackend(ckpt, act_int8=True)
    if name == "cpu":
        from edge.backends.cpu import CpuInt4Backend
        return CpuInt4Backend(ckpt)
    if name == "triton":
        from edge.backends.triton_gpu import TritonBackend
        return TritonBackend(ckpt)
    raise BitNestError(f"the {name} backend runs whole decoder steps and has no per-op form: use make_engine")


ELASTIC_BACKENDS = ("native", "cpu", "torch")   # the backends that read elastic KV (a refinement ring, per-query windows)
# Backends that run a checkpoint loaded with its base planes only (`--weights base`): the exported step graphs
# (onnxruntime, tensorrt) and the Triton kernels take both planes of every linear.
BASE_WEIGHT_BACKENDS = ("native", "cpu", "torch")


def make_engine(name: str, ckpt: Checkpoint, capacity: int, scratch: int = 8, prefill_chunk: int = 256,
                elastic: ElasticKV | None = None) -> Engine:
    """An engine of backend `name` for one sequence of up to `capacity` positions, with `scratch` draft slots;
    `elastic`: elastic KV (edge.engine.kv_cache.ElasticKV), on the ELASTIC_BACKENDS only."""
    name = resolve_backend(name)
    if elastic is not None and name not in ELASTIC_BACKENDS:
        raise BitNestError(f"elastic KV (--kv-window) runs on the {', '.join(ELASTIC_BACKENDS)} backends, not {name}")
    if not ckpt.has_target and name not in BASE_WEIGHT_BACKENDS:
        raise BitNestError(f"the {name} backend runs both planes of every linear and cannot run --weights base: use "
                           f"--backend {' or '.join(BASE_WEIGHT_BACKENDS)}, or --weights nested")
    if name == "native":
        from edge.backends.native import NativeEngine
        return NativeEngine(ckpt, capacity, scratch=scratch, prefill_chunk=prefill_chunk, elastic=elastic)
    if name == "onnxruntime":
        from edge.backends.onnxruntime_step import onnxruntime_engine
        return onnxruntime_engine(ckpt, capacity)
    if name == "tensorrt":
        from edge.backends.tensorrt_step import tensorrt_engine
        return tensorrt_engine(ckpt, capacity)
    if name == "triton":     # static passes, replayed as CUDA graphs on a GPU (edge.backends.triton_graphs)
        from edge.backends.triton_graphs import GraphedEngine
        return GraphedEngine(ckpt, make_backend(name, ckpt), capacity, scratch=scratch, prefill_chunk=prefill_chunk)
    return PassEngine(ckpt, make_backend(name, ckpt), capacity, scratch=scratch, prefill_chunk=prefill_chunk,
                      elastic=elastic)
