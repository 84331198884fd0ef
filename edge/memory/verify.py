"""Checking a memory plan on this machine: build the engine at the planned context, run the planned passes
at the last position, and compare the bytes really allocated with the plan.

Measured bytes = the distinct tensor storages the engine holds after construction (weights as the backend
keeps them, KV planes, scratch) + the largest peak of live storages any one pass allocates (a dispatch
tracer over real tensors). Resident memory (VmHWM, reset before loading) is reported beside it as an
independent check (peak during the passes minus the RSS before loading); it also holds allocator slack
and freed-but-kept heap, so it is not the figure compared.
"""

import time
from typing import Callable

from edge.backends import make_backend
from edge.decode.engine import PassEngine
from edge.decode.kv_cache import KVRead
from edge.memory.alloc_trace import AllocationTracer, storage_bytes
from edge.memory.devices import process_rss_bytes
from edge.memory.plan import MemoryPlan
from edge.memory.workspace import run_step, steps_at_end
from edge.model.checkpoint import Checkpoint

TOLERANCE = 0.02


def _malloc_to_mmap(threshold: int = 1 << 20) -> bool:
    """glibc only: serve allocations from `threshold` bytes up by mmap (returned to the OS on free) and
    stop glibc raising that threshold after frees, so resident size follows live tensors instead of
    keeping freed heap; the RSS cross-check is then meaningful for models with small tensors."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, threshold)) and bool(libc.malloc_trim(0) or True)   # -3 = M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def verify_plan(p: MemoryPlan, load: Callable[[], Checkpoint]) -> dict:
    """Allocate what `p` plans for its maximum context (checkpoint from `load`, backend `p.backend`), run
    its passes at the last position and compare. Returns planned and measured bytes and their ratio."""
    mmap = _malloc_to_mmap()
    rss0 = process_rss_bytes()
    t0 = time.perf_counter()
    ckpt = load()
    eng = PassEngine(ckpt, make_backend(p.backend, ckpt), p.max_context, scratch=p.scratch_slots,
                     prefill_chunk=p.workload.prefill_chunk)
    held = storage_bytes(eng.backend, eng.ckpt.tensors, eng.cache, eng.decoder)
    built_s = time.perf_counter() - t0
    hwm_reset = _reset_peak_rss()    # after loading: the loader's own transients are not the run's
    peaks, times = {}, {}
    for step in steps_at_end(p.max_context, p.config.speculative, p.workload.gamma, p.workload.prefill_chunk,
                             KVRead(p.config.draft_kv)):
        t = time.perf_counter()
        with AllocationTracer() as tr:
            run_step(eng, step)
        peaks[step.name], times[step.name] = tr.peak, round(time.perf_counter() - t, 2)
    measured = held + max(peaks.values())
    planned = p.total_bytes()
    rss = _peak_rss() - rss0 if hwm_reset else None
    return {"context": p.max_context, "backend": p.backend, "planned_bytes": planned, "measured_bytes": measured,
            "ratio": round(measured / planned, 5), "within_2pct": abs(measured / planned - 1) <= TOLERANCE,
            "planned": {"weights": p.weight_bytes, "kv": p.kv_bytes(p.max_context), "scratch": p.scratch_bytes,
                        "workspace": p.workspace},
            "measured": {"held_by_engine": held, "step_peaks": peaks},
            "rss_peak_delta_bytes": rss, "rss_ratio": round(rss / planned, 4) if rss else None,
            "malloc_mmap_threshold_set": mmap,
            "build_seconds": round(built_s, 1), "step_seconds": times,
            "method": "tensor storages held by the engine + the largest per-pass peak of live storages "
                      "(dispatch tracer); RSS: peak during the passes minus RSS before loading"}
