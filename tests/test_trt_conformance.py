"""The TensorRT plugins against TensorRT 10.3's Python wrapper without TensorRT: plugins.trt.conformance drives the
real plugin classes (defined over plugins.trt.standin) through 10.3's build and run-time calls, enqueue included on
real data (host pointers into the Triton interpreter here, device pointers on a GPU), and names every method 10.3
has no default for when a plugin lacks it."""

import types

import pytest
import torch

from plugins.trt import standin as trt_standin
from plugins.contracts import DOMAIN
from plugins.step_contract import as_words
from plugins.trt.conformance import DEFAULTS, REQUIRED, ConformanceError, Engine, build, check_required, drive, execute
from plugins.trt.plugins import PLUGIN_IO, PLUGIN_VERSION, define_plugins, register_creators
from tests.conftest import KERNEL_DEVICE
from tests.test_trt_rules import _attention_io

# what TensorRT calls on a deserialized plugin before and at its first execution (NvInferRuntime.h, v10.3.0)
RUN_TIME_CALLS = ["create_plugin", "get_capability_interface", "attach_to_context", "get_capability_interface",
                  "set_tactic", "on_shape_change", "enqueue"]


def _classes():
    """Fresh plugin and creator classes over the stand-in (a test may delete a method from them)."""
    (gemv, attention), creator = define_plugins(trt_standin, KERNEL_DEVICE)
    return {"DualPlaneGemv": gemv, "NestedKvAttention": attention}, creator


def _gemv_inputs(gen, code: int = 1):
    from plugins.nesting import nest_rtn
    from plugins.packing import pack_nibbles
    codes = nest_rtn(torch.randn(48, 128, generator=gen), 64)
    base, refine = pack_nibbles(codes.q4), pack_nibbles(codes.qr)
    ins = [torch.randn(3, 128, generator=gen), as_words(base), as_words(refine), codes.scale,
           torch.tensor([code], dtype=torch.int64)]
    return [t.to(KERNEL_DEVICE) for t in ins], (base, refine, codes.scale)


@pytest.mark.parametrize("code,view", [(1, "target"), (0, "draft")])
def test_gemv_plugin_runs_tensorrt_10_3s_calls_and_matches_the_reference(gen, code, view):
    from plugins.reference import dual_plane_linear
    plugins, creator_cls = _classes()
    ins, (base, refine, scale) = _gemv_inputs(gen, code)
    r = drive(creator_cls(plugins["DualPlaneGemv"]), ins)
    assert r["build_interface"] == "IPluginV3OneBuildV2" and r["tactics"] == [] and r["aliases"] == {}
    assert r["calls"][-len(RUN_TIME_CALLS):] == RUN_TIME_CALLS
    build = r["calls"][:-len(RUN_TIME_CALLS)]
    assert build.index("configure_plugin") < build.index("set_tactic") < build.index("enqueue"), build
    ref = dual_plane_linear(ins[0].cpu(), base, refine, scale, view, None, act_int8=True)
    y = r["outputs"][0].cpu().double()
    assert float((y - ref).norm() / ref.norm()) < 1e-5, view


