"""TensorRT plugins for the `bitnest` ops (DualPlaneGemv, NestedKvAttention) as Python IPluginV3 classes,
the plugin interface TensorRT 10.3 (JetPack 6.1/6.2) runs from Python. `enqueue` wraps TensorRT's device
pointers as torch tensors (__cuda_array_interface__) and launches the Triton launchers of plugins.kernels
on TensorRT's stream (torch.cuda.ExternalStream). tensorrt, torch.cuda and the kernels import lazily:
nothing here runs without TensorRT and a CUDA GPU (`tensorrt_unavailable` says why).

Scalar inputs (view, seq_len, kv8_from) are int64 device tensors; each plugin reads them to the host once
per enqueue (a stream synchronization per node; see docs/tensorrt.md, "TensorRT on Jetson", for the cost).
The attention plugin writes the pass's KV entries into its plane inputs in place and also returns them
(plugins.step_contract), so the runtime's persistent plane buffers are the engine's KV cache.
"""

import importlib.util

from plugins.contracts import CODE_VIEWS, DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION

PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
MIN_TENSORRT = (10, 3)


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
    import torch
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch: TensorRT plugins launch Triton kernels through torch.cuda"
    if importlib.util.find_spec("plugins.kernels") is None:
        return "plugins.kernels (the Triton launchers) is missing from this install"
    return None


class _CudaArray:
    """A device pointer seen as an array (CUDA array interface v3), for torch.as_tensor."""

    def __init__(self, ptr: int, shape, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(int(d) for d in shape), "typestr": typestr,
                                         "data": (int(ptr), False), "version": 3, "strides": None}


def _typestr(trt, dtype) -> str:
    return {trt.DataType.FLOAT: "<f4", trt.DataType.HALF: "<f2", trt.DataType.UINT8: "|u1",
            trt.DataType.INT64: "<i8", trt.DataType.INT32: "<i4"}[dtype]


def _tensor(trt, ptr, desc):
    """torch view of a TensorRT I/O tensor (no copy)."""
    import torch
    return torch.as_tensor(_CudaArray(ptr, tuple(desc.dims), _typestr(trt, desc.type)), device="cuda")


def _dims(trt, exprs):
    d = trt.DimsExprs(len(exprs))
    for i, e in enumerate(exprs):
        d[i] = e
    return d


def _define(trt):
    """The plugin and creator classes over an imported tensorrt module (built once, lazily)."""
    F, H, U8, I64 = trt.DataType.FLOAT, trt.DataType.HALF, trt.DataType.UINT8, trt.DataType.INT64

    class _Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        """Shared IPluginV3 plumbing; subclasses give the name, I/O types, output shapes and `run`."""

        name = ""
        input_types: tuple = ()
        output_types: tuple = ()
        optional_inputs: int = 0

        def __init__(self, phase=None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_namespace, self.plugin_version = self.name, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.num_outputs = len(self.output_types)
            self.timing_cache_id = ""
            self.phase = phase

        def get_capability_interface(self, kind):
            return self

        def get_output_data_types(self, input_types):
            return list(self.output_types)

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            want = self.input_types[pos] if pos < num_inputs else self.output_types[pos - num_inputs]
            return desc.type == want

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
            import torch
            ins = [_tensor(trt, p, d) for p, d in zip(inputs, input_desc)]
            outs = [_tensor(trt, p, d) for p, d in zip(outputs, output_desc)]
            with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
                self.run(ins, outs)
            return 0

    class DualPlaneGemvPlugin(_Plugin):
        """y [M, N] float32 = x [M, K] @ W_view^T (plugins.kernels.dual_plane_linear)."""

        name = DUAL_PLANE_LINEAR.graph
        input_types = (F, U8, U8, H, I64, H)
        output_types = (F,)

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [_dims(trt, [inputs[0][0], inputs[1][0]])]

        def run(self, ins, outs):
            from plugins.kernels import dual_plane_linear
            x, base, refine, scale, view = ins[:5]
            offset = ins[5] if len(ins) > 5 else None
            v = CODE_VIEWS[int(view.cpu()[0])]                       # host read: syncs the stream
            dual_plane_linear(x, base, refine if v == "target" else None, scale, v, offset, out=outs[0])

    class NestedKvAttentionPlugin(_Plugin):
        """out [Hq, T, D] plus the new KV entries; writes them into the plane inputs in place."""

        name = NESTED_KV_ATTENTION.graph
        input_types = (F, F, F, U8, U8, H, I64, I64)
        output_types = (F, U8, U8, H)

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            q, k, planes = inputs[0], inputs[1], inputs[3]
            entries = _dims(trt, [planes[0], k[0], k[1], planes[3]])              # [2, Hkv, T, D/2]
            return [_dims(trt, [q[0], q[1], q[2]]), entries, _dims(trt, [planes[0], k[0], k[1], planes[3]]),
                    _dims(trt, [planes[0], k[0], k[1]])]

        def run(self, ins, outs):
            from plugins.kernels import nested_kv_attention, write_kv
            q, k, v, base, refine, scale, seq_len, kv8_from = ins
            out, new_base, new_refine, new_scale = outs
            s, t = int(seq_len.cpu()[0]), q.shape[1]                  # host reads: sync the stream
            write_kv(k, v, base, refine, scale, s - t)                # the in-place contract
            new_base.copy_(base[:, :, s - t:s])
            new_refine.copy_(refine[:, :, s - t:s])
            new_scale.copy_(scale[:, :, s - t:s])
            nested_kv_attention(q, base, refine, scale, s, int(kv8_from.cpu()[0]), out=out)

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
