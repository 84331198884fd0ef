"""Teacher-forced replay analysis (paper 2611.14418 §5–6, §3.3, §8) over step traces of the target's
greedy trajectories: how well the low pass's entropy and margin rank argmax flips (AUC, bootstrap
intervals over prompts), what each ordering catches at fixed escalation budgets against the random
expectation and the KL oracle, calibrated gates, verified speculation replayed for several k, and the
byte cost model with the head counted in every pass."""

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from edge.corpora import sharegpt_prompts
from edge.analysis.significance import bootstrap_ci, roc_auc
from edge.analysis.replay.trace import StepTrace, trace_prompt
from edge.engine.stats import head_bytes_per_pass, head_row_bytes_per_token, weight_bytes_per_pass
from edge.decode.thresholds import RATES, rate_key, thresholds_entry
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint

SPEC_K = (2, 4, 6, 8)
HEAD_BITS = (16, 8, 4)


def _score(tr: StepTrace, order: str) -> np.ndarray:
    """Uncertainty scores [T] (higher = escalate first) of one prompt's steps under an ordering."""
    if order == "entropy":
        return np.asarray(tr.entropy)
    if order == "margin":
        return -np.asarray(tr.margin)
    if order == "oracle":
        return np.asarray(tr.kl)
    if order.startswith("lagged_"):     # the previous step's signal; the first step has none
        s = _score(tr, order[len("lagged_"):])
        return np.concatenate(([-np.inf], s[:-1])) if len(s) else s
    raise ValueError(order)


