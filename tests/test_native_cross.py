"""The native kernels and decoder step without torch, built as a standalone program (tests/native/check_kernels.cpp,
check_step.cpp) from the library's own sources: on this CPU for every kernel set it runs, the portable one included
(the program's CPUID/XCR0 detection checked against /proc/cpuinfo), and for aarch64 (the Jetson's CPU) under qemu,
once on a CPU with the dot-product extension (`-cpu max`: the sdot path) and once on a plain ARMv8.0 core
(`-cpu cortex-a57`: the widening path and the portable kernels). Every run checks its kernel set against the float64
scalar oracle (tests/native/oracle.h: the contracts as plain loops in double, sharing no code with the kernels): the
nested linear, the INT8 and KV quantizers (exact ties to even), the per-token kernels, attention over KV8, KV4 and
Recent-N, and the whole step's logits (to 1e-5, up to float32's legitimate choices on codes that sit within 1e-4 of a
rounding boundary); and besides: the layout, rows bit for bit the portable kernel's (any M, any slice), a pass bit
for bit one-token passes, each draft-head setting, a refused pass and a failing pool worker. The aarch64 runs need
g++-aarch64-linux-gnu and qemu-user (.ci/run installs them) and skip with that reason where they are absent, except
under CI (CI=true), where a missing tool fails the run in one line."""

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from plugins.native import KERNEL_SOURCES

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "plugins" / "native"
SOURCES = [NATIVE / s for s in KERNEL_SOURCES] + [ROOT / "tests" / "native" / f for f in ("check_kernels.cpp", "check_step.cpp")]
FLAGS = ["-O2", "-std=c++17", "-pthread", "-ffp-contract=off", f"-I{NATIVE}"]
X86_SETS = {"avx512-vnni": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, "avx-vnni": {"avx_vnni", "avx2"},
            "avx2": {"avx2", "fma", "f16c"}}


def _build(cxx: str, out: Path, static: bool = False) -> Path:
    r = subprocess.run([cxx, *FLAGS, *(["-static"] if static else []), *map(str, SOURCES), "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout[-3000:]}{r.stderr[-1000:]}"
    return r.stdout


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("g++") is None, reason="needs g++ on x86-64")
def test_kernels_and_step_on_this_cpu(tmp_path):
    exe = _build("g++", tmp_path / "check")
    runs = [s.strip() for s in _run([str(exe), "--list"]).split(",")]
    flags = _cpu_flags()
    expected = [name for name, need in X86_SETS.items() if need <= flags] + ["generic"]
    assert runs == expected, f"detected {runs}, /proc/cpuinfo says {expected}"
    for isa in runs:
        assert f"{isa}: ok" in _run([str(exe), isa])
    for isa in set(X86_SETS) - set(runs):    # a set this CPU lacks is refused, never run
        r = subprocess.run([str(exe), isa], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "do not run here" in r.stdout, r.stdout


def _cross_tools() -> None:
    """Skip where the aarch64 cross compiler or qemu-user is missing; fail instead under CI (CI=true), where .ci/run
    installs them: a CI run never passes without the NEON kernels having run."""
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        why = f"{' and '.join(missing)} not found: apt-get install g++-aarch64-linux-gnu qemu-user"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {why} (the NEON kernels would not run)", pytrace=False)
        pytest.skip(why)


def test_kernels_and_step_on_aarch64_under_qemu(tmp_path):
    _cross_tools()
    exe = _build("aarch64-linux-gnu-g++", tmp_path / "check-aarch64", static=True)
    assert _run(["qemu-aarch64", "-cpu", "max", str(exe), "--list"]).strip() == "neon-sdot, neon-widen, generic"
    assert "neon-sdot: ok" in _run(["qemu-aarch64", "-cpu", "max", str(exe), "neon-sdot"])
    assert _run(["qemu-aarch64", "-cpu", "cortex-a57", str(exe), "--list"]).strip() == "neon-widen, generic"
    assert "neon-widen: ok" in _run(["qemu-aarch64", "-cpu", "cortex-a57", str(exe), "neon-widen"])
    assert "generic: ok" in _run(["qemu-aarch64", "-cpu", "cortex-a57", str(exe), "generic"])


def test_the_build_leaves_the_language_standard_to_torch():
    """torch.utils.cpp_extension passes the C++ standard its headers need (-std=c++20 from torch 2.13 on) before our
    flags; a -std of ours would override it, and torch 2.14's headers refuse C++17 (the build failed there and the
    runtime fell back to the cpu backend, measured in a Python 3.10 venv with torch 2.14.1)."""
    from plugins.native import CFLAGS
    assert not [f for f in CFLAGS if f.startswith("-std")], CFLAGS
