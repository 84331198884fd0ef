"""The policy registry: the one place a policy name is parsed into a class, and where a generation's policy
object is built."""

from typing import Callable, Optional

from edge.decode.gates import GATES
from edge.decode.policies import Adaptive, Auto, DraftAR, Policy, Speculative, TargetAR
from edge.decode.sampling import Sampler

POLICY_CLASSES: dict[str, type[Policy]] = {c.name: c for c in (Speculative, Adaptive, Auto, TargetAR, DraftAR)
                                               + GATES}
POLICIES = tuple(POLICY_CLASSES)


def policy_class(name: str) -> type[Policy]:
    """The class of policy `name`; ValueError naming every policy where there is none."""
    if name not in POLICY_CLASSES:
        raise ValueError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}")
    return POLICY_CLASSES[name]


def most_proposals(cfg) -> int:
    """Draft proposals one step of `cfg`'s policy may hold (the draft scratch slots an engine needs for it)."""
    return policy_class(cfg.policy).most_proposals(cfg)


def make_policy(cfg, sampler: Sampler, decode: Optional[Callable[[list[int]], str]] = None) -> Policy:
    """A fresh policy object for one generation under `cfg` (an edge.decode.config.GenerateConfig)."""
    return policy_class(cfg.policy)(cfg, sampler, decode)
