"""scripts/selfcheck.py on a real export: the paths that run here pass, TensorRT is skipped with its reason."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_selfcheck_reports_every_path(small_llama_checkpoint):
    """Every path on the 2-layer model (its ONNX export and onnxruntime run take seconds where the default model's
    take a minute; the paths and what they report are the same)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "selfcheck.py"), "--checkpoint",
                          str(small_llama_checkpoint),
                          "--tokens", "2", "--paths", "torch,onnxruntime,tensorrt,energy", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    by = {p["path"]: p for p in r["paths"]}
    assert r["passed"] and len(r["reference_tokens"]) == 2
    assert by["torch"]["status"] == "passed" and by["torch"]["details"]["tokens"] == r["reference_tokens"]
    assert by["onnxruntime"]["status"] == "passed", by["onnxruntime"]
    assert by["onnxruntime"]["details"]["max_rel_err"] < 1e-3
    for p in r["paths"]:
        assert p["status"] in ("passed", "failed", "skipped")
        if p["status"] == "skipped":
            assert p["reason"], p
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert by["tensorrt"]["status"] == "skipped" and "TensorRT" in by["tensorrt"]["reason"]
    assert "tensorrt: skipped" in out.stderr or "tensorrt: passed" in out.stderr


def test_selfcheck_bad_path_is_one_line(small_llama_checkpoint):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "selfcheck.py"), "--checkpoint",
                          str(small_llama_checkpoint), "--paths", "torch,warp"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "'warp'" in out.stderr


def test_on_a_jetson_a_missing_path_fails(small_llama_checkpoint):
    """--expect jetson: what JetPack 6 and .[jetson] must provide (TensorRT with a CUDA torch and an engine, the
    tegrastats meter) is `failed` where it cannot run, not `skipped`, and the exit code says so."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "selfcheck.py"), "--checkpoint",
                          str(small_llama_checkpoint), "--tokens", "2", "--paths", "torch,tensorrt,energy", "--expect",
                          "jetson", "--json"],
                         capture_output=True, text=True, timeout=600)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    by = {p["path"]: p for p in r["paths"]}
    assert by["torch"]["status"] == "passed"
    if by["tensorrt"]["status"] != "passed":
        assert by["tensorrt"]["status"] == "failed" and "expected on a Jetson" in by["tensorrt"]["reason"]
    if by["energy:tegrastats"]["status"] != "passed":
        assert by["energy:tegrastats"]["status"] == "failed" and "tegrastats" in by["energy:tegrastats"]["reason"]
    assert by["energy:jtop"]["status"] in ("passed", "skipped")            # optional even on a Jetson
    assert (out.returncode == 0) == r["passed"] and (r["passed"] or out.returncode == 1)
    assert r["expected"] == ["onnxruntime", "triton", "tensorrt", "energy:tegrastats"]
    if by["tensorrt"]["status"] == "failed":
        assert out.returncode == 1 and "tensorrt: failed" in out.stderr


def test_an_engine_lossless_against_itself_but_wrong_fails_against_the_independent_reference(small_llama_checkpoint):
    """What the tensorrt path requires beyond losslessness, shown on an engine that runs here (the 2-layer model,
    seconds): the torch backend agrees with the independent step reference; the same engine over planes with one
    wrong scale (planted in memory, the files untouched) is still lossless against itself and writes the same greedy
    tokens, and fails on its prefill logits."""
    from edge.backends.torch_ref import TorchBackend
    from edge.checks.reference_agreement import SMALL_MODEL_MAX_REL_ERR
    from edge.checks.selfcheck import SelfCheckOptions, _Check
    from edge.engine.interface import PassEngine
    from edge.model.checkpoint import load_checkpoint
    c = _Check(SelfCheckOptions(checkpoint=str(small_llama_checkpoint), tokens=3))
    good = lambda: PassEngine(c.ckpt, TorchBackend(c.ckpt), c.capacity)
    r = c.against_independent(good, c.lossless(good, "torch"))
    checked = r.details["independent_reference"]
    assert r.status == "passed" and checked["reference_tokens"] == c.reference, r
    assert checked["prefill_bound"] == SMALL_MODEL_MAX_REL_ERR and checked["prefill_rel_err"] < 1e-5
    wrong = load_checkpoint(small_llama_checkpoint)
    name = "model.layers.1.self_attn.v_proj.scale"
    wrong.tensors[name] = wrong.tensors[name] * 1.25                       # a misread scale, one layer
    bad = lambda: PassEngine(wrong, TorchBackend(wrong), c.capacity)
    lossless = c.lossless(bad, "tensorrt")
    assert lossless.status == "passed"                                     # consistent garbage passes this alone
    r = c.against_independent(bad, lossless)
    assert r.status == "failed" and "prefill logits" in r.reason and "\n" not in r.reason, r
