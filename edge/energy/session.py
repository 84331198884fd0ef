"""Power metering of a chat (docs/energy.md): one meter for the whole session, every power sample tagged with the
phase it fell in (prefill, draft, verify, idle: the engine reports each pass's phase), J/token of each answer over
its decode phase (from its first token to its last) beside idle power where it was measured, an optional JSON-lines
log of every sample, and a meter that dies mid-chat reported once while the answers go on without the figure."""

import bisect
import json
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from edge.energy.decode_energy import energy_summary

PHASES = ("prefill", "draft", "verify", "idle")


class PhaseClock:
    """Phase changes on the monotonic clock; the phase of any past instant and the answer it belongs to (each
    entry into prefill starts one; 0 before the first). Thread-safe: the meter's reader asks, the engine tells."""

    def __init__(self, phase: str = "idle"):
        self._lock = threading.Lock()
        self._t: list[float] = [float("-inf")]
        self._phase: list[str] = [phase]
        self._answer: list[int] = [0]

    def enter(self, phase: str, t: Optional[float] = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}: use one of {', '.join(PHASES)}")
        with self._lock:
            if phase != self._phase[-1]:
                self._t.append(time.monotonic() if t is None else t)
                self._phase.append(phase)
                self._answer.append(self._answer[-1] + (phase == "prefill"))

    def at(self, t: float) -> tuple[str, int]:
        """(phase, answer) at instant t."""
        with self._lock:
            i = bisect.bisect_right(self._t, t) - 1
            return self._phase[i], self._answer[i]

    def phase_at(self, t: float) -> str:
        return self.at(t)[0]


class EnergySession:
    """A started meter over a chat. `attach(engine)` tags passes; `answer(run)` meters one answer."""

    def __init__(self, meter, log_path=None, idle_seconds: float = 0.0):
        self.meter, self.clock = meter, PhaseClock("idle")
        self.log_path = Path(log_path) if log_path else None
        self.cursor, self.reported = 0, None
        self.idle_mw: list[float] = []
        self.readings, self.tokens = [], 0
        if idle_seconds > 0:
            time.sleep(idle_seconds)
        self.flush()

    def attach(self, engine) -> None:
        engine.on_phase = self.clock.enter

    def idle_watts(self) -> Optional[float]:
        """Mean power of the samples taken while idle (between answers, or --idle-seconds), or None."""
        return sum(self.idle_mw) / len(self.idle_mw) / 1000.0 if len(self.idle_mw) >= 2 else None

    def answer(self, run: Callable[[Callable[[list[int]], None]], dict]) -> tuple[dict, dict]:
        """Run one answer (`run(on_tokens)` -> the loader's generate result, edge.llm) and meter its decode phase:
        (the result, its energy figures for the stats)."""
        opened: list[float] = []
        result = run(lambda new: opened or opened.append(self.meter.mark()))
        t1 = self.meter.mark()
        self.clock.enter("idle", t1)
        stats = result["stats"]
        reading = self.meter.energy(opened[0] if opened else t1, t1)
        self.readings.append(reading)
        self.tokens += stats.tokens
        self.flush()
        return result, self._figures([reading], stats.tokens)

    def summary(self) -> dict:
        """J/token over the decode phases of every answer so far."""
        return self._figures(self.readings, self.tokens)

    def _figures(self, readings, tokens: int) -> dict:
        energy = energy_summary(readings, tokens, self.idle_watts())
        out = {"meter": self.meter.name, **energy}
        out["energy_reason"] = out.pop("reason")
        return out

    def failure(self) -> Optional[str]:
        """The reason the meter stopped, the first time it is asked after it did (None otherwise)."""
        log = getattr(self.meter, "log", None)
        error = getattr(log, "error", None)
        if error and self.reported is None:
            self.reported = error
            return error
        return None

    def flush(self) -> None:
        """Tag the samples logged since the last flush with their phase; append them to the log file."""
        if not hasattr(self.meter, "samples_since"):
            return
        samples = self.meter.samples_since(self.cursor)
        self.cursor += len(samples)
        lines = []
        for t, mw, rails in samples:
            phase, answer = self.clock.at(t)
            if phase == "idle":
                self.idle_mw.append(mw)
            lines.append(json.dumps({"t": round(t, 6), "mw": mw, "phase": phase, "answer": answer,
                                     "meter": self.meter.name, "rails": rails}))
        if self.log_path is not None and lines:
            with open(self.log_path, "a") as f:     # one write per flush: whole lines only
                f.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self.clock.enter("idle")
        self.flush()
        self.meter.stop()
