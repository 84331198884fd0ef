"""Speculative speed where the weights cannot say what a draft would get accepted (a synthetic checkpoint: random
planes), borrowed from the real model: **replayed**, real passes of the synthetic model (γ draft passes into draft
slots, one verification pass, the cache committed and rolled back as edge.decode.policies.Speculative does) whose
accept/reject decisions follow per-round accepted counts recorded on the real model; or **projected** from pass
times and the real model's acceptance α: E = (1 - α^(γ+1)) / (1 - α) tokens a round, over
γ·t_draft(1) + t_target(γ+1)."""

import time

from edge.decode.auto import expected_tokens  # the auto policy's rule, shared
from edge.decode.config import DraftKVPolicy
from edge.engine.interface import Engine
from edge.engine.kv_cache import KV8
from edge.decode.sampling import Sampler, SamplingConfig
from edge.engine.stats import DecodeStats
from plugins.contracts import DRAFT, TARGET

GAMMAS = tuple(range(0, 8))          # γ = 0: a plain target step; up to 7: pass times reach width 8


def replay_round(eng: Engine, pending: int, gamma: int, accepted: int, sampler: Sampler,
                 draft_kv: DraftKVPolicy) -> tuple[list[int], int]:
    """One round of Speculative.step with the accepted count given: the draft view proposes γ tokens (its own greedy
    choices) from the pending token into draft slots, one target pass verifies [pending, d_1..d_γ] (the acceptance
    rule still runs, so a round costs what a real one does), then `accepted` of them (at most γ) are kept with the
    target's token after them, and the committed length moves past the pending token and those."""
    base = eng.length
    kv = draft_kv.read(base)
    draft, draft_q, token = [], [], pending
    greedy = sampler.argmax_only                           # as the policy's round: logits left on a GPU engine
    for slot in range(gamma):
        logits = eng.forward([token], DRAFT, kv, draft_slot=slot, on_device=greedy)[-1]
        token, q = sampler.propose(logits)
        draft.append(token)
        draft_q.append(q)
    target_logits = eng.forward([pending] + draft, TARGET, KV8, on_device=greedy)  # [γ+1, V]
    sampler.accept(draft, draft_q, target_logits)                            # the real rule's cost; its verdict unused
    a = min(accepted, len(draft))
    eng.commit(base + 1 + a)
    return draft[:a] + [int(target_logits[a].argmax())], a


def replay_generation(eng: Engine, prompt: list[int], rounds: list[list[int]], max_new_tokens: int) -> DecodeStats:
    """A greedy generation of exactly `max_new_tokens` tokens after `prompt` whose rounds take their drafted and
    accepted counts from `rounds` ([[drafted, accepted], ...], cycled if the generation outlasts them); the decode
    phase is timed as edge.decode.generate times it."""
    if not rounds:
        raise ValueError("a replay needs at least one recorded round")
    sampler, draft_kv = Sampler(SamplingConfig()), DraftKVPolicy()
    stats = eng.reset("speculative (replayed)")
    out = [sampler.choose(eng.prefill(prompt))]
    t0 = time.perf_counter()
    i = 0
    while len(out) < max_new_tokens:
        drafted, accepted = rounds[i % len(rounds)]
        i += 1
        gamma = max(0, min(drafted, eng.room() - 1))                         # fewer near a full context
        new, a = replay_round(eng, out[-1], gamma, accepted, sampler, draft_kv)
        stats.record_round(gamma, a)
        out.extend(new[:max_new_tokens - len(out)])
    stats.record_decode(len(out) - 1, time.perf_counter() - t0)
    return stats


def judged_acceptance(rounds: list) -> float | None:
    """α as the projection's E = (1 - α^(γ+1)) / (1 - α) means it: accepted ÷ judged, where a round's judged proposals
    are its accepted ones and the first rejected one (the proposals after a rejection are never judged), from the
    recorded rounds ([[drafted, accepted], ...] per prompt); None without rounds. Accepted ÷ drafted is lower (it
    counts the unjudged proposals as failures) and would understate every projected speed."""
    flat = [r for prompt in rounds or [] for r in prompt]
    judged = sum(a + (a < d) for d, a in flat)
    return round(sum(a for _, a in flat) / judged, 4) if judged else None


def alpha_from_tokens_per_round(tokens: float, gamma: int) -> float:
    """The judged acceptance α whose E = (1 - α^(γ+1)) / (1 - α) is `tokens` a round (E rises from 1 at α = 0 to
    γ + 1 at α = 1): what a run that kept its tokens per round but not its rounds implies."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tokens else (lo, mid)
    return round((lo + hi) / 2, 4)


def projected(ms: dict, alpha: float) -> dict:
    """tok/s per γ (GAMMAS, where the pass times have width γ + 1) from pass times `ms` ({"draft": {"1": ms},
    "target": {"W": ms}}) and acceptance α; the best γ, and each γ's speed over the target's one-token pass."""
    target1 = ms["target"]["1"]
    by_gamma = {}
    for g in GAMMAS:
        if str(g + 1) not in ms["target"]:
            continue
        seconds = (g * ms["draft"]["1"] + ms["target"][str(g + 1)]) / 1e3
        by_gamma[str(g)] = round(expected_tokens(alpha, g) / seconds, 2)
    best = max(by_gamma, key=by_gamma.get)
    return {"alpha": alpha, "tok_s_by_gamma": by_gamma, "best_gamma": int(best),
            "vs_target_by_gamma": {g: round(v * target1 / 1e3, 3) for g, v in by_gamma.items()}}
