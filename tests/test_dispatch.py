"""The batch-invariance properties again under other CPUs' kernels, forced on this machine: numpy's OpenBLAS
(the Triton interpreter's `tl.dot` was numpy's matmul, and OpenBLAS's AVX2 sgemm made a row's result depend on
its position, which failed the attention test on AVX2-only AMD machines and nowhere else) and torch's CPU
dispatch (`ATEN_CPU_CAPABILITY`: the `cpu` backend's int4 and float16 GEMMs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import KERNEL_DEVICE

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def openblas_core_types() -> list[str]:
    """OpenBLAS kernel families this CPU can run (Haswell's AVX2 sgemm is what an AVX2-only AMD EPYC gets,
    SkylakeX's what an AVX-512 one gets); none where numpy's BLAS is not a DYNAMIC_ARCH OpenBLAS."""
    import numpy
    blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    if "openblas" not in str(blas.get("name", "")).lower() or "DYNAMIC_ARCH" not in str(blas):
        return []
    need = {"Haswell": {"avx2", "fma"}, "SkylakeX": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}
    return [core for core, f in need.items() if f <= cpu_flags()]


@pytest.mark.skipif(KERNEL_DEVICE != "cpu", reason="CPU dispatch of the Triton interpreter's numpy")
@pytest.mark.parametrize("core", ["Haswell", "SkylakeX"])
def test_attention_is_batch_invariant_under_every_blas_kernel(core):
    if core not in openblas_core_types():
        pytest.skip(f"this CPU or numpy build cannot run OpenBLAS's {core} kernels")
    env = dict(os.environ, OPENBLAS_CORETYPE=core, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_kernels.py",
                          "-k", "is_batch_invariant and 133"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-3000:]


def torch_capabilities() -> list[str]:
    """ATEN_CPU_CAPABILITY values this CPU runs, other than the one this process already uses."""
    need = {"default": set(), "avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}
    here = torch.backends.cpu.get_cpu_capability().lower()
    return [c for c, f in need.items() if f <= cpu_flags() and c != here]


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_cpu_backend_is_row_exact_under_every_torch_dispatch(rtn_checkpoint, capability):
    if capability not in torch_capabilities():
        pytest.skip(f"{capability} is this process's own dispatch (tests/test_row_invariance.py) or not on this CPU")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    sizes = "2,5,9"      # one-token drafting against verification at γ = 1, 4, 8 (the scalar build is slow)
    run = subprocess.run([sys.executable, "-m", "tests.test_row_invariance", str(rtn_checkpoint), sizes],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(report)
    assert report["capability"].lower() == capability and report["exact_failures"] == []
