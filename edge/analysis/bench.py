"""Decode speed on this machine: speculative, target and draft policies on a backend (default `cpu`) against
transformers' own float32 `generate` on the float reference model, on the same real prompts.

    python scripts/bench.py [--checkpoint DIR] [--backend cpu|torch|triton|tensorrt] [--prompts N] [--max-new-tokens N] [--repeats R]
                            [--policy P (repeatable; gate and adaptive options as chat.py)] [--json]

Each figure is the median over repeats of decode-phase tok/s (prefill excluded: for transformers,
(time for N new tokens - time for 1) / (N - 1)); ratios are taken within this one run.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from edge.analysis.calibrate import calibrated_gate
from edge.analysis.corpora import sharegpt_prompts
from edge.backends import BACKENDS
from edge.cli.common import run_cli
from edge.cli.options import (
    adaptive_config,
    add_policy_arguments,
    checkpoint_arg,
    gate_config,
)
from edge.decode.generate import GenerateConfig
from edge.decode.registry import POLICIES
from edge.runtime import Runtime, merged_summary


def hf_tok_s(folder: str, prompts: list[list[int]], n: int) -> float:
    """Median decode tok/s of transformers' greedy generate (float32) over the prompts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rates = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            kw = dict(do_sample=False, pad_token_id=model.config.eos_token_id)
            t0 = time.perf_counter()
            model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
            t1 = time.perf_counter()
            model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
            t2 = time.perf_counter()
            rates.append((n - 1) / ((t2 - t1) - (t1 - t0)))
    return statistics.median(rates)


def profile(rt: Runtime, prompt: list[int], a) -> dict:
    """Where one speculative generation spends its time: the top functions by own time (cProfile)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    rt.generate(prompt, GenerateConfig(policy="speculative", gamma=a.gamma, max_new_tokens=a.max_new_tokens))
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    return {"total_s": round(total, 3),
            "top": [{"function": f"{Path(k[0]).name}:{k[1]}({k[2]})", "calls": v[1], "own_s": round(v[2], 3),
                     "share": round(v[2] / total, 3)} for k, v in rows]}


def bench(a, ckpt: str) -> dict:
    """Decode tok/s (medians over repeats) of each policy and of transformers float32, with their ratios."""
    rt = Runtime(ckpt, backend=a.backend, max_context=a.max_new_tokens + 1024, scratch=max(17, a.gamma_max + 1))
    prompts = [rt.encode(p) for p in sharegpt_prompts(a.prompts)]
    out = {"checkpoint": ckpt, "backend": a.backend, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
           "threads": torch.get_num_threads(), "policies": {}}
    for policy in a.policy or ("speculative", "target", "draft"):
        rates, stats = [], []
        cfg = GenerateConfig(policy=policy, gamma=a.gamma, max_new_tokens=a.max_new_tokens,
                             gate=calibrated_gate(rt, policy, gate_config(a)), adaptive=adaptive_config(a))
        for _ in range(a.repeats):
            run_stats = [rt.generate(p, cfg)["stats"] for p in prompts]
            summary = merged_summary(run_stats)
            rates.append(summary["tok_s"])
            stats = summary
        out["policies"][policy] = {"tok_s_median": statistics.median(rates), "tok_s": rates, "stats": stats}
    hf = [hf_tok_s(rt.ckpt.manifest["source"]["folder"], prompts, a.max_new_tokens) for _ in range(a.repeats)]
    out["hf_fp32"] = {"tok_s_median": statistics.median(hf), "tok_s": hf}
    if a.profile:
        out["profile"] = profile(rt, prompts[0], a)
    tok_s = {k: v["tok_s_median"] for k, v in out["policies"].items()}
    out["ratios"] = {f"{k}_vs_hf_fp32": round(v / out["hf_fp32"]["tok_s_median"], 3) for k, v in tok_s.items()}
    if "target" in tok_s:
        out["ratios"].update({f"{k}_vs_target": round(v / tok_s["target"], 3) for k, v in tok_s.items() if k != "target"})
    return out


def main(argv=None, default_checkpoint=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint")
    p.add_argument("--backend", default="cpu", choices=BACKENDS, help="backend that runs the nested views")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="add a cProfile breakdown of one speculative run")
    p.add_argument("--policy", action="append", choices=POLICIES, help="policy to time (repeatable; default: "
                   "speculative, target, draft)")
    p.add_argument("--json", action="store_true")
    add_policy_arguments(p)
    a = p.parse_args(argv)
    return run_cli(lambda: bench(a, checkpoint_arg(a, default_checkpoint)), a.json, "bench.py")
