"""Typed settings of a generation: the policy by name, γ, token limit, sampling, the draft's KV read, and the
gate, adaptive-speculation and auto settings. The policy name is checked against the registry (edge.decode.registry)."""

import math
from dataclasses import dataclass, field
from typing import Optional

from edge.decode.adaptive import AdaptiveConfig
from edge.decode.auto import AutoConfig
from edge.decode.sampling import SamplingConfig
from edge.decode.signals import SIGNALS
from edge.engine import MAX_PROPOSALS
from edge.engine.kv_cache import KV8, KVRead

PHASE_ORDERS = ("low-high", "high-low")


@dataclass(frozen=True)
class DraftKVPolicy:
    """Context-aware draft KV (BitNest §3.4): KV8 below `kv8_below` committed positions, else `long_view`
    (kv4, or recent with KV8 for the last `recent` positions). Verification always reads KV8."""

    kv8_below: int = 2048
    long_view: str = "kv4"
    recent: int = 256

    def read(self, length: int) -> KVRead:
        if length < self.kv8_below:
            return KV8
        return KVRead(self.long_view, self.recent if self.long_view == "recent" else 0)


@dataclass(frozen=True)
class GateConfig:
    """Settings of the gate policies. `threshold` (nats for entropy, logits for margin) drives the
    entropy, margin and lagged gates; when it is None the runtime resolves it from the thresholds
    calibrated for `rate` (edge.decode.thresholds). `rate` is also the share of steps gate-random escalates."""

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


@dataclass(frozen=True)
class GenerateConfig:
    """One generation's settings; `policy` names a class of the registry (edge.decode.registry, which refuses an
    unknown name when it builds the policy: settings know no policy classes). `gamma` is the round length of the fixed
    policies (speculative; adaptive's usual length); `auto` chooses its own γ up to `auto.gamma_max` and ignores
    it. The default stays `speculative`: a library caller gets the same passes on every machine and opts into
    `auto` (which times passes at its first generation on an engine); the chat's default is `auto`."""

    policy: str = "speculative"
    gamma: int = 4
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    draft_kv: DraftKVPolicy = field(default_factory=DraftKVPolicy)
    gate: GateConfig = field(default_factory=GateConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)

    def __post_init__(self):
        if not 1 <= self.gamma <= MAX_PROPOSALS:
            raise ValueError(f"gamma must be in [1, {MAX_PROPOSALS}], got {self.gamma}")
        if self.max_new_tokens < 1:
            raise ValueError("max new tokens must be at least 1")
