"""scripts/device_check.sh, the one prepared script for a CUDA machine, run here in its dry mode (the Triton
interpreter on the CPU, tiny shapes): every section's code runs, so a typo cannot waste device time."""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_device_check_script_runs_dry(tmp_path):
    env = dict(os.environ, DRY="1", OUT=str(tmp_path))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--repeats", "1"], capture_output=True,
                         text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "device_check.json").read_text())
    assert r["dry"] and r["environment"]["interpreter"]
    for section in ("kernels", "bandwidth", "lossless", "pass_times"):
        assert "error" not in r[section], (section, r[section])
    assert r["passed"] and r["kernels"]["passed"] and r["lossless"]["identical"]
    assert r["bandwidth"]["copy_GBps"] > 0 and r["bandwidth"]["gemv"] and r["bandwidth"]["attention"]
    assert set(r["pass_times"]["tiny"]) == {"eager", "static"}                 # graphs only where CUDA is
    assert all(v > 0 for form in r["pass_times"]["tiny"].values() for v in form.values())
    assert r["projection"]["tiny"]["static"] > 0 and r["projection"]["tokens_per_round"] > 1
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert r["tensorrt"]["status"] == "skipped" and "TensorRT" in r["tensorrt"]["reason"]
        assert "TensorRT is not installed here" in out.stderr
    md = (tmp_path / "device_check.md").read_text()
    assert "| tiny | static |" in md and "Kernels against the oracle: all passed" in md


def test_device_check_without_a_gpu_says_so():
    import torch
    if torch.cuda.is_available():
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "edge.cli.device_check"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs a CUDA GPU" in out.stderr
