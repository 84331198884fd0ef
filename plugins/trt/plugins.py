"""TensorRT plugins for the `bitnest` ops (DualPlaneGemv, NestedKvAttention) as Python IPluginV3 classes,
the plugin interface TensorRT 10.3 (JetPack 6.1/6.2) runs from Python: their declared I/O (`PLUGIN_IO`, read
by export.trt.readiness without TensorRT), their enqueue logic on torch tensors (`enqueue_op`, testable without
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
  attention plugin's plane outputs alias its plane inputs. Built without the feature (the ping-pong KV binding,
  edge.backends.tensorrt_kv) the outputs are buffers of their own: the plugin copies the last `kv_window` positions
  before the pass from input to output (`catch_up`; kv_window is the profile's largest pass, taken from
  configure_plugin's max dims and serialized with the engine), never the whole plane;
- Python's enqueue return value is not read: an exception becomes -1 (pyPlugin.cpp, enqueue);
- the Python wrapper has no default for set_tactic, on_shape_change, attach_to_context, get_fields_to_serialize,
  enqueue, configure_plugin, the output types and shapes, supports_format_combination, get_capability_interface and
  clone (a missing one fails the build or the engine): plugins.trt.conformance lists them with the evidence and plays
  TensorRT's calls without TensorRT (tests/test_trt_conformance.py); the classes define every one, and
  get_valid_tactics / get_workspace_size as NVIDIA's V3 samples do;
- the ONNX parser imports a node it has no importer for as a plugin, looked up by (op_type, the node's `plugin_version`
  attribute, default "1", its `plugin_namespace` attribute, default ""); from TensorRT 10.10, where that finds no
  creator, it looks again with the node's domain as the namespace (onnx-tensorrt onnxOpImporters.cpp,
  FallbackPluginImporter; onnx-tensorrt PR #1025, the 10.10-GA release: "Plugin fallback importer now also reads its
  namespace from a Node's domain field"; at 10.1-GA, onnxOpImporters.cpp line 6443, the attribute alone). The graph's
  plugin nodes carry no `plugin_namespace`, so every version finds the creators registered under "" first; those
  registered under `bitnest` (the graph's domain) serve only a node that names that namespace in its attribute.
"""

import importlib.util
from dataclasses import dataclass, field

from plugins.contracts import DOMAIN, DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION
from plugins.step_contract import TILE_ROWS, as_bytes

PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
PLUGIN_NAMESPACES = (PLUGIN_NAMESPACE, DOMAIN)       # "": the parser's default (attribute absent); DOMAIN: see above
MIN_TENSORRT = (10, 3)
KV_WINDOW_FIELD = "kv_window"     # the attention plugin's serialized field: the profile's largest pass (its catch-up)

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
        return (f"TensorRT is not installed ({e}); it ships with JetPack 6.1/6.2 (TensorRT 10.3); the tensorrt "
                "packages on the package index are stubs whose install fetches TensorRT from NVIDIA's own index "
                "(x86_64 only): run on a Jetson or a CUDA machine with TensorRT >= 10.3")
    version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT or not hasattr(trt, "IPluginV3") or not hasattr(trt, "IPluginV3OneBuildV2"):
        return (f"TensorRT {trt.__version__} lacks Python IPluginV3 plugins with aliased I/O (IPluginV3OneBuildV2): "
                "use TensorRT >= 10.3 (JetPack 6.1/6.2)")
    reason = plugin_library_unavailable()
    if reason:
        return reason
    import torch
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch: TensorRT plugins launch Triton kernels through torch.cuda"
    return None


