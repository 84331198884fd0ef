"""Pass costs for the `auto` policy: the time of a target pass of 1..9 tokens and of a one-token draft pass on this
engine, measured once (medians of interleaved repeats after a warm-up, at a real context) and cached per machine,
checkpoint and backend under the user's cache folder, keyed by a fingerprint of everything that changes them.
A cached table that is unreadable, of another fingerprint, of the wrong widths or with non-positive times is
re-measured, never trusted; so is one whose shape this machine's passes no longer show (a spot check at first use:
a table timed while something else loaded the machine); the reason comes back as one line (`CostTable.note`)."""

import hashlib
import json
import math
import platform
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from edge.atomic import write_atomic
from edge.cache import cache_root
from edge.engine.cost_table import CostTable
from edge.engine.interface import Engine
from edge.engine.kv_cache import KV8
from edge.engine.stats import draft_head_summary
from edge.model.manifest import manifest_seal
from plugins.contracts import DRAFT, TARGET

COSTS_FORMAT = "bitnest-pass-costs"
COSTS_VERSION = 4            # bump when what is measured or how changes: every cached table is then re-measured
#                              (4: passes timed as a greedy round runs them, argmaxes to the host, not full logits)
MAX_GAMMA = 8                # the most proposals `auto` may choose: target passes of 1..MAX_GAMMA + 1 tokens
CONTEXT = 192                # committed positions the passes are timed at (a modest real context)
WARMUP, REPEATS = 2, 9       # interleaved sweeps over every (view, width): discarded, then kept (medians; 5 left
                             # a pass's median ~10% apart between tables measured minutes apart on a shared machine)
# The spot check of a cached table: interleaved sweeps of three passes (a 1-token target pass, a CHECK_WIDTH-token
# one, a draft pass) after one warm-up, their medians' ratios held against the table's. `auto`'s choice depends on
# the table's ratios only (best_gamma is unchanged when every time scales alike), so a host whose bandwidth moved
# (27-77 GB/s between runs on a shared 2-core machine) keeps its table, and one whose passes changed shape (a power
# mode or governor that slows compute and memory apart, a table timed in a burst of load) is re-measured. On that
# 2-core host 24 checks of 3 sweeps landed 1.00-1.22x from a table timed just before (median 1.07x; the default
# model, native step): CHECK_TOLERANCE sits past that noise, so a table is refused only where it is clearly off.
# 3 sweeps cost 12 passes and a prefill at first use: 0.22 s on the 135M's native step. The reference backends are
# not checked: there the same check took 2.5 s (`cpu`) and 9.2 s (`torch`) a start, more than a table could win.
CHECK_SWEEPS, CHECK_WIDTH, CHECK_TOLERANCE = 3, 5, 1.5
CHECKED_BACKENDS = ("native", "triton", "tensorrt")   # the decode paths a user runs `auto` on
# CPU flags that select or speed up kernels (x86 vector extensions, aarch64 SIMD features)
KERNEL_FLAG = re.compile(r"^(avx|amx|fma|f16c|sse4|bmi2|sve|asimd|i8mm|bf16|dotprod)")
# a paragraph of plain English: the context the passes are timed at where the caller has no text of its own
SAMPLE_TEXT = (
    "The old lighthouse stood at the end of a narrow spit of rock, and for most of the year the only visitors were "
    "gulls and the supply boat that came every second Tuesday. Its keeper kept a log of the weather, the ships that "
    "passed and the hours the lamp burned, in a neat hand that never changed in thirty years. When the coast guard "
    "finally automated the light, they found the logs stacked in the store room, one volume for every year, and a "
    "note on top asking whoever came next to keep writing them. Nobody did, at first. Then a student who had come "
    "to count seabirds read a few pages on a stormy night and began to add her own entries: the wind, the birds, "
    "the boats, and now and then a line about the keeper she had never met."
)


