"""TensorRT 10.3's side of a Python IPluginV3 plugin, played without TensorRT: `drive` takes a plugin creator and
real input tensors, calls the plugin's methods in the order TensorRT 10.3 calls them (`build`, then `load`:
deserialization, and `execute`, any number of times on the buffers given), and raises ConformanceError, one line
naming the method, wherever 10.3's Python wrapper would fail:
a method it has no default for is missing, a method raises, or a result has the wrong type or length.

The wrapper (NVIDIA/TensorRT v10.3.0, python/src/infer/pyPlugin.cpp) finds each Python method by name with
pybind11's get_override. Where it finds none it does one of two things:
- no default: it raises "no implementation provided for <name>()" inside a noexcept method and returns its error
  value (-1 or nullptr), which ends the build or the engine. `REQUIRED` lists these, with the lines in that file.
- a default: get_valid_tactics (getNbTactics: "communicate that no custom tactics are used", 0 tactics),
  get_workspace_size (0 bytes), get_aliased_input (-1, no aliasing), destroy (nothing). `DEFAULTS` lists these.
Properties set in __init__ (plugin_name, plugin_version, plugin_namespace, num_outputs; a creator's name,
plugin_version, plugin_namespace, field_names) raise "<name> not initialized" when read unset.

The call order (include/NvInferRuntime.h at v10.3.0, IPluginV3OneBuild / IPluginV3OneRuntime):
- build: create_plugin(BUILD), clone, the capability interfaces, num_outputs, get_output_data_types,
  get_output_shapes, supports_format_combination, get_aliased_input (only with
  PreviewFeature.ALIASED_PLUGIN_IO_10_03), configure_plugin, get_valid_tactics, get_workspace_size, then per tactic
  (tactic 0 where none are advertised) set_tactic and on_shape_change at the profile's shapes and enqueue on fake
  data while the builder times it; get_fields_to_serialize for the engine file.
- run: create_plugin(RUNTIME) with the serialized fields, attach_to_context (a clone per execution context: Engine),
  set_tactic(0) (the chosen tactic: "if no custom tactics were advertised, this will have a value of 0"),
  on_shape_change, enqueue on the real device addresses.
Python's return values of set_tactic, on_shape_change, configure_plugin and enqueue are not read (an exception is
the failure: the wrapper returns -1, and "a non-zero return terminates the engine").

Addresses are the tensors' data_ptr(): device pointers where the plugins were defined for CUDA, host pointers where
they were defined for the CPU (plugins.trt.plugins.define_plugins(..., device="cpu"), kernels in Triton's
interpreter).

Each check is marked in a comment: "10.3:" with the source line that makes it a TensorRT 10.3 rule, or "PROJECT
RULE:" where the harness is stricter than 10.3, saying what 10.3 does instead (the plugins must pass both)."""

import gc

import torch

from plugins.trt import standin as trt

# 10.3's wrapper has no default for these (pyPlugin.cpp at v10.3.0, "no implementation provided for ...()"):
REQUIRED = {
    "IPluginV3": ("get_capability_interface",         # line 776, PyIPluginV3Impl::getCapabilityInterface
                  "clone"),                           # line 823, PyIPluginV3Impl::clone
    "IPluginV3OneBuild": ("supports_format_combination",   # line 1069
                          "get_output_data_types",         # line 1103
                          "get_output_shapes",             # line 1146
                          "configure_plugin"),             # line 1196
    "IPluginV3OneRuntime": ("enqueue",                    # line 1422
                            "set_tactic",                 # line 1474: returns -1, the engine terminates
                            "on_shape_change",            # line 1506
                            "attach_to_context",          # line 1546
                            "get_fields_to_serialize"),   # line 1572
    "IPluginCreatorV3One": ("create_plugin",),            # line 1763
}
# ...and has a default for these (lines 992-1000, 1232-1236, 1377-1382, 847): the value the wrapper uses.
DEFAULTS = {"get_valid_tactics": [], "get_workspace_size": 0, "get_aliased_input": -1, "destroy": None}
PLUGIN_PROPERTIES = ("plugin_name", "plugin_version", "plugin_namespace", "num_outputs")   # lines 976, 1632-1663
CREATOR_PROPERTIES = ("name", "plugin_version", "plugin_namespace", "field_names")        # lines 1716-1787

