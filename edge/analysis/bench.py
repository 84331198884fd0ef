"""Decode speed on this machine, in one run and fair: this runtime's policies on a backend (default `auto`: native where
it builds) against llama.cpp on the same model's GGUF (Q4_1 as shipped and a Q8_0 made from it) and transformers'
float32 `generate`, at the same thread count, on the same real prompts, beside a DRAM read probe; with --shape, the
same at a real model's shapes that stream from DRAM (edge.analysis.bench_shape).

    bitnest bench [--checkpoint DIR] [--backend B] [--prompts N] [--max-new-tokens N] [--repeats R] [--threads T]
                  [--policy P (repeatable)] [--peer llamacpp|hf|none (repeatable)] [--pass-repeats N]
                  [--shape smollm2-360m|smollm2-1.7b [--acceptance-from FILE]] [--json]

Every runner (each policy, each peer, the probe) runs in its own fresh process (edge.analysis.bench_process) with the
same threads; each loads its model once and warms up; the repeats interleave the runners, one working at a time, so
drift in the machine's speed falls on all of them. Every figure is a median over repeats of decode-phase tok/s
(prefill excluded; every generation runs exactly --max-new-tokens tokens, EOS ignored, as llama.cpp's `ignore_eos`).
Ratios are taken within this run; `*_roofline_fraction` is a policy's weight bytes per second over the probe's read
bandwidth, the probe's buffer at least 4x the last-level cache (edge.analysis.machine). Pass times per view and width
are measured in the target runner's process after the repeats.
"""

import argparse
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

from edge.analysis.bench_process import Workers
from edge.analysis.corpora import sharegpt_prompts
from edge.analysis.machine import load_average, machine
from edge.analysis.peers import q8_0_gguf, shipped_gguf
from edge.argtypes import Parser, count, gamma
from edge.backends import BACKENDS
from edge.cli.common import run_cli
from edge.cli.options import (
    adaptive_config,
    add_draft_head_arguments,
    add_policy_arguments,
    checkpoint_arg,
    draft_head_options,
    gate_config,
)
from edge.decode.registry import POLICIES
from edge.errors import BitNestError
from edge.memory.model_shapes import MODEL_PRESETS

PEERS = ("llamacpp", "hf", "none")
DEFAULT_POLICIES = ("target", "speculative", "adaptive", "draft", "auto")
MINE = ("speculative", "adaptive", "auto", "target", "draft")
# peer run -> its label in ratio names
RATIO_PEERS = {"target": "target", "llamacpp_q8_0": "llamacpp_q8", "llamacpp_q4_1": "llamacpp_q4_1",
               "hf_fp32": "hf_fp32"}
SHAPES = ("smollm2-360m", "smollm2-1.7b")      # real models that share the default model's tokenizer
ISOLATION = "process per runner"
STAT_KEYS = ("acceptance", "tokens_per_round", "weight_bytes_per_token", "kv_bytes_per_token", "draft_passes",
             "target_passes", "policy_stats")


def cache_folder() -> Path:
    return Path(os.environ.get("BITNEST_CACHE", Path.home() / ".cache" / "bitnest-edge"))


def default_threads() -> int:
    import torch
    return torch.get_num_threads()


def prompt_set(checkpoint: str, n: int) -> tuple[list[str], list[list[int]]]:
    """The first `n` held-out ShareGPT requests and their token ids through the checkpoint's chat template."""
    from edge.runtime import encode, load_tokenizer
    texts = sharegpt_prompts(n)
    tok = load_tokenizer(Path(checkpoint))
    return texts, [encode(tok, t) for t in texts]


def policy_spec(a, checkpoint: str, policy: str, prompts: list, threads: int, record_rounds: bool = False) -> dict:
    return {"kind": "policy", "threads": threads, "checkpoint": checkpoint, "backend": a.backend, "policy": policy,
            "gamma": a.gamma, "max_new_tokens": a.max_new_tokens, "prompts": prompts,
            "max_context": max(map(len, prompts)) + a.max_new_tokens + 64, "scratch": max(17, a.gamma_max + 1),
            "gate": asdict(gate_config(a)), "adaptive": asdict(adaptive_config(a)), "record_rounds": record_rounds,
            **draft_head_options(a)}


