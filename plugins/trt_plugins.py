"""TensorRT plugins for the `bitnest` ops (DualPlaneGemv, NestedKvAttention) as Python IPluginV3 classes,
the plugin interface TensorRT 10.3 (JetPack 6.1/6.2) runs from Python: their declared I/O (`PLUGIN_IO`, read
by export.trt_readiness without TensorRT), their enqueue logic on torch tensors (`enqueue_op`, testable without
TensorRT) and the IPluginV3 glue over an imported tensorrt module. `enqueue` wraps TensorRT's device pointers as
torch tensors (__cuda_array_interface__) and launches the Triton launchers of plugins.kernels on TensorRT's
stream (torch.cuda.ExternalStream). tensorrt, torch.cuda and the kernels import lazily.

Facts of TensorRT 10.3 this follows (NVIDIA/TensorRT v10.3.0 headers and python/src/infer/pyPlugin.cpp):
- no kBOOL or kUINT8 plugin tensor (NvInferRuntime.h, IPluginV3OneBuild::getOutputDataTypes): packed planes travel
  as int32 words (plugins.step_contract) and are viewed as bytes here;
- the builder may call `enqueue` on fake data while it times tactics (getValidTactics: "the plugin will be timed");
  in the build phase `enqueue` returns at once, and at run time the kernels clamp garbage lengths themselves;
- scalar inputs (view, seq_len, kv8_from) stay on the device: the kernels read them (no host read, no sync);
- a plugin may write into an input only when the output is declared aliased to it (IPluginV3OneBuildV2::
  getAliasedInput, effective with PreviewFeature::kALIASED_PLUGIN_IO_10_03; "TensorRT may insert copies"): the
  attention plugin's plane outputs alias its plane inputs, and where TensorRT hands distinct buffers the plane is
  copied to the output before the in-place write, so the output is right either way;
- Python's enqueue return value is not read: an exception becomes -1 (pyPlugin.cpp, enqueue).
"""

import importlib.util
from dataclasses import dataclass, field

from plugins.contracts import DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION
from plugins.step_contract import as_bytes

PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
MIN_TENSORRT = (10, 3)

# Element types a TensorRT 10.3 plugin tensor may have (every DataType but kBOOL and kUINT8; FP8 and INT4 left out).
TRT_PLUGIN_TYPES = ("float32", "float16", "bfloat16", "int8", "int32", "int64")


