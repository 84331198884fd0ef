"""Gate threshold calibration (Precision on Demand §3.2): on the target's greedy trajectories for calibration
prompts (ShareGPT conversations before the evaluation range), the entropy and margin thresholds at which the
low-pass signal crosses on 3, 7, 15 and 30% of steps, saved beside the checkpoint (edge.decode.thresholds)."""

import sys
import time

from edge.corpora import sharegpt_prompts
from edge.analysis.replay.trace import StepTrace, trace_prompt
from edge.decode.config import GateConfig
from edge.decode.signals import SIGNALS
from edge.decode.thresholds import (
    RATES,
    rate_key,
    resolve_gate,
    save_thresholds,
    thresholds_entry,
)
from edge.errors import BitNestError


def order_by_uncertainty(values: list[float], signal: str) -> list[float]:
    """Most uncertain first: highest entropy, or smallest margin."""
    return sorted(values, reverse=signal == "entropy")


def threshold_for_rate(values: list[float], signal: str, rate: float) -> float:
    """The threshold that escalates round(rate · n) of `values`: halfway between the last escalated
    value and the next one in order of uncertainty (ties at that boundary can move the count)."""
    v = order_by_uncertainty(values, signal)
    k = round(rate * len(v))
    sign = 1.0 if signal == "entropy" else -1.0      # direction of "more uncertain"
    if k == 0:
        return v[0] + sign
    if k == len(v):
        return v[-1] - sign
    return (v[k - 1] + v[k]) / 2


def calibration_traces(rt, prompts: int = 12, max_new_tokens: int = 64) -> list[StepTrace]:
    """Step traces of the target's greedy trajectories on the first `prompts` calibration requests."""
    if prompts < 1 or max_new_tokens < 2:
        raise ValueError("calibration needs at least 1 prompt and 2 new tokens per prompt")
    return [trace_prompt(rt.engine, rt.encode(p), max_new_tokens, rt.eos) for p in sharegpt_prompts(prompts, start=0)]


def thresholds_from_traces(traces: list[StepTrace], rates=RATES) -> dict:
    """{"entropy": {rate: threshold}, "margin": {...}, "steps": n} over the pooled steps."""
    values = {"entropy": [x for t in traces for x in t.entropy], "margin": [x for t in traces for x in t.margin]}
    if not values["entropy"]:
        raise BitNestError("calibration produced no decode steps: raise --max-new-tokens")
    return {"steps": len(values["entropy"]),
            **{s: {rate_key(r): threshold_for_rate(values[s], s, r) for r in rates} for s in SIGNALS}}


def calibrate(rt, prompts: int = 12, max_new_tokens: int = 64, rates=RATES) -> dict:
    """Thresholds for `rates` on `rt` (an LLM): its checkpoint and backend, greedy target trajectories."""
    t0 = time.time()
    traces = calibration_traces(rt, prompts, max_new_tokens)
    return {"backend": rt.backend, "draft_head": rt.ckpt.draft_head, "prompts": len(traces),
            "max_new_tokens": max_new_tokens,
            "source": "ShareGPT conversations [0, 10000) (calibration range), first user turns, chat template; "
                      "target greedy trajectories, low pass on the target's history",
            **thresholds_from_traces(traces, rates), "seconds": round(time.time() - t0, 1)}


def ensure_thresholds(rt, **calib) -> dict:
    """This runtime's calibrated entry, calibrating (about a minute on 2 cores) and saving it if absent."""
    entry = thresholds_entry(rt.ckpt, rt.backend)
    if entry is None:
        print(f"calibrating gate thresholds for {rt.ckpt.path} on the {rt.backend} backend (once)...", file=sys.stderr)
        entry = calibrate(rt, **calib)
        save_thresholds(rt.ckpt, entry)
    return entry


def calibrated_gate(rt, policy: str, gate: GateConfig) -> GateConfig:
    """`gate` with its threshold resolved for `rt` (an LLM), calibrating first where no thresholds exist: for
    the measurement tools; the runtime itself only reads the file (edge.decode.thresholds.resolve_gate)."""
    from edge.decode.registry import policy_class
    if policy_class(policy).needs_threshold and gate.threshold is None:
        ensure_thresholds(rt)
    return resolve_gate(rt.ckpt, rt.backend, policy, gate)