def _pool(traces: list[StepTrace], order: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled scores, flips and KL over the given prompts."""
    return (np.concatenate([_score(t, order) for t in traces]), np.concatenate([np.asarray(t.flip, bool) for t in traces]),
            np.concatenate([np.asarray(t.kl) for t in traces]))


def auc_table(traces: list[StepTrace], resamples: int, seed: int) -> dict:
    """AUC of entropy and (inverted) margin for flips and for the top 10% of steps by KL, with intervals."""
    out = {}
    for signal in ("entropy", "margin"):
        flips = lambda g: roc_auc(*_pool(g, signal)[:2])
        out[signal] = bootstrap_ci(traces, flips, resamples, seed)

        def top_kl(g):
            s, _, kl = _pool(g, signal)
            return roc_auc(s, kl >= np.quantile(kl, 0.9))
        out[signal]["kl_top10"] = round(top_kl(traces), 4)
    return out


def _escalate_top(scores: np.ndarray, budget: float) -> np.ndarray:
    """Boolean mask of the round(budget · n) highest-scoring steps (stable order on ties)."""
    k = round(budget * len(scores))
    mask = np.zeros(len(scores), bool)
    mask[np.argsort(-scores, kind="stable")[:k]] = True
    return mask


def _gate_effect(mask: np.ndarray, flips: np.ndarray, kl: np.ndarray) -> dict:
    n_flip, total_kl = int(flips.sum()), float(kl.sum())
    caught = int((mask & flips).sum())
    return {"rate": float(mask.mean()), "recall": caught / n_flip if n_flip else float("nan"),
            "precision": caught / int(mask.sum()) if mask.any() else float("nan"),
            "kl_removed": float(kl[mask].sum()) / total_kl if total_kl > 0 else float("nan"),
            "kl_left": float(kl[~mask].sum()) / len(kl)}


def budget_table(traces: list[StepTrace], cost: dict, resamples: int, seed: int) -> dict:
    """At each budget: recall of flips and share of KL removed for entropy, margin, their lagged forms
    and the KL oracle (intervals over prompts, re-ranked within each resample), plus the random gate's
    analytic expectation (recall = KL removed = rate, no interval) and bytes relative to all-high."""
    flips_all = np.concatenate([np.asarray(t.flip, bool) for t in traces])
    kl_all = np.concatenate([np.asarray(t.kl) for t in traces])
    out = {}
    for rate in RATES:
        row = {}
        for order in ("entropy", "margin", "lagged_entropy", "lagged_margin", "oracle"):
            s, f, kl = _pool(traces, order)
            row[order] = _gate_effect(_escalate_top(s, rate), f, kl)
            for metric in ("recall", "kl_removed"):
                ci = bootstrap_ci(traces, lambda g: _gate_effect(_escalate_top(_pool(g, order)[0], rate),
                                                                 *_pool(g, order)[1:])[metric], resamples, seed)
                row[order][metric + "_ci"] = [ci["low"], ci["high"]]
        k = round(rate * len(flips_all))
        row["random"] = {"rate": k / len(flips_all), "recall": k / len(flips_all), "kl_removed": k / len(flips_all),
                         "kl_left": float(kl_all.mean()) * (1 - k / len(flips_all)), "analytic": True}
        row["bytes_vs_high"] = {"gate": gate_bytes(cost, rate), "lagged": lagged_bytes(cost, rate)}
        out[rate_key(rate)] = row
    return out


def calibrated_table(traces: list[StepTrace], entry: dict, cost: dict) -> dict:
    """The calibrated gates (thresholds fitted on other prompts) replayed on these trajectories."""
    out = {}
    for signal in ("entropy", "margin"):
        values = np.concatenate([np.asarray(getattr(t, signal)) for t in traces])
        flips = np.concatenate([np.asarray(t.flip, bool) for t in traces])
        kl = np.concatenate([np.asarray(t.kl) for t in traces])
        for key, thr in entry[signal].items():
            mask = values > thr if signal == "entropy" else values < thr
            eff = _gate_effect(mask, flips, kl)
            out[f"{signal}@{key}"] = dict(eff, threshold=thr, target_rate=float(key), lift=eff["recall"] / eff["rate"]
                                          if eff["rate"] else float("nan"), bytes_vs_high=gate_bytes(cost, eff["rate"]))
    return out


def speculation_replay(traces: list[StepTrace], cost: dict) -> dict:
    """Verified speculation on the trajectories: a round proposes k low-pass tokens, accepts the longest
    prefix on which low and high argmax agree (exact for greedy) and adds one high token (none when the
    trajectory ends). Bytes: k low passes plus one high pass over k + 1 positions (one pass of weights).
    First-order: proposals after the first see the target's KV entries here, their own scratch live."""
    out = {}
    for k in SPEC_K:
        rounds = steps = accepted = 0
        hist = [0] * (k + 1)
        for tr in traces:
            agree, pos, n = [not f for f in tr.flip], 0, len(tr.flip)
            while pos < n:
                a = 0
                while a < k and pos + a < n and agree[pos + a]:
                    a += 1
                emitted = a + 1 if pos + a < n else a
                rounds, accepted, steps, pos = rounds + 1, accepted + a, steps + emitted, pos + emitted
                hist[a] += 1
        byts = rounds * (k * cost["low_pass"] + cost["high_pass"])
        out[f"k{k}"] = {"rounds": rounds, "mean_accepted": accepted / rounds, "tokens_per_round": steps / rounds,
                        "acceptance": accepted / (rounds * k), "bytes_vs_high": byts / (steps * cost["high_pass"]),
                        "kl": 0.0, "accepted_histogram": hist}
    return out


def cost_model(ckpt: Checkpoint) -> dict:
    """Bytes one pass reads (paper §3.3): blocks (nested linears, norms, biases) at each view and the head,
    which every pass reads in full; embedding rows are per token and left out."""
    high, low = weight_bytes_per_pass(ckpt, "target"), weight_bytes_per_pass(ckpt, "draft")
    head_high, head_low = (head_bytes_per_pass(ckpt, v) + head_row_bytes_per_token(ckpt, v)
                           for v in ("target", "draft"))                # a one-token pass, as `high` and `low`
    return {"high_pass": high, "low_pass": low, "blocks_high": high - head_high, "blocks_low": low - head_low,
            "head_high": head_high, "head_low": head_low, "low_share_of_high": low / high,
            "blocks_low_share": (low - head_low) / (high - head_high), "head_share_of_high": head_high / high,
            "head_share_of_low": head_low / low, "head_nested": ckpt.head_nested}


def gate_bytes(cost: dict, rate: float) -> float:
    """Gate after the low pass: every step a low pass, escalated steps a high pass too."""
    return (cost["low_pass"] + rate * cost["high_pass"]) / cost["high_pass"]


def lagged_bytes(cost: dict, rate: float) -> float:
    """Lagged gate: one pass per step, high on escalated steps."""
    return (rate * cost["high_pass"] + (1 - rate) * cost["low_pass"]) / cost["high_pass"]


def head_what_if(cost: dict, spec: dict, rate: float = 0.15) -> dict:
    """Relative bytes per token with a head stored at 16, 8 or 4 bits in every pass (all-high baseline
    with the same head); paper §8, figure 20. A cost-model what-if: no accuracy is implied."""
    if cost["head_nested"]:
        return {}
    out = {}
    for bits in HEAD_BITS:
        head = cost["head_high"] * bits / 16
        c = dict(cost, high_pass=cost["blocks_high"] + head, low_pass=cost["blocks_low"] + head)
        out[f"head{bits}"] = {"all_low": c["low_pass"] / c["high_pass"], f"gate@{rate_key(rate)}": gate_bytes(c, rate),
                              f"lagged@{rate_key(rate)}": lagged_bytes(c, rate),
                              "speculation_k4": spec["k4"]["rounds"] * (4 * c["low_pass"] + c["high_pass"]) /
                              (spec["k4"]["tokens_per_round"] * spec["k4"]["rounds"] * c["high_pass"])}
    return out


def analyse(traces: list[StepTrace], ckpt: Checkpoint, thresholds: dict | None, resamples: int = 1000,
            seed: int = 0) -> dict:
    """Everything above on one set of traces; JSON-ready (nan becomes None)."""
    traces = [t for t in traces if len(t)]
    flips = np.concatenate([np.asarray(t.flip, bool) for t in traces])
    kl = np.concatenate([np.asarray(t.kl) for t in traces])
    cost = cost_model(ckpt)
    spec = speculation_replay(traces, cost)
    out = {"prompts": len(traces), "steps": int(len(flips)), "flip_rate": float(flips.mean()),
           "mean_kl": float(kl.mean()), "auc": auc_table(traces, resamples, seed),
           "budgets": budget_table(traces, cost, resamples, seed), "speculation": spec,
           "cost_model": dict(cost, all_low=cost["low_share_of_high"], head_what_if=head_what_if(cost, spec)),
           "calibrated": calibrated_table(traces, thresholds, cost) if thresholds else None}
    return _clean(out)


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else round(float(x), 6)
    if isinstance(x, np.integer):
        return int(x)
    return x


@dataclass(frozen=True)
class ReplayOptions:
    checkpoint: str
    backend: str = "auto"
    prompts_file: Optional[str] = None
    prompts: int = 12                  # held-out ShareGPT requests when no prompts file is given
    max_new_tokens: int = 96
    resamples: int = 1000
    seed: int = 0
    plots: Optional[str] = None        # folder for the PNG figures
    draft_head: Optional[str] = None   # what the draft reads of a nested head (None: the checkpoint's setting)
    shortlist_k: Optional[int] = None
    draft_vocab: Optional[int] = None  # ids the draft scores, [0, N) (None: the checkpoint's setting)

    def __post_init__(self):
        if self.prompts < 1 or self.max_new_tokens < 2 or self.resamples < 10:
            raise ValueError("need --prompts >= 1, --max-new-tokens >= 2 and --resamples >= 10")


def replay(opts: ReplayOptions) -> dict:
    """Trace the target's greedy trajectories on the prompts, analyse them, optionally draw the figures."""
    from edge.options.prompts import read_prompts
    from edge.llm import LLM
    t0 = time.time()
    prompts = read_prompts(opts.prompts_file) if opts.prompts_file else \
        [(p, True) for p in sharegpt_prompts(opts.prompts)]
    rt = LLM(opts.checkpoint, policy="target", backend=opts.backend, max_context=opts.max_new_tokens + 2048,
             draft_head=opts.draft_head, shortlist_k=opts.shortlist_k, draft_vocab=opts.draft_vocab, meter="none")
    traces = [trace_prompt(rt.engine, rt.encode(p, chat), opts.max_new_tokens, rt.eos) for p, chat in prompts]
    if not any(len(t) for t in traces):
        raise BitNestError("the trajectories hold no decode steps: raise --max-new-tokens")
    traced = time.time() - t0
    out = {"checkpoint": str(rt.ckpt.path), "method": rt.ckpt.method, "rotation": rt.ckpt.manifest["rotation"]["kind"],
           "backend": rt.backend, "max_new_tokens": opts.max_new_tokens,
           "prompt_source": opts.prompts_file or "ShareGPT held-out first user turns (chat template)",
           **analyse(traces, rt.ckpt, thresholds_entry(rt.ckpt, rt.backend), opts.resamples, opts.seed),
           "trace_seconds": round(traced, 1)}
    if opts.plots:
        from edge.analysis.replay.plots import save_plots
        out["plots"] = save_plots(out, traces, Path(opts.plots), prefix=f"replay-{rt.ckpt.method}")
    out["seconds"] = round(time.time() - t0, 1)
    return out
