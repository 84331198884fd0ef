"""Precision on Demand (paper 2611.14418): gated escalation policies. Every step decodes with
the draft (low) view unless a rule sends it to the target (high) view: the low pass's entropy or top-two
margin (`gate-entropy`, `gate-margin`), the previous step's signal (`gate-lagged`, no wasted low pass),
a closing tag such as `</think>` (`gate-phase`), or a seeded random subset of the steps at a matched
rate (`gate-random`). The repairing variants (`gate-repair`, `gate-random-repair`) re-run the target view over
the low steps since the last escalation when they escalate, so the escalated step reads target-view history."""

import math
from typing import TYPE_CHECKING, ClassVar, Optional

import torch

from edge.engine.interface import Engine
from edge.engine.kv_cache import KV8
from edge.decode.policies import Policy, Step
from edge.decode.signals import entropy_and_margin, is_uncertain
from plugins.contracts import DRAFT, TARGET

if TYPE_CHECKING:
    from edge.decode.config import GateConfig

TAIL_TOKENS = 16   # the phase rule looks for its tag in the text of the last this many tokens


def random_schedule(rate: float, steps: int, seed: int) -> set[int]:
    """gate-random's escalated steps: a seeded uniform subset of the `steps` planned decode steps holding
    floor(rate * steps + u) of them (u a seeded uniform), so the realised share is `rate` in expectation and
    within one step of it in every generation; independent coins per step would miss a matched rate by
    several points on a short run."""
    coin = torch.Generator().manual_seed(seed)
    u = float(torch.rand((), generator=coin, dtype=torch.float64))
    k = min(steps, int(math.floor(rate * steps + u)))
    return set(torch.randperm(steps, generator=coin)[:k].tolist()) if steps > 0 else set()


class GatePolicy(Policy):
    """A gated step (Precision on Demand): one token per step from the low (draft) or the high (target) view.
    Subclasses say which view a step runs; `_run` runs it, commits the entry and chooses the token."""

    gated = True

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        self.gate = cfg.gate
        self.index = 0        # this step's index among the generation's decode steps
        self.low_from: Optional[int] = None   # position of the first low-pass KV entry since the last high step
        self.repaired = 0     # low-pass entries rewritten by repair passes

    def _pass(self, eng: Engine, pending: int, high: bool) -> torch.Tensor:
        """Logits [V] of one pass over the pending token at the chosen view (its KV entry lands at `length`)."""
        if high:
            return eng.forward([pending], TARGET, KV8)[-1]
        return eng.forward([pending], DRAFT, self.cfg.draft_kv.read(eng.length))[-1]

    def _emit(self, eng: Engine, logits: torch.Tensor, high: bool) -> Step:
        if high:
            self.low_from = None
        elif self.low_from is None:
            self.low_from = eng.length
        eng.commit(eng.length + 1)
        self.index += 1
        return Step([self.sampler.choose(logits)], escalated=high)

    def _repair_pass(self, eng: Engine, history: list[int]) -> torch.Tensor:
        """Logits [V] of the escalated step after repairing its history: one target pass over the tokens whose
        entries low passes wrote since the last high step and the pending token (a verification-shaped pass),
        rewriting those entries with target-view K/V. The tokens are the ones already emitted: only the cache
        changes. Bounded by the engine's widest pass."""
        start = eng.length                                      # the pending token's position
        first = start if self.low_from is None else self.low_from
        if eng.max_pass_tokens is not None:
            first = max(first, start + 1 - eng.max_pass_tokens)
        ids = history[len(history) - 1 - (start - first):]       # positions [first, start]; history[-1] is pending
        eng.commit(first)
        logits = eng.forward(ids, TARGET, KV8)[-1]
        eng.commit(start)
        self.repaired += start - first
        return logits

    def summary(self):
        return {"repaired_positions": self.repaired} if self.repaired else {}

    def high(self, eng: Engine, history: list[int]) -> bool:
        """Before the step: run it with the target view?"""
        raise NotImplementedError

    def step(self, eng, pending, history):
        """Rule: pick the view before the step and run only that pass."""
        high = self.high(eng, history)
        return self._emit(eng, self._pass(eng, pending, high), high)