_DTYPES = {torch.float32: trt.DataType.FLOAT, torch.float16: trt.DataType.HALF, torch.int8: trt.DataType.INT8,
           torch.int32: trt.DataType.INT32, torch.int64: trt.DataType.INT64, torch.bfloat16: trt.DataType.BF16,
           torch.bool: trt.DataType.BOOL, torch.uint8: trt.DataType.UINT8}
_TORCH = {v: k for k, v in _DTYPES.items()}


class ConformanceError(Exception):
    """Where TensorRT 10.3 would fail the plugin: one line naming the class and the method."""


def _is_interface(cls) -> bool:
    """A class of the API itself (the stand-in's, or a real tensorrt module's: `tensorrt`, `tensorrt_bindings`)."""
    return cls in trt.INTERFACES or cls.__module__.startswith("tensorrt")


def defines(cls, name: str) -> bool:
    """Whether attribute lookup on `cls` finds `name` in a plugin's own class, not in an interface class's
    documentation stub (pybind11's get_override: a C++ function found there counts as no override)."""
    owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
    return owner is not None and not _is_interface(owner)


def _missing(cls, name: str) -> ConformanceError:
    return ConformanceError(f"{cls.__name__}: no implementation provided for {name}() (TensorRT 10.3's Python "
                            "wrapper has no default: the build or the engine fails)")


def override(obj, name: str):
    """The Python method `name` of obj, or None where only the interface classes have it (get_override)."""
    if not defines(type(obj), name):
        return None
    fn = getattr(obj, name)
    if not callable(fn):
        raise ConformanceError(f"{type(obj).__name__}.{name} is not a method")
    return fn


def call(obj, name: str, *args):
    """Call obj's `name` as 10.3's wrapper does: missing -> its default or ConformanceError; raising -> error."""
    fn = override(obj, name)
    if fn is None:
        if name in DEFAULTS:
            return DEFAULTS[name]
        raise _missing(type(obj), name)
    try:
        return fn(*args)
    except ConformanceError:
        raise
    except Exception as e:
        raise ConformanceError(f"{type(obj).__name__}.{name}() raised {e.__class__.__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''} (TensorRT 10.3 returns -1)") from e


def check_required(plugin_cls, creator_cls) -> None:
    """The classes define every method 10.3's wrapper has no default for (on the stand-in or on a real tensorrt
    module's classes, before TensorRT calls any): ConformanceError naming the first one missing."""
    plugin_methods = sum((m for i, m in REQUIRED.items() if i != "IPluginCreatorV3One"), ())
    for cls, names in ((plugin_cls, plugin_methods), (creator_cls, REQUIRED["IPluginCreatorV3One"])):
        for name in names:
            if not defines(cls, name):
                raise _missing(cls, name)


def _prop(obj, name: str):
    # 10.3: a property read unset raises AttributeError "<name> not initialized" inside the wrapper's getter, which
    # returns its error value (pyPlugin.cpp v10.3.0 lines 976, 1632, 1647, 1663; a creator's 1716, 1731, 1746, 1787)
    try:
        return getattr(obj, name)
    except AttributeError as e:
        raise ConformanceError(f"{type(obj).__name__}: {e} (set it in __init__: TensorRT 10.3 reads it)") from None


def _interface(c, plugin, kind, want: tuple):
    # 10.3: the result is cast to the capability's interface class, nullptr where it is not one (pyPlugin.cpp v10.3.0
    # lines 783-805; BUILD: IPluginV3OneBuildV2 first, then IPluginV3OneBuild)
    got = c(plugin, "get_capability_interface", kind)
    for cls in want:
        if isinstance(got, cls):
            return got, cls
    raise ConformanceError(f"{type(plugin).__name__}.get_capability_interface({kind.name}) returned "
                           f"{type(got).__name__}, not {want[0].__name__}")


def _desc(t: torch.Tensor) -> trt.PluginTensorDesc:
    if t.dtype not in _DTYPES:
        raise ConformanceError(f"no TensorRT type for {t.dtype}")
    return trt.PluginTensorDesc(tuple(t.shape), _DTYPES[t.dtype], trt.TensorFormat.LINEAR)


