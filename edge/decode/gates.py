"""Precision on Demand (paper 2611.14418, DESIGN §7): gated escalation policies. Every step decodes with
the draft (low) view unless a rule sends it to the target (high) view: the low pass's entropy or top-two
margin (`gate-entropy`, `gate-margin`), the previous step's signal (`gate-lagged`, no wasted low pass),
a closing tag such as `</think>` (`gate-phase`), or a seeded random subset of the steps at a matched
rate (`gate-random`)."""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from edge.decode.engine import KV8, Engine
from edge.decode.kv_cache import KVRead
from edge.decode.sampling import SamplingConfig, choose

GATE_POLICIES = ("gate-entropy", "gate-margin", "gate-lagged", "gate-phase", "gate-random")
SIGNALS = ("entropy", "margin")
PHASE_ORDERS = ("low-high", "high-low")
THRESHOLD_GATES = ("gate-entropy", "gate-margin", "gate-lagged")
TAIL_TOKENS = 16   # the phase rule looks for its tag in the text of the last this many tokens


def entropy_and_margin(logits: torch.Tensor) -> tuple[float, float]:
    """Entropy (nats) of softmax(logits) and the gap between the two largest logits; logits [V]."""
    z = logits.double()
    logp = torch.log_softmax(z, dim=-1)
    top = torch.topk(z, 2).values
    return float(-(logp.exp() * logp).sum()), float(top[0] - top[1])


def is_uncertain(signal: str, value: float, threshold: float) -> bool:
    """The gate's rule: entropy above the threshold, or margin below it."""
    return value > threshold if signal == "entropy" else value < threshold


@dataclass(frozen=True)
class GateConfig:
    """Settings of the gate policies. `threshold` (nats for entropy, logits for margin) drives the
    entropy, margin and lagged gates; when it is None the runtime resolves it from the thresholds
    calibrated for `rate` (edge/decode/thresholds.py). `rate` is also the share of steps gate-random escalates."""

    threshold: Optional[float] = None
    rate: float = 0.15
    signal: str = "entropy"        # the lagged gate's signal (entropy and margin gates fix their own)
    seed: int = 0                  # gate-random's choice of steps
    tag: str = "</think>"          # gate-phase: the closing tag that ends the first phase
    order: str = "low-high"        # gate-phase: low view until the tag, high after (or the reverse)

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown gate signal {self.signal!r}: use one of {', '.join(SIGNALS)}")
        if self.order not in PHASE_ORDERS:
            raise ValueError(f"unknown phase order {self.order!r}: use one of {', '.join(PHASE_ORDERS)}")
        if not 0 <= self.rate <= 1:
            raise ValueError(f"gate rate must be in [0, 1], got {self.rate}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError("gate threshold must be a finite number")
        if not self.tag:
            raise ValueError("the phase tag must not be empty")


def random_schedule(rate: float, steps: int, seed: int) -> set[int]:
    """gate-random's escalated steps: a seeded uniform subset of the `steps` planned decode steps holding
    floor(rate * steps + u) of them (u a seeded uniform), so the realised share is `rate` in expectation and
    within one step of it in every generation; independent coins per step would miss a matched rate by
    several points on a short run."""
    coin = torch.Generator().manual_seed(seed)
    u = float(torch.rand((), generator=coin, dtype=torch.float64))
    k = min(steps, int(math.floor(rate * steps + u)))
    return set(torch.randperm(steps, generator=coin)[:k].tolist()) if steps > 0 else set()


def gate_signal(policy: str, cfg: GateConfig) -> str:
    """Which signal a threshold gate reads."""
    return {"gate-entropy": "entropy", "gate-margin": "margin"}.get(policy, cfg.signal)


class Gate:
    """The per-generation state of one gate policy; `step` decodes one token and counts escalation."""

    def __init__(self, policy: str, cfg: GateConfig, decode: Optional[Callable[[list[int]], str]] = None,
                 planned_steps: int = 0):
        if policy in THRESHOLD_GATES and cfg.threshold is None:
            raise ValueError(f"{policy} needs a threshold: pass --gate-threshold, or --gate-rate with thresholds "
                             "calibrated by scripts/calibrate_gates.py")
        if policy == "gate-phase" and decode is None:
            raise ValueError("gate-phase needs the tokenizer's decode to find its closing tag")
        self.policy, self.cfg, self.decode = policy, cfg, decode
        self.signal = gate_signal(policy, cfg)
        self.lagged_high = False      # gate-lagged: the previous step's signal said "uncertain"
        self.closed = False           # gate-phase: the tag has been generated
        # gate-random: which of the planned decode steps (step index -> escalate) go to the target view
        self.random_steps = random_schedule(cfg.rate, planned_steps, cfg.seed) if policy == "gate-random" else set()

    def _uncertain(self, logits: torch.Tensor) -> bool:
        h, m = entropy_and_margin(logits)
        return is_uncertain(self.signal, h if self.signal == "entropy" else m, self.cfg.threshold)

    def _high_by_phase(self, eng: Engine, out: list[int]) -> bool:
        if not self.closed and self.cfg.tag in self.decode(out[-TAIL_TOKENS:]):
            self.closed = True
            eng.stats.extra["phase_switch_at"] = len(out)   # tokens generated when the tag was seen
        return self.closed == (self.cfg.order == "low-high")

    def step(self, eng: Engine, pending: int, out: list[int], sampling: SamplingConfig, gen: torch.Generator,
             draft_kv: KVRead) -> list[int]:
        """One token. Rule: entropy / margin gates run the low pass and, when it looks uncertain, redo the
        step with the target view (its KV entry overwrites the low pass's; both passes are counted);
        the others pick one view before the step and run only that pass."""
        p, length = self.policy, eng.cache.length
        if p in ("gate-entropy", "gate-margin"):
            logits = eng.run([pending], "draft", draft_kv)[-1]
            high = self._uncertain(logits)
            if high:
                logits = eng.run([pending], "target", KV8)[-1]
        else:
            if p == "gate-lagged":
                high = self.lagged_high
            elif p == "gate-random":
                high = eng.stats.steps in self.random_steps   # steps so far = this step's index
            else:
                high = self._high_by_phase(eng, out)
            logits = eng.run([pending], "target", KV8)[-1] if high else eng.run([pending], "draft", draft_kv)[-1]
            if p == "gate-lagged":   # the signal of whichever pass ran decides the next step
                self.lagged_high = self._uncertain(logits)
        eng.cache.commit(length + 1)
        if high:
            eng.stats.escalated_at.append(eng.stats.steps)
        eng.stats.steps += 1
        eng.stats.escalated += int(high)
        return [choose(logits, sampling, gen)]
