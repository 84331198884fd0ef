"""Token choice rules: filtering, greedy acceptance, and rejection sampling's exact target distribution."""

import torch

from edge.decode.sampling import SamplingConfig, accept_greedy, accept_sampled, probs


def test_top_k_top_p_filter(gen):
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = probs(logits, SamplingConfig(1.0, top_k=2))
    assert p[2:].sum() == 0 and torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64))
    p = probs(logits, SamplingConfig(1.0, top_p=0.7))
    full = torch.softmax(logits.double(), -1)
    assert p[0] > 0 and p[1] > 0 and p[2:].sum() == 0 and full[0] < 0.7 < full[:2].sum()


def test_greedy_acceptance():
    target = torch.full((5, 10), -5.0)
    for i, t in enumerate([3, 4, 7, 1, 2]):
        target[i, t] = 5.0
    assert accept_greedy([3, 4, 7, 1], target) == (4, 2)
    assert accept_greedy([3, 9, 7, 1], target) == (1, 4)
    assert accept_greedy([0, 4, 7, 1], target) == (0, 3)


def test_rejection_sampling_reproduces_the_target_distribution(gen):
    """One-token rounds many times: the first emitted token must follow p, not q (chi-square bound)."""
    v = 6
    cfg = SamplingConfig(temperature=1.0)
    t_logits = torch.randn(2, v, generator=gen)
    q = torch.softmax(torch.randn(v, generator=gen, dtype=torch.float64), -1)
    p = probs(t_logits[0], cfg)
    n, counts = 6000, torch.zeros(v)
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=gen))
        a, nxt = accept_sampled([x], q.unsqueeze(0), t_logits, cfg, gen)
        counts[x if a == 1 else nxt] += 1
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 30, f"emitted distribution departs from the target's (chi2 = {chi2:.1f}, 5 dof)"
