"""Decode speed on this machine, in one run: this runtime's policies on a backend (default `auto`: native where it
builds) against llama.cpp on the same model's GGUF (Q4_1 as shipped and a Q8_0 made from it) and transformers'
float32 `generate`, at the same thread count, on the same real prompts, with a read-bandwidth probe of the run.

    bitnest bench [--checkpoint DIR] [--backend B] [--prompts N] [--max-new-tokens N] [--repeats R]
                  [--policy P (repeatable)] [--peer llamacpp|hf|none (repeatable)] [--json]

Every figure is a median over repeats of decode-phase tok/s (prefill excluded; every generation runs exactly
--max-new-tokens tokens, EOS ignored, as llama.cpp's `ignore_eos`); the repeats interleave the runners so that
drift in the machine's speed falls on all of them. Ratios are taken within this run; `*_roofline_fraction` is a
policy's weight bytes per second over the probe's read bandwidth.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from edge.analysis.calibrate import calibrated_gate
from edge.analysis.corpora import sharegpt_prompts
from edge.analysis.peers import LlamaCpp, q8_0_gguf, read_bandwidth, shipped_gguf
from edge.backends import BACKENDS
from edge.cli.common import run_cli
from edge.cli.options import (
    adaptive_config,
    add_policy_arguments,
    checkpoint_arg,
    gate_config,
)
from edge.decode.config import GenerateConfig
from edge.decode.generate import generate
from edge.decode.registry import POLICIES
from edge.runtime import Runtime, merged_summary

PEERS = ("llamacpp", "hf", "none")
DEFAULT_POLICIES = ("target", "speculative", "adaptive", "draft")


def hf_tok_s(model, prompts: list[list[int]], n: int) -> float:
    """Decode tok/s of transformers' greedy generate (float32) over the prompts: (time for n new tokens - time
    for 1) / (n - 1), summed over prompts."""
    kw = dict(do_sample=False, pad_token_id=model.config.eos_token_id)
    seconds = 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
            t1 = time.perf_counter()
            model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
            seconds += (time.perf_counter() - t1) - (t1 - t0)
    return len(prompts) * (n - 1) / seconds


def policy_run(rt: Runtime, prompts: list[list[int]], cfg: GenerateConfig) -> dict:
    """One pass over the prompts with every generation running exactly max_new_tokens tokens (no EOS)."""
    return merged_summary([generate(rt.engine, p, cfg, eos=set())[1] for p in prompts])


PASS_WIDTHS = (1, 2, 3, 4, 5, 8)


def pass_times(rt: Runtime, prompt: list[int], repeats: int = 15) -> dict:
    """Median ms of one pass of W tokens per view, after `prompt` (real passes at its end, not committed): how a
    pass's cost grows with its width, which decides what a verification costs against a single-token step."""
    eng = rt.engine
    eng.reset("pass-times")
    eng.prefill(prompt)
    out = {}
    for view in ("draft", "target"):
        out[view] = {}
        for w in PASS_WIDTHS:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                eng.forward(prompt[-w:], view)
                times.append(time.perf_counter() - t0)
            out[view][str(w)] = round(statistics.median(times) * 1e3, 2)
    return {"context": len(prompt), "ms": out}


def _with_threads(threads: int, fn):
    """`fn` run with torch at `threads` intra-op threads, then torch's count as it was (the native engine keeps
    torch's at one while its own pool runs the step)."""
    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def _runners(a, rt: Runtime, prompts: list[list[int]], texts: list[str], threads: int) -> dict:
    """name -> a function returning one repeat's tok/s (and, for policies, their stats); every peer runs at
    `threads` threads, the count this runtime's step uses."""
    runners = {}
    for policy in a.policy or DEFAULT_POLICIES:
        cfg = GenerateConfig(policy=policy, gamma=a.gamma, max_new_tokens=a.max_new_tokens,
                             gate=calibrated_gate(rt, policy, gate_config(a)), adaptive=adaptive_config(a))
        runners[policy] = lambda cfg=cfg: policy_run(rt, prompts, cfg)
    peers = set(a.peer or ("llamacpp", "hf")) - {"none"}
    if "llamacpp" in peers:
        q41 = shipped_gguf()
        q80 = q8_0_gguf(q41, Path(os.environ.get("BITNEST_CACHE", Path.home() / ".cache" / "bitnest-edge")) / "gguf")
        for name, path in (("llamacpp_q4_1", q41), ("llamacpp_q8_0", q80)):
            llama = LlamaCpp(path, threads)
            runners[name] = lambda llama=llama: {"tok_s": statistics.median(
                llama.decode_tok_s([{"role": "user", "content": t}], a.max_new_tokens) for t in texts)}
    if "hf" in peers:
        from transformers import AutoModelForCausalLM
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model = AutoModelForCausalLM.from_pretrained(rt.ckpt.manifest["source"]["folder"], dtype=torch.float32).eval()
        runners["hf_fp32"] = _with_threads(threads, lambda: {"tok_s": hf_tok_s(model, prompts, a.max_new_tokens)})
    return runners