def test_gemv_plugin_over_a_range_of_rows_sees_wildcards_in_its_input_and_output_descs(gen):
    """A profile of 3..8 rows: at build the builder's desc.dims holds -1 for the row count in x and in y
    (NvInferRuntime.h v10.3.0 line 360, "-1 in place of any runtime dimension"; line 811, wildcards at configure
    time), nowhere else; the plugin still builds and runs at 3 rows against the reference."""
    from plugins.reference import dual_plane_linear
    plugins, creator_cls = _classes()
    ins, (base, refine, scale) = _gemv_inputs(gen)
    r = drive(creator_cls(plugins["DualPlaneGemv"]), ins, max_shapes=[(8, 128)] + [None] * 4)
    assert r["build_dims"] == [(-1, 128), (48, 16), (48, 16), (48, 2), (1,), (-1, 48)]
    ref = dual_plane_linear(ins[0].cpu(), base, refine, scale, "target", None, act_int8=True)
    assert float((r["outputs"][0].cpu().double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("code", [1, 0])
def test_gemv_plugin_on_warp_tiled_planes_sizes_its_output_and_matches_the_canonical_node(gen, code):
    """The step graph's planes travel warp-tiled (int32 words [N/32, K/G, G/32, 32, 4], scales [N/32, K/G, 32]):
    the plugin's output has N = 32 x dim 0 rows (a shape expression), and its rows are the canonical node's bit for
    bit at a decode width and at a prefill width (12 rows: two decode launches)."""
    from plugins.kernels.tiling import tile_planes
    from plugins.nesting import nest_rtn
    from plugins.packing import pack_nibbles
    plugins, creator_cls = _classes()
    codes = nest_rtn(torch.randn(64, 128, generator=gen), 64)
    base, refine = pack_nibbles(codes.q4), pack_nibbles(codes.qr)
    tiled = tile_planes(base, refine, codes.scale)
    for m in (3, 12):
        x, view = torch.randn(m, 128, generator=gen), torch.tensor([code], dtype=torch.int64)
        outs = []
        for planes in ((base, refine, codes.scale), (tiled.base, tiled.refine, tiled.scale)):
            ins = [t.to(KERNEL_DEVICE) for t in (x, as_words(planes[0]), as_words(planes[1]), planes[2], view)]
            r = drive(creator_cls(plugins["DualPlaneGemv"]), ins)
            assert tuple(r["outputs"][0].shape) == (m, 64), r["outputs"][0].shape      # from get_output_shapes
            outs.append(r["outputs"][0].cpu())
        assert torch.equal(outs[0], outs[1]), (m, code)


@pytest.mark.parametrize("source", ["desc.dims", "max"])
def test_a_plugin_sizing_scratch_from_an_output_descs_dynamic_dim_fails_the_build(gen, source):
    """A gemv variant that sizes per-row scratch at configure_plugin from the output's row count: read from
    `desc.dims` it reads the wildcard -1 and the build fails, as on TensorRT; read from `max` (the profile's bound) it
    builds."""
    plugins, creator_cls = _classes()

    class RowScratch(plugins["DualPlaneGemv"]):
        def configure_plugin(self, inp, out):
            rows = out[0].desc.dims[0] if source == "desc.dims" else out[0].max[0]
            self.scratch = torch.empty(rows, dtype=torch.float32)
    ranged = [(8, 128)] + [None] * 4
    if source == "max":
        assert drive(creator_cls(RowScratch), _gemv_inputs(gen)[0], max_shapes=ranged)["outputs"][0].shape == (3, 48)
        return
    with pytest.raises(ConformanceError, match=r"RowScratch.configure_plugin\(\) raised RuntimeError"):
        drive(creator_cls(RowScratch), _gemv_inputs(gen)[0], max_shapes=ranged)
    drive(creator_cls(RowScratch), _gemv_inputs(gen)[0])          # no range: no wildcard, it builds


@pytest.mark.parametrize("attach", ["clone", "self", "one clone for all"])
def test_each_execution_context_gets_a_clone_of_its_own(gen, attach):
    """One deserialized plugin attached to two execution contexts: attach_to_context is called per new context and
    returns "A clone of the IPluginV3 object" (NvInferRuntime.h v10.3.0 lines 1066 and 1078), which TensorRT then owns
    (pyPlugin.cpp v10.3.0 line 1549, `.release()`). The plugins' own (a fresh clone each time) gives two distinct
    clones, neither the engine's plugin, each running against the reference on its own buffers; returning `self`, or
    the same clone to both contexts, fails."""
    from plugins.reference import dual_plane_linear
    plugins, creator_cls = _classes()

    class Attaching(plugins["DualPlaneGemv"]):
        def attach_to_context(self, context):
            if attach == "self":
                return self
            if attach == "one clone for all":
                self.__dict__.setdefault("_attached", self.clone())
                return self._attached
            return super().attach_to_context(context)
    ins, (base, refine, scale) = _gemv_inputs(gen)
    creator = creator_cls(Attaching)
    engine = Engine(creator, build(creator, ins))
    if attach != "clone":
        with pytest.raises(ConformanceError, match=r"attach_to_context\(\) (must return a clone|returned the plugin "
                                                   r"of another execution context)"):
            engine.context(), engine.context()
        return
    contexts = [engine.context(), engine.context()]
    assert contexts[0] is not contexts[1] and all(rt is not engine.loaded for rt in contexts)
    assert engine.calls.count("attach_to_context") == 2
    ref = dual_plane_linear(ins[0].cpu(), base, refine, scale, "target", None, act_int8=True)
    for rt in contexts:
        (y,) = execute(rt, engine.built, ins, [torch.empty(3, 48, device=ins[0].device)])
        assert float((y.cpu().double() - ref).norm() / ref.norm()) < 1e-5


def _attention_oracle(ins) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The float64 reference of one attention pass (plugins.reference, not the plugin's own enqueue): the pass's new
    K and V quantized into positions [seq_len - T, seq_len) of the planes (plugins.kv.quantize_kv), then causal
    attention over the nested cache; returns (out [Hq, T, D] float64, the planes as words)."""
    from plugins.kv import quantize_kv
    from plugins.reference import nested_kv_attention
    from plugins.step_contract import as_bytes
    q, k, v, base, refine, scale = (t.cpu() for t in ins[:6])
    seq_len, kv8_from, t = int(ins[6][0]), int(ins[7][0]), q.shape[1]
    planes = [as_bytes(base).clone(), as_bytes(refine).clone(), scale.clone()]
    for plane, new in zip(planes, quantize_kv(torch.stack([k, v]))):            # [2, Hkv, T, ...]
        plane[:, :, seq_len - t:seq_len] = new
    out = nested_kv_attention(q, planes[0], planes[1], planes[2], seq_len, kv8_from)
    return out, [as_words(planes[0]), as_words(planes[1]), planes[2]]


def test_attention_plugin_writes_its_planes_in_place_through_declared_aliases(gen):
    plugins, creator_cls = _classes()
    ins, outs = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, 4
    want_out, want_planes = _attention_oracle(ins)
    ins = [t.to(KERNEL_DEVICE) for t in ins]
    r = drive(creator_cls(plugins["NestedKvAttention"]), ins)
    assert r["aliases"] == PLUGIN_IO["NestedKvAttention"].aliases and r["build_interface"] == "IPluginV3OneBuildV2"
    assert all(o is ins[i] for o, i in zip(r["outputs"][1:], (3, 4, 5)))          # the planes' own buffers
    assert all(torch.equal(got.cpu(), want) for got, want in zip(ins[3:6], want_planes))
    out = r["outputs"][0].cpu().double()
    assert float((out - want_out).norm() / want_out.norm()) < 1e-5


def _definer(cls, name):
    return next(k for k in cls.__mro__ if name in k.__dict__)


# the plugin methods 10.3's wrapper has no default for, written from pyPlugin.cpp at v10.3.0 ("no implementation
# provided for ...()": lines 776, 823, 1069, 1103, 1146, 1196, 1422, 1474, 1506, 1546, 1572), not from the harness
NO_DEFAULT = ["get_capability_interface", "clone", "supports_format_combination", "get_output_data_types",
              "get_output_shapes", "configure_plugin", "enqueue", "set_tactic", "on_shape_change", "attach_to_context",
              "get_fields_to_serialize"]
# ...and the four it has a default for (lines 992-1000, 1232-1236, 1377-1382, 847)
WITH_DEFAULT = ["get_valid_tactics", "get_workspace_size", "get_aliased_input", "destroy"]


def test_the_harness_tables_are_the_sources():
    assert sorted(m for i, ms in REQUIRED.items() if i != "IPluginCreatorV3One" for m in ms) == sorted(NO_DEFAULT)
    assert REQUIRED["IPluginCreatorV3One"] == ("create_plugin",) and sorted(DEFAULTS) == sorted(WITH_DEFAULT)


@pytest.mark.parametrize("name", NO_DEFAULT)
def test_a_plugin_without_a_method_10_3_requires_is_named(gen, name):
    """Remove one method TensorRT 10.3's wrapper has no default for (set_tactic, which the plugins lacked, among
    them): the harness fails and names it, and so does the check register_creators runs."""
    plugins, creator_cls = _classes()
    cls = plugins["DualPlaneGemv"]
    delattr(_definer(cls, name), name)                        # fresh classes: nothing else sees the removal
    with pytest.raises(ConformanceError, match=rf"no implementation provided for {name}\(\)") as e:
        drive(creator_cls(cls), _gemv_inputs(gen)[0])
    assert "\n" not in str(e.value)
    with pytest.raises(ConformanceError, match=rf"{name}\(\)"):
        check_required(cls, creator_cls)


def test_a_creator_without_create_plugin_is_named(gen):
    plugins, creator_cls = _classes()
    delattr(creator_cls, "create_plugin")
    with pytest.raises(ConformanceError, match=r"no implementation provided for create_plugin\(\)"):
        drive(creator_cls(plugins["DualPlaneGemv"]), _gemv_inputs(gen)[0])


@pytest.mark.parametrize("name", WITH_DEFAULT)
def test_methods_with_a_10_3_default_may_be_absent(gen, name):
    """The harness is no stricter than the wrapper: without get_valid_tactics, get_workspace_size, get_aliased_input
    or destroy a plugin still builds and runs (an attention plugin without get_aliased_input loses its aliases)."""
    plugins, creator_cls = _classes()
    cls = plugins["NestedKvAttention"]
    if any(name in k.__dict__ for k in cls.__mro__ if k not in trt_standin.INTERFACES):
        delattr(_definer(cls, name), name)
    ins = _attention_io(gen)[0]
    ins[6][0] = 10
    r = drive(creator_cls(cls), [t.to(KERNEL_DEVICE) for t in ins])
    assert name in r["calls"], r["calls"]          # asked for (destroy, which the plugins leave to 10.3, included)
    assert r["aliases"] == ({} if name == "get_aliased_input" else PLUGIN_IO["NestedKvAttention"].aliases)


def test_the_plugins_answer_tactic_and_workspace_queries_as_nvidias_samples_do():
    plugins, _ = _classes()
    for cls in plugins.values():
        p = cls(trt_standin.TensorRTPhase.RUNTIME)
        assert p.set_tactic(0) == 0 and p.get_valid_tactics() == [] and p.get_workspace_size([], []) == 0


def test_a_method_that_raises_fails_the_engine(gen):
    plugins, creator_cls = _classes()

    class Broken(plugins["DualPlaneGemv"]):
        def on_shape_change(self, inp, out):
            raise ValueError("no shapes here")
    with pytest.raises(ConformanceError, match=r"Broken.on_shape_change\(\) raised ValueError: no shapes here"):
        drive(creator_cls(Broken), _gemv_inputs(gen)[0])


def _window_kept_as(attention, keep: str):
    """The attention plugin with a get_fields_to_serialize that keeps `keep` of its window field on itself: "nothing"
    (the buffer and the collection temporaries), "collection" (the buffer made inside a temporary PluginField),
    "buffer" (the collection a temporary)."""
    import numpy as np
    f = trt_standin

    class Kept(attention):
        def get_fields_to_serialize(self):
            if keep == "buffer":
                self._kept = np.array([self.kv_window], np.int32)
                return f.PluginFieldCollection([f.PluginField("kv_window", self._kept, f.PluginFieldType.INT32)])
            made = f.PluginFieldCollection([f.PluginField("kv_window", np.array([self.kv_window], np.int32),
                                                          f.PluginFieldType.INT32)])
            if keep == "collection":
                self._kept = made
            return made
    Kept.__name__ = f"Kept_{keep}"
    return Kept


@pytest.mark.parametrize("keep", ["nothing", "collection"])
def test_a_serialized_field_whose_buffer_only_a_temporary_field_held_fails_the_build(gen, keep):
    """trt.PluginFieldCollection holds copies of the fields' C structs (pyTensorRT.cpp v10.3.0 line 48, bind_vector;
    pybind11 v2.13.1 stl_bind.h line 156, push_back(h.cast<T>())): keeping it keeps no buffer alive, only the
    PluginField made over a buffer does (pyPlugin.cpp v10.3.0 line 2414, keep_alive<1, 3>). A buffer made inside a
    temporary PluginField is freed before TensorRT reads the field, kept collection or not: 10.3 reads freed memory."""
    plugins, creator_cls = _classes()
    ins, _ = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, 4
    with pytest.raises(ConformanceError, match=rf"Kept_{keep}.get_fields_to_serialize\(\): field 'kv_window': its "
                                               "buffer was freed"):
        build(creator_cls(_window_kept_as(plugins["NestedKvAttention"], keep)), [t.to(KERNEL_DEVICE) for t in ins])


def test_a_temporary_collection_over_a_kept_buffer_is_read_whole(gen):
    """The other way round is safe in 10.3: the wrapper's cast of the returned collection (pyPlugin.cpp v10.3.0 line
    1579) goes through the implicit conversion (line 2465) to a PluginFieldCollection_ over the vector's storage (lines
    1956-1957) that keeps the vector alive (line 2456, keep_alive<1, 2>) as a temporary of the enclosing bound call
    (pybind11 v2.13.1 type_caster_base.h line 772, add_patient), the build, so the structs live while TensorRT reads
    them and the buffer they point at is the plugin's. The build passes and serializes the window."""
    plugins, creator_cls = _classes()
    ins, _ = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, 4
    kept_buffer = _window_kept_as(plugins["NestedKvAttention"], "buffer")
    built = build(creator_cls(kept_buffer), [t.to(KERNEL_DEVICE) for t in ins])
    (field,) = built["fields"]
    assert field.name == "kv_window" and field.data.tolist() == [ins[0].shape[1]]