def plugin_library_unavailable() -> str | None:
    """None where the plugins' kernel library imports (plugins.kernels' Triton modules, which every enqueue
    launches), else the one-line reason naming the fix. Checked before the creators are registered: a plugin whose
    enqueue cannot import its kernels would fail inside TensorRT (enqueue returns -1, the engine stops)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (the plugins launch Triton kernels): pip install -e .[jetson]"
    try:
        import plugins.kernels.attention  # noqa: F401
        import plugins.kernels.gemv  # noqa: F401
        import plugins.kernels.kv_write  # noqa: F401
    except ImportError as e:
        return (f"the plugins' kernel library plugins.kernels does not import ({e}): reinstall the project with its "
                "kernels and the jetson extra (pip install -e .[jetson])")
    return None


# -- the enqueue logic, on torch tensors (no TensorRT needed) --------------------------------------------------------

def _gemv(ins, outs) -> None:
    """Planes of rank 2 are canonical words [N, K/8]; of rank 5 the warp-tiled words [N/32, K/G, G/32, 32, 4] the
    step graph carries for every linear that tiles (export.onnx.planes): the decode kernel then reads each warp's
    rows in 512-byte loads (plugins.kernels.tiling)."""
    from plugins.kernels import dual_plane_linear_coded, dual_plane_linear_tiled_coded
    from plugins.kernels.tiling import TiledPlanes
    x, base, refine, scale, view = ins[:5]
    offset = ins[5] if len(ins) > 5 else None
    if base.dim() == 5:
        planes = TiledPlanes.from_words(base, refine, scale, offset)
        if x.dim() != 2 or x.shape[1] != planes.k:
            raise ValueError(f"DualPlaneGemv: x {tuple(x.shape)} does not fit tiled planes {tuple(base.shape)}")
        dual_plane_linear_tiled_coded(x, planes, view, out=outs[0])
        return
    if x.dim() != 2 or base.shape != refine.shape or base.shape[1] * 8 != x.shape[1]:
        raise ValueError(f"DualPlaneGemv: x {tuple(x.shape)} does not fit planes {tuple(base.shape)} (int32 words)")
    dual_plane_linear_coded(x, as_bytes(base), as_bytes(refine), scale, view, offset, out=outs[0])


def catch_up(dst, src, seq_len, t: int, window: int) -> None:
    """Copy positions [S - t - window, S - t) of plane `src` into plane `dst` (dim 2 is the position; S = seq_len, a
    device scalar clamped to [t, C] as the KV write clamps it): what a ping-pong output buffer lacks of the history.
    The index is computed on the device (no host read: capturable in a CUDA graph); positions below 0 clamp to 0."""
    import torch
    cap = src.shape[2]
    end = seq_len.reshape(()).clamp(t, cap) - t                                        # [] first position written now
    idx = (end - window + torch.arange(window, device=src.device)).clamp(0, cap - 1)   # [window]
    dst.index_copy_(2, idx, src.index_select(2, idx))


def _attention(ins, outs, window: int = 0) -> None:
    """Attention over planes with this pass's entries written. Planes in place where each output is its input's
    buffer (the aliasing build: a copy TensorRT inserts for aliased I/O sits in front of the plugin, which still sees
    one buffer for both, NvInferRuntime.h v10.3.0 getAliasedInput's diagram); otherwise (the ping-pong build: separate input and output buffers, swapped by the
    runner each pass, edge.backends.tensorrt_kv) the output buffer holds the history as of two passes ago, so the
    last `window` (the profile's largest pass, >= the previous pass's width) positions before this pass are copied
    from the input first: every pass starts at or before the previous pass's end, so that is all the output lacks.
    window 0 (an engine that did not record it): the whole plane is copied."""
    from plugins.kernels import nested_kv_attention_at, write_kv_at
    q, k, v, base, refine, scale, seq_len, kv8_from = ins
    out, base_out, refine_out, scale_out = outs
    t, cap = q.shape[1], base.shape[2]
    if not 1 <= t <= cap or k.shape != v.shape or k.shape[1] != t:
        raise ValueError(f"NestedKvAttention: {t} queries do not fit a KV capacity of {cap}")
    for dst, src in ((base_out, base), (refine_out, refine), (scale_out, scale)):
        if dst.data_ptr() == src.data_ptr():      # aliased: the entries are written in place
            continue
        if window > 0:
            catch_up(dst, src, seq_len, t, window)
        else:
            dst.copy_(src)
    pb, pr = as_bytes(base_out), as_bytes(refine_out)                 # [2, Hkv, C, D/2] bytes
    write_kv_at(k, v, pb, pr, scale_out, seq_len)                      # entries of positions [S - T, S), in place
    nested_kv_attention_at(q, pb, pr, scale_out, seq_len, seq_len, kv8_from, out=out)


_RUN = {DUAL_PLANE_LINEAR.graph: _gemv, NESTED_KV_ATTENTION.graph: _attention}


def enqueue_op(op: str, ins, outs, building: bool, kv_window: int = 0) -> int:
    """One plugin execution on torch tensors over TensorRT's buffers: 0, or an exception for shapes that cannot
    run. In the build phase nothing is launched: TensorRT may time the plugin on fake data (garbage view and
    lengths), and a timing of one tactic chooses nothing. `kv_window`: the attention's catch-up window (_attention)."""
    if building:
        return 0
    if op == NESTED_KV_ATTENTION.graph:
        _attention(ins, outs, kv_window)
    else:
        _RUN[op](ins, outs)
    return 0