def cpu_identity() -> dict:
    """The CPU's model and its kernel-relevant flags (Linux /proc/cpuinfo; elsewhere what `platform` says)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {"model": model, "machine": platform.machine(), "flags": flags}
    fields = dict((k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in first.splitlines()) if v)
    model = fields.get("model name") or " ".join(fields.get(k, "") for k in ("CPU implementer", "CPU part")).strip() \
        or model
    flags = sorted(f for f in (fields.get("flags") or fields.get("Features") or "").split() if KERNEL_FLAG.match(f))
    return {"model": model, "machine": platform.machine(), "flags": flags}


def fingerprint(eng: Engine) -> dict:
    """Everything that changes this engine's pass costs: the CPU, the backend (the native step's ISA, its sources'
    hash and threads; a GPU's name), torch's version and threads, the checkpoint (its sealed manifest's digest,
    which covers every weight file's sha256), what the draft reads of its head (a run may override the manifest's
    setting: an 8-bit draft head reads 68 MB more a pass than the shortlist on Qwen2.5-0.5B) and the table's format
    version."""
    out = {"format": COSTS_FORMAT, "version": COSTS_VERSION, "cpu": cpu_identity(), "torch": torch.__version__,
           "backend": eng.name, "activations": eng.activations, "threads": torch.get_num_threads(),
           "checkpoint": manifest_seal(eng.ckpt.manifest), "max_pass_tokens": eng.max_pass_tokens,
           **draft_head_summary(eng.ckpt)}
    if eng.name == "native":
        from plugins import native
        out.update(isa=eng.isa, threads=eng.threads, native_sources=native.source_hash())
    if eng.name in ("triton", "tensorrt") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def table_path(fp: dict) -> Path:
    """The cache file of a fingerprint: one per machine, checkpoint and backend setting."""
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "costs" / f"{fp['backend']}-{key}.json"


def widths(eng: Engine) -> int:
    """Target pass widths the table holds, 1..this: γ + 1 for γ up to MAX_GAMMA, within the engine's pass limit."""
    return min(MAX_GAMMA + 1, eng.max_pass_tokens or MAX_GAMMA + 1)


def read_table(path: Path, fp: dict, width: int) -> tuple[Optional[CostTable], Optional[str]]:
    """The cached table at `path` if it is sound for `fp`, else (None, why not; None where there is no file)."""
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return None, f"unreadable ({e.__class__.__name__})"
    if not isinstance(data, dict) or data.get("fingerprint") != fp:
        return None, "stale (measured for another machine, checkpoint, backend or format)"
    target, draft = data.get("target_s"), data.get("draft_s")
    if not isinstance(target, list) or len(target) != width or not isinstance(draft, list) or len(draft) != 1:
        return None, f"of the wrong widths (want target passes of 1..{width} tokens and a draft pass of 1)"
    times = target + draft
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in times):
        return None, "holding times that are not positive numbers"
    context = data.get("context")
    return CostTable(tuple(map(float, target)), float(draft[0]), "cache", path,
                     context if isinstance(context, int) else CONTEXT), None


