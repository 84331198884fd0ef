"""`tegrastats` meter (Jetson): parse every power rail of a tegrastats line (`NAME now/avg`, mW) and log
the module's input power from a tegrastats subprocess read line by line.

Rails by module (JetPack 6): Orin NX / Orin Nano report `VDD_IN` (module input), `VDD_CPU_GPU_CV` and
`VDD_SOC`; AGX Orin reports `VDD_GPU_SOC`, `VDD_CPU_CV` and `VIN_SYS_5V0` and no `VDD_IN`. The meter
integrates `VDD_IN` where it exists and otherwise the sum of every rail on the line (the reading names
which). Only the instantaneous value is used; tegrastats' second figure is a running average.
"""

import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from edge.energy.power_log import PowerLog, SampledMeter

# "VDD_IN 4673mW/4673mW" (JetPack 5/6) or "VDD_IN 4067/4067" (older releases, mW implied)
# a rail is a whole whitespace-separated token pair; a token with garbage attached is not a reading
_RAIL = re.compile(r"(?:^|(?<=\s))((?:VDD|VIN|POM)_[A-Z0-9_]+) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
TOTAL_RAIL = "VDD_IN"


@dataclass(frozen=True)
class TegrastatsLine:
    rails: dict[str, tuple[int, int]]    # name -> (instant mW, average mW)
    ram_used_mb: int | None
    ram_total_mb: int | None

    def total_mw(self, rail: str | None = None) -> tuple[float, str]:
        """(mW, what it is): `rail` if given, VDD_IN where present, else the sum of every rail."""
        if rail:
            if rail not in self.rails:
                raise KeyError(f"rail {rail} not on this tegrastats line (rails: {', '.join(self.rails)})")
            return float(self.rails[rail][0]), rail
        if TOTAL_RAIL in self.rails:
            return float(self.rails[TOTAL_RAIL][0]), TOTAL_RAIL
        return float(sum(now for now, _ in self.rails.values())), "+".join(self.rails)


def parse_line(line: str) -> TegrastatsLine | None:
    """The rails and RAM of one tegrastats line; None for a line without any power rail."""
    rails = {}
    for m in _RAIL.finditer(line):          # a rail named twice (a garbled line): its first reading counts
        rails.setdefault(m.group(1), (int(m.group(2)), int(m.group(3))))
    if not rails:
        return None
    ram = _RAM.search(line)
    return TegrastatsLine(rails, int(ram.group(1)) if ram else None, int(ram.group(2)) if ram else None)


class TegrastatsMeter(SampledMeter):
    """Runs `command` (default `tegrastats --interval MS`) and logs each line's power until `stop`."""

    name = "tegrastats"

    def __init__(self, interval_ms: int = 100, command: list[str] | None = None, rail: str | None = None):
        self.interval_s = interval_ms / 1000.0
        self.command = command or ["tegrastats", "--interval", str(interval_ms)]
        self.rail = rail
        self.log = PowerLog()
        self.measured = None
        self._proc = None
        self._thread = None

    @staticmethod
    def unavailable_reason() -> str | None:
        return None if shutil.which("tegrastats") else "tegrastats is not on PATH (not a Jetson)"

    def start(self) -> None:
        self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      bufsize=1)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self.log.wait_past(time.monotonic(), timeout=max(5.0, 20 * self.interval_s)):
            self.stop()
            raise RuntimeError(f"{' '.join(self.command)} gave no power reading: {self.log.error or 'timed out'}")

    def _read(self) -> None:
        n = 0
        for line in self._proc.stdout:
            t = time.monotonic()
            parsed = parse_line(line)
            if parsed is None:
                continue
            try:
                mw, self.measured = parsed.total_mw(self.rail)
            except KeyError as e:
                self.log.fail(str(e.args[0]))
                return
            self.log.add(t, mw, {k: v[0] for k, v in parsed.rails.items()})
            n += 1
        code = self._proc.wait()
        self.log.fail(f"{self.command[0]} stopped after {n} readings (exit code {code})")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)