def _shapes(c, plugin, build, inputs, max_shapes, num_outputs) -> tuple[list[tuple], list[tuple]]:
    """get_output_shapes over the inputs' dims (non-constant expressions, as for dynamic shapes), called once as
    TensorRT calls it: the output shapes at the profile's min (the inputs' shapes) and at its max (`max_shapes`)."""
    exprs = [trt.DimsExprs([trt.IDimensionExpr(d, top=m) for d, m in zip(t.shape, top)])
             for t, top in zip(inputs, max_shapes)]
    out = c(build, "get_output_shapes", exprs, [], trt.IExprBuilder())
    # 10.3: a list of num_outputs DimsExprs (pyPlugin.cpp v10.3.0 lines 1165-1170: cast<std::vector<DimsExprs>>, length
    # checked). PROJECT RULE: every entry set; 10.3 hands TensorRT a null IDimensionExpr for an entry DimsExprs(n) left
    # unset (line 2091, `new DimsExprs{}`).
    if not isinstance(out, (list, tuple)) or len(out) != num_outputs or \
            not all(isinstance(d, trt.DimsExprs) and all(isinstance(e, trt.IDimensionExpr) for e in d) for d in out):
        raise ConformanceError(f"{type(plugin).__name__}.get_output_shapes() must return {num_outputs} DimsExprs "
                               "with every entry set")
    return ([tuple(trt.evaluated(e) for e in d) for d in out], [tuple(trt.evaluated_max(e) for e in d) for d in out])


def _at_build(desc: trt.PluginTensorDesc, max_dims) -> trt.DynamicPluginTensorDesc:
    """An input or output as the builder describes it to supports_format_combination and configure_plugin: -1 in
    `desc.dims` wherever the profile's range is open, the range in min / opt / max (NvInferRuntime.h v10.3.0 lines
    358-371, DynamicPluginTensorDesc: "desc.dims has -1 in place of any runtime dimension", min and max the bounds;
    lines 804-811, configurePlugin: "Wildcard dimensions may exist during this phase in the desc.dims field").
    `desc.dims` holds the shape at the profile's min (= opt), `max_dims` the one at its max (None: the same). For an
    output these are get_output_shapes evaluated at both ends, min and max taken entry by entry (the bounds of the
    monotonic expressions the plugins use: the stand-in bounds no other expression)."""
    at_min, at_max = tuple(desc.dims), tuple(desc.dims if max_dims is None else max_dims)
    wild = [a if a == b else -1 for a, b in zip(at_min, at_max)]
    lo, hi = tuple(min(a, b) for a, b in zip(at_min, at_max)), tuple(max(a, b) for a, b in zip(at_min, at_max))
    return trt.DynamicPluginTensorDesc(trt.PluginTensorDesc(wild, desc.type, desc.format, desc.scale),
                                       min=lo, opt=at_min, max=hi)


def _garbage(shape, dtype, gen) -> torch.Tensor:
    """Fake data as the builder's timing runs have it: arbitrary bytes."""
    n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).view(dtype).reshape(shape)


