"""Statistics and replay arithmetic on known inputs: ROC AUC, bootstrap intervals, paired differences,
the exact McNemar test (against the p-values printed in paper 2611.14418, Table 7), budgets and the
verified-speculation replay over a hand-checked agreement pattern."""

import math

import numpy as np
import pytest

from edge.analysis.replay.analyse import (
    _escalate_top,
    _gate_effect,
    gate_bytes,
    lagged_bytes,
    speculation_replay,
)
from edge.analysis.significance import (
    bootstrap_ci,
    mcnemar_exact,
    paired_bootstrap_diff,
    roc_auc,
)
from edge.analysis.replay.trace import StepTrace


def test_roc_auc_known_values():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75          # 3 of 4 pairs ordered
    assert roc_auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert roc_auc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0
    assert roc_auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5                    # ties count half
    assert math.isnan(roc_auc([1, 2], [1, 1]))


@pytest.mark.parametrize("right_high_only, right_here_only, p", [
    (26, 13, 0.053), (19, 16, 0.736), (14, 11, 0.690), (13, 11, 0.839), (10, 12, 0.832), (12, 15, 0.701),
    (10, 11, 1.000)])
def test_mcnemar_reproduces_the_papers_p_values(right_high_only, right_here_only, p):
    both = 60
    a = [True] * right_high_only + [False] * right_here_only + [True] * both
    b = [False] * right_high_only + [True] * right_here_only + [True] * both
    r = mcnemar_exact(a, b)
    assert (r["a_only"], r["b_only"]) == (right_high_only, right_here_only)
    assert round(r["p"], 3) == p


def test_mcnemar_without_discordant_pairs_is_one():
    assert mcnemar_exact([True, False], [True, False])["p"] == 1.0


def test_bootstrap_intervals():
    const = bootstrap_ci([2.0] * 30, lambda xs: float(np.mean(xs)), resamples=200)
    assert const == {"value": 2.0, "low": 2.0, "high": 2.0}
    half = bootstrap_ci([0.0, 1.0] * 50, lambda xs: float(np.mean(xs)), resamples=2000, seed=1)
    # normal approximation of the half-width: 1.96 * sqrt(0.25 / 100) = 0.098
    assert half["value"] == 0.5 and 0.08 < (half["high"] - half["low"]) / 2 < 0.12
    d = paired_bootstrap_diff([1, 0, 1, 1], [0, 0, 1, 0], resamples=500)
    assert d["value"] == 0.5 and 0.0 <= d["low"] <= 0.5 <= d["high"] <= 1.0
    shifted = paired_bootstrap_diff([3.0, 4.0, 5.0], [2.0, 3.0, 4.0], resamples=100)
    assert shifted == {"value": 1.0, "low": 1.0, "high": 1.0}


def test_budget_selects_the_most_uncertain_steps():
    scores = np.array([0.1, 0.9, 0.5, 0.7, 0.2])
    mask = _escalate_top(scores, 0.4)                                      # round(0.4 * 5) = 2 steps
    assert mask.tolist() == [False, True, False, True, False]
    e = _gate_effect(mask, np.array([0, 1, 1, 0, 0], bool), np.array([0.0, 2.0, 1.0, 1.0, 0.0]))
    assert e["recall"] == 0.5 and e["precision"] == 0.5 and e["kl_removed"] == 0.75 and e["kl_left"] == 1.0 / 5


def test_speculation_replay_counts_rounds():
    # agreement pattern over 8 steps: A A F A A A A F (F = flip); k = 2
    tr = StepTrace(flip=[False, False, True, False, False, False, False, True], kl=[0.0] * 8,
                   entropy=[0.0] * 8, margin=[0.0] * 8)
    cost = {"low_pass": 0.5, "high_pass": 1.0}
    r = speculation_replay([tr], cost)["k2"]
    # step 0: 2 accepted + the target's token at the flip (3 steps); step 3: 2 accepted + 1 (3 steps);
    # step 6: 1 accepted, step 7 flips, + 1 (2 steps): 3 rounds over 8 steps
    assert (r["rounds"], r["mean_accepted"], r["tokens_per_round"]) == (3, 5 / 3, 8 / 3)
    assert r["accepted_histogram"] == [0, 1, 2]
    assert r["bytes_vs_high"] == pytest.approx(3 * (2 * 0.5 + 1.0) / 8)
    assert gate_bytes(cost, 0.2) == pytest.approx(0.7) and lagged_bytes(cost, 0.2) == pytest.approx(0.6)