def bench(a, ckpt: str, command: str = "") -> dict:
    """Medians over interleaved repeats of every runner's decode tok/s, the read probe, and the ratios."""
    threads = torch.get_num_threads()       # before the runtime: the native engine sets torch's own to one
    rt = Runtime(ckpt, backend=a.backend, max_context=a.max_new_tokens + 1024, scratch=max(17, a.gamma_max + 1))
    threads = getattr(rt.engine, "threads", threads)
    texts = sharegpt_prompts(a.prompts)
    prompts = [rt.encode(t) for t in texts]
    runners = _runners(a, rt, prompts, texts, threads)
    samples = {name: [] for name in runners}
    probe_at = _with_threads(threads, read_bandwidth)
    probe = [probe_at()]
    for _ in range(a.repeats):
        for name, run in runners.items():
            samples[name].append(run())
        probe.append(probe_at())
    out = {"command": command, "checkpoint": ckpt, "backend": rt.backend, "isa": getattr(rt.engine, "isa", None),
           "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "gamma": a.gamma,
           "threads": threads, "read_gbps": round(statistics.median(probe), 2),
           "read_gbps_samples": [round(p, 2) for p in probe], "runs": {}}
    for name, runs in samples.items():
        rates = [r["tok_s"] for r in runs]
        entry = {"tok_s": round(statistics.median(rates), 2), "tok_s_samples": rates}
        if "weight_bytes_per_token" in runs[0]:
            last = runs[-1]
            entry.update({k: last[k] for k in ("acceptance", "tokens_per_round", "weight_bytes_per_token",
                                               "kv_bytes_per_token", "draft_passes", "target_passes")})
            gbps = entry["tok_s"] * last["weight_bytes_per_token"] / 1e9
            entry.update(weight_gbps=round(gbps, 2), roofline_fraction=round(gbps / out["read_gbps"], 3))
        out["runs"][name] = entry
    tok = {k: v["tok_s"] for k, v in out["runs"].items()}
    peers = {"target": "target", "llamacpp_q8_0": "llamacpp_q8", "llamacpp_q4_1": "llamacpp_q4_1", "hf_fp32": "hf_fp32"}
    out["ratios"] = {f"{mine}_vs_{label}": round(tok[mine] / tok[peer], 3)
                     for mine in ("speculative", "adaptive", "target", "draft") for peer, label in peers.items()
                     if mine in tok and peer in tok and mine != peer}
    if "target" in out["runs"]:
        out["target_roofline_fraction"] = out["runs"]["target"]["roofline_fraction"]
    out["pass_times"] = pass_times(rt, prompts[0])
    return out


def main(argv=None, default_checkpoint=None) -> int:
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="backend that runs the nested views")
    p.add_argument("--prompts", type=int, default=4, help="held-out ShareGPT requests")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policy", action="append", choices=POLICIES,
                   help=f"policy to time (repeatable; default: {', '.join(DEFAULT_POLICIES)})")
    p.add_argument("--peer", action="append", choices=PEERS, help="peer to time beside them (repeatable; default: "
                   "llamacpp and hf; none: no peer)")
    p.add_argument("--json", action="store_true")
    add_policy_arguments(p)
    a = p.parse_args(argv)
    if a.prompts < 1 or a.repeats < 1 or a.max_new_tokens < 2:
        p.error("--prompts and --repeats must be at least 1, --max-new-tokens at least 2")
    command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    return run_cli(lambda: bench(a, checkpoint_arg(a, default_checkpoint), command.strip()), a.json, "bench.py")
