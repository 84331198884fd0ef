"""Bad input, fuzzed: mutated inputs thrown at every reader the runtime has (checkpoint manifest and weights, prompts
files, gate thresholds, tegrastats lines, the ONNX step graph, command-line values), each outcome counted as a clear
one-line error, accepted correctly, a crash (any other exception: a traceback for the user), a hang (past the time
limit), a silent wrong load (accepted, but not what the input says or what was exported) or a valid input refused
(one the oracle says a correct reader loads). `valid` counts the cases the oracle called valid. Each reader's oracle is
written apart from the reader (edge.analysis.fuzz.readers). The command, with command-line values and killed or
disk-full exports, is export.tools.fuzz_inputs (scripts/fuzz_inputs.py)."""

import contextlib
import io
import json
import os
import random
import shutil
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edge.errors import BitNestError

OUTCOMES = ("error", "accepted", "crash", "hang", "wrong", "refused_valid")
BAD = ("crash", "hang", "wrong", "refused_valid")


class Hang(Exception):
    pass


@dataclass
class Tally:
    """Counts of one reader's outcomes (and of the cases its oracle called valid), with the first few crashes,
    hangs, wrong loads and refused valid inputs kept as examples."""

    counts: dict = field(default_factory=lambda: dict.fromkeys(OUTCOMES + ("valid",), 0))
    examples: list = field(default_factory=list)

    def add(self, outcome: str, what: str) -> None:
        self.counts[outcome] += 1
        if outcome in BAD and len(self.examples) < 5:
            self.examples.append(f"{outcome}: {what}"[:400])


@contextlib.contextmanager
def time_limit(seconds: float):
    def fire(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def attempt(tally: Tally, label: str, read: Callable, correct: Callable[[object], bool], seconds: float,
            valid: bool | None = None) -> None:
    """Run `read()` on an input the oracle calls `valid` (True: a correct reader loads it; False: it refuses it;
    None: either). A one-line BitNestError is a clear error, or a valid input refused; a result of an input that is
    not invalid for which `correct` returns True is accepted correctly, any other result (`correct` False, or a str
    saying how the result differs from what it should be) a silent wrong load."""
    if valid:
        tally.counts["valid"] += 1
    try:
        with time_limit(seconds):
            result = read()
    except Hang:
        return tally.add("hang", label)
    except BitNestError as e:
        msg = str(e)
        if not msg or "\n" in msg:
            return tally.add("crash", f"{label}: multi-line error {msg!r}")
        return tally.add("refused_valid" if valid else "error", f"{label}: refused {msg!r}")
    except Exception as e:    # noqa: BLE001 -- anything else reaches the user as a traceback
        return tally.add("crash", f"{label}: {e.__class__.__name__}: {e} "
                                  f"@ {traceback.extract_tb(e.__traceback__)[-1].name}")
    verdict = correct(result) if valid is not False else "an input the oracle calls invalid"
    why = verdict if isinstance(verdict, str) else None if verdict else "not what it says"
    if why is None:
        return tally.add("accepted", label)
    shown = f"a checkpoint of {result.path}" if hasattr(result, "tensors") else repr(result)[:200]
    tally.add("wrong", f"{label}: accepted, {why}: {shown}")


# -- mutations ---------------------------------------------------------------------------------------------------
JUNK = [None, "", "x", -1, 0, 1, 2 ** 31, 2 ** 63, -(2 ** 63), 1e308, -0.0, 0.5, float("nan"), float("inf"), True,
        False, [], {}, [1, 2], {"a": 1}, "\u0000", "é" * 3, "../../etc/passwd", 10 ** 30]


def mutate_bytes(rng: random.Random, data: bytes, region: int | None = None) -> bytes:
    """One byte-level mutation (flip, zero, truncate, insert, delete, duplicate), within the first `region` bytes."""
    n = len(data)
    hi = max(1, min(n, region or n))
    i = rng.randrange(hi)
    op = rng.choice(("flip", "zero", "truncate", "insert", "delete", "dup", "ff"))
    if op == "flip":
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:] if n else b"\x00"
    if op == "zero":
        return data[:i] + b"\x00" * rng.randint(1, 8) + data[i + 8:]
    if op == "truncate":
        return data[:i]
    if op == "insert":
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[i:]
    if op == "delete":
        return data[:i] + data[i + rng.randint(1, 16):]
    if op == "dup":
        return data[:i] + data[i:i + 32] + data[i:]
    return data[:i] + b"\xff" * rng.randint(1, 8) + data[i + 8:]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def mutate_json(rng: random.Random, obj):
    """A deep copy of `obj` with one node deleted, replaced by junk, or its number or string nudged."""
    obj = json.loads(json.dumps(obj))
    paths = [p for p in _paths(obj) if p]
    if not paths:
        return rng.choice(JUNK)
    path = rng.choice(paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key, value = path[-1], parent[path[-1]]
    op = rng.choice(("delete", "junk", "junk", "nudge"))
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "nudge" and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = rng.choice((value + 1, value - 1, value * 2, -value, value // 3 if isinstance(value, int) else 0))
    elif op == "nudge" and isinstance(value, str):
        parent[key] = value[:-1] if value else "?"
    else:
        parent[key] = rng.choice(JUNK)
    return obj


def json_text(rng: random.Random, obj) -> str:
    """`obj` mutated as JSON (most cases) or as text (broken syntax, encoding)."""
    if rng.random() < 0.7:
        return json.dumps(mutate_json(rng, obj))
    return mutate_bytes(rng, json.dumps(obj).encode()).decode("utf-8", errors="surrogateescape")


def write_text(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def case_dir(base: Path, work: Path, replaced: tuple[str, ...]) -> Path:
    """A fresh copy of checkpoint folder `base` in `work` (files hard-linked, except `replaced`, left absent)."""
    d = work / "case"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for f in base.iterdir():
        if f.is_file() and f.name not in replaced:
            try:
                os.link(f, d / f.name)
            except OSError:
                shutil.copyfile(f, d / f.name)
    return d


@contextlib.contextmanager
def quiet():
    """Swallow what a reader prints (progress bars, warnings)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield
