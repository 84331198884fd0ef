"""Gate threshold calibration (paper 2611.14418 §3.2): on the target's greedy trajectories for
calibration prompts (ShareGPT conversations before the evaluation range), the entropy and margin
thresholds at which the low-pass signal crosses on 3, 7, 15 and 30% of steps, saved beside the
checkpoint as a small JSON file (atomic write), one entry per backend, tied to the weights' hash."""

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from edge.atomic import write_atomic
from edge.model.checkpoint import WEIGHTS, Checkpoint
from edge.analysis.corpora import sharegpt_prompts
from edge.errors import BitNestError
from edge.decode.gates import SIGNALS, THRESHOLD_GATES, GateConfig, gate_signal
from edge.analysis.trace import StepTrace, trace_prompt

RATES = (0.03, 0.07, 0.15, 0.30)
THRESHOLDS_FILE = "gate_thresholds.json"
FORMAT = "bitnest-gate-thresholds"


def rate_key(rate: float) -> str:
    return f"{rate:g}"


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
    """Thresholds for `rates` on `rt` (a Runtime): its checkpoint and backend, greedy target trajectories."""
    t0 = time.time()
    traces = calibration_traces(rt, prompts, max_new_tokens)
    return {"backend": rt.backend, "prompts": len(traces), "max_new_tokens": max_new_tokens,
            "source": "ShareGPT conversations [0, 10000) (calibration range), first user turns, chat template; "
                      "target greedy trajectories, low pass on the target's history",
            **thresholds_from_traces(traces, rates), "seconds": round(time.time() - t0, 1)}


def _weights_hash(ckpt: Checkpoint) -> str:
    return ckpt.manifest["files"][WEIGHTS]


def read_thresholds(ckpt: Checkpoint) -> dict:
    """The thresholds file beside the checkpoint ({} if absent); entries of another export are dropped."""
    path = ckpt.path / THRESHOLDS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise BitNestError(f"{path} is not valid JSON: delete it and calibrate again") from None
    if data.get("format") != FORMAT or data.get("weights_sha256") != _weights_hash(ckpt):
        return {}
    return data.get("backends", {})


def save_thresholds(ckpt: Checkpoint, entry: dict) -> Path:
    """Merge one backend's entry into the file beside the checkpoint, atomically (temp file + rename)."""
    backends = read_thresholds(ckpt)
    backends[entry["backend"]] = entry
    data = {"format": FORMAT, "version": 1, "weights_sha256": _weights_hash(ckpt), "backends": backends}
    path = ckpt.path / THRESHOLDS_FILE
    try:
        write_atomic(json.dumps(data, indent=1).encode(), path)
    except OSError as e:
        raise BitNestError(f"cannot write gate thresholds beside {ckpt.path} ({e.strerror}): "
                           "make the folder writable or pass --gate-threshold") from None
    return path


def ensure_thresholds(rt, **calib) -> dict:
    """This runtime's calibrated entry, calibrating (about a minute on 2 cores) and saving it if absent."""
    entry = read_thresholds(rt.ckpt).get(rt.backend)
    if entry is None:
        print(f"calibrating gate thresholds for {rt.ckpt.path} on the {rt.backend} backend (once)...", file=sys.stderr)
        entry = calibrate(rt, **calib)
        save_thresholds(rt.ckpt, entry)
    return entry


def resolve_gate(rt, policy: str, gate: GateConfig) -> GateConfig:
    """`gate` with the threshold of its rate filled in from the calibration (threshold gates only)."""
    if policy not in THRESHOLD_GATES or gate.threshold is not None:
        return gate
    table = ensure_thresholds(rt)[gate_signal(policy, gate)]
    key = rate_key(gate.rate)
    if key not in table:
        raise BitNestError(f"no threshold calibrated for rate {key}: use one of {', '.join(table)} "
                           "or pass --gate-threshold")
    return replace(gate, threshold=table[key])


def main(argv=None, default_checkpoint=None) -> int:
    """`python scripts/calibrate_gates.py`: calibrate (again) and save the thresholds of one backend."""
    from edge.cli.common import run_cli
    from edge.cli.options import checkpoint_arg, tool_parser
    from edge.runtime import Runtime
    p = tool_parser("calibrate_gates.py", __doc__)
    p.add_argument("--prompts", type=int, default=12, help="calibration prompts (ShareGPT calibration range)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="length of each target trajectory")
    a = p.parse_args(argv)

    def body():
        ckpt = checkpoint_arg(a, default_checkpoint)
        rt = Runtime(ckpt, backend=a.backend, max_context=a.max_new_tokens + 2048)
        entry = calibrate(rt, a.prompts, a.max_new_tokens)
        return dict(entry, file=str(save_thresholds(rt.ckpt, entry)))
    return run_cli(body, a.json, "calibrate_gates.py")