def test_the_plugins_keep_buffer_field_and_collection_for_their_lifetime(gen):
    """Each plugin keeps what get_fields_to_serialize returned, the PluginField objects and their buffers: the returned
    collection is the same object on every call and reads whole after every other reference to it is gone; a later
    call rewrites the buffer in place. A clone serializes through fields of its own."""
    import gc
    import weakref
    plugins, creator_cls = _classes()
    for cls in plugins.values():
        p = cls(trt_standin.TensorRTPhase.BUILD)
        p.kv_window = 5
        returned = weakref.ref(p.get_fields_to_serialize())
        gc.collect()
        assert returned() is not None and returned() is p.get_fields_to_serialize(), cls.name
        assert [f.data.tolist() for f in returned()] == ([[5]] if cls.name == "NestedKvAttention" else [])
    p.kv_window = 7
    assert p.get_fields_to_serialize() is returned() and [f.data.tolist() for f in returned()] == [[7]]
    clone = p.clone()
    clone.kv_window = 9
    assert [f.data.tolist() for f in clone.get_fields_to_serialize()] == [[9]]
    assert clone.get_fields_to_serialize() is not returned() and [f.data.tolist() for f in returned()] == [[7]]
    ins, _ = _attention_io(gen)
    ins[6][0], ins[7][0] = 10, 4
    built = build(creator_cls(plugins["NestedKvAttention"]), [t.to(KERNEL_DEVICE) for t in ins])
    assert [f.data.tolist() for f in built["fields"]] == [[ins[0].shape[1]]]       # the configured window


