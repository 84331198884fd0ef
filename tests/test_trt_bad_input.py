"""Bad input on the TensorRT path, each refused in one line naming the fix (no traceback, exit != 0 from a
command where one reaches it): a graph whose plugin nodes sit in a domain other than the graph's own (a project
rule, export.trt.readiness's `namespace`: the parser would take them for plugins by op_type alone), an engine built
by another TensorRT version (its build record), a missing plugin kernel library. Checked here without TensorRT: the
graph rules and the record run before any TensorRT call, the plugin library check before the creators are
registered (plugins.trt.standin's registry)."""

import json
import sys
from pathlib import Path

import onnx
import pytest

from edge.errors import BitNestError


@pytest.fixture(scope="module")
def foreign_namespace_graph(small_llama_checkpoint, tmp_path_factory):
    """The small model's step graph with its attention nodes moved to the domain another exporter would use."""
    from export.onnx.graph import export_onnx
    path = export_onnx(small_llama_checkpoint, tmp_path_factory.mktemp("ns") / "decoder_step.onnx")["onnx"]
    model = onnx.load(str(path))
    for n in model.graph.node:
        if n.op_type == "NestedKvAttention":
            n.domain = "trt.plugins"
    model.opset_import.append(onnx.helper.make_opsetid("trt.plugins", 1))
    bad = Path(path).with_name("foreign.onnx")
    onnx.save(model, str(bad))
    return bad


def test_a_graph_in_an_unknown_plugin_namespace_is_named(foreign_namespace_graph):
    from export.trt.build import build_engine
    from export.trt.readiness import check_file
    rules = {v.rule for v in check_file(foreign_namespace_graph)}
    assert "namespace" in rules, rules
    with pytest.raises(BitNestError, match=r"\[namespace\].*trt\.plugins::NestedKvAttention.*re-export it with "
                                           r"scripts/export.py") as e:
        build_engine(foreign_namespace_graph)                   # refused before any TensorRT call
    assert "\n" not in str(e.value)


def test_an_engine_built_by_another_tensorrt_version_is_refused_naming_the_rebuild(tmp_path):
    """The build record beside an engine names the TensorRT that built it; the backend compares it with its own
    before deserializing (TensorRT refuses a plan of another version, or crashes on it, without saying which)."""
    from edge.backends.tensorrt_record import check_version, read_record, record_path
    engine = tmp_path / "decoder_step.engine"
    engine.write_bytes(b"plan")
    record_path(engine).write_text(json.dumps({"tensorrt": "10.0.1.6", "kv_binding": "aliased"}))
    record = read_record(engine)
    check_version(record, engine, "10.0.1.6")                   # the same version: nothing to say
    with pytest.raises(BitNestError, match=r"built by TensorRT 10\.0\.1\.6, this is TensorRT 10\.3\.0.*rebuild it "
                                           r"with `python scripts/export.py --out CKPT --existing --engine`") as e:
        check_version(record, engine, "10.3.0")
    assert "\n" not in str(e.value)
    for bad in ("{not json", json.dumps({"tensorrt": "10.3.0", "kv_binding": "mirrored"})):
        record_path(engine).write_text(bad)
        with pytest.raises(BitNestError, match="scripts/export.py") as e:
            read_record(engine)
        assert "\n" not in str(e.value)
    record_path(engine).unlink()
    assert read_record(engine) == {}                          # an engine from before records: aliased, no version


def test_a_missing_plugin_kernel_library_is_named_before_registration(monkeypatch):
    """The plugins launch plugins.kernels' Triton modules from enqueue, inside TensorRT: without them registration
    stops in one line naming the install, instead of an engine whose every enqueue returns -1."""
    from plugins.trt import standin as trt_standin
    from plugins.trt.plugins import plugin_library_unavailable, register_creators
    assert plugin_library_unavailable() is None
    monkeypatch.setitem(sys.modules, "plugins.kernels.attention", None)      # as if the module were not installed
    reason = plugin_library_unavailable()
    assert reason and "\n" not in reason and "pip install -e .[jetson]" in reason
    with pytest.raises(RuntimeError, match=r"plugins\.kernels does not import") as e:
        register_creators(trt_standin, trt_standin.IPluginRegistry(), "cpu")
    assert "\n" not in str(e.value)
