"""Check that greedy speculative output (fixed γ, adaptive and auto) equals greedy target output, token for token, on
real prompts.

    python scripts/lossless.py [--checkpoint DIR | --model PRESET] [--backend B] [--prompts N] [--code-prompts C]
                               [--max-new-tokens N] [--gamma G] [--reference torch] [--json]

Prompts: N/2 held-out ShareGPT requests (chat template) and N/2 Shakespeare passages (raw continuation), and C coding
requests (held-out ShareGPT, chat template; edge.corpora.code_prompts).
A divergence is reported with the target's top-two logit gap at that step (a float near-tie when < 1e-4).
Also reports, per corpus, the speculative, adaptive and target decode statistics (acceptance, tokens per round,
weight and KV bytes per token, their ratio to the FP16 AR baseline, tok/s).
"""

import sys

import torch

from edge.options.groups import draft_head_options
from edge.corpora import code_prompts, shakespeare_prompts, sharegpt_prompts
from edge.decode.config import GenerateConfig
from edge.engine.stats import draft_head_summary, weight_bytes_per_pass
from edge.llm import LLM
from edge.engine.stats import merged_summary


def top2_gap(rt: LLM, ids: list[int]) -> float:
    """Target logit gap between the best and second-best token after `ids`."""
    rt.engine.reset()
    top = torch.topk(rt.engine.prefill(ids), 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def against_reference(rt: LLM, ref: LLM, runs: list[tuple[list[int], list[int]]]) -> dict:
    """Teacher-forced comparison of `rt`'s target view with `ref`'s (the torch backend: the reference semantics) on
    each prompt plus `rt`'s own greedy output: the share of positions whose argmax agrees and the largest logit
    difference. The backends sum floats in different orders, and a last-bit difference before a per-token INT8
    quantizer can flip a code (docs/runtime.md): agreement is measured, not required."""
    agree = total = 0
    worst = 0.0
    for prompt, out in runs:
        logits = []
        for eng in (rt.engine, ref.engine):
            eng.reset("reference")
            first = eng.prefill(prompt).unsqueeze(0)                                   # [1, V]
            rest = eng.forward(out[:-1], "target") if len(out) > 1 else first[:0]      # [n-1, V]
            logits.append(torch.cat((first, rest)))
        mine, want = logits
        agree += int((mine.argmax(-1) == want.argmax(-1)).sum())
        total += mine.shape[0]
        worst = max(worst, float((mine - want).abs().max()))
    return {"backend": ref.backend, "positions": total, "argmax_agreement": round(agree / total, 4),
            "max_abs_logit_diff": round(worst, 4)}


def lossless(a, ckpt: str) -> dict:
    """Speculative against target greedy output on every prompt, divergences with their logit gaps, and stats."""
    rt = LLM(ckpt, policy="target", backend=a.backend, max_context=a.max_new_tokens + 1024, meter="none",
             **draft_head_options(a))
    half = a.prompts // 2
    prompts = [("sharegpt", p, True) for p in sharegpt_prompts(a.prompts - half)] + \
              [("shakespeare", p, False) for p in shakespeare_prompts(half)] + \
              [("code", p, True) for p in code_prompts(a.code_prompts)]
    policies = ("speculative",) + (("adaptive",) if a.adaptive else ()) + ("auto",)
    same, divergences, outputs = {p: 0 for p in policies}, [], []
    stats = {c: {p: [] for p in ("target",) + policies} for c in ("sharegpt", "shakespeare", "code")}
    for n, (corpus, text, chat) in enumerate(prompts):
        ids = rt.encode(text, chat)
        t_run = rt.generate(ids, config=GenerateConfig(policy="target", max_new_tokens=a.max_new_tokens))
        target = t_run.tokens
        outputs.append((ids, target))
        stats[corpus]["target"].append(t_run.stats)
        for policy in policies:
            run = rt.generate(ids, config=GenerateConfig(policy=policy, gamma=a.gamma, max_new_tokens=a.max_new_tokens))
            stats[corpus][policy].append(run.stats)
            if run.tokens == target:
                same[policy] += 1
                print(f"prompt {n + 1}/{len(prompts)} {policy}: identical ({len(target)} tokens)", file=sys.stderr,
                      flush=True)
                continue
            i = next((j for j, (x, y) in enumerate(zip(run.tokens, target)) if x != y),
                     min(len(target), len(run.tokens)))
            gap = top2_gap(rt, ids + target[:i])
            divergences.append({"policy": policy, "prompt": text[:60], "position": i, "target_top2_gap": gap,
                                "near_tie": gap < 1e-4})
            print(f"{policy}: divergence at token {i} of {text[:40]!r}: top-2 gap {gap:.3g}", file=sys.stderr)
    summaries = {c: {p: _with_fp16_ratio(merged_summary(v)) for p, v in d.items() if v} for c, d in stats.items()}
    per_pass = {v: weight_bytes_per_pass(rt.ckpt, v) for v in ("draft", "target")}       # one-token passes
    out = {"checkpoint": ckpt, "backend": rt.backend, "isa": getattr(rt.engine, "isa", None), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
           "gamma": a.gamma, **draft_head_summary(rt.ckpt), "weight_bytes_per_pass": per_pass,
           "identical": same["speculative"], "identical_by_policy": same, "divergences": divergences,
           "lossless": all(d["near_tie"] for d in divergences), "stats": summaries}
    if a.reference != "none" and a.reference != rt.backend:
        ref = LLM(ckpt, policy="target", backend=a.reference, max_context=a.max_new_tokens + 1024, meter="none",
                  **draft_head_options(a))
        out["reference"] = against_reference(rt, ref, outputs)
    return out


def _with_fp16_ratio(summary: dict) -> dict:
    """`summary` with weight_bytes_vs_fp16: weight bytes per token over the FP16 AR baseline's."""
    fp16 = summary.get("fp16_weight_bytes_per_token")
    w = summary.get("weight_bytes_per_token")
    return dict(summary, weight_bytes_vs_fp16=round(w / fp16, 4) if w and fp16 else None)
