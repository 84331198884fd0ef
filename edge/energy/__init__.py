"""Energy meters (docs/energy.md): `tegrastats` and `jtop` on a Jetson, `nvml` on a desktop GPU, `none`; `auto`
takes the first that works here. Each meter's hardware package is imported only when it is used.

A meter has start(), mark() -> t (monotonic), energy(t0, t1) -> EnergyReading, stop()."""

import time

from edge.energy.power_log import EnergyReading
from edge.errors import BitNestError

METERS = ("auto", "tegrastats", "jtop", "nvml", "none")


class NoMeter:
    """No power source: every reading is absent, with the reason."""

    name = "none"

    def __init__(self, reason: str):
        self.reason = reason

    def start(self) -> None:
        pass

    def mark(self) -> float:
        return time.monotonic()

    def energy(self, t0: float, t1: float) -> EnergyReading:
        return EnergyReading(None, t1 - t0, 0, self.reason)

    def stop(self) -> None:
        pass


def _factories(interval_ms: int, command: list[str] | None, rail: str | None) -> dict:
    """name -> (reason it is unavailable or None, constructor); imports stay inside."""
    from edge.energy.jtop_meter import JtopMeter
    from edge.energy.nvml import NvmlMeter
    from edge.energy.tegrastats import TegrastatsMeter
    return {
        # a given command is the tegrastats source (a recorded replay, or tegrastats over ssh)
        "tegrastats": (None if command else TegrastatsMeter.unavailable_reason(),
                       lambda: TegrastatsMeter(interval_ms, command, rail)),
        "jtop": (JtopMeter.unavailable_reason(), lambda: JtopMeter(interval_ms)),
        "nvml": (NvmlMeter.unavailable_reason(), lambda: NvmlMeter()),
    }


def make_meter(name: str, interval_ms: int = 100, command: list[str] | None = None, rail: str | None = None):
    """A started meter by name. `auto` tries tegrastats, jtop, nvml in that order and falls back to `none`
    with every reason; naming an unavailable meter is a one-line error."""
    if name not in METERS:
        raise BitNestError(f"unknown meter {name!r}: use one of {', '.join(METERS)}")
    if name == "none":
        return NoMeter("no meter requested (--meter none)")
    factories = _factories(interval_ms, command, rail)
    reasons = []
    for candidate in (factories if name == "auto" else [name]):
        why, make = factories[candidate]
        if why is None:
            meter = make()
            try:
                meter.start()
                return meter
            except Exception as e:       # the tool exists but gives no reading (service down, no permission)
                why = f"{e.__class__.__name__}: {e}"
        if name != "auto":
            raise BitNestError(f"--meter {name} is not available here ({why}): use --meter auto or none")
        reasons.append(f"{candidate}: {why}")
    return NoMeter("no power meter on this machine (" + "; ".join(reasons) + ")")
