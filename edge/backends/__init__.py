"""Backends: weight stores that run `dual_plane_linear` for the decoder, chosen by name."""

from edge.model.checkpoint import Checkpoint
from edge.errors import BitNestError

BACKENDS = ("torch", "cpu", "triton", "tensorrt")


def make_weights(name: str, ckpt: Checkpoint):
    """The weight store of backend `name` over a loaded checkpoint (may re-lay its planes in place)."""
    if name == "torch":
        from edge.backends.torch_ref import TorchReferenceWeights
        return TorchReferenceWeights(ckpt, act_int8=True)
    if name == "cpu":
        from edge.backends.cpu import CpuInt4Weights
        return CpuInt4Weights(ckpt)
    if name == "triton":
        from edge.backends.triton_gpu import TritonWeights
        return TritonWeights(ckpt)
    if name == "tensorrt":  # runs whole decoder steps from an engine: edge.runtime builds its StepEngine
        raise BitNestError("the tensorrt backend has no weight store: use it through edge.runtime.Runtime")
    raise BitNestError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