# -- the IPluginV3 glue ----------------------------------------------------------------------------------------------

class _CudaArray:
    """A device pointer seen as an array (CUDA array interface v3), for torch.as_tensor."""

    def __init__(self, ptr: int, shape, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(int(d) for d in shape), "typestr": typestr,
                                         "data": (int(ptr), False), "version": 3, "strides": None}


class _HostArray:
    """A host pointer seen as an array (numpy array interface v3): the plugins defined for the CPU (the Triton
    interpreter), which plugins.trt.conformance drives without TensorRT."""

    def __init__(self, ptr: int, shape, typestr: str):
        self.__array_interface__ = {"shape": tuple(int(d) for d in shape), "typestr": typestr,
                                    "data": (int(ptr), False), "version": 3, "strides": None}


_TYPESTR = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8"}


def define_plugins(trt, device: str = "cuda"):
    """((DualPlaneGemvPlugin, NestedKvAttentionPlugin), creator class) over a tensorrt module (TensorRT's, or
    plugins.trt.standin); `device` "cuda" takes TensorRT's addresses as device pointers, "cpu" as host pointers."""
    import numpy as np
    import torch

    if device not in ("cuda", "cpu"):
        raise ValueError(f"plugins run on 'cuda' or 'cpu', not {device!r}")
    dtype = {"float32": trt.DataType.FLOAT, "float16": trt.DataType.HALF, "int32": trt.DataType.INT32,
             "int64": trt.DataType.INT64}
    names = {v: k for k, v in dtype.items()}
    # the attention plugin writes into its plane inputs: defined only as declared aliasing (get_aliased_input, on
    # IPluginV3OneBuildV2); on IPluginV3OneBuild the same writes would be undefined, so there is no fallback
    if not hasattr(trt, "IPluginV3OneBuildV2"):
        raise RuntimeError(f"TensorRT {getattr(trt, '__version__', '?')} has no IPluginV3OneBuildV2 (aliased plugin "
                           "I/O): the KV planes are written in place; use TensorRT >= 10.3 (JetPack 6.1/6.2)")
    build_base = trt.IPluginV3OneBuildV2

    def tensor(ptr, desc):
        """torch view of a TensorRT I/O tensor (no copy)."""
        shape, typestr = tuple(desc.dims), _TYPESTR[names[desc.type]]
        if device == "cpu":
            return torch.from_numpy(np.asarray(_HostArray(ptr, shape, typestr)))
        return torch.as_tensor(_CudaArray(ptr, shape, typestr), device="cuda")

    def dims(exprs):
        d = trt.DimsExprs(len(exprs))
        for i, e in enumerate(exprs):
            d[i] = e
        return d

    class _Plugin(trt.IPluginV3, trt.IPluginV3OneCore, build_base, trt.IPluginV3OneRuntime):
        """Shared IPluginV3 plumbing; subclasses give the name and output shapes, PLUGIN_IO the types."""

        name = ""

        def __init__(self, phase=None, namespace: str = PLUGIN_NAMESPACE):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            build_base.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.io = PLUGIN_IO[self.name]
            self.plugin_name, self.plugin_namespace, self.plugin_version = self.name, namespace, PLUGIN_VERSION
            self.num_outputs = len(self.io.outputs)
            self.timing_cache_id = ""
            self.phase = phase
            self.kv_window = 0             # the attention's catch-up window (_attention), serialized in the engine

        def read_fields(self, fc) -> None:
            """Take the fields the engine serialized (get_fields_to_serialize) or the parser passed (none)."""
            for f in fc or ():
                if f.name == KV_WINDOW_FIELD and f.data is not None and len(f.data):
                    self.kv_window = int(f.data[0])

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

        def get_valid_tactics(self):
            return []                                  # no custom tactics: TensorRT runs tactic 0

        def get_workspace_size(self, input_desc, output_desc):
            return 0

        def set_tactic(self, tactic):
            return 0                                   # 10.3 has no default for it (the engine would terminate)

        def on_shape_change(self, inp, out):
            pass

        def serialized_values(self) -> list:
            """(name, int32 value) of each field the engine stores for this plugin (the attention adds its window)."""
            return []

        def get_fields_to_serialize(self):
            # The buffer, the PluginField over it and the collection returned stay on the plugin for its lifetime,
            # made once and rewritten in place (a collection returned earlier never points at freed memory). 10.3's
            # trt.PluginFieldCollection is a std::vector of PluginField struct copies (pyTensorRT.cpp v10.3.0 line
            # 48; pybind11's bind_vector pushes copies) that keeps no buffer alive: a buffer lives as long as the
            # PluginField made over it (keep_alive<1, 3>, pyPlugin.cpp v10.3.0 line 2414) or whatever holds it; the
            # wrapper's C collection points into the returned vector (lines 1956-1957, 2465), held only until the
            # enclosing build call returns (plugins.trt.conformance.build says how).
            values = self.serialized_values()
            kept = self.__dict__.get("_serialized")
            if kept is None:
                buffers = [np.zeros(1, np.int32) for _ in values]
                made = [trt.PluginField(n, b, trt.PluginFieldType.INT32) for (n, _), b in zip(values, buffers)]
                kept = self._serialized = (buffers, made, trt.PluginFieldCollection(made))
            for buf, (_, v) in zip(kept[0], values):
                buf[0] = v
            return kept[2]

        def attach_to_context(self, context):
            # a new clone per execution context ("A clone of the IPluginV3 object", NvInferRuntime.h v10.3.0 line 1078),
            # which TensorRT owns (pyPlugin.cpp v10.3.0 line 1549, .release())
            return self.clone()

        def clone(self):
            c = type(self)(self.phase, self.plugin_namespace)
            c.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_serialized"})   # fields: its own
            return c

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            building = self.phase == trt.TensorRTPhase.BUILD
            if building:
                return enqueue_op(self.name, [], [], True)
            ins = [tensor(p, d) for p, d in zip(inputs, input_desc)]
            outs = [tensor(p, d) for p, d in zip(outputs, output_desc)]
            if device == "cpu":
                return enqueue_op(self.name, ins, outs, False, self.kv_window)
            with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
                return enqueue_op(self.name, ins, outs, False, self.kv_window)

    class DualPlaneGemvPlugin(_Plugin):
        """y [M, N] float32 = x [M, K] @ W_view^T (plugins.kernels.dual_plane_linear_coded)."""

        name = DUAL_PLANE_LINEAR.graph

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            rows = inputs[1][0]
            if len(inputs[1]) == 5:                   # warp-tiled words [N/32, K/G, G/32, 32, 4]: N = 32 blocks
                rows = expr_builder.operation(trt.DimensionOperation.PROD, rows, expr_builder.constant(TILE_ROWS))
            return [dims([inputs[0][0], rows])]

    class NestedKvAttentionPlugin(_Plugin):
        """out [Hq, T, D] and the three planes (aliased to the plane inputs, entries written in place)."""

        name = NESTED_KV_ATTENTION.graph

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [trt.DimsExprs(inputs[0]), trt.DimsExprs(inputs[3]), trt.DimsExprs(inputs[4]),
                    trt.DimsExprs(inputs[5])]

        def configure_plugin(self, inp, out):
            # q [Hq, T, D]: the profile's largest T bounds the previous pass's width, hence what a ping-pong output
            # buffer lacks (DynamicPluginTensorDesc.max, pyPlugin.cpp v10.3.0 line 2393)
            self.kv_window = int(inp[0].max[1])

        def serialized_values(self):
            return [(KV_WINDOW_FIELD, self.kv_window)]

    class _Creator(trt.IPluginCreatorV3One):
        """Creates one plugin class's plugins in one namespace (they report it: the engine finds this creator)."""

        def __init__(self, plugin_cls, namespace: str = PLUGIN_NAMESPACE):
            trt.IPluginCreatorV3One.__init__(self)
            self.plugin_cls = plugin_cls
            self.name, self.plugin_namespace, self.plugin_version = plugin_cls.name, namespace, PLUGIN_VERSION
            self.field_names = trt.PluginFieldCollection([])

        def create_plugin(self, name, fc, phase):
            plugin = self.plugin_cls(phase, self.plugin_namespace)
            plugin.read_fields(fc)
            if phase == trt.TensorRTPhase.RUNTIME and self.plugin_cls.name == NESTED_KV_ATTENTION.graph:
                _runtime_windows.append(plugin.kv_window)
            return plugin

    return (DualPlaneGemvPlugin, NestedKvAttentionPlugin), _Creator


