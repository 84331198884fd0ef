"""Decoding policies as objects, each a short `step(engine, pending, history)` with its rule in a comment:
autoregressive (`target`, `draft`), BitNest's speculative round (the draft view proposes γ tokens, the target
view verifies them in one pass), its confidence-adaptive variant, and `auto`, which chooses γ (0: a target step)
before each round from measured pass costs. The gates are in edge.decode.gates; the registry that maps names to
classes is edge.decode.registry."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

import torch

from edge.decode.auto import PROBE_GAMMA, AcceptanceEstimate, best_gamma, probe_interval
from edge.engine.costs import engine_costs
from edge.engine.interface import Engine
from edge.engine.kv_cache import KV8
from edge.decode.sampling import Sampler
from plugins.contracts import DRAFT, TARGET

if TYPE_CHECKING:
    from edge.decode.config import GenerateConfig


@dataclass(frozen=True)
class Step:
    """What one policy step produced: tokens to emit, and what the generation loop records of it."""

    tokens: list[int]
    drafted: Optional[int] = None     # a speculative round: proposals drafted (None: not a round)
    accepted: int = 0                 # of them, accepted by verification
    escalated: Optional[bool] = None  # a gated step: ran with the target view (None: not a gated step)
    chosen: Optional[int] = None      # an auto round: the γ it chose (None: not an auto round)
    alpha: Optional[float] = None     # an auto round: the acceptance estimate after it
    probe: bool = False               # an auto round: a probe (γ = 0 won, α needed evidence)


class Policy(ABC):
    """One generation's decoding policy. Built per generation by edge.decode.registry.make_policy."""

    name: ClassVar[str]
    gated: ClassVar[bool] = False             # a Precision on Demand gate (escalation counted per step)
    prefill_view: ClassVar[str] = TARGET      # the view the prompt is prefilled with
    needs_target: ClassVar[bool] = True       # runs target-view passes (False: runs from the base planes alone)
    needs_threshold: ClassVar[bool] = False   # reads a calibrated entropy / margin threshold

    def __init__(self, cfg: "GenerateConfig", sampler: Sampler, decode: Optional[Callable[[list[int]], str]] = None):
        self.cfg, self.sampler, self.decode = cfg, sampler, decode

    @classmethod
    def most_proposals(cls, cfg: "GenerateConfig") -> int:
        """Draft proposals one step may hold (draft scratch slots it needs)."""
        return 0

    def prepare(self, eng: Engine, prompt: list[int]) -> None:
        """Before the generation (the engine is reset right after): set up what the policy needs from the engine."""

    @abstractmethod
    def step(self, eng: Engine, pending: int, history: list[int]) -> Step:
        """Decode from the pending token (the last emitted one, not yet in the cache); `history` is every token
        emitted so far. Commits what it keeps and returns the new tokens."""

    def summary(self) -> dict:
        """Policy-specific figures for the run's statistics."""
        return {}


def ar_step(eng: Engine, pending: int, view: str, sampler: Sampler, kv=KV8) -> torch.Tensor:
    """One autoregressive pass: run the pending token with `view`, commit its entry; logits [V] (left on a GPU
    engine's device where the sampler reads only their argmax)."""
    logits = eng.forward([pending], view, kv, on_device=sampler.argmax_only)[-1]
    eng.commit(eng.length + 1)
    return logits


class TargetAR(Policy):
    """Target view only, one token per pass: the reference output every lossless policy must match."""

    name = "target"

    def step(self, eng, pending, history):
        return Step([self.sampler.choose(ar_step(eng, pending, TARGET, self.sampler))])


class DraftAR(Policy):
    """Draft view only, one token per pass (reads base planes and the draft KV view), the prompt's prefill included:
    the 4-bit model by itself, which is what a checkpoint loaded with `--weights base` runs."""

    name = "draft"
    prefill_view = DRAFT
    needs_target = False

    def step(self, eng, pending, history):
        logits = ar_step(eng, pending, DRAFT, self.sampler, self.cfg.draft_kv.read(eng.length))
        return Step([self.sampler.choose(logits)])


