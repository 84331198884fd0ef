"""The uncertainty signals of a pass's logits that gates and adaptive speculation read: entropy and the
top-two logit margin, and the rule that calls a value uncertain."""

import torch

SIGNALS = ("entropy", "margin")


def entropy_and_margin(logits: torch.Tensor) -> tuple[float, float]:
    """Entropy (nats) of softmax(logits) and the gap between the two largest logits; logits [V]. Tokens at -inf
    (outside a shortlist draft's candidates, edge.model.draft_head) have probability 0 and add 0 to the entropy."""
    z = logits.double()
    logp = torch.log_softmax(z, dim=-1)
    top = torch.topk(z, 2).values
    plogp = torch.where(torch.isneginf(logp), 0.0, logp.exp() * logp)
    return float(-plogp.sum()), float(top[0] - top[1])


def is_uncertain(signal: str, value: float, threshold: float) -> bool:
    """The gate's rule: entropy above the threshold, or margin below it."""
    return value > threshold if signal == "entropy" else value < threshold
