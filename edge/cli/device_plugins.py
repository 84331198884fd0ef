"""The device check's `plugins` section: the TensorRT plugins' own code on this device without TensorRT. The
conformance suite (both plugins through TensorRT 10.3's build and run-time calls over the stand-in of its Python
API, each against its reference), the KV-binding suite (ping-pong against aliased over a decode schedule, and the
plugin enqueues captured in a CUDA graph and replayed against an eager pass where CUDA is present) and the engine
inspector and binding rules, run by pytest in a process of its own on the kernels' device (the GPU; the CPU and the
Triton interpreter in a dry run), bounded by the section's limit. Its verdict: every test passed or skipped, at least
one passed."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("tests/test_trt_conformance.py", "tests/test_trt_kv_binding.py", "tests/test_trt_inspect.py")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def counts(summary: str) -> dict:
    """pytest's closing line ("3 failed, 40 passed, 1 skipped in 9.1s") as {outcome: n}."""
    out = {}
    for n, word in _COUNT.findall(summary):
        out["error" if word.startswith("error") else word] = int(n)
    return out


def plugins_section(limit: float, suites: tuple = SUITES) -> dict:
    """The suites' outcome: {"passed", "counts", "device", "summary", "failures"}; skipped with the reason where
    pytest or the suites are not here (a copy of the product without its tests)."""
    import importlib.util
    import os
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "reason": "pytest is not installed here (pip install pytest)"}
    missing = [s for s in suites if not (ROOT / s).is_file()]
    if missing:
        return {"status": "skipped", "reason": f"{missing[0]} is not in this copy of the repo"}
    # the project's addopts cleared: one process, whether or not pytest-xdist is installed here
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", *suites]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=limit)
    lines = run.stdout.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if _COUNT.search(line)), "")
    got = counts(summary)
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))][:8]
    ok = run.returncode == 0 and got.get("passed", 0) > 0 and not got.get("failed") and not got.get("error")
    return {"passed": ok, "counts": got, "summary": summary or (run.stderr.strip().splitlines() or ["no output"])[-1],
            "device": "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda", "suites": list(suites),
            "failures": failures}
