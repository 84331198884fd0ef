"""The generation loop: prefill, then decode with the chosen policy until EOS, a stop condition or
the token limit, streaming tokens to a callback and counting decode-phase statistics."""

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from edge.decode.adaptive import AdaptiveConfig
from edge.decode.engine import Engine
from edge.decode.gates import GATE_POLICIES, Gate, GateConfig
from edge.decode.policies import POLICIES, DraftKVPolicy, ar_step, speculative_round
from edge.decode.sampling import SamplingConfig, choose
from edge.decode.stats import DecodeStats


@dataclass(frozen=True)
class GenerateConfig:
    policy: str = "speculative"
    gamma: int = 4
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    draft_kv: DraftKVPolicy = field(default_factory=DraftKVPolicy)
    gate: GateConfig = field(default_factory=GateConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if not 1 <= self.gamma <= 16:
            raise ValueError(f"gamma must be in [1, 16], got {self.gamma}")
        if self.max_new_tokens < 1:
            raise ValueError("max new tokens must be at least 1")

    @property
    def most_proposals(self) -> int:
        """Draft proposals a round may hold (scratch slots it needs)."""
        return self.adaptive.most_proposals(self.gamma) if self.policy == "adaptive" else self.gamma


def generate(eng: Engine, prompt: list[int], cfg: GenerateConfig, eos: set[int],
             stop: Optional[Callable[[list[int]], bool]] = None,
             on_tokens: Optional[Callable[[list[int]], None]] = None,
             decode: Optional[Callable[[list[int]], str]] = None) -> tuple[list[int], DecodeStats]:
    """New token ids after `prompt` and the run's statistics. The first new token comes from the
    prefill; the decode phase (timed, and counted in tok/s and bytes per token) produces the rest.
    `decode` (token ids -> text) is needed by gate-phase only."""
    # the prefill yields the first token, so a generation plans max_new_tokens - 1 gated decode steps
    gate = Gate(cfg.policy, cfg.gate, decode, cfg.max_new_tokens - 1) if cfg.policy in GATE_POLICIES else None
    rule = cfg.adaptive.rule(cfg.gamma) if cfg.policy == "adaptive" else None
    eng.reset()
    eng.stats = DecodeStats(policy=cfg.policy, backend=eng.stats.backend)
    gen = torch.Generator().manual_seed(cfg.sampling.seed)
    out = [choose(eng.prefill(prompt), cfg.sampling, gen)]
    if on_tokens:
        on_tokens(out[:])
    done = lambda: len(out) >= cfg.max_new_tokens or out[-1] in eos or (stop is not None and stop(out))
    t0 = time.perf_counter()
    while not done():
        length, pending = eng.cache.length, out[-1]
        if length + 1 >= eng.cache.capacity:
            eng.stats.extra["stopped"] = "context full"
            break
        if cfg.policy in ("speculative", "adaptive") and length + cfg.most_proposals + 1 <= eng.cache.capacity:
            new = speculative_round(eng, pending, cfg.most_proposals, cfg.sampling, gen, cfg.draft_kv.read(length),
                                    rule)
        elif gate is not None:
            new = gate.step(eng, pending, out, cfg.sampling, gen, cfg.draft_kv.read(length))
        elif cfg.policy == "draft":
            new = ar_step(eng, pending, "draft", cfg.sampling, gen, cfg.draft_kv.read(length))
        else:
            new = ar_step(eng, pending, "target", cfg.sampling, gen)
        emitted = []
        for t in new:
            out.append(t)
            emitted.append(t)
            if done():
                break
        if on_tokens:
            on_tokens(emitted)
    eng.stats.decode_seconds = time.perf_counter() - t0
    eng.stats.tokens = len(out) - 1
    return out, eng.stats
