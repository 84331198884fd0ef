"""`jtop` meter (jetson-stats >= 4.2, its jtop service running): poll `jetson.power['tot']['power']` (mW,
instantaneous) at every update and integrate it; the smoothed `avg` field is never used."""

import threading
import time

from edge.energy.power_log import PowerLog, SampledMeter


def power_from_jtop(power: dict) -> tuple[float, dict[str, float]]:
    """(total instantaneous mW, {rail: instantaneous mW}) of a `jetson.power` dict:
    {'rail': {NAME: {'online', 'type', 'status', 'volt', 'curr', 'power', 'avg', 'warn', 'crit'}}, 'tot': {...}}."""
    try:
        total = float(power["tot"]["power"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"jtop power reading without tot.power: {sorted(power) if isinstance(power, dict) else power!r}")
    rails = {name: float(r["power"]) for name, r in power.get("rail", {}).items()
             if r.get("online", True) and "power" in r}
    return total, rails


class JtopMeter(SampledMeter):
    """Reads the jtop service through its client (imported here only) on a polling thread."""

    name = "jtop"

    def __init__(self, interval_ms: int = 100):
        self.interval_s = interval_ms / 1000.0
        self.log = PowerLog()
        self._jetson = None
        self._thread = None
        self._running = False

    @staticmethod
    def unavailable_reason() -> str | None:
        try:
            import jtop  # noqa: F401
        except ImportError:
            return "jetson-stats (jtop) is not installed"
        return None

    def start(self) -> None:
        from jtop import jtop
        self._jetson = jtop(interval=self.interval_s)
        self._jetson.start()          # raises if the jtop service is not running
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        if not self.log.wait_past(time.monotonic(), timeout=max(5.0, 20 * self.interval_s)):
            self.stop()
            raise RuntimeError(f"jtop gave no power reading: {self.log.error or 'timed out'}")

    def _poll(self) -> None:
        n = 0
        try:
            while self._running and self._jetson.ok():       # ok() waits for the service's next update
                total, rails = power_from_jtop(self._jetson.power)
                self.log.add(time.monotonic(), total, rails)
                n += 1
        except Exception as e:                                 # the service or its socket went away
            self.log.fail(f"jtop stopped after {n} readings ({e.__class__.__name__}: {e})")
            return
        self.log.fail(f"jtop stopped after {n} readings")

    def stop(self) -> None:
        self._running = False
        if self._jetson is not None:
            try:
                self._jetson.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
