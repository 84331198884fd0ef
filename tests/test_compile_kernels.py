"""Every kernel compiles for Orin (sm_87) without a GPU, with PTX that JetPack 6's CUDA 12.6 driver loads, and the
matrix instructions the design relies on (int8 MMA in the W4A8/W8A8 GEMV, float16 MMA in attention) are there."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_kernels(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the compiler, not the interpreter
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), *args],
                          capture_output=True, text=True, env=env, timeout=900)


def test_compile_kernels_for_sm87(tmp_path):
    out = compile_kernels("--arch", "sm_87", "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = {r["kernel"]: r for r in result["kernels"]}
    assert {"gemv_draft_w4a8", "gemv_target_w8a8", "flash_decode_d128_gqa4", "write_kv_d128"} <= rows.keys()
    for name, r in rows.items():
        assert r["ptx_isa"] == "8.5" and r["target"] == "sm_87", name
        assert (tmp_path / f"{name}.ptx").stat().st_size > 0 and (tmp_path / f"{name}.cubin").stat().st_size > 0
        assert r["registers"] and r["registers"] <= 255 and r["spill_store_bytes"] == 0, name
    assert rows["gemv_draft_w4a8"]["imma"] > 0 and rows["gemv_target_w8a8"]["imma"] > rows["gemv_draft_w4a8"]["imma"]
    assert rows["gemv_draft_w4a16"]["hmma"] > 0 and rows["flash_decode_d128_gqa4"]["hmma"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["arch"] == "sm_87"


def test_compile_kernels_rejects_a_bad_arch(tmp_path):
    out = compile_kernels("--arch", "ampere", "--out", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "sm_87" in out.stderr


def selfcheck(*args: str, interpret: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET=interpret)
    return subprocess.run([sys.executable, "-m", "edge.checks.kernels", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=900)


def test_kernel_selfcheck_passes_on_real_planes(small_llama_checkpoint):
    """The command on a real export's planes (the small Llama's: the interpreter runs them in seconds where the
    default model's take half a minute; tests/test_kernels.py runs the default model's shapes and GQA 3:1)."""
    out = selfcheck("--checkpoint", str(small_llama_checkpoint), interpret=os.environ["TRITON_INTERPRET"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and result["passed"], result
    names = " ".join(c["name"] for c in result["checks"])
    assert "q_proj M=5 target int8" in names and "down_proj M=1 draft float16" in names and "kv4" in names
    assert len(result["checks"]) == 20 and all(c["passed"] for c in result["checks"])


def test_kernel_selfcheck_reports_why_it_cannot_run(tmp_path):
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernels can run")
    out = selfcheck(interpret="0")
    assert out.returncode == 2 and "no CUDA GPU" in json.loads(out.stdout.strip())["reason"]


def test_kernel_selfcheck_rejects_a_bad_checkpoint(tmp_path):
    out = selfcheck("--checkpoint", str(tmp_path), interpret="1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(tmp_path) in json.loads(out.stdout.strip())["reason"]


def test_bench_kernels_without_a_gpu_says_so():
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark runs (minutes)")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs a CUDA GPU" in out.stderr
