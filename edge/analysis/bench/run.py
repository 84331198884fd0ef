"""Decode speed on this machine, in one run and fair: this runtime's policies on a backend (default `auto`: native where
it builds) against llama.cpp on the same model's GGUF (--peer llamacpp: the `xllamacpp` wheel, built for AVX2, its
ggml features recorded, on the file as shipped and on a Q8_0 this project re-quantizes from it; --peer
llamacpp-native: llama.cpp built for this CPU, edge.analysis.bench.llamacpp, on the same two files; --peer
llamacpp-speculative, only when asked: the wheel's own draft-model speculation, the Q8_0 verifying and the shipped
4-bit file of the same model drafting) and transformers' float32 `generate`, at the same thread count, on the same
real prompts, beside a DRAM read probe; with --shape, the same at a real model's shapes that stream from DRAM
(edge.analysis.bench.shape). The headline is fixed before the run: `auto` (the default policy) against each llama.cpp
peer's two files, paired by repeat.

    bitnest bench [--checkpoint DIR] [--backend B] [--prompts N] [--max-new-tokens N] [--repeats R] [--threads T]
                  [--policy P (repeatable)] [--peer llamacpp|llamacpp-native|llamacpp-speculative|hf|none
                  (repeatable)] [--pass-repeats N]
                  [--shape NAME [--acceptance-from FILE]] [--json]
    bitnest bench --shape NAME --passes-only [--r4 online|legacy|none (repeatable)] [--rounds N] [--pass-repeats N]
                  [--prefill N] [--peer llamacpp-native] [--draft-head H] [--draft-vocab N]

Every runner (each policy, each peer, the probe) runs in its own fresh process (edge.analysis.bench.process) with the
same threads; each loads its model once and warms up; the repeats interleave the runners, one working at a time, so
drift in the machine's speed falls on all of them. Every figure is a median over repeats of decode-phase tok/s
(prefill excluded; every generation runs exactly --max-new-tokens tokens, EOS ignored, as llama.cpp's `ignore_eos`;
with --stop-at-eos this runtime's policies stop at the model's end of text, as a user's answer does: past it a model
writes what it would never be asked for, which can flatter speculation's acceptance; the peers still ignore it).
Ratios are taken within this run; `*_roofline_fraction` is a policy's weight bytes per second over the probe's read
bandwidth, the probe's buffer at least 4x the last-level cache (edge.analysis.bench.machine). Pass times per view and width
are measured in the target runner's process after the repeats. Each policy's prefill tok/s (its prompts' prefill,
timed apart from decode) is in its run's entry, llama-bench's pp beside it. With --passes-only, the pass times and a
prefill of --prefill tokens alone at a shape, per R4 layout, beside native llama.cpp's pp and tg on GGUFs of the same
shapes (edge.analysis.bench.passes).
"""

import sys
from pathlib import Path

from edge.analysis.bench.common import (
    ISOLATION,
    RATIO_PEERS,
    cache_folder,
    native_spec,
    default_threads,
    identical_to_target,
    llama_spec,
    paired_ratios,
    pass_ratios,
    policy_spec,
    probe_entry,
    probe_spec,
    prompt_set,
    ratios,
    run_all,
    run_entry,
)
from edge.analysis.bench.memory import MiB, memory_plan
from edge.analysis.bench.machine import load_average, machine
from edge.analysis.bench.peers import q8_0_gguf, quant_label, source_gguf
from edge.errors import BitNestError
from edge.model.manifest import read_manifest
from edge.memory.model_shapes import BENCH_SHAPES

