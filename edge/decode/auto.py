"""The `auto` policy's rules: γ chosen before each round from the measured pass costs (edge.engine.costs) and a
running estimate α of the per-proposal acceptance, to maximize expected tokens per second; γ = 0 is a plain target
step. Where γ = 0 wins, a cheap probe round now and then keeps α alive, but only where some α ≤ 1 would let
speculation win at all. Pure functions and a small estimator; the policy that runs them is in edge.decode.policies."""

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from edge.engine.costs import MAX_GAMMA

PROBE_GAMMA = 1                # a probe round drafts one proposal: the cheapest round, one trial of evidence
PROBE_MIN, PROBE_MAX = 4, 256  # bounds on the γ = 0 steps between probe rounds
# A round is chosen over a target step only where it promises this much more speed: a cost table measured on a
# shared 2-core machine moved by up to ~12% between runs minutes apart (issue 21: an AVX2 table put one-proposal
# rounds 1.3% ahead of target steps, the bench's own pass times 11% behind, and `auto` lost 12% to the target), so
# a win smaller than the table's noise is no win; where speculation pays it wins by far more (a flat verification).
WIN_MARGIN = 0.05


@dataclass(frozen=True)
class AutoConfig:
    """`gamma_max`: the most proposals a round may choose (0..gamma_max). `prior`: α before any evidence, worth
    `prior_weight` proposals. `decay`: the weight each older proposal keeps per newer one (a window of about
    1 / (1 - decay) proposals). `probe_budget`: the share of decode time probe rounds may lose, in expectation.
    `margin`: how much faster than a target step, in expected tokens per second, a round must be to be chosen
    (WIN_MARGIN)."""

    gamma_max: int = MAX_GAMMA
    prior: float = 0.8
    prior_weight: float = 2.0
    decay: float = 0.95
    probe_budget: float = 0.01
    margin: float = WIN_MARGIN

    def __post_init__(self):
        if not 1 <= self.gamma_max <= MAX_GAMMA:
            raise ValueError(f"auto chooses γ in 0..{MAX_GAMMA} from the measured pass costs: its ceiling (--gamma) "
                             f"must be in [1, {MAX_GAMMA}], got {self.gamma_max}")
        if not (0 <= self.prior <= 1 and self.prior_weight > 0 and 0 < self.decay <= 1 and 0 < self.probe_budget < 1
                and 0 <= self.margin < 1):
            raise ValueError("auto needs 0 <= prior <= 1, prior weight > 0, 0 < decay <= 1, 0 < probe budget < 1 and "
                             "0 <= margin < 1")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a round of γ proposals emits in expectation when each is accepted with probability α, independently,
    until the first rejection: the accepted prefix plus the target's own token, 1 + α + ... + α^γ."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def best_gamma(alpha: float, t_draft: float, t_target: Sequence[float], most: int, margin: float = 0.0) -> int:
    """The γ in 0..`most` with the most expected tokens per second; `t_target[w - 1]` is a target pass of w tokens.
    Rule: a round of γ proposals costs γ·t_draft + t_target(γ + 1) and emits (1 − α^(γ+1)) / (1 − α) tokens in
    expectation (γ + 1 at α = 1); γ = 0 is one target pass for one token. A γ > 0 counts only where its rate is at
    least (1 + `margin`) times the target step's. Ties go to the smaller γ."""
    rate = lambda g: expected_tokens(alpha, g) / (g * t_draft + t_target[g])
    floor = rate(0) * (1 + margin)
    return max((g for g in range(min(most, len(t_target) - 1) + 1) if g == 0 or rate(g) >= floor), key=rate)


def probe_interval(alpha: float, t_draft: float, t_target: Sequence[float], most: int, budget: float,
                   margin: float = 0.0) -> Optional[int]:
    """γ = 0 steps between probe rounds (γ = PROBE_GAMMA), or None: never probe where even α = 1 would not make
    speculation win by `margin` (the best γ in 0..`most` at α = 1 is 0). Rule: a probe costs t_draft + t_target(2) and emits
    1 + α tokens in expectation, where target steps would spend (1 + α)·t_target(1) on as many; spread over the
    steps between probes, that expected loss stays within `budget` of their time (PROBE_MIN..PROBE_MAX steps)."""
    if len(t_target) < 2 or best_gamma(1.0, t_draft, t_target, most, margin) == 0:
        return None
    loss = t_draft + t_target[1] - expected_tokens(alpha, PROBE_GAMMA) * t_target[0]
    return min(PROBE_MAX, max(PROBE_MIN, math.ceil(loss / (budget * t_target[0]))))


class AcceptanceEstimate:
    """α, the chance that the target accepts a proposal, as an exponentially decayed share over recent proposals
    with a prior. Acceptance changes along a text (a code block, a list, a quotation, free prose), so a window of
    about 1 / (1 − decay) recent proposals (20 at 0.95) follows it where a lifetime mean would lag; the prior,
    worth `prior_weight` proposals and never decayed, keeps a few early outcomes from pinning α at 0 or 1. A round
    is evidence for its accepted proposals and for the first rejected one; the proposals after a rejection were
    never judged on their own, so they count for nothing. One estimate per generation: the same prompt and
    seed choose the same γ sequence on the same cost table."""

    def __init__(self, cfg: AutoConfig):
        self.cfg = cfg
        self.hits = 0.0      # decayed accepted proposals
        self.trials = 0.0    # decayed judged proposals

    @property
    def value(self) -> float:
        c = self.cfg
        return (self.hits + c.prior * c.prior_weight) / (self.trials + c.prior_weight)

    def observe(self, drafted: int, accepted: int) -> None:
        """One round: `accepted` of `drafted` proposals, the first rejection (if any) right after them."""
        for i in range(min(drafted, accepted + 1)):
            self.hits = self.cfg.decay * self.hits + (i < accepted)
            self.trials = self.cfg.decay * self.trials + 1