def _timed(eng: Engine, text: list[int], passes: list[tuple[str, int]], width: int, repeats: int,
           warmup: int) -> tuple[dict, int]:
    """Median seconds of each (view, width) in `passes` at a context of up to CONTEXT positions of `text` (repeated to
    length where short), exactly as a greedy round runs them (logits left on a GPU engine's device, their argmaxes
    taken to the host; KV8, the draft in scratch slot 0, nothing committed), over `repeats` interleaved sweeps after
    `warmup`; and the context. The engine is reset before and after (nothing leaks into a sequence; its stats are
    fresh) and its phase callback is off meanwhile."""
    if not text:
        raise ValueError("measuring pass costs needs at least one token of context")
    context = max(1, min(CONTEXT, eng.capacity - width))
    tokens = (text * (1 + (context + width) // len(text)))[:context + width]
    seconds = {p: [] for p in passes}
    phase, eng.on_phase = eng.on_phase, None
    try:
        eng.reset()
        eng.prefill(tokens[:context])
        for sweep in range(warmup + repeats):
            for view, w in passes:
                t0 = time.perf_counter()
                eng.forward(tokens[context:context + w], view, KV8, draft_slot=0 if view == DRAFT else None,
                            on_device=True).argmax(-1).tolist()
                if sweep >= warmup:
                    seconds[(view, w)].append(time.perf_counter() - t0)
    finally:
        eng.reset()
        eng.on_phase = phase
    return {p: statistics.median(s) for p, s in seconds.items()}, context


def measure(eng: Engine, text: list[int], width: int, repeats: Optional[int] = None,
            warmup: Optional[int] = None) -> CostTable:
    """Time target passes of 1..`width` tokens and one-token draft passes at a context of `text` (`_timed`): medians
    of `repeats` (REPEATS) sweeps over every pass, after `warmup` (WARMUP) sweeps."""
    repeats, warmup = repeats or REPEATS, WARMUP if warmup is None else warmup
    width = min(width, eng.capacity - 1)              # a tiny engine: the widths that fit past one position
    passes = [(TARGET, w) for w in range(1, width + 1)] + [(DRAFT, 1)]
    med, context = _timed(eng, text, passes, width, repeats, warmup)
    return CostTable(widening([med[(TARGET, w)] for w in range(1, width + 1)]), med[(DRAFT, 1)], "measured", None,
                     context)


def ratios(target_1: float, target_w: float, draft: float) -> dict:
    """The shape of a table that `auto`'s choice depends on: the draft pass and the CHECK_WIDTH-token target pass,
    each over the 1-token target pass."""
    return {"draft_vs_target_1": draft / target_1, f"target_{CHECK_WIDTH}_vs_target_1": target_w / target_1}


def disagreement(cached: dict, timed: dict, tolerance: float) -> Optional[str]:
    """None where every ratio timed now (`ratios`) is within `tolerance` times the cached one either way, else one
    line naming the ratio furthest off, its value in the table and now."""
    off = {k: max(timed[k] / cached[k], cached[k] / timed[k]) for k in cached}
    worst = max(off, key=off.get)
    if off[worst] <= tolerance:
        return None
    return (f"out of step with this machine's passes now ({worst.replace('_', ' ')} {cached[worst]:.3f} in the table, "
            f"{timed[worst]:.3f} timed now, {off[worst]:.1f}x apart where {tolerance:g}x is allowed)")


def check_table(eng: Engine, text: list[int], table: CostTable) -> tuple[dict, Optional[str]]:
    """Spot-check a cached table on this engine (CHECK_SWEEPS sweeps of three passes, after one warm-up): the ratios
    cached and timed, and the disagreement (None where the table holds)."""
    w = min(CHECK_WIDTH, len(table.target))
    med, _ = _timed(eng, text, [(TARGET, 1), (TARGET, w), (DRAFT, 1)], len(table.target), CHECK_SWEEPS, 1)
    cached = ratios(table.target[0], table.target[w - 1], table.draft)
    timed = ratios(med[(TARGET, 1)], med[(TARGET, w)], med[(DRAFT, 1)])
    r3 = lambda d: {k: round(v, 3) for k, v in d.items()}
    return {"sweeps": CHECK_SWEEPS, "cached": r3(cached), "timed": r3(timed)}, disagreement(cached, timed,
                                                                                           CHECK_TOLERANCE)


def widening(seconds: list[float]) -> tuple[float, ...]:
    """Target pass times by width, each the least of its own median and every wider pass's: a pass over more tokens
    reads the same weights and does more work, so it never costs less than a narrower one, and a width whose median
    is above a wider one's was lifted by a neighbour's burst while it was timed (seen in a bench: a 4-token pass at
    25.8 ms between 3- and 5-token passes at 14.4 ms, which made `auto` take gamma 1 where 4 paid)."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return tuple(out)


def write_table(table: CostTable, path: Path, fp: dict) -> None:
    """Save a measured table atomically (OSError where the cache folder cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"fingerprint": fp, "context": table.context, "target_s": list(table.target),
            "draft_s": [table.draft], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic((json.dumps(data, indent=1) + "\n").encode(), path)


def engine_costs(eng: Engine, text: list[int], remeasure: bool = False) -> CostTable:
    """This engine's cost table, kept on the engine (`eng.costs`) so that every generation shares it: read from the
    cache where a sound table for its fingerprint is there and passes the spot check (`check_table`, on the
    CHECKED_BACKENDS; CHECK_SWEEPS 0: none), else measured at a context of `text` (token ids) and saved.
    `remeasure` measures even where one is cached or kept. A table measured at a shorter context than CONTEXT (an
    engine of small capacity) is used but not saved."""
    if eng.costs is not None and not remeasure:
        return eng.costs
    fp, width = fingerprint(eng), widths(eng)
    path = table_path(fp)
    table, refused = (None, None) if remeasure else read_table(path, fp, width)
    if table is not None and CHECK_SWEEPS and eng.name in CHECKED_BACKENDS:
        check, refused = check_table(eng, text, table)
        table = None if refused else replace(table, check=check)
    if table is None:
        table = measure(eng, text, width)
        note = f"the cost table {path} is {refused}: re-measured" if refused else None
        if table.context == CONTEXT:
            try:
                write_table(table, path, fp)
                table = replace(table, path=path)
            except OSError as e:
                unsaved = f"the cost table could not be saved to {path} ({e.strerror or e}): measured for this run only"
                note = f"{note}; {unsaved}" if note else unsaved
        table = replace(table, note=note)
    eng.costs = table
    return table
