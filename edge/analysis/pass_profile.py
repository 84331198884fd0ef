"""Where a decode pass's GPU time goes: each kernel the device ran during a pass, from the profiler's device records
(torch.profiler over CUPTI: the kernels inside a CUDA-graph replay included), grouped into the step's families (the
decode GEMV, the norms, RoPE, the KV write, attention, the gated product, R1, what torch launched itself), with
their time and launches per pass, against the pass's wall time measured beside them. What a whole step's share of
the copy bandwidth cannot say: whether the GEMV streams slowly inside the step, or the step waits on small kernels
and the gaps between them (docs/kernels.md, the whole step).

A kernel's family is found from its name (`family`): the Triton kernels are named after their jit functions, so a
kernel the map does not know lands in "other" (tests/test_pass_profile.py holds every kernel a triton-backend pass
launches to a family of its own). In the Triton interpreter (the device check's dry run) there are no device
records: the profiler's host ops stand in, plumbing only."""

import statistics
import time
from typing import Callable

# family -> substrings of the kernel names it holds (first match wins, in this order)
FAMILIES = (
    ("gemv", ("decode_gemv", "dual_plane", "split_reduce", "gemm_kernel")),   # every linear and the nested head
    ("norm", ("rms_norm",)),                                        # with the next linear's INT8 activations
    ("rope_kv_write", ("rope_write_kv",)),                          # RoPE in the KV write's launch
    ("rope", ("rope",)),
    ("kv_write", ("write_kv",)),
    ("attention", ("flash_decode", "chunk_reduce", "flash_prefill")),   # (o_proj's activations in the reduction)
    ("gated", ("swiglu",)),                                         # SwiGLU, R4 and down_proj's activations
    ("rotate", ("rotate_decode",)),                                 # R1 at the embedding and before the head
    ("quantize", ("quantize",)),                                    # a linear's own activations (none expected)
    ("copy", ("memcpy", "memset")),                                 # the staged ids in, the logits out
)
OTHER = "other"                                                     # torch's own kernels (embedding gather, ...)


def family(kernel: str) -> str:
    """The family of a kernel named `kernel` (FAMILIES; OTHER where none matches)."""
    low = kernel.lower()
    for name, parts in FAMILIES:
        if any(p in low for p in parts):
            return name
    return OTHER


def breakdown(kernels: list[tuple[str, float]], passes: int) -> dict:
    """kernels: (name, microseconds) of every device record over `passes` passes -> per pass: the kernels' total
    time (`kernel_ms`) and count (`launches`), each family's {"ms", "launches"} (families that ran, in FAMILIES
    order, OTHER last) and the five longest kernels by total time ({name: ms})."""
    fams: dict[str, list] = {}
    names: dict[str, float] = {}
    for name, us in kernels:
        f = fams.setdefault(family(name), [0.0, 0])
        f[0] += us
        f[1] += 1
        names[name] = names.get(name, 0.0) + us
    order = [n for n, _ in FAMILIES] + [OTHER]
    per = {n: {"ms": round(fams[n][0] / passes / 1e3, 4), "launches": round(fams[n][1] / passes, 2)}
           for n in order if n in fams}
    top = sorted(names.items(), key=lambda kv: -kv[1])[:5]
    return {"kernel_ms": round(sum(us for _, us in kernels) / passes / 1e3, 4),
            "launches": round(len(kernels) / passes, 2), "families": per,
            "top": {n: round(us / passes / 1e3, 4) for n, us in top}}


def _sync(cuda: bool) -> None:
    if cuda:
        import torch
        torch.cuda.synchronize()


def device_records(fn: Callable[[], object], passes: int, cuda: bool) -> list[tuple[str, float]]:
    """(name, µs) of every device record of `passes` calls of fn under torch.profiler (the host's ops where `cuda`
    is False: the dry run's stand-in)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            fn()
        _sync(cuda)
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == kind]


def median_ms(fn: Callable[[], object], repeats: int, cuda: bool, warm: bool = True) -> float:
    """Median wall milliseconds of `repeats` calls of fn, each to the device's end (host included: what a decode step
    waits for), after one warm-up call (compiles, captures) where `warm`."""
    if warm:
        fn()
        _sync(cuda)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(cuda)
        walls.append(time.perf_counter() - t0)
    return round(statistics.median(walls) * 1e3, 4)


def profile_pass(fn: Callable[[], object], repeats: int, cuda: bool, warm: bool = True) -> dict:
    """One pass's breakdown over `repeats` calls of fn, with its median wall time (`median_ms`, timed without the
    profiler) and the time no kernel ran (`idle_ms`: launch gaps, host work, the copies' waits)."""
    wall = median_ms(fn, repeats, cuda, warm)
    out = breakdown(device_records(fn, repeats, cuda), repeats)
    return {"wall_ms": wall, "idle_ms": round(max(0.0, wall - out["kernel_ms"]), 4)} | out