def register_creators(trt, registry, device: str = "cuda") -> list:
    """A creator per plugin and namespace (PLUGIN_NAMESPACES), each checked to define every method TensorRT 10.3's
    Python wrapper has no default for, registered with `registry`; returns them (keep them alive: the registry does
    not own Python creators). RuntimeError, one line, where a class lacks a method or the registry refuses one."""
    from plugins.trt.conformance import ConformanceError, check_required
    reason = plugin_library_unavailable()
    if reason:
        raise RuntimeError(reason)
    plugins, creator_cls = define_plugins(trt, device)
    out = []
    for cls in plugins:
        try:
            check_required(cls, creator_cls)
        except ConformanceError as e:
            raise RuntimeError(str(e)) from None
        for namespace in PLUGIN_NAMESPACES:
            creator = creator_cls(cls, namespace)
            if registry.register_creator(creator, namespace) is False:
                raise RuntimeError(f"TensorRT's plugin registry refused {cls.name} v{PLUGIN_VERSION} in namespace "
                                   f"{namespace!r} (another creator holds it): register the plugins once per process")
            out.append(creator)
    return out


_creators: list = []
_runtime_windows: list[int] = []      # the kv_window of every runtime attention plugin created in this process


def runtime_windows() -> list[int]:
    """The catch-up window each runtime attention plugin of this process was created with, in order (the engine build
    reads it back after deserializing what it built, into its build record)."""
    return list(_runtime_windows)


def register_plugins() -> list[str]:
    """Register both plugins' creators with TensorRT's plugin registry under every PLUGIN_NAMESPACES entry (once per
    process); returns the plugin names. Raises RuntimeError with the reason where TensorRT plugins cannot run here."""
    reason = tensorrt_unavailable()
    if reason:
        raise RuntimeError(reason)
    import tensorrt as trt
    if not _creators:
        _creators.extend(register_creators(trt, trt.get_plugin_registry()))
    return sorted({c.name for c in _creators})