class ThresholdGate(GatePolicy):
    """A gate that reads a calibrated entropy or margin threshold (edge.decode.thresholds)."""

    needs_threshold = True
    fixed_signal: ClassVar[Optional[str]] = None

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        if self.gate.threshold is None:
            raise ValueError(f"{self.name} needs a threshold: pass --gate-threshold, or --gate-rate with thresholds "
                             "calibrated by `bitnest calibrate` (scripts/calibrate_gates.py)")
        self.signal = self.signal_of(self.gate)

    @classmethod
    def signal_of(cls, gate: "GateConfig") -> str:
        """Which signal this gate reads."""
        return cls.fixed_signal or gate.signal

    def uncertain(self, logits: torch.Tensor) -> bool:
        h, m = entropy_and_margin(logits)
        return is_uncertain(self.signal, h if self.signal == "entropy" else m, self.gate.threshold)


class EntropyGate(ThresholdGate):
    """Escalate a step whose low pass has entropy above the threshold."""

    name = "gate-entropy"
    fixed_signal = "entropy"

    def step(self, eng, pending, history):
        """Rule: run the low pass; when it looks uncertain, redo the step with the target view (its KV entry
        overwrites the low pass's; both passes are counted)."""
        logits = self._pass(eng, pending, False)
        high = self.uncertain(logits)
        if high:
            logits = self._pass(eng, pending, True)
        return self._emit(eng, logits, high)


class MarginGate(EntropyGate):
    """Escalate a step whose low pass has a top-two logit margin below the threshold."""

    name = "gate-margin"
    fixed_signal = "margin"


class LaggedGate(ThresholdGate):
    """Decide from the previous step's signal: no wasted low pass."""

    name = "gate-lagged"

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        self.lagged_high = False      # the previous step's signal said "uncertain"

    def step(self, eng, pending, history):
        """Rule: this step's view is what the previous step's signal said; the signal of whichever pass ran
        decides the next step."""
        high = self.lagged_high
        logits = self._pass(eng, pending, high)
        self.lagged_high = self.uncertain(logits)
        return self._emit(eng, logits, high)


class PhaseGate(GatePolicy):
    """One view until a closing tag (such as `</think>`) appears in the output, the other view after it."""

    name = "gate-phase"

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        if decode is None:
            raise ValueError("gate-phase needs the tokenizer's decode to find its closing tag")
        self.closed_at: Optional[int] = None    # tokens generated when the tag was seen

    def high(self, eng, history):
        if self.closed_at is None and self.gate.tag in self.decode(history[-TAIL_TOKENS:]):
            self.closed_at = len(history)
        return (self.closed_at is not None) == (self.gate.order == "low-high")

    def summary(self):
        return {} if self.closed_at is None else {"phase_switch_at": self.closed_at}


class RandomGate(GatePolicy):
    """The control: a seeded random subset of the decode steps at a matched rate."""

    name = "gate-random"

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        # the prefill yields the first token, so a generation plans max_new_tokens - 1 decode steps
        self.steps = random_schedule(self.gate.rate, cfg.max_new_tokens - 1, self.gate.seed)

    def high(self, eng, history):
        return self.index in self.steps


class RepairGate(ThresholdGate):
    """The repaired gate: escalate on the low pass's signal (`gate.signal`, entropy or margin) and run the
    escalated step as a target pass over the low steps since the last escalation plus the pending token."""

    name = "gate-repair"

    def step(self, eng, pending, history):
        """Rule: run the low pass; when it looks uncertain, rewind to the first low-pass entry since the last high
        step and re-run those tokens and the pending one with the target view in one pass (their entries become
        target-view K/V, as a speculative round's verification writes them); the last row picks the token. The
        escalated step so sees the history the target would have written for the same tokens."""
        logits = self._pass(eng, pending, False)
        high = self.uncertain(logits)
        if high:
            logits = self._repair_pass(eng, history)
        return self._emit(eng, logits, high)


class RandomRepairGate(RandomGate):
    """The control of the repaired gate: gate-random's steps, each escalated step run as a repair pass."""

    name = "gate-random-repair"

    def step(self, eng, pending, history):
        """Rule: on a scheduled step, the repair pass of gate-repair (no low pass); else one low pass."""
        high = self.high(eng, history)
        logits = self._repair_pass(eng, history) if high else self._pass(eng, pending, False)
        return self._emit(eng, logits, high)


GATES = (EntropyGate, MarginGate, LaggedGate, PhaseGate, RandomGate, RepairGate, RandomRepairGate)
