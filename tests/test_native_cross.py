"""The native kernels and decoder step without torch, built as a standalone program (tests/native/check_kernels.cpp):
on this CPU for every kernel set it runs, and for aarch64 (the Jetson's CPU) under qemu, once on a CPU with the
dot-product extension (`-cpu max`: the sdot path) and once on a plain ARMv8.0 core (`-cpu cortex-a57`: the widening
path). Each run checks the kernels against the portable ones, rows independent of M, and a two-layer step whose
6-token pass equals six one-token passes bit for bit. The aarch64 runs need g++-aarch64-linux-gnu and qemu-user
(.ci/run installs them) and skip with that reason where they are absent."""

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "plugins" / "native"
SOURCES = [NATIVE / s for s in ("kernels_generic.cpp", "kernels_avx2.cpp", "kernels_neon.cpp", "step.cpp")] + \
          [ROOT / "tests" / "native" / "check_kernels.cpp"]
FLAGS = ["-O2", "-std=c++17", "-fopenmp", "-ffp-contract=off", f"-I{NATIVE}"]


def _build(cxx: str, out: Path, static: bool = False) -> Path:
    r = subprocess.run([cxx, *FLAGS, *(["-static"] if static else []), *map(str, SOURCES), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout}{r.stderr[-1000:]}"
    return r.stdout


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("g++") is None, reason="needs g++ on x86-64")
def test_kernels_and_step_on_this_cpu(tmp_path):
    exe = _build("g++", tmp_path / "check")
    assert "generic: ok" in _run([str(exe), "generic"])
    if "avx2" in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""):
        assert "avx2: ok" in _run([str(exe), "avx2"])


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs g++-aarch64-linux-gnu and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)")
def test_kernels_and_step_on_aarch64_under_qemu(tmp_path):
    exe = _build("aarch64-linux-gnu-g++", tmp_path / "check-aarch64", static=True)
    assert "neon-sdot: ok" in _run(["qemu-aarch64", "-cpu", "max", str(exe), "neon"])
    assert "neon-widen: ok" in _run(["qemu-aarch64", "-cpu", "cortex-a57", str(exe), "neon"])
    assert "generic: ok" in _run(["qemu-aarch64", "-cpu", "cortex-a57", str(exe), "generic"])