def build(creator, inputs: list[torch.Tensor], namespace: str | None = None, seed: int = 0, aliasing: bool = True,
          max_shapes: list[tuple] | None = None, calls: list | None = None) -> dict:
    """TensorRT 10.3's build phase of one plugin node of `creator` on `inputs`: `aliasing` is the builder's
    PreviewFeature.ALIASED_PLUGIN_IO_10_03 (off: get_aliased_input is never called, NvInferRuntime.h v10.3.0 line
    1119, and no output aliases an input); `max_shapes` the profile's largest input shapes (default: the inputs').
    Returns {"fields" (serialized), "aliases", "build_interface", "tactics", "workspace", "out_shapes" (at the
    inputs' shapes), "out_types", "build_dims" (each input's and output's desc.dims at build, -1 where it ranges),
    "calls"}."""
    calls = [] if calls is None else calls

    def c(obj, name, *args):
        calls.append(name)
        return call(obj, name, *args)

    for p in CREATOR_PROPERTIES:
        _prop(creator, p)
    name, version = creator.name, creator.plugin_version
    namespace = creator.plugin_namespace if namespace is None else namespace
    created = c(creator, "create_plugin", name, trt.PluginFieldCollection([]), trt.TensorRTPhase.BUILD)
    if not isinstance(created, trt.IPluginV3):            # 10.3: cast<IPluginV3*> (pyPlugin.cpp v10.3.0 line 1771)
        raise ConformanceError(f"{type(creator).__name__}.create_plugin() returned {type(created).__name__}, "
                               "not an IPluginV3")
    plugin = c(created, "clone")                          # the network holds its own copy
    core, _ = _interface(c, plugin, trt.PluginCapabilityType.CORE, (trt.IPluginV3OneCore,))
    ident = tuple(_prop(core, p) for p in PLUGIN_PROPERTIES[:3])
    # 10.3: name, version and namespace "Should match" the creator's (NvInferRuntime.h v10.3.0 lines 752, 762, 772-773):
    # the engine looks its creator up by them at deserialization
    if ident != (name, version, namespace):
        raise ConformanceError(f"{type(plugin).__name__} reports (name, version, namespace) {ident}, its creator "
                               f"{(name, version, namespace)}: the engine could not find its creator again")
    build_, build_cls = _interface(c, plugin, trt.PluginCapabilityType.BUILD,
                                   (trt.IPluginV3OneBuildV2, trt.IPluginV3OneBuild))
    n_out = _prop(build_, "num_outputs")
    in_types = [_desc(t).type for t in inputs]
    out_types = c(build_, "get_output_data_types", in_types)
    # 10.3: a list of num_outputs DataTypes (pyPlugin.cpp v10.3.0 lines 1115-1121: cast<std::vector<DataType>>, length)
    if not isinstance(out_types, (list, tuple)) or len(out_types) != n_out or \
            not all(isinstance(t, trt.DataType) for t in out_types):
        raise ConformanceError(f"{type(plugin).__name__}.get_output_data_types() must return {n_out} DataTypes")
    max_in = [tuple(t.shape if m is None else m) for t, m in zip(inputs, max_shapes or [None] * len(inputs))]
    out_shapes, out_max = _shapes(c, plugin, build_, inputs, max_in, n_out)
    in_desc = [_desc(t) for t in inputs]
    out_desc = [trt.PluginTensorDesc(s, t, trt.TensorFormat.LINEAR) for s, t in zip(out_shapes, out_types)]
    dyn_in = [_at_build(d, m) for d, m in zip(in_desc, max_in)]
    dyn_out = [_at_build(d, m) for d, m in zip(out_desc, out_max)]
    # PROJECT RULE: only the graph's own type at LINEAR is offered, and a refusal fails the build; TensorRT 10.3 asks
    # for the combinations it considers, up to getFormatCombinationLimit (NvInferRuntime.h v10.3.0 lines 864-898), and
    # fails only where none is accepted
    for pos in range(len(inputs) + n_out):
        if not c(build_, "supports_format_combination", pos, dyn_in + dyn_out, len(inputs)):   # cast<bool>
            raise ConformanceError(f"{type(plugin).__name__}.supports_format_combination() refuses position {pos} "
                                   f"({(in_desc + out_desc)[pos].type.name}, LINEAR), the graph's own type")
    aliases = {}
    if aliasing and build_cls is trt.IPluginV3OneBuildV2:
        for o in range(n_out):
            i = c(build_, "get_aliased_input", o)
            # 10.3: -1 or an input index (NvInferRuntime.h v10.3.0 lines 1113-1115), one output per input (line 1117).
            # PROJECT RULE: the input of the output's type and shape (10.3's header does not say; the wrapper casts
            # a non-int to 0U, aliasing input 0, pyPlugin.cpp v10.3.0 lines 1389-1393: refused here)
            if not isinstance(i, int) or not -1 <= i < len(inputs):
                raise ConformanceError(f"{type(plugin).__name__}.get_aliased_input({o}) = {i!r}: not -1 or an input")
            if i >= 0:
                if in_desc[i].type != out_types[o] or tuple(in_desc[i].dims) != out_shapes[o] or i in aliases.values():
                    raise ConformanceError(f"{type(plugin).__name__}: output {o} aliased to input {i} of another type "
                                           "or shape, or to an input already aliased")
                aliases[o] = i
    c(build_, "configure_plugin", dyn_in, dyn_out)
    tactics = c(build_, "get_valid_tactics")
    # 10.3: a list of ints (pyPlugin.cpp v10.3.0 line 1004, cast<std::vector<int32_t>>), "unique and non-zero"
    # (NvInferRuntime.h v10.3.0 lines 947-948)
    if not isinstance(tactics, (list, tuple)) or not all(isinstance(t, int) and t != 0 for t in tactics) or \
            len(set(tactics)) != len(tactics):
        raise ConformanceError(f"{type(plugin).__name__}.get_valid_tactics() = {tactics!r}: unique non-zero ints")
    workspace = c(build_, "get_workspace_size", dyn_in, dyn_out)
    # PROJECT RULE: an int >= 0; 10.3 casts the result to size_t and, where that fails (a negative int, a float), prints
    # "[ERROR] Return value of get_workspace_size() could not be interpreted as size_t" and builds with 0 bytes
    # (pyPlugin.cpp v10.3.0 lines 1254-1260)
    if not isinstance(workspace, int) or workspace < 0:
        raise ConformanceError(f"{type(plugin).__name__}.get_workspace_size() = {workspace!r}: bytes, an int >= 0")
    runtime, _ = _interface(c, plugin, trt.PluginCapabilityType.RUNTIME, (trt.IPluginV3OneRuntime,))
    gen = torch.Generator().manual_seed(seed)
    device = inputs[0].device
    for tactic in list(tactics) or [0]:
        c(runtime, "set_tactic", tactic)
        c(runtime, "on_shape_change", in_desc, out_desc)
        fake_in = [_garbage(t.shape, t.dtype, gen).to(device) for t in inputs]
        fake_out = [_garbage(s, _TORCH[t], gen).to(device) for s, t in zip(out_shapes, out_types)]
        _enqueue(c, runtime, fake_in, fake_out, workspace)
    returned = c(runtime, "get_fields_to_serialize")
    if not isinstance(returned, trt.PluginFieldCollection):       # 10.3: the cast, nullptr otherwise (lines 1577-1581)
        raise ConformanceError(f"{type(plugin).__name__}.get_fields_to_serialize() returned {type(returned).__name__}, "
                               "not a PluginFieldCollection")
    # The wrapper (pyPlugin.cpp v10.3.0 lines 1575-1579) casts the returned vector of struct copies to a C
    # PluginFieldCollection: the implicit conversion (line 2465) makes a PluginFieldCollection_ pointing into the
    # vector's own storage (lines 1956-1957, fields.data()), which keeps the vector alive (keep_alive<1, 2>, line 2456)
    # as a temporary of the enclosing bound call (pybind11 v2.13.1 type_caster_base.h lines 767-773, add_patient;
    # freed when that call returns, pybind11.h line 986): build_serialized_network, here this function. So the vector
    # outlives the Python call (`returned` stays referenced while TensorRT reads it); the buffers its structs point at
    # live only as long as something else holds them.
    gc.collect()
    try:
        fields = trt.engine_copy(returned)           # the engine file's copy, read at each struct's address
    except trt.FieldFreed as e:
        raise ConformanceError(f"{type(plugin).__name__}.get_fields_to_serialize(): {e}") from None
    c(plugin, "destroy")
    return {"fields": fields, "aliases": aliases, "build_interface": build_cls.__name__, "tactics": list(tactics),
            "workspace": workspace, "out_shapes": out_shapes, "out_types": out_types, "calls": calls,
            "build_dims": [tuple(d.desc.dims) for d in dyn_in + dyn_out]}


