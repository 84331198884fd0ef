"""Power samples and their integral: a thread-safe log of (monotonic time, instantaneous mW) readings,
energy over a window by the trapezoid rule, and a reading that is either a figure or a reason."""

import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnergyReading:
    """Energy over a window; `joules` is None when the meter could not cover it, and `reason` says why."""

    joules: float | None
    seconds: float
    samples: int
    reason: str | None = None
    rails: dict = field(default_factory=dict)     # last instantaneous mW of every rail seen, for the record

    @property
    def watts(self) -> float | None:
        return None if self.joules is None or self.seconds <= 0 else self.joules / self.seconds


class PowerLog:
    """Samples appended by a reader thread; `error` is set when the source stops early (with the reason)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._t: list[float] = []
        self._mw: list[float] = []
        self._rails: list[dict] = []
        self.rails: dict[str, float] = {}
        self.error: str | None = None

    def add(self, t: float, mw: float, rails: dict | None = None) -> None:
        with self._lock:
            self._t.append(t)
            self._mw.append(mw)
            self._rails.append(dict(rails or {}))
            if rails:
                self.rails = dict(rails)

    def since(self, index: int) -> list[tuple[float, float, dict]]:
        """Samples (monotonic t, mW, {rail: mW}) from the index-th on, in order."""
        with self._lock:
            return list(zip(self._t[index:], self._mw[index:], self._rails[index:]))

    def fail(self, reason: str) -> None:
        with self._lock:
            self.error = self.error or reason

    def last_time(self) -> float | None:
        with self._lock:
            return self._t[-1] if self._t else None

    def wait_past(self, t: float, timeout: float) -> bool:
        """Wait until a sample later than `t` arrives (True) or the source fails or times out (False)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            last = self.last_time()
            if last is not None and last >= t:
                return True
            if self.error:
                return False
            time.sleep(0.005)
        return False

    def energy(self, t0: float, t1: float) -> EnergyReading:
        """Integral of power over [t0, t1] (trapezoids between samples, interpolated at the ends). Needs a
        sample at or before t0 and one at or after t1: a window the samples do not cover has no figure."""
        with self._lock:
            ts, ps, err = list(self._t), list(self._mw), self.error
        dt = t1 - t0
        inside = sum(1 for t in ts if t0 <= t <= t1)
        if not ts or ts[0] > t0 or ts[-1] < t1:
            why = err or ("no power samples" if not ts else "the power samples do not cover the window")
            return EnergyReading(None, dt, inside, f"{why} (window {dt:.3f} s)", self.rails)
        at = lambda x: _interp(ts, ps, x)
        pts = [(t0, at(t0))] + [(t, p) for t, p in zip(ts, ps) if t0 < t < t1] + [(t1, at(t1))]
        mj = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]))    # mW * s = mJ
        return EnergyReading(mj / 1000.0, dt, inside, None, self.rails)


def _interp(ts: list[float], ps: list[float], x: float) -> float:
    """Power at time x, linear between the samples around it."""
    for i in range(1, len(ts)):
        if ts[i] >= x:
            a, b = ts[i - 1], ts[i]
            return ps[i] if b == a else ps[i - 1] + (ps[i] - ps[i - 1]) * (x - a) / (b - a)
    return ps[-1]


class SampledMeter:
    """What a meter that logs samples continuously into `self.log` every `self.interval_s` seconds shares:
    windows are marked by monotonic time and their energy integrated from the log."""

    log: PowerLog
    interval_s: float

    def mark(self) -> float:
        """The monotonic time of a window's end (samples are logged continuously)."""
        return time.monotonic()

    def energy(self, t0: float, t1: float) -> EnergyReading:
        """Energy over [t0, t1] (monotonic); waits a few intervals for the sample that closes the window."""
        self.log.wait_past(t1, timeout=3 * self.interval_s + 1.0)
        return self.log.energy(t0, t1)

    def samples_since(self, index: int) -> list[tuple[float, float, dict]]:
        """Every sample logged from the index-th on (monotonic t, mW, {rail: mW})."""
        return self.log.since(index)
