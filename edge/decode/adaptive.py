"""Confidence-adaptive speculation: the draft's own top-two margin (or entropy) decides, proposal by
proposal, whether a round drafts on. An uncertain proposal ends the round (it is still verified, which
costs nothing extra in a weight-bound pass, but a proposal after it would rest on a likely rejection);
a confident one may draft past γ up to `gamma_max`. Verification is unchanged, so greedy output stays
exactly the target's."""

from dataclasses import dataclass
from typing import Optional

import torch

from edge.decode.signals import SIGNALS, entropy_and_margin, is_uncertain
from edge.engine import MAX_PROPOSALS


@dataclass(frozen=True)
class AdaptiveConfig:
    """`stop`: a proposal whose signal is uncertain (margin below / entropy above it) ends the round.
    `extend`: past γ, drafting goes on while the signal is confident (margin at least / entropy at most
    it), up to `gamma_max` proposals; None never drafts past γ."""

    signal: str = "margin"
    stop: float = 1.0
    extend: Optional[float] = 6.0
    gamma_max: int = 8

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown adaptive signal {self.signal!r}: use one of {', '.join(SIGNALS)}")
        if not 1 <= self.gamma_max <= MAX_PROPOSALS:
            raise ValueError(f"adaptive gamma max must be in [1, {MAX_PROPOSALS}], got {self.gamma_max}")

    def rule(self, gamma: int):
        """keep_drafting(n, logits [V] of proposal n) for the adaptive policy, with γ the usual length."""
        def keep_drafting(n: int, logits: torch.Tensor) -> bool:
            h, m = entropy_and_margin(logits)
            value = h if self.signal == "entropy" else m
            if is_uncertain(self.signal, value, self.stop):
                return False
            if n < gamma:
                return True
            confident = self.extend is not None and not is_uncertain(self.signal, value, self.extend)
            return confident and n < self.gamma_max
        return keep_drafting

    def most_proposals(self, gamma: int) -> int:
        return gamma if self.extend is None else max(gamma, self.gamma_max)