def test_a_collection_holds_struct_copies_that_read_through_the_address():
    """The stand-in's field model: a collection's entries are copies (not the PluginField given) holding the address,
    alive buffers read whole; a buffer freed behind a copy, or a size past the buffer set later (the `data` setter
    changes the address only, pyPlugin.cpp v10.3.0 lines 2445-2450), is caught on reading (10.3 would read freed or
    foreign memory there)."""
    import gc

    import numpy as np
    i32 = trt_standin.PluginFieldType.INT32
    buffer = np.array([3, 4], np.int32)
    field = trt_standin.PluginField("w", buffer, i32)
    fc = trt_standin.PluginFieldCollection([field, trt_standin.PluginField("gone", np.array([1], np.int32), i32)])
    assert fc[0] is not field and fc[0].data.tolist() == [3, 4] and fc[0].size == 2
    gc.collect()
    with pytest.raises(trt_standin.FieldFreed, match="'gone': its buffer was freed"):
        fc[1].data
    field.data = np.array([5], np.int32)               # the address changes, the size stays 2 (as in 10.3)
    assert field.size == 2 and fc[0].data.tolist() == [3, 4]      # the copy still points at `buffer`
    with pytest.raises(trt_standin.FieldFreed, match="'w': its buffer holds fewer than the 8 bytes"):
        field.data


