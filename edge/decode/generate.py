"""The generation loop: prefill, then decode with the chosen policy until EOS, a stop condition, the token
limit or a full context, streaming tokens to a callback and recording each step's statistics."""

import time
from typing import Callable, Optional

from edge.decode.config import GenerateConfig
from edge.engine.interface import Engine
from edge.decode.registry import make_policy
from edge.decode.sampling import Sampler
from edge.engine.stats import DecodeStats

CONTEXT_FULL = "context full"


def generate(eng: Engine, prompt: list[int], cfg: GenerateConfig, eos: set[int],
             stop: Optional[Callable[[list[int]], bool]] = None,
             on_tokens: Optional[Callable[[list[int]], None]] = None,
             decode: Optional[Callable[[list[int]], str]] = None) -> tuple[list[int], DecodeStats]:
    """New token ids after `prompt` and the run's statistics. The first new token comes from the prefill; the
    decode phase (timed, and counted in tok/s and bytes per token) produces the rest. `decode` (token ids ->
    text) is needed by gate-phase only. A context that fills up ends the run with `stopped` in the stats."""
    sampler = Sampler(cfg.sampling)
    policy = make_policy(cfg, sampler, decode)
    policy.prepare(eng, prompt)
    stats = eng.reset(cfg.policy)
    out = [sampler.choose(eng.prefill(prompt, policy.prefill_view))]
    if on_tokens:
        on_tokens(out[:])
    done = lambda: len(out) >= cfg.max_new_tokens or out[-1] in eos or (stop is not None and stop(out))
    t0 = time.perf_counter()
    while not done():
        if eng.room() < 1:   # no position left for the pending token's entry
            stats.extra["stopped"] = CONTEXT_FULL
            break
        step = policy.step(eng, out[-1], out)
        if step.drafted is not None:
            stats.record_round(step.drafted, step.accepted)
        if step.escalated is not None:
            stats.record_gated_step(step.escalated)
        if step.chosen is not None:
            stats.record_choice(step.chosen, step.alpha, step.probe)
        emitted = []
        for t in step.tokens:
            out.append(t)
            emitted.append(t)
            if done():
                break
        if on_tokens:
            on_tokens(emitted)
    stats.record_decode(len(out) - 1, time.perf_counter() - t0)
    stats.extra.update(policy.summary())
    stats.extra.update(eng.kv_summary())
    return out, stats
