"""The engine build's KV-binding decision without TensorRT: plane copies read from the engine inspector's JSON
(export.trt.inspect; the layout of NVIDIA's own reader, trt-engine-explorer's trex/parser.py and trex/layer.py, with
the step graph's tensor names), the binding rule (ping-pong by default and refused with a copy, aliased on request,
`auto` aliased unless it copies), `auto`'s fallback when the aliased engine fails or disagrees (export.trt.check), and
the catch-up window the runtime attention plugins are created with (plugins.trt.plugins, through the stand-in)."""

import json

import pytest
import torch

from edge.errors import BitNestError
from export.trt.build import choose_binding
from export.trt.check import with_fallback
from export.trt.inspect import inspector_plane_copies

ATTENTION = "NestedKvAttention_7"


def _layer(name, kind, ins, outs, parameter=None):
    d = {"Name": name, "LayerType": kind, "Inputs": [{"Name": t, "Location": "Device", "Dimensions": [2, 3, 64, 8],
                                                        "Format/Datatype": "Int32"} for t in ins],
         "Outputs": [{"Name": t, "Location": "Device", "Dimensions": [2, 3, 64, 8], "Format/Datatype": "Int32"}
                     for t in outs], "TacticValue": "0x0000000000000000"}
    if parameter:
        d["ParameterType"] = parameter
    return d


def _engine(*layers) -> str:
    return json.dumps({"Layers": list(layers), "Bindings": ["q_in", "kv_base.0", "kv_base_out.0", "logits"]})


PLUGIN = _layer(ATTENTION, "PluginV3", ["q", "kv_base.0", "kv_refine.0", "kv_scale.0"],
                ["out", "kv_base_out.0", "kv_refine_out.0", "kv_scale_out.0"])
UNRELATED = _layer("Reformatting CopyNode for Input Tensor 0 to /lm_head", "Reformat", ["x"], ["x_reformatted"])


def test_a_clean_engine_has_no_plane_copies():
    assert inspector_plane_copies(_engine(PLUGIN, UNRELATED)) == []


@pytest.mark.parametrize("copy", [
    _layer(f"Reformatting CopyNode for Output Tensor 1 to {ATTENTION}", "Reformat", ["kv_base_out.0 copy"],
           ["kv_base_out.0"]),
    _layer("copy_kv_refine.12", "Copy", ["kv_refine.12"], ["kv_refine.12 (copy)"]),
    _layer("myelin_copy", "NoOp", ["kv_scale.3"], ["t"], parameter="Reformat"),
])
def test_a_copy_of_a_plane_is_found_whatever_its_kind(copy):
    got = inspector_plane_copies(_engine(PLUGIN, UNRELATED, copy))
    assert len(got) == 1 and got[0].startswith(copy["Name"]) and "->" in got[0]


def test_a_names_only_engine_is_one_line_naming_the_verbosity():
    with pytest.raises(BitNestError, match="ProfilingVerbosity.DETAILED") as e:
        inspector_plane_copies(json.dumps({"Layers": [ATTENTION, "lm_head"], "Bindings": []}))
    assert "\n" not in str(e.value)
    with pytest.raises(BitNestError, match="not JSON"):
        inspector_plane_copies("Layers: none")


CLEAN = {"plane_copies": [], "log_plane_copies": [], "kv_window": [5]}
COPIES = {"plane_copies": ["copy_kv_base.0 (Copy): kv_base.0 -> t"], "log_plane_copies": [], "kv_window": [5]}


def _builds(aliased: dict, pingpong: dict):
    made = []

    def build(aliasing: bool):
        made.append("aliased" if aliasing else "pingpong")
        return f"engine-{made[-1]}", aliased if aliasing else pingpong
    return build, made


@pytest.mark.parametrize("asked, aliased, pingpong, chosen, built", [
    ("pingpong", CLEAN, CLEAN, "pingpong", ["pingpong"]),             # the default: one build, no aliasing
    ("aliased", COPIES, CLEAN, "aliased", ["aliased"]),               # on request, its copies recorded
    ("auto", CLEAN, CLEAN, "aliased", ["aliased"]),
    ("auto", COPIES, CLEAN, "pingpong", ["aliased", "pingpong"]),
])
def test_the_binding_rule(asked, aliased, pingpong, chosen, built):
    build, made = _builds(aliased, pingpong)
    mode, serialized, facts, extra = choose_binding(asked, build)
    assert (mode, made, serialized) == (chosen, built, f"engine-{chosen}")
    assert facts == (aliased if chosen == "aliased" else pingpong)
    assert extra == ({"aliased_build_copies": COPIES["plane_copies"]} if built == ["aliased", "pingpong"] else {})