class Engine:
    """A deserialized engine's plugin: create_plugin(RUNTIME) with the serialized fields (`loaded`), and `context()`
    per execution context, which attaches a clone of it. attach_to_context's contract (NvInferRuntime.h v10.3.0 lines
    1062-1081): "called automatically for each plugin when a new execution context is created" (line 1066), with "a
    different resource context ... for each different execution context" (lines 1072-1073), and it returns "A clone of
    the IPluginV3 object" (line 1078); the wrapper releases the returned Python object to TensorRT, which owns it
    from then on (pyPlugin.cpp v10.3.0 line 1549, `.release()`). So the returned plugin must be neither the engine's
    plugin nor one attached to another context: ConformanceError otherwise."""

    def __init__(self, creator, built: dict, calls: list | None = None):
        self.built, self.calls, self.attached = built, (built["calls"] if calls is None else calls), []
        self.loaded = self._c(creator, "create_plugin", creator.name, trt.PluginFieldCollection(built["fields"]),
                              trt.TensorRTPhase.RUNTIME)

    def _c(self, obj, name, *args):
        self.calls.append(name)
        return call(obj, name, *args)

    def context(self):
        """A new execution context: attach_to_context with a resource context of its own, then set_tactic with the
        chosen tactic; returns the runtime interface of its clone, which `execute` enqueues."""
        runtime_of_loaded, _ = _interface(self._c, self.loaded, trt.PluginCapabilityType.RUNTIME,
                                          (trt.IPluginV3OneRuntime,))
        attached = self._c(runtime_of_loaded, "attach_to_context", trt.IPluginResourceContext())
        name = type(self.loaded).__name__
        if not isinstance(attached, trt.IPluginV3) or attached is self.loaded:
            raise ConformanceError(f"{name}.attach_to_context() must return a clone (an IPluginV3), not the plugin")
        if any(attached is other for other in self.attached):
            raise ConformanceError(f"{name}.attach_to_context() returned the plugin of another execution context "
                                   "(TensorRT owns one clone per context)")
        self.attached.append(attached)
        rt, _ = _interface(self._c, attached, trt.PluginCapabilityType.RUNTIME, (trt.IPluginV3OneRuntime,))
        self._c(rt, "set_tactic", self.built["tactics"][0] if self.built["tactics"] else 0)
        return rt


