"""Statistics of the Precision on Demand analysis: ROC AUC (Mann-Whitney, ties count half), percentile
bootstrap intervals resampling prompts (clusters of steps), paired bootstrap differences and the exact
McNemar test (two-sided binomial test on the discordant pairs, scipy)."""

from typing import Callable, Sequence

import numpy as np


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """P(score of a random positive > score of a random negative) + 0.5 P(equal); nan without both classes."""
    from scipy.stats import rankdata
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = rankdata(s)                                   # average ranks: ties count half
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def bootstrap_ci(groups: Sequence, statistic: Callable[[list], float], resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> dict:
    """{"value", "low", "high"}: `statistic(groups)` and its percentile interval over resamples of the
    groups with replacement (resamples where the statistic is undefined, nan, are left out)."""
    rng = np.random.default_rng(seed)
    value = statistic(list(groups))
    n = len(groups)
    stats = []
    for _ in range(resamples):
        v = statistic([groups[i] for i in rng.integers(0, n, n)])
        if not np.isnan(v):
            stats.append(v)
    if not stats:
        return {"value": value, "low": float("nan"), "high": float("nan")}
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return {"value": float(value), "low": float(low), "high": float(high)}


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0,
                          level: float = 0.95) -> dict:
    """Mean of a - b over paired items with its bootstrap interval (items resampled in pairs)."""
    if len(a) != len(b) or not len(a):
        raise ValueError("paired samples must be non-empty and of equal length")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return bootstrap_ci(list(d), lambda xs: float(np.mean(xs)), resamples, seed, level)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Exact McNemar test of paired binary outcomes: {"a_only", "b_only", "p"}, where a_only counts items
    right under a and wrong under b; p is the two-sided binomial test of a_only among the discordant."""
    from scipy.stats import binomtest
    if len(a) != len(b):
        raise ValueError("paired samples must be of equal length")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    n = a_only + b_only
    p = 1.0 if n == 0 else float(binomtest(a_only, n, 0.5).pvalue)
    return {"a_only": a_only, "b_only": b_only, "p": p}