class Speculative(Policy):
    """BitNest's speculative round with γ proposals (fewer where the context has no room for γ + 1)."""

    name = "speculative"

    @classmethod
    def most_proposals(cls, cfg):
        return cfg.gamma

    def keep_drafting(self, n: int, logits: torch.Tensor) -> bool:
        """After proposal n (its draft logits [V]): draft another? Fixed γ: always, up to the limit."""
        return True

    def step(self, eng, pending, history):
        """Rule: the draft view proposes d_1..d_γ from the pending token (entries in draft slots); one target pass
        over [pending, d_1..d_γ] writes the real entries and yields γ+1 distributions; accept the longest agreeing
        prefix (greedy) or apply rejection sampling; emit the accepted drafts plus one target token; commit the
        pending token and the accepted drafts, so rejected entries fall off the committed length. Near a full
        context γ shrinks to what fits, down to none (a target step over the pending token alone)."""
        return self.round(eng, pending, min(self.most_proposals(self.cfg), eng.room() - 1))

    def round(self, eng: Engine, pending: int, limit: int) -> Step:
        """One round of at most `limit` proposals (fewer where `keep_drafting` ends it; 0: a target step)."""
        base = eng.length
        draft_kv = self.cfg.draft_kv.read(base)
        draft, draft_q, token = [], [], pending
        greedy = self.sampler.argmax_only        # logits left on a GPU engine's device: only argmaxes cross (and
        for slot in range(limit):                # adaptive's two signals, computed where the logits are)
            logits = eng.forward([token], DRAFT, draft_kv, draft_slot=slot, on_device=greedy)[-1]
            token, q = self.sampler.propose(logits)
            draft.append(token)
            draft_q.append(q)
            if not self.keep_drafting(len(draft), logits):
                break
        target_logits = eng.forward([pending] + draft, TARGET, KV8, on_device=greedy)   # [γ+1, V]
        a, nxt = self.sampler.accept(draft, draft_q, target_logits)
        eng.commit(base + 1 + a)
        return Step(draft[:a] + [nxt], drafted=len(draft), accepted=a)


class Adaptive(Speculative):
    """Confidence-adaptive speculation (edge.decode.adaptive): the draft's own signal ends a round early or
    extends it past γ. The rule reads only the draft's distributions, so verification keeps it lossless."""

    name = "adaptive"

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        self.keep_drafting = cfg.adaptive.rule(cfg.gamma)

    @classmethod
    def most_proposals(cls, cfg):
        return cfg.adaptive.most_proposals(cfg.gamma)


class Auto(Speculative):
    """γ chosen before each round from this engine's measured pass costs and a running acceptance estimate
    (edge.decode.auto; the cost table from edge.engine.costs, measured or read from the cache at the first
    generation and kept on the engine). γ = 0 is a plain target step; where γ = 0 wins but some α ≤ 1 would let
    speculation win, a one-proposal probe round runs every few steps so that α can recover."""

    name = "auto"

    def __init__(self, cfg, sampler, decode=None):
        super().__init__(cfg, sampler, decode)
        self.alpha = AcceptanceEstimate(cfg.auto)
        self.costs = None
        self.idle = 0      # γ = 0 steps since the last round that drafted

    @classmethod
    def most_proposals(cls, cfg):
        return cfg.auto.gamma_max

    def prepare(self, eng, prompt):
        self.costs = engine_costs(eng, prompt)

    def step(self, eng, pending, history):
        """Rule: bound γ by the ceiling, the widths measured, the room past the pending token and the scratch
        slots; take the γ of most expected tokens per second at the current α, a round only where it beats a
        target step by the configured margin (best_gamma); where that is 0 and
        `probe_interval` γ = 0 steps have passed, run a probe round of PROBE_GAMMA proposals instead; run the
        round (Speculative.round: γ = 0 is one target pass over the pending token) and feed its outcome to α."""
        c = self.costs
        slots = eng.draft_slots()
        limit = min(self.cfg.auto.gamma_max, len(c.target) - 1, eng.room() - 1, eng.room() if slots is None else slots)
        gamma = best_gamma(self.alpha.value, c.draft, c.target, limit, self.cfg.auto.margin)
        probe = False
        if gamma == 0 and limit >= PROBE_GAMMA:
            every = probe_interval(self.alpha.value, c.draft, c.target, limit, self.cfg.auto.probe_budget,
                                   self.cfg.auto.margin)
            self.idle += 1
            probe = every is not None and self.idle > every
        if gamma or probe:
            gamma, self.idle = gamma or PROBE_GAMMA, 0
        step = self.round(eng, pending, gamma)
        self.alpha.observe(step.drafted, step.accepted)
        return replace(step, chosen=gamma, alpha=self.alpha.value, probe=probe)

    def summary(self):
        return {"cost_table": self.costs.summary()} if self.costs is not None else {}
