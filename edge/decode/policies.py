"""Decoding policies as short step functions over an Engine: autoregressive (`target`, `draft`) and
BitNest's speculative round (draft view proposes γ tokens, target view verifies them in one pass)."""

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from edge.decode.engine import KV8, Engine
from edge.decode.gates import GATE_POLICIES
from edge.decode.kv_cache import KVRead
from edge.decode.sampling import SamplingConfig, accept_greedy, accept_sampled, choose, probs

POLICIES = ("speculative", "adaptive", "target", "draft") + GATE_POLICIES


@dataclass(frozen=True)
class DraftKVPolicy:
    """Context-aware draft KV (paper §3.4): KV8 below `kv8_below` committed positions, else `long_view`
    (kv4, or recent with KV8 for the last `recent` positions). Verification always reads KV8."""

    kv8_below: int = 2048
    long_view: str = "kv4"
    recent: int = 256

    def read(self, length: int) -> KVRead:
        if length < self.kv8_below:
            return KV8
        return KVRead(self.long_view, self.recent if self.long_view == "recent" else 0)


def ar_step(eng: Engine, pending: int, view: str, sampling: SamplingConfig, gen: torch.Generator,
            kv: KVRead = KV8) -> list[int]:
    """One autoregressive step: run the pending token with `view`, commit its entry, choose the next token."""
    logits = eng.run([pending], view, kv)
    eng.cache.commit(eng.cache.length + 1)
    return [choose(logits[-1], sampling, gen)]


def speculative_round(eng: Engine, pending: int, gamma: int, sampling: SamplingConfig, gen: torch.Generator,
                      draft_kv: KVRead,
                      keep_drafting: Optional[Callable[[int, torch.Tensor], bool]] = None) -> list[int]:
    """One round. Rule: the draft view proposes d_1..d_γ from the pending token (its entries go to the
    scratch area); one target pass over [pending, d_1..d_γ] writes the real entries and yields γ+1
    distributions; accept the longest agreeing prefix (greedy) or apply rejection sampling; emit the
    accepted drafts plus one target token; commit the pending token and the accepted drafts, so the
    rejected entries fall off the committed length. With `keep_drafting(n, logits of proposal n)`
    (adaptive speculation, edge/decode/adaptive.py) γ is the most proposals and the rule ends drafting early;
    it reads only the draft's own distributions, so verification keeps the output lossless."""
    base = eng.cache.length
    draft, draft_p, token = [], [], pending
    for slot in range(gamma):
        logits = eng.run([token], "draft", draft_kv, draft_slot=slot)[-1]
        if sampling.greedy:
            token = int(torch.argmax(logits))
        else:
            q = probs(logits, sampling)
            token = int(torch.multinomial(q, 1, generator=gen))
            draft_p.append(q)
        draft.append(token)
        if keep_drafting is not None and not keep_drafting(len(draft), logits):
            break
    target_logits = eng.run([pending] + draft, "target", KV8)             # [γ+1, V]
    if sampling.greedy:
        a, nxt = accept_greedy(draft, target_logits)
    else:
        a, nxt = accept_sampled(draft, torch.stack(draft_p), target_logits, sampling, gen)
    eng.cache.commit(base + 1 + a)
    s = eng.stats
    s.rounds += 1
    s.drafted += len(draft)
    s.accepted += a
    return draft[:a] + [nxt]
