"""Checking a memory plan on this machine: build the engine at the planned context, run the planned passes
at the last position, and compare the bytes really allocated with the plan.

Measured bytes = the distinct tensor storages the engine holds after construction (weights as the backend
keeps them, KV planes, scratch) + the largest peak of live storages any one pass allocates (a dispatch
tracer over real tensors). Resident memory (VmHWM, reset before loading) is reported beside it as an
independent check (peak during the passes minus the RSS before loading); it also holds allocator slack
and freed-but-kept heap, so it is not the figure compared.

What resident memory holds beyond the plan, measured on the default model (plan 241 MB, RSS peak delta 463 MB):
file-backed pages, not allocations. The checkpoint is memory-mapped (safetensors), and the pages a backend read
while re-laying or moving its planes stay mapped in the process until the kernel reclaims them (clean, reclaimable:
~80 MB of the 166 MB file), and the first passes page in torch's kernel code (~60 MB). Anonymous memory (tensors,
Python heap, allocator slack) grew by 207 MB. The bound checked (`rss_within_bound`): RSS peak delta <= plan +
the checkpoint file's bytes + LIBRARY_RSS_BOUND of code and heap outside the tensors.

Anonymous memory is also sampled every millisecond during each pass (`AnonSampler`), so a pass's transient scratch
counts, and its peak is split by `anon_breakdown`. On the default model (2-core AMD EPYC, `bitnest max-context
--device local --total-mib 230 ... --verify --json`): plan 241.2 MB, sampled peak 268.7 MB over the RSS before
loading (+27 MiB): the engine's tensors 193.7 MB, 23.1 MB that loading left beyond them, the prefill chunk's
sampled rise 52.5 MB against its traced 47.6 MB (4.9 MB of kernel scratch the tracer cannot see), 4.6 MB kept by
the first pass (thread pools) under the draft and verification passes, whose sampled rises equal their traced peaks.
What loading leaves beyond the tensors is mostly heap glibc keeps after frees: on the RTN export of the tests, 3 to
133 MB run to run untrimmed, 1 to 3 MB after `release_freed_heap` (which loading an LLM calls, and so does this check),
for a peak of plan + 12 to 22 MiB.
"""

import threading
import time
from typing import Callable

from edge.backends import make_backend
from edge.engine.interface import PassEngine
from edge.engine.kv_cache import ElasticKV
from edge.memory.alloc_trace import AllocationTracer, storage_bytes
from edge.memory.devices import process_rss_bytes, release_freed_heap
from edge.memory.plan import MemoryPlan, plan_steps
from edge.memory.workspace import run_step
from edge.model.checkpoint import Checkpoint

TOLERANCE = 0.02
LIBRARY_RSS_BOUND = 160 << 20     # code pages and heap outside tensors that the first passes bring in (~60 MB seen)


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