def load(creator, built: dict, calls: list | None = None):
    """Deserialization and one execution context (Engine(...).context()): the runtime interface `execute` enqueues."""
    return Engine(creator, built, calls).context()


def execute(rt, built: dict, inputs: list[torch.Tensor], outputs: list[torch.Tensor], calls: list | None = None,
            sync: bool = True):
    """One execution of a loaded plugin on the addresses of `inputs` and `outputs` (an aliased output is its input's
    buffer, as TensorRT binds it; a ping-pong engine's plane outputs are buffers of their own): on_shape_change at
    these shapes, then enqueue on the current stream (waited for unless `sync` is off: inside a CUDA-graph capture)."""
    calls = built["calls"] if calls is None else calls

    def c(obj, name, *args):
        calls.append(name)
        return call(obj, name, *args)

    c(rt, "on_shape_change", [_desc(t) for t in inputs], [_desc(t) for t in outputs])
    _enqueue(c, rt, inputs, outputs, built["workspace"], sync)
    return outputs


def drive(creator, inputs: list[torch.Tensor], namespace: str | None = None, seed: int = 0,
          max_shapes: list[tuple | None] | None = None) -> dict:
    """Build and run one plugin node of `creator` on `inputs` (real data, on the device the plugins launch on) as
    TensorRT 10.3 does, aliasing on; the profile spans the inputs' shapes (its min and opt) to `max_shapes` (its max,
    None for an input that does not range). Returns {"outputs": tensors after the run-time enqueue at the inputs'
    shapes (an aliased output is its input's buffer), "aliases": {output: input}, "build_interface", "tactics",
    "build_dims": desc.dims of inputs then outputs at build, "calls": [method names in call order]}."""
    built = build(creator, inputs, namespace, seed, max_shapes=max_shapes)
    rt = load(creator, built)
    aliases, device = built["aliases"], inputs[0].device
    outs = [inputs[aliases[o]] if o in aliases else torch.empty(s, dtype=_TORCH[t], device=device)
            for o, (s, t) in enumerate(zip(built["out_shapes"], built["out_types"]))]
    execute(rt, built, inputs, outs)
    return {"outputs": outs, **{k: built[k] for k in ("aliases", "build_interface", "tactics", "build_dims", "calls")}}


def _enqueue(c, runtime, ins, outs, workspace: int, sync: bool = True) -> None:
    """enqueue(descs, addresses, workspace address, stream) as the wrapper hands them: ints (intptr_t)."""
    device = ins[0].device
    ws = torch.empty(workspace, dtype=torch.uint8, device=device) if workspace else None
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    c(runtime, "enqueue", [_desc(t) for t in ins], [_desc(t) for t in outs], [t.data_ptr() for t in ins],
      [t.data_ptr() for t in outs], ws.data_ptr() if ws is not None else 0, stream)
    if device.type == "cuda" and sync:
        torch.cuda.current_stream(device).synchronize()
