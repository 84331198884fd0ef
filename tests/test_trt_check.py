"""The device check's TensorRT section (export.trt.check) without TensorRT: the same code with the step graph on
the CPU (onnxruntime) in place of the engine agrees with the independent step reference on the 2-layer test model,
and a graph with one misread scale (1.25x, one layer) fails the section, and the dry device check with it."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import ROOT

PLANTED = "model.layers.1.self_attn.v_proj.scale"       # the scale tests/test_selfcheck.py misreads


@pytest.fixture(scope="module")
def graphs(small_llama_checkpoint, tmp_path_factory):
    """(the exported step graph, a copy whose PLANTED scale initializer reads 1.25x)."""
    from export.onnx.graph import export_onnx
    good = export_onnx(small_llama_checkpoint, tmp_path_factory.mktemp("graph") / "decoder_step.onnx")["onnx"]
    model = onnx.load(str(good))
    init = next(i for i in model.graph.initializer if i.name == PLANTED)
    wrong = (numpy_helper.to_array(init).astype(np.float32) * 1.25).astype(np.float16)
    init.CopyFrom(numpy_helper.from_array(wrong, PLANTED))
    bad = tmp_path_factory.mktemp("planted") / "decoder_step.onnx"
    onnx.save(model, str(bad))
    return good, bad


def _check(checkpoint, onnx_path):
    out = subprocess.run([sys.executable, "-m", "export.trt.check", "--checkpoint", str(checkpoint), "--onnx",
                          str(onnx_path), "--engine", "onnxruntime", "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_the_section_passes_an_engine_that_agrees(small_llama_checkpoint, graphs):
    code, r = _check(small_llama_checkpoint, graphs[0])
    assert code == 0 and r["status"] == "passed" and r["tokens_equal"], r
    assert r["prefill_rel_err"] < r["prefill_bound"] == 1e-3
    assert list(r["phase_seconds"]) == ["load", "reference", "engine"]        # the graph given: no onnx phase
    assert all(v >= 0 for v in r["phase_seconds"].values())


def test_a_section_stopped_at_its_limit_names_the_phase_it_was_in(small_llama_checkpoint, graphs, tmp_path,
                                                                   monkeypatch):
    """The child stopped in a phase that never ends (a cold build, simulated): the section fails naming that phase,
    within its limit, and the checks after it would still run (the section returns, no alarm fires)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))          # the stopped child's temporary folder stays here
    from edge.analysis.report.device import table
    from export.tools.device_check import TRT_HANG_PHASE, DeviceCheckOptions, run_device_check
    opts = DeviceCheckOptions(dry=True, sections=("tensorrt",), checkpoint=str(small_llama_checkpoint),
                              onnx=str(graphs[0]), hang="tensorrt", limits=(("tensorrt", 8),))
    r = run_device_check(opts, tmp_path / "device_check.json")
    trt = r["tensorrt"]
    assert trt["status"] == "failed" and trt["phase"] == TRT_HANG_PHASE == "load", trt
    assert trt["reason"] == "timed out after 6 s in its load phase" and trt["phase_seconds"] == {}
    assert r["tensorrt_seconds"] < 8 and r["complete"] and not r["passed"]
    assert "in its load phase" in table(r)


def test_phases_are_read_back_from_a_childs_stderr():
    """What the parent reads: the phase started last and not ended, and the seconds of those that ended, among other
    lines; a phase entered again adds to its seconds."""
    import io

    from edge.phase_clock import PhaseClock, read_phases
    out = io.StringIO()
    clock = PhaseClock(stream=out)
    for name in ("load", "build", "build"):
        with clock.phase(name):
            print("a log line of the phase's own", file=out)
    assert set(clock.seconds) == {"load", "build"} and read_phases(out.getvalue()) == (None, clock.seconds)
    out.write("phase: engine\nTensorRT warning: phase: not a phase line\n")
    assert read_phases(out.getvalue()) == ("engine", clock.seconds)


def test_the_dry_device_check_fails_a_misread_scale(small_llama_checkpoint, graphs, tmp_path):
    """The device check's tensorrt section, dry (the graph on the CPU in place of the engine): the planted scale
    fails the section and the whole check, in the JSON and in the table."""
    from edge.analysis.report.device import table
    from export.tools.device_check import DeviceCheckOptions, run_device_check
    opts = DeviceCheckOptions(dry=True, sections=("tensorrt",), checkpoint=str(small_llama_checkpoint),
                              onnx=str(graphs[1]))
    run_device_check(opts, tmp_path / "device_check.json")
    r = json.loads((tmp_path / "device_check.json").read_text())
    trt = r["tensorrt"]
    assert r["complete"] and trt["status"] == "failed" and trt["engine"] == "onnxruntime" and not r["passed"], trt
    assert trt["prefill_rel_err"] > trt["prefill_bound"] and "from the independent reference" in trt["reason"]
    assert "TensorRT: failed against the independent reference (onnxruntime" in table(r)