PEERS = ("llamacpp", "llamacpp-native", "llamacpp-speculative", "hf", "none")
# llama.cpp's own draft-model speculation drafts with the same model's shipped 4-bit file: a configuration nobody would
# choose (the draft costs half the target's pass), run only when asked and never in a headline
SPECULATIVE_PEER = "llamacpp_speculative"
DEFAULT_POLICIES = ("target", "speculative", "adaptive", "draft", "auto")
SHAPES = BENCH_SHAPES
def bench(a, ckpt: str, command: str = "") -> dict:
    """Medians over interleaved repeats of every runner's decode tok/s, each runner in its own process, the read
    probe, the pass times and the ratios."""
    threads = a.threads or default_threads()
    mach = machine(threads)
    texts, prompts = prompt_set(ckpt, a.prompts)
    policies = a.policy or DEFAULT_POLICIES
    specs = {p: policy_spec(a, ckpt, p, prompts, threads, record_rounds=p == "speculative") for p in policies}
    peers = set(a.peer or ("llamacpp", "hf")) - {"none"}
    manifest = read_manifest(Path(ckpt))
    if "llamacpp" in peers:
        shipped = source_gguf(manifest)
        q80 = q8_0_gguf(shipped, cache_folder() / "gguf")
        for name, path in ((f"llamacpp_{quant_label(shipped)}", shipped), ("llamacpp_q8_0", q80)):
            specs[name] = llama_spec(path, texts, a.max_new_tokens, threads)
    if "llamacpp-speculative" in peers:   # the Q8_0 verifies, the shipped GGUF (the same model at 4 bits) drafts
        shipped = source_gguf(manifest)
        specs[SPECULATIVE_PEER] = llama_spec(q8_0_gguf(shipped, cache_folder() / "gguf"), texts, a.max_new_tokens,
                                             threads, draft=shipped, draft_max=a.gamma)
    if "llamacpp-native" in peers:     # built once per machine before any timing (minutes)
        from edge.analysis.bench.llamacpp import ensure_built
        ensure_built(cache_folder())
        shipped = source_gguf(manifest)
        for name, path in ((f"llamacpp_native_{quant_label(shipped)}", shipped),
                           ("llamacpp_native_q8_0", q8_0_gguf(shipped, cache_folder() / "gguf"))):
            specs[name] = native_spec(path, prompts, a.max_new_tokens, threads)
    if "hf" in peers:
        folder = manifest.get("source", {}).get("folder")
        if not folder:
            raise BitNestError(f"{ckpt} names no source model folder: --peer hf needs one (or use --peer llamacpp)")
        weights = any(Path(folder).glob("*.safetensors"))   # a GGUF source's folder holds its config and tokenizer
        specs["hf_fp32"] = {"kind": "hf", "threads": threads, "folder": folder, "prompts": prompts,
                            "max_new_tokens": a.max_new_tokens,
                            "gguf": None if weights else str(source_gguf(manifest))}
    specs["probe"] = probe_spec(mach)
    plan = memory_plan(_plan_order(specs, policies), ckpt, a.memory_mib and a.memory_mib * MiB)
    for name, why in plan["skipped"].items():
        print(f"bench.py: skipped {name}: {why}", file=sys.stderr)
        del specs[name]
    if len(plan["groups"]) > 1:
        print(f"bench.py: the runners do not fit in memory together: {len(plan['groups'])} groups, one after another "
              "(their repeats interleave within a group only)", file=sys.stderr)
    policies = [p for p in policies if p in specs]
    pass_runner = "target" if "target" in specs else policies[0]
    loaded, samples, passes = run_all(specs, a.repeats, pass_runner, a.pass_repeats, plan["groups"])
    mach["load_average_after"] = load_average()
    plan["peak_rss_after_load"] = {name: loaded[name].get("peak_rss_bytes") for name in loaded}   # planned vs seen
    read_gbps, probe = probe_entry(samples.pop("probe"), loaded["probe"])
    first = loaded[pass_runner]
    out = {"command": command, "checkpoint": ckpt, "backend": first["backend"], "isa": first["isa"],
           **{k: first[k] for k in ("draft_head", "shortlist_k", "draft_vocab") if k in first}, "isolation": ISOLATION,
           "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "stop_at_eos": a.stop_at_eos,
           "repeats": a.repeats,
           "gamma": a.gamma, "threads": threads, "machine": mach, "read_gbps": read_gbps,
           "read_gbps_samples": probe["gbps_samples"], "probe": probe, "memory_plan": plan, "runs": {}}
    for name, runs in ((n, samples[n]) for n in specs if n in samples):     # the runners in the order asked
        out["runs"][name] = run_entry(runs, loaded[name], read_gbps)
        if name == "speculative":
            out["runs"][name]["rounds"] = runs[-1]["rounds"]
    out["identical_to_target"] = identical_to_target(out["runs"])     # prompts, of out["prompts"]
    tok = {k: v["tok_s"] for k, v in out["runs"].items()}
    out["ratios"] = ratios(tok)
    out["paired_ratios"] = paired_ratios(samples)
    best = max((p for p in policies if p in tok and p != "draft"), key=tok.get, default=None)   # the draft is lossy
    if best and "llamacpp_q8_0" in tok:    # chosen after the run from noisy medians: reported, never the headline
        out["ratios"]["best_policy_vs_llamacpp_q8"] = round(tok[best] / tok["llamacpp_q8_0"], 3)
        out["best_policy"] = best
    out["headline"] = headline(out, "auto" if "auto" in tok else "target")
    if "target" in out["runs"]:
        out["target_roofline_fraction"] = out["runs"]["target"].get("roofline_fraction")
    out["pass_times"] = passes
    out["ratios"].update(pass_ratios(passes, a.gamma))
    return out


def _plan_order(specs: dict, policies) -> dict:
    """The runners in the order the memory plan places them: the probe, the headline policy (`auto`, else the
    target) and llama.cpp's runs it is paired with, the other policies, then transformers (the largest)."""
    lead = "auto" if "auto" in policies else "target"
    rank = lambda n: (n != "probe", n != lead, not n.startswith("llamacpp"), n == "hf_fp32")
    return {name: specs[name] for name in sorted(specs, key=rank)}


def headline(out: dict, policy: str) -> dict:
    """The figures a summary leads with: one policy fixed before the run (the default `auto`, else the target)
    against each llama.cpp peer of the run (the shipped file's own quantization and the Q8_0 made from it), paired by
    repeat (median of the per-repeat ratios) and as the ratio of medians."""
    peers = {run: label for run, label in RATIO_PEERS.items()
             if run.startswith("llamacpp_") and run != SPECULATIVE_PEER and run in out["runs"]}
    return {"policy": policy, "tok_s": out["runs"][policy]["tok_s"] if policy in out["runs"] else None,
            "vs": {label: {"paired": out["paired_ratios"].get(f"{policy}_vs_{label}", {}).get("median"),
                           "medians": out["ratios"].get(f"{policy}_vs_{label}")} for run, label in peers.items()}}