@dataclass(frozen=True)
class PluginIO:
    """A plugin's I/O as TensorRT sees it: element type names per input and output (numpy names), how many
    trailing inputs are optional, and which output aliases which input (output index -> input index)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optional_inputs: int = 0
    aliases: dict = field(default_factory=dict)


PLUGIN_IO = {
    # x, base words, refine words, scale, view [, offset] -> y
    DUAL_PLANE_LINEAR.graph: PluginIO(("float32", "int32", "int32", "float16", "int64", "float16"), ("float32",), 1),
    # q, k, v, kv_base words, kv_refine words, kv_scale, seq_len, kv8_from -> out, and the planes (aliased)
    NESTED_KV_ATTENTION.graph: PluginIO(("float32", "float32", "float32", "int32", "int32", "float16", "int64", "int64"),
                                        ("float32", "int32", "int32", "float16"), 0, {1: 3, 2: 4, 3: 5}),
}


def tensorrt_unavailable() -> str | None:
    """None where TensorRT plugins can run here, else a one-line reason naming the fix."""
    try:
        import tensorrt as trt
    except ImportError as e:
        return (f"TensorRT is not installed ({e}); it ships with JetPack 6.1/6.2 (TensorRT 10.3), "
                "not from PyPI: run on a Jetson or a CUDA machine with TensorRT >= 10.3")
    version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT or not hasattr(trt, "IPluginV3"):
        return f"TensorRT {trt.__version__} lacks Python IPluginV3 plugins: use TensorRT >= 10.3 (JetPack 6.1/6.2)"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (the plugins launch Triton kernels): pip install -e .[jetson]"
    import torch
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch: TensorRT plugins launch Triton kernels through torch.cuda"
    return None


# -- the enqueue logic, on torch tensors (no TensorRT needed) --------------------------------------------------------

def _gemv(ins, outs) -> None:
    from plugins.kernels import dual_plane_linear_coded
    x, base, refine, scale, view = ins[:5]
    offset = ins[5] if len(ins) > 5 else None
    if x.dim() != 2 or base.shape != refine.shape or base.shape[1] * 8 != x.shape[1]:
        raise ValueError(f"DualPlaneGemv: x {tuple(x.shape)} does not fit planes {tuple(base.shape)} (int32 words)")
    dual_plane_linear_coded(x, as_bytes(base), as_bytes(refine), scale, view, offset, out=outs[0])


def _attention(ins, outs) -> None:
    from plugins.kernels import nested_kv_attention_at, write_kv_at
    q, k, v, base, refine, scale, seq_len, kv8_from = ins
    out, base_out, refine_out, scale_out = outs
    t, cap = q.shape[1], base.shape[2]
    if not 1 <= t <= cap or k.shape != v.shape or k.shape[1] != t:
        raise ValueError(f"NestedKvAttention: {t} queries do not fit a KV capacity of {cap}")
    for dst, src in ((base_out, base), (refine_out, refine), (scale_out, scale)):
        if dst.data_ptr() != src.data_ptr():     # TensorRT gave the aliased output its own buffer: start from the input
            dst.copy_(src)
    pb, pr = as_bytes(base_out), as_bytes(refine_out)                 # [2, Hkv, C, D/2] bytes
    write_kv_at(k, v, pb, pr, scale_out, seq_len)                      # entries of positions [S - T, S), in place
    nested_kv_attention_at(q, pb, pr, scale_out, seq_len, seq_len, kv8_from, out=out)


_RUN = {DUAL_PLANE_LINEAR.graph: _gemv, NESTED_KV_ATTENTION.graph: _attention}


def enqueue_op(op: str, ins, outs, building: bool) -> int:
    """One plugin execution on torch tensors over TensorRT's buffers: 0, or an exception for shapes that cannot
    run. In the build phase nothing is launched: TensorRT may time the plugin on fake data (garbage view and
    lengths), and a timing of one tactic chooses nothing."""
    if building:
        return 0
    _RUN[op](ins, outs)
    return 0


# -- the IPluginV3 glue ----------------------------------------------------------------------------------------------

class _CudaArray:
    """A device pointer seen as an array (CUDA array interface v3), for torch.as_tensor."""

    def __init__(self, ptr: int, shape, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(int(d) for d in shape), "typestr": typestr,
                                         "data": (int(ptr), False), "version": 3, "strides": None}


_TYPESTR = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8"}


def _define(trt):
    """The plugin and creator classes over an imported tensorrt module (built once, lazily)."""
    import torch

    dtype = {"float32": trt.DataType.FLOAT, "float16": trt.DataType.HALF, "int32": trt.DataType.INT32,
             "int64": trt.DataType.INT64}
    names = {v: k for k, v in dtype.items()}
    # IPluginV3OneBuildV2 (TensorRT >= 10.3) adds get_aliased_input; the bindings accept either build interface
    build_base = getattr(trt, "IPluginV3OneBuildV2", trt.IPluginV3OneBuild)

    def tensor(ptr, desc):
        """torch view of a TensorRT I/O tensor (no copy)."""
        return torch.as_tensor(_CudaArray(ptr, tuple(desc.dims), _TYPESTR[names[desc.type]]), device="cuda")

    def dims(exprs):
        d = trt.DimsExprs(len(exprs))
        for i, e in enumerate(exprs):
            d[i] = e
        return d

    class _Plugin(trt.IPluginV3, trt.IPluginV3OneCore, build_base, trt.IPluginV3OneRuntime):
        """Shared IPluginV3 plumbing; subclasses give the name and output shapes, PLUGIN_IO the types."""

        name = ""

        def __init__(self, phase=None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            build_base.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.io = PLUGIN_IO[self.name]
            self.plugin_name, self.plugin_namespace, self.plugin_version = self.name, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.num_outputs = len(self.io.outputs)
            self.timing_cache_id = ""
            self.phase = phase

        def get_capability_interface(self, kind):
            return self

        def get_output_data_types(self, input_types):
            return [dtype[t] for t in self.io.outputs]

        def get_aliased_input(self, output_index):
            return self.io.aliases.get(output_index, -1)

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            want = self.io.inputs[pos] if pos < num_inputs else self.io.outputs[pos - num_inputs]
            return desc.type == dtype[want]

        def configure_plugin(self, inp, out):
            pass

        def on_shape_change(self, inp, out):
            pass

        def get_fields_to_serialize(self):
            return trt.PluginFieldCollection([])

        def attach_to_context(self, context):
            return self.clone()

        def clone(self):
            c = type(self)(self.phase)
            c.__dict__.update(self.__dict__)
            return c

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            building = self.phase == trt.TensorRTPhase.BUILD
            if building:
                return enqueue_op(self.name, [], [], True)
            ins = [tensor(p, d) for p, d in zip(inputs, input_desc)]
            outs = [tensor(p, d) for p, d in zip(outputs, output_desc)]
            with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
                return enqueue_op(self.name, ins, outs, False)

    class DualPlaneGemvPlugin(_Plugin):
        """y [M, N] float32 = x [M, K] @ W_view^T (plugins.kernels.dual_plane_linear_coded)."""

        name = DUAL_PLANE_LINEAR.graph

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [dims([inputs[0][0], inputs[1][0]])]

    class NestedKvAttentionPlugin(_Plugin):
        """out [Hq, T, D] and the three planes (aliased to the plane inputs, entries written in place)."""

        name = NESTED_KV_ATTENTION.graph

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [trt.DimsExprs(inputs[0]), trt.DimsExprs(inputs[3]), trt.DimsExprs(inputs[4]),
                    trt.DimsExprs(inputs[5])]

    class _Creator(trt.IPluginCreatorV3One):
        def __init__(self, plugin_cls):
            trt.IPluginCreatorV3One.__init__(self)
            self.plugin_cls = plugin_cls
            self.name, self.plugin_namespace, self.plugin_version = plugin_cls.name, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.field_names = trt.PluginFieldCollection([])

        def create_plugin(self, name, fc, phase):
            return self.plugin_cls(phase)

    return (DualPlaneGemvPlugin, NestedKvAttentionPlugin), _Creator


_creators: list = []


def register_plugins() -> list[str]:
    """Register both creators with TensorRT's plugin registry (once per process); returns their names.
    Raises RuntimeError with the reason where TensorRT plugins cannot run here."""
    reason = tensorrt_unavailable()
    if reason:
        raise RuntimeError(reason)
    import tensorrt as trt
    if not _creators:
        plugins, creator_cls = _define(trt)
        registry = trt.get_plugin_registry()
        for cls in plugins:
            creator = creator_cls(cls)
            registry.register_creator(creator, PLUGIN_NAMESPACE)
            _creators.append(creator)  # the registry does not own Python creators: keep them alive
    return [c.name for c in _creators]