def probe_spec(mach: dict) -> dict:
    return {"kind": "probe", "threads": mach["threads"], "nbytes": mach["probe_bytes"]}


def llama_spec(gguf: Path, texts: list[str], n: int, threads: int) -> dict:
    return {"kind": "llamacpp", "threads": threads, "gguf": str(gguf), "texts": texts, "max_new_tokens": n}


def run_all(specs: dict, repeats: int, pass_runner: str | None, pass_repeats: int) -> tuple[dict, dict, dict | None]:
    """Start every runner in its own process, load them one at a time, interleave `repeats` repeats across them, then
    time passes in `pass_runner`'s process: ({name: what it reported on loading}, {name: [results]}, pass times)."""
    with Workers(specs) as w:
        loaded = w.load_all(specs)
        samples = w.interleave(repeats)
        passes = None
        if pass_runner is not None:
            passes = dict(w[pass_runner].request("pass_times", repeats=pass_repeats), runner=pass_runner,
                          pid=loaded[pass_runner]["pid"])
    return loaded, samples, passes


def run_entry(runs: list[dict], loaded: dict, read_gbps: float | None) -> dict:
    """One runner's JSON entry: median tok/s and its samples, its pid, the last repeat's statistics, the weight GB/s
    it reached and that over the probe's bandwidth."""
    rates = [r["tok_s"] for r in runs]
    entry = {"tok_s": round(statistics.median(rates), 2), "tok_s_samples": rates, "pid": loaded["pid"]}
    entry.update({k: loaded[k] for k in ("gguf", "mmap") if k in loaded})
    last = runs[-1]
    entry.update({k: last[k] for k in STAT_KEYS if k in last})
    if last.get("weight_bytes_per_token"):
        gbps = entry["tok_s"] * last["weight_bytes_per_token"] / 1e9
        entry["weight_gbps"] = round(gbps, 2)
        if read_gbps:
            entry["roofline_fraction"] = round(gbps / read_gbps, 3)
    return entry


def probe_entry(samples: list[dict], loaded: dict) -> tuple[float, dict]:
    rates = [s["gbps"] for s in samples]
    med = round(statistics.median(rates), 2)
    return med, {"gbps": med, "gbps_samples": rates, "bytes": loaded["bytes"], "pid": loaded["pid"]}


def ratios(tok: dict, mine=MINE, peers=RATIO_PEERS) -> dict:
    return {f"{m}_vs_{label}": round(tok[m] / tok[p], 3)
            for m in mine for p, label in peers.items() if m in tok and p in tok and m != p}


def pass_ratios(passes: dict, gamma: int) -> dict:
    """What a verification (γ + 1 tokens) and a draft pass cost against a 1-token target pass, from the pass times."""
    ms = passes["ms"]
    verify = ms["target"].get(str(gamma + 1))
    return {"verification_pass_vs_target_pass": None if verify is None else round(verify / ms["target"]["1"], 3),
            "draft_pass_vs_target_pass": round(ms["draft"]["1"] / ms["target"]["1"], 3)}


