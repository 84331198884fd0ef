"""Energy per token over the decode phase (docs/energy.md): idle power first, then each generation's
decode window (from the first token, which the prefill yields, to the last) metered and summed."""

import time

from edge.decode.config import GenerateConfig
from edge.engine.interface import Engine
from edge.decode.generate import generate
from edge.engine.stats import DecodeStats
from edge.energy.power_log import EnergyReading


def idle_power(meter, seconds: float) -> dict:
    """Mean power while nothing runs for `seconds` (W), or null with the reason."""
    t0 = meter.mark()
    time.sleep(seconds)
    r = meter.energy(t0, meter.mark())
    return {"watts": None if r.watts is None else round(r.watts, 3), "seconds": round(r.seconds, 2),
            "samples": r.samples, "reason": r.reason}


def metered_generate(eng: Engine, prompt: list[int], cfg: GenerateConfig, eos: set[int], meter
                     ) -> tuple[DecodeStats, EnergyReading]:
    """One generation and the energy of its decode phase (the window opens when the prefill's token arrives)."""
    opened = []
    _, stats = generate(eng, prompt, cfg, eos, None, lambda new: opened or opened.append(meter.mark()))
    return stats, meter.energy(opened[0], meter.mark())


def energy_summary(readings: list[EnergyReading], tokens: int, idle_w: float | None) -> dict:
    """J/token over the summed decode windows; null with the first reason if any window has no figure."""
    missing = [r.reason for r in readings if r.joules is None]
    seconds = sum(r.seconds for r in readings)
    if missing or tokens == 0:
        return {"joules": None, "joules_per_token": None, "mean_power_w": None, "joules_per_token_above_idle": None,
                "metered_seconds": round(seconds, 3),
                "reason": missing[0] if missing else "no decode-phase tokens to divide by"}
    joules = sum(r.joules for r in readings)
    return {"joules": round(joules, 4), "joules_per_token": round(joules / tokens, 5),
            "mean_power_w": round(joules / seconds, 3) if seconds > 0 else None,
            "joules_per_token_above_idle": None if idle_w is None else round((joules - idle_w * seconds) / tokens, 5),
            "metered_seconds": round(seconds, 3), "samples": sum(r.samples for r in readings),
            "rails_mw": readings[-1].rails, "reason": None}
