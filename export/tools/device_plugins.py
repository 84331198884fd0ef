"""The device check's `plugins` section: the TensorRT plugins' own code on this device without TensorRT. The
conformance suite (both plugins through TensorRT 10.3's build and run-time calls over the stand-in of its Python
API, each against its reference), the KV-binding suite (ping-pong against aliased over a decode schedule, and the
plugin enqueues captured in a CUDA graph and replayed against eager where CUDA is present) and the engine
inspector and binding rules, run by pytest in a process of its own on the kernels' device (the GPU; the CPU and the
Triton interpreter in a dry run). Its verdict: every test passed or skipped, at least one passed.

The child is stopped PLUGINS_STOP_MARGIN seconds before the section's own limit, so the section still returns: it
fails naming the test that was running (pytest -v prints each test's id as it starts, unbuffered) with the counts
so far. A real run without pytest or onnx (the suites' imports) fails in one line naming the install; a dry run
skips with the same line, as it does for a copy of the repo without the suites."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("tests/test_trt_conformance.py", "tests/test_trt_kv_binding.py", "tests/test_trt_inspect.py")
# what the suites cannot run without, and the fix (the conformance suite imports tests/test_trt_rules.py: onnx graphs)
NEEDS = (("pytest", "pip install pytest"), ("onnx", "pip install onnx"))
PLUGINS_STOP_MARGIN = 3.0       # seconds before the section's limit at which the pytest child is stopped
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
_OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
_TEST_ID = re.compile(r"^(\S+::\S+)")


def counts(summary: str) -> dict:
    """pytest's closing line ("3 failed, 40 passed, 1 skipped in 9.1s") as {outcome: n}."""
    out = {}
    for n, word in _COUNT.findall(summary):
        out["error" if word.startswith("error") else word] = int(n)
    return out


def missing_requirement() -> str | None:
    """None where pytest and onnx import here, else one line naming the missing one and its install."""
    for module, fix in NEEDS:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed here ({fix}): the plugin suites cannot run"
    return None


def running_test(output: str) -> str | None:
    """The test `pytest -v` had started and not finished when its output stops: the last line naming a test id
    without an outcome (None between tests)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    last = _TEST_ID.match(lines[-1])
    return last.group(1) if last and not _OUTCOME.search(lines[-1]) else None


def plugins_section(limit: float, suites: tuple = SUITES, dry: bool = False, workers: int = 0) -> dict:
    """The suites' outcome: {"passed", "counts", "device", "summary", "failures", "suites"}; on a real run without
    pytest or onnx {"status": "failed", "passed": False, "reason"} (a dry run skips with the reason, as where the
    suites are not in this copy); `workers` > 1: that many pytest-xdist workers where it is installed (the
    kernels section's unit tests); stopped PLUGINS_STOP_MARGIN s before `limit`, it fails with "running" (the test
    under way) and the counts so far."""
    reason = missing_requirement()
    if reason:
        return {"status": "skipped", "reason": reason} if dry else {"status": "failed", "passed": False,
                                                                     "reason": reason}
    missing = [s for s in suites if not (ROOT / s.split("::")[0]).is_file()]
    if missing:
        return {"status": "skipped", "reason": f"{missing[0]} is not in this copy of the repo"}
    # the project's addopts cleared: one process unless `workers` asks for more and pytest-xdist is here; -u and -v:
    # each test's id reaches the pipe as it starts, so a stopped child still says which test it was in
    xdist = workers > 1 and importlib.util.find_spec("xdist") is not None     # suites that compile many kernels
    cmd = [sys.executable, "-u", "-m", "pytest", "-o", "addopts=", "-v", "-p", "no:cacheprovider",
           *(("-n", str(workers)) if xdist else ()), *suites]
    stop = max(1.0, limit - PLUGINS_STOP_MARGIN)
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=stop)
    except subprocess.TimeoutExpired as e:      # the child is killed; its output so far is on the exception (bytes)
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        running = running_test(out)
        got = {k.lower(): len(re.findall(rf" {k}\b", out)) for k in ("PASSED", "FAILED", "SKIPPED")}
        return {"status": "failed", "passed": False, "running": running, "counts": got, "device": device,
                "suites": list(suites), "summary": f"stopped after {stop:g} s (the section's limit {limit:g} s less "
                f"{PLUGINS_STOP_MARGIN:g}) " + (f"in {running}" if running else "between tests"),
                "reason": f"timed out after {stop:g} s " + (f"in {running}" if running else "between tests"),
                "failures": [line for line in out.splitlines() if " FAILED" in line][:8]}
    lines = run.stdout.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if _COUNT.search(line)), "")
    got = counts(summary)
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))][:8]
    ok = run.returncode == 0 and got.get("passed", 0) > 0 and not got.get("failed") and not got.get("error")
    return {"passed": ok, "counts": got, "summary": summary or (run.stderr.strip().splitlines() or ["no output"])[-1],
            "device": device, "suites": list(suites), "failures": failures}