def bench(a, ckpt: str, command: str = "") -> dict:
    """Medians over interleaved repeats of every runner's decode tok/s, each runner in its own process, the read
    probe, the pass times and the ratios."""
    threads = a.threads or default_threads()
    mach = machine(threads)
    texts, prompts = prompt_set(ckpt, a.prompts)
    policies = a.policy or DEFAULT_POLICIES
    specs = {p: policy_spec(a, ckpt, p, prompts, threads, record_rounds=p == "speculative") for p in policies}
    peers = set(a.peer or ("llamacpp", "hf")) - {"none"}
    if "llamacpp" in peers:
        q41 = shipped_gguf()
        q80 = q8_0_gguf(q41, cache_folder() / "gguf")
        for name, path in (("llamacpp_q4_1", q41), ("llamacpp_q8_0", q80)):
            specs[name] = llama_spec(path, texts, a.max_new_tokens, threads)
    if "hf" in peers:
        from edge.model.checkpoint import read_manifest
        folder = read_manifest(Path(ckpt)).get("source", {}).get("folder")
        if not folder:
            raise BitNestError(f"{ckpt} names no source model folder: --peer hf needs one (or use --peer llamacpp)")
        specs["hf_fp32"] = {"kind": "hf", "threads": threads, "folder": folder, "prompts": prompts,
                            "max_new_tokens": a.max_new_tokens}
    specs["probe"] = probe_spec(mach)
    pass_runner = "target" if "target" in specs else policies[0]
    loaded, samples, passes = run_all(specs, a.repeats, pass_runner, a.pass_repeats)
    mach["load_average_after"] = load_average()
    read_gbps, probe = probe_entry(samples.pop("probe"), loaded["probe"])
    first = loaded[pass_runner]
    out = {"command": command, "checkpoint": ckpt, "backend": first["backend"], "isa": first["isa"],
           **{k: first[k] for k in ("draft_head", "shortlist_k") if k in first}, "isolation": ISOLATION, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
           "gamma": a.gamma, "threads": threads, "machine": mach, "read_gbps": read_gbps,
           "read_gbps_samples": probe["gbps_samples"], "probe": probe, "runs": {}}
    for name, runs in samples.items():
        out["runs"][name] = run_entry(runs, loaded[name], read_gbps)
        if name == "speculative":
            out["runs"][name]["rounds"] = runs[-1]["rounds"]
    out["ratios"] = ratios({k: v["tok_s"] for k, v in out["runs"].items()})
    if "target" in out["runs"]:
        out["target_roofline_fraction"] = out["runs"]["target"].get("roofline_fraction")
    out["pass_times"] = passes
    out["ratios"].update(pass_ratios(passes, a.gamma))
    return out


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bench.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="backend that runs the nested views")
    p.add_argument("--prompts", type=count(), default=4, help="held-out ShareGPT requests")
    p.add_argument("--max-new-tokens", type=count(2), default=64)
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--repeats", type=count(), default=3)
    p.add_argument("--threads", type=count(), help="threads of every runner (default: torch's count here)")
    p.add_argument("--pass-repeats", type=count(), default=15, help="timed passes per view and width (median)")
    p.add_argument("--policy", action="append", choices=POLICIES,
                   help=f"policy to time (repeatable; default: {', '.join(DEFAULT_POLICIES)})")
    p.add_argument("--peer", action="append", choices=PEERS, help="peer to time beside them (repeatable; default: "
                   "llamacpp and hf, with --shape llamacpp; none: no peer)")
    p.add_argument("--shape", help=f"time a synthetic checkpoint of a real model's shapes ({', '.join(SHAPES)}): "
                   "target and draft AR, speculation replayed from the default model's rounds and projected, "
                   "llama.cpp Q8_0 on a GGUF of the same shapes")
    p.add_argument("--acceptance-from", help="with --shape: a bench JSON whose runs.speculative holds the recorded "
                   "rounds (or at least the acceptance) to follow, instead of recording them in this run")
    add_draft_head_arguments(p)
    p.add_argument("--json", action="store_true")
    add_policy_arguments(p)
    return p


def main(argv=None, default_checkpoint=None) -> int:
    a = parser().parse_args(argv)            # the option types refuse counts out of range
    command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)

    def body():
        if a.shape is None:
            if a.acceptance_from:
                raise BitNestError("--acceptance-from goes with --shape")
            return bench(a, checkpoint_arg(a, default_checkpoint), command.strip())
        from edge.analysis.bench_shape import bench_shape
        if a.shape not in SHAPES:
            raise BitNestError(f"unknown shape {a.shape!r}: use one of {', '.join(SHAPES)}")
        return bench_shape(a, MODEL_PRESETS[a.shape], a.shape, checkpoint_arg(a, default_checkpoint), command.strip())
    return run_cli(body, a.json, "bench.py")
