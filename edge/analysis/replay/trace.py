"""Step traces along the target's greedy trajectory: at every decode step the low (draft view) pass and
the high (target view) pass over the same history, with the low pass's entropy and margin, KL(high‖low)
and whether the argmax flips. Replay analysis and gate calibration both read these traces."""

from dataclasses import dataclass, field

import torch

from edge.decode.config import DraftKVPolicy
from edge.engine.interface import Engine
from edge.engine.kv_cache import KV8
from edge.decode.signals import entropy_and_margin


@dataclass
class StepTrace:
    """One prompt's decode steps, index i = the step that chose generated token i + 1."""

    tokens: list[int] = field(default_factory=list)      # the target's greedy tokens (the trajectory)
    entropy: list[float] = field(default_factory=list)   # low pass, nats
    margin: list[float] = field(default_factory=list)    # low pass, top-1 minus top-2 logit
    kl: list[float] = field(default_factory=list)        # KL(high ‖ low), nats
    flip: list[bool] = field(default_factory=list)       # low argmax != high argmax

    def __len__(self) -> int:
        return len(self.flip)


def compare_passes(low: torch.Tensor, high: torch.Tensor) -> tuple[float, float, float, bool]:
    """Entropy and margin of the low logits [V], KL(softmax(high) ‖ softmax(low)), argmax flip."""
    entropy, margin = entropy_and_margin(low)
    lp_low, lp_high = torch.log_softmax(low.double(), -1), torch.log_softmax(high.double(), -1)
    kl = float((lp_high.exp() * (lp_high - lp_low)).sum())
    return entropy, margin, max(kl, 0.0), int(torch.argmax(low)) != int(torch.argmax(high))


@torch.no_grad()
def trace_prompt(eng: Engine, prompt: list[int], max_new_tokens: int, eos: set[int],
                 draft_kv: DraftKVPolicy = DraftKVPolicy()) -> StepTrace:
    """Decode `prompt` greedily with the target view, and at every decode step also run the low pass on
    the same history (a scratch-slot pass: the committed entries the target wrote, then its own). This is
    exactly the first proposal of a speculative round, and the low pass of a gate whose earlier steps
    were all escalated; a live gate's non-escalated steps leave draft-view KV entries behind instead."""
    eng.reset()
    tr = StepTrace()
    tr.tokens.append(int(torch.argmax(eng.prefill(prompt))))
    while len(tr.tokens) < max_new_tokens and tr.tokens[-1] not in eos and eng.room() > 2:
        length, pending = eng.length, tr.tokens[-1]
        low = eng.forward([pending], "draft", draft_kv.read(length), draft_slot=0)[-1]     # [V]
        high = eng.forward([pending], "target", KV8)[-1]                                   # [V]
        eng.commit(length + 1)
        h, m, kl, flip = compare_passes(low, high)
        tr.entropy.append(h)
        tr.margin.append(m)
        tr.kl.append(kl)
        tr.flip.append(flip)
        tr.tokens.append(int(torch.argmax(high)))
    return tr
