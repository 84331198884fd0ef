"""Token choice: greedy argmax, filtered sampling distributions (temperature, top-k, top-p), and the
speculative acceptance rules (greedy prefix match; Leviathan et al. rejection sampling)."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need temperature >= 0, top-k >= 0 and 0 < top-p <= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> float64 probabilities after temperature, top-k and top-p (same rule for any model)."""
    z = logits.double() / cfg.temperature
    if cfg.top_k:
        kth = torch.topk(z, min(cfg.top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    p = torch.softmax(z, dim=-1)
    if cfg.top_p < 1:
        sp, idx = torch.sort(p, dim=-1, descending=True)
        drop = sp.cumsum(-1) - sp > cfg.top_p          # keep the smallest prefix reaching top_p
        p = p.scatter(-1, idx, sp.masked_fill(drop, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def choose(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator) -> int:
    """One token from logits [V]."""
    if cfg.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs(logits, cfg), 1, generator=gen))


def accept_greedy(draft: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy rule: accept the longest prefix of `draft` [γ] on which the target's argmax agrees;
    target_logits [γ+1, V]. Returns (accepted count a, the target's token at position a)."""
    best = torch.argmax(target_logits, dim=-1).tolist()
    a = 0
    while a < len(draft) and draft[a] == best[a]:
        a += 1
    return a, best[a]


def accept_sampled(draft: list[int], draft_probs: torch.Tensor, target_logits: torch.Tensor,
                   cfg: SamplingConfig, gen: torch.Generator) -> tuple[int, int]:
    """Rejection sampling (Leviathan et al. 2023): accept draft token x_i with probability
    min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from norm(max(0, p_i - q_i)); if all γ
    are accepted, sample the bonus token from p_γ. The output is distributed exactly as the target's.
    draft_probs [γ, V] (q, already filtered); target_logits [γ+1, V] (filtered here the same way)."""
    p = probs(target_logits, cfg)                                     # [γ+1, V]
    for i, x in enumerate(draft):
        qx, px = float(draft_probs[i, x]), float(p[i, x])
        if float(torch.rand((), generator=gen, dtype=torch.float64)) * qx <= px:
            continue
        residual = (p[i] - draft_probs[i]).clamp_min(0)
        total = float(residual.sum())
        dist = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=gen))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=gen))


class Sampler:
    """One generation's token choice: its sampling settings and seeded generator, shared by every step."""

    def __init__(self, cfg: SamplingConfig):
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed)

    @property
    def argmax_only(self) -> bool:
        """Greedy: every choice reads only the logits' argmax (so they may stay on a GPU engine's device)."""
        return self.cfg.greedy

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from logits [V]."""
        return choose(logits, self.cfg, self.gen)

    def propose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """A draft proposal from the draft's logits [V], with the distribution it was drawn from (None if greedy)."""
        if self.cfg.greedy:
            return int(torch.argmax(logits)), None
        q = probs(logits, self.cfg)
        return int(torch.multinomial(q, 1, generator=self.gen)), q

    def accept(self, draft: list[int], draft_q: list[torch.Tensor], target_logits: torch.Tensor) -> tuple[int, int]:
        """Accepted count and the target's next token for proposals `draft` under target_logits [γ+1, V] (no
        proposals: the target's token chosen as a target step chooses it)."""
        if not draft:
            return 0, self.choose(target_logits[0])
        if self.cfg.greedy:
            return accept_greedy(draft, target_logits)
        return accept_sampled(draft, torch.stack(draft_q), target_logits, self.cfg, self.gen)