def _status(key: str) -> int:
    """A byte figure of /proc/self/status (VmHWM, RssAnon, RssFile...); 0 where absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss() -> int:
    return _status("VmHWM")


class AnonSampler:
    """Samples this process's anonymous resident memory (RssAnon: tensors, heap, thread stacks; not mapped files)
    every `interval` seconds from a thread while a block runs; the kernels and torch release the GIL, so the samples
    fall inside the passes. `peak` is the largest sample (the first is taken on entry, the last on exit)."""

    def __init__(self, interval: float = 0.001):
        self.interval, self.peak, self.count = interval, 0, 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        self.peak = max(self.peak, _status("RssAnon"))
        self.count += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "AnonSampler":
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def anon_breakdown(loaded: int, held: int, steps: dict, traced: dict) -> dict:
    """Where the anonymous memory sampled during a check went, against what the plan counts: `load_beyond_tensors`,
    what loading left resident beyond the tensor storages the engine holds (Python objects, allocator slack);
    per pass, how far its sampled peak rose over its start beyond the pass's traced peak (`untraced`: kernel
    scratch and thread-pool buffers the dispatch tracer cannot see) and what an earlier pass left behind
    (`kept`: growth that stays, e.g. a thread pool started by the first pass)."""
    return {"engine_tensors": held, "load_beyond_tensors": loaded - held,
            "passes": {name: {"traced_peak": traced[name], "sampled_peak_over_start": s["peak_over_start"],
                              "untraced": s["peak_over_start"] - traced[name], "kept": s["start_over_loaded"]}
                       for name, s in steps.items()}}


def verify_plan(p: MemoryPlan, load: Callable[[], Checkpoint]) -> dict:
    """Allocate what `p` plans for its maximum context (checkpoint from `load`, backend `p.backend`), run
    its passes at the last position and compare. Returns planned and measured bytes and their ratio."""
    mmap = _malloc_to_mmap()
    rss0, anon0, file0 = process_rss_bytes(), _status("RssAnon"), _status("RssFile")
    t0 = time.perf_counter()
    ckpt = load()
    elastic = ElasticKV(p.kv_window, p.ring_slots) if p.config.elastic else None
    eng = PassEngine(ckpt, make_backend(p.backend, ckpt), p.max_context, scratch=p.scratch_slots,
                     prefill_chunk=p.workload.prefill_chunk, elastic=elastic)
    held = storage_bytes(eng.backend, eng.ckpt.tensors, eng.cache, eng.decoder)
    built_s = time.perf_counter() - t0
    release_freed_heap()             # as loading an LLM does
    hwm_reset = _reset_peak_rss()    # after loading: the loader's own transients are not the run's
    anon_built = _status("RssAnon")
    peaks, times, anon_steps = {}, {}, {}
    for step in plan_steps(p.config, p.max_context, p.workload):
        t = time.perf_counter()
        start = _status("RssAnon")
        with AnonSampler() as sampler, AllocationTracer() as tr:
            run_step(eng, step)
        peaks[step.name], times[step.name] = tr.peak, round(time.perf_counter() - t, 2)
        anon_steps[step.name] = {"start_over_loaded": start - anon_built, "peak_over_start": sampler.peak - start,
                                 "samples": sampler.count}
    anon_peak = max(anon_built + s["start_over_loaded"] + s["peak_over_start"] for s in anon_steps.values())
    measured = held + max(peaks.values())
    planned = p.total_bytes()
    rss = _peak_rss() - rss0 if hwm_reset else None
    files = sum(f.stat().st_size for f in ckpt.path.glob("*.safetensors")) if ckpt.path else 0
    return {"context": p.max_context, "backend": p.backend, "planned_bytes": planned, "measured_bytes": measured,
            "ratio": round(measured / planned, 5), "within_2pct": abs(measured / planned - 1) <= TOLERANCE,
            "config": p.config.name,
            "planned": {"weights": p.weight_bytes, "kv": p.kv_bytes(p.max_context), "scratch": p.scratch_bytes,
                        "ring": p.ring_bytes, "workspace": p.workspace},
            "measured": {"held_by_engine": held, "step_peaks": peaks},
            "rss_peak_delta_bytes": rss, "rss_ratio": round(rss / planned, 4) if rss else None,
            "rss_anon_delta_bytes": _status("RssAnon") - anon0, "rss_file_delta_bytes": _status("RssFile") - file0,
            "rss_anon_peak_delta_bytes": anon_peak - anon0,
            "rss_anon_breakdown": anon_breakdown(anon_built - anon0, held, anon_steps, peaks),
            "checkpoint_file_bytes": files, "rss_bound_bytes": planned + files + LIBRARY_RSS_BOUND,
            "rss_within_bound": None if rss is None else rss <= planned + files + LIBRARY_RSS_BOUND,
            "malloc_mmap_threshold_set": mmap,
            "build_seconds": round(built_s, 1), "step_seconds": times,
            "method": "tensor storages held by the engine + the largest per-pass peak of live storages "
                      "(dispatch tracer); RSS: peak during the passes minus RSS before loading"}