@pytest.mark.parametrize("asked", ["pingpong", "auto"])
def test_a_pingpong_engine_that_copies_a_plane_is_refused(asked):
    build, _ = _builds(COPIES, COPIES)
    with pytest.raises(BitNestError, match="ping-pong build still copies a KV plane") as e:
        choose_binding(asked, build)
    assert "\n" not in str(e.value) and "copy_kv_base.0" in str(e.value)


def _attempts(results: dict):
    tried = []

    def attempt(binding):
        tried.append(binding)
        r = results[binding]
        if isinstance(r, Exception):
            raise r
        return r
    return attempt, tried


PASSED_ALIASED = {"status": "passed", "build": {"kv_binding": "aliased"}}
FAILED_ALIASED = {"status": "failed", "reason": "greedy tokens differ at 2", "build": {"kv_binding": "aliased"}}
PASSED_PINGPONG = {"status": "passed", "build": {"kv_binding": "pingpong"}}
FAILED_PINGPONG = {"status": "failed", "reason": "prefill logits 3e-2", "build": {"kv_binding": "pingpong"}}


@pytest.mark.parametrize("results, tried, why", [
    ({"auto": PASSED_ALIASED}, ["auto"], None),
    ({"auto": FAILED_ALIASED, "pingpong": PASSED_PINGPONG}, ["auto", "pingpong"], "greedy tokens differ at 2"),
    ({"auto": RuntimeError("enqueue failed: illegal memory access"), "pingpong": PASSED_PINGPONG},
     ["auto", "pingpong"], "enqueue failed: illegal memory access"),
    ({"auto": FAILED_PINGPONG}, ["auto"], None),           # auto already chose ping-pong: nothing to fall back to
])
def test_auto_falls_back_to_pingpong_when_the_aliased_engine_fails(results, tried, why):
    attempt, made = _attempts(results)
    out = with_fallback("auto", attempt)
    assert made == tried and out.get("aliased_failed") == why
    if why:
        assert out["build"]["kv_binding"] == "pingpong"


def test_pingpong_is_the_default_everywhere_an_engine_is_built():
    import inspect

    from export.trt import check as trt_check
    from export.commands import export as cli
    from export.trt.build import build_engine
    assert inspect.signature(build_engine).parameters["kv_binding"].default == "pingpong"
    assert inspect.signature(trt_check.engine_agreement).parameters["kv_binding"].default == "pingpong"
    for p, argv in ((cli.parser(), ["--out", "x"]), (trt_check.parser(), [])):
        assert p.parse_args(argv).kv_binding == "pingpong"


def test_an_explicit_binding_never_falls_back():
    attempt, made = _attempts({"aliased": FAILED_ALIASED})
    assert with_fallback("aliased", attempt) is FAILED_ALIASED and made == ["aliased"]


def test_the_runtime_plugins_window_is_recorded_as_created():
    """Deserializing creates each attention plugin from its serialized kv_window (create_plugin at RUNTIME): the
    build reads those windows back into its record; the GEMV plugin and build-phase plugins add none."""
    from plugins.trt import standin as trt_standin
    from plugins.trt.conformance import build, load
    from plugins.trt.plugins import define_plugins, runtime_windows
    from tests.test_trt_kv_binding import HKV, HQ, WIDEST, D, _inputs, _planes
    from tests.conftest import KERNEL_DEVICE
    (_, attention), creator_cls = define_plugins(trt_standin, KERNEL_DEVICE)
    gen = torch.Generator().manual_seed(0)
    example = _inputs(gen, 0, 1, _planes(gen, False))
    built = build(creator_cls(attention), example, max_shapes=[(HQ, WIDEST, D), (HKV, WIDEST, D),
                                                                (HKV, WIDEST, D)] + [None] * 5, aliasing=False)
    before = runtime_windows()
    load(creator_cls(attention), built)
    assert runtime_windows() == before + [WIDEST]