def test_a_plugin_reading_a_dimension_expressions_value_fails_the_build(gen):
    """10.3's IDimensionExpr has is_constant and get_constant_value and no `value`: a build-time dimension is symbolic.
    A get_output_shapes that folds one to an int (here the gemv's row count) fails as on a device."""
    plugins, creator_cls = _classes()

    class Folding(plugins["DualPlaneGemv"]):
        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            rows = expr_builder.constant(inputs[0][0].value)
            return super().get_output_shapes([trt_standin.DimsExprs([rows, inputs[0][1]]), *inputs[1:]], shape_inputs,
                                              expr_builder)
    with pytest.raises(ConformanceError, match=r"Folding.get_output_shapes\(\) raised AttributeError"):
        drive(creator_cls(Folding), _gemv_inputs(gen)[0])


@pytest.mark.parametrize("skipped", ["IPluginV3", "IPluginV3OneCore", "IPluginV3OneBuildV2", "IPluginV3OneRuntime"])
def test_a_plugin_that_skips_a_base_classs_init_is_refused(gen, skipped):
    """pybind11 refuses an instance whose bound base's __init__ was not called ("... must be called when overriding
    __init__"): creating the plugin fails the build."""
    plugins, creator_cls = _classes()
    base = next(k for k in getattr(trt_standin, skipped).__mro__ if "__init__" in k.__dict__)   # V2's is V1's
    real = base.__init__

    class Skipping(plugins["DualPlaneGemv"]):
        def __init__(self, *args, **kwargs):
            base.__init__ = lambda self: None                             # that base's __init__ does nothing here
            try:
                super().__init__(*args, **kwargs)
            finally:
                base.__init__ = real
    with pytest.raises(ConformanceError, match=r"create_plugin\(\) raised TypeError: .*__init__\(\) must be called"):
        drive(creator_cls(Skipping), _gemv_inputs(gen)[0])
    drive(creator_cls(plugins["DualPlaneGemv"]), _gemv_inputs(gen)[0])   # every base initialised: it builds


