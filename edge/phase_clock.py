"""Phases of a long child process, timed and announced on stderr as they start and end, and read back by the parent
that stops the child at its limit: a timeout then names the phase that was running and the seconds of those that
finished (the device check's TensorRT section: export.trt.check's load, ONNX export, reference, engine build and
engine run; a cold TensorRT build can take minutes on a Jetson).

The lines are `PREFIX NAME` at a phase's start and `PREFIX NAME done in S s` at its end."""

import re
import sys
import time
from contextlib import contextmanager

PREFIX = "phase:"
_LINE = re.compile(rf"^{re.escape(PREFIX)} (\S+)(?: done in ([0-9.]+) s)?$")


def hang() -> None:
    """Never return: a compile that never ends, as far as a parent's limit can tell (tests of timeouts)."""
    while True:
        time.sleep(0.2)


class PhaseClock:
    """Each phase's seconds (a phase entered again adds to its total); `hang` names a phase that never ends once
    entered (for tests of the parent's timeout)."""

    def __init__(self, hang: str | None = None, stream=None):
        self.seconds: dict[str, float] = {}
        self.hang = hang
        self.stream = stream

    def _say(self, text: str) -> None:
        print(f"{PREFIX} {text}", file=self.stream or sys.stderr, flush=True)

    @contextmanager
    def phase(self, name: str):
        self._say(name)
        t0 = time.monotonic()
        if self.hang == name:
            hang()
        yield
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - t0, 1)
        self._say(f"{name} done in {self.seconds[name]} s")


def read_phases(text: str) -> tuple[str | None, dict[str, float]]:
    """(the phase started last and not finished, or None; {phase: seconds} of the finished ones) from a child's
    stderr, other lines ignored."""
    running, done = None, {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        if m.group(2) is None:
            running = m.group(1)
        else:
            done[m.group(1)] = float(m.group(2))
            running = None if running == m.group(1) else running
    return running, done