def test_plugin_fields_take_buffers_of_their_declared_type():
    """PluginField's data is bound as a buffer (10.3: a list is a TypeError, pyPlugin.cpp v10.3.0 line 1949) and read
    as the declared C type; an int64 buffer declared INT32 is refused too, a PROJECT RULE (10.3 would serialize the
    low half of the first value: line 1952 takes the buffer's element count)."""
    import numpy as np
    with pytest.raises(TypeError, match="must be a buffer"):
        trt_standin.PluginField("kv_window", [4], trt_standin.PluginFieldType.INT32)
    with pytest.raises(TypeError, match="must hold int32, not int64"):
        trt_standin.PluginField("kv_window", np.array([4]), trt_standin.PluginFieldType.INT32)
    f = trt_standin.PluginField("kv_window", np.array([4], np.int32), trt_standin.PluginFieldType.INT32)
    assert f.size == 1 and f.data.dtype == np.int32


def test_build_properties_read_unset_are_what_10_3_returns():
    """10.3 raises "<name> not initialized" for num_outputs read unset, but returns None for timing_cache_id and
    metadata_string and the default limit for format_combination_limit (pyPlugin.cpp v10.3.0 lines 976, 1271-1274,
    1286-1289, 1301-1304): the stand-in is no stricter there."""
    build_ = trt_standin.IPluginV3OneBuildV2()
    assert build_.timing_cache_id is None and build_.metadata_string is None
    assert build_.format_combination_limit == trt_standin.IPluginV3OneBuild.DEFAULT_FORMAT_COMBINATION_LIMIT == 100
    with pytest.raises(AttributeError, match="num_outputs not initialized"):
        build_.num_outputs


def test_no_fallback_to_the_non_aliasing_build_interface():
    """A tensorrt without IPluginV3OneBuildV2 cannot declare the attention plugin's in-place writes: one line."""
    old = types.SimpleNamespace(**{k: v for k, v in vars(trt_standin).items() if k != "IPluginV3OneBuildV2"})
    with pytest.raises(RuntimeError, match="IPluginV3OneBuildV2") as e:
        define_plugins(old, "cpu")
    assert "\n" not in str(e.value)


def test_creators_register_under_the_empty_namespace_and_the_graph_domain(gen):
    """The parser looks a plugin up in its node's `plugin_namespace` attribute, default "" (every version), and from
    10.10 falls back to the node's domain (onnx-tensorrt FallbackPluginImporter): both namespaces resolve, and a
    plugin created in either reports that namespace (the engine finds its creator again: the harness checks it)."""
    registry = trt_standin.IPluginRegistry()
    register_creators(trt_standin, registry, KERNEL_DEVICE)
    assert sorted(registry.creators) == sorted((n, PLUGIN_VERSION, ns) for n in PLUGIN_IO for ns in ("", DOMAIN))
    r = drive(registry.get_creator("DualPlaneGemv", PLUGIN_VERSION, DOMAIN), _gemv_inputs(gen)[0], namespace=DOMAIN)
    assert r["outputs"][0].shape == (3, 48)
    with pytest.raises(RuntimeError, match="refused DualPlaneGemv") as e:
        register_creators(trt_standin, registry, KERNEL_DEVICE)
    assert "\n" not in str(e.value)
