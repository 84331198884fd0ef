"""What both modes of `bitnest bench` share (edge.analysis.bench.run at the default model, edge.analysis.bench.shape at a
real model's shapes): the runners' specs, running them each in its own process with interleaved repeats, and the
JSON entries and ratios made from their samples."""

import statistics
from dataclasses import asdict
from pathlib import Path

from edge.analysis.bench.process import Workers
from edge.corpora import sharegpt_prompts
from edge.engine import MAX_PROPOSALS
from edge.options.groups import adaptive_config, draft_head_options, gate_config

MINE = ("speculative", "adaptive", "auto", "target", "draft")
# peer run -> its label in ratio names
RATIO_PEERS = {"target": "target", "llamacpp_q8_0": "llamacpp_q8", "llamacpp_q4_1": "llamacpp_q4_1",
               "llamacpp_q4_k_m": "llamacpp_q4_k_m", "llamacpp_speculative": "llamacpp_speculative",
               "llamacpp_native_q8_0": "llamacpp_native_q8", "llamacpp_native_q4_1": "llamacpp_native_q4_1",
               "llamacpp_native_q4_k_m": "llamacpp_native_q4_k_m", "hf_fp32": "hf_fp32"}
ISOLATION = "process per runner"
STAT_KEYS = ("tokens", "acceptance", "drafted", "tokens_per_round", "weight_bytes_per_token", "kv_bytes_per_token",
             "draft_passes", "target_passes", "policy_stats", "prefill_tokens", "prefill_tok_s", "system_info",
             "tg_depth", "outputs")


def cache_folder() -> Path:
    from edge.cache import cache_root
    return cache_root()


def default_threads() -> int:
    import torch
    return torch.get_num_threads()


def prompt_set(checkpoint: str, n: int) -> tuple[list[str], list[list[int]]]:
    """The first `n` held-out ShareGPT requests and their token ids through the checkpoint's chat template."""
    from edge.model.tokenizer import encode, load_tokenizer
    texts = sharegpt_prompts(n)
    tok = load_tokenizer(Path(checkpoint))
    return texts, [encode(tok, t) for t in texts]


def policy_spec(a, checkpoint: str, policy: str, prompts: list, threads: int, record_rounds: bool = False) -> dict:
    return {"kind": "policy", "threads": threads, "checkpoint": checkpoint, "backend": a.backend, "policy": policy,
            "gamma": a.gamma, "max_new_tokens": a.max_new_tokens, "prompts": prompts,
            "max_context": max(map(len, prompts)) + a.max_new_tokens + 64, "gamma_room": max(MAX_PROPOSALS, a.gamma_max),
            "gate": asdict(gate_config(a)), "adaptive": asdict(adaptive_config(a)), "record_rounds": record_rounds,
            "stop_at_eos": getattr(a, "stop_at_eos", False), **draft_head_options(a)}


def probe_spec(mach: dict) -> dict:
    return {"kind": "probe", "threads": mach["threads"], "nbytes": mach["probe_bytes"]}


def llama_spec(gguf: Path, texts: list[str], n: int, threads: int, draft: Path | None = None, draft_max: int = 4) -> dict:
    """A llama.cpp runner on `gguf`; with `draft`, llama.cpp's own speculation (`draft` proposes up to `draft_max`)."""
    extra = {} if draft is None else {"draft": str(draft), "draft_max": draft_max}
    return {"kind": "llamacpp", "threads": threads, "gguf": str(gguf), "texts": texts, "max_new_tokens": n, **extra}


def native_spec(gguf: Path, prompts: list, n: int, threads: int) -> dict:
    """llama.cpp built for this CPU on `gguf`: pp at the prompts' median length, tg of `n` tokens."""
    from edge.cache import cache_root
    return {"kind": "llamacpp_native", "threads": threads, "gguf": str(gguf),
            "prompt_tokens": int(statistics.median(map(len, prompts))), "max_new_tokens": n, "cache": str(cache_root())}


def run_all(specs: dict, repeats: int, pass_runner: str | None, pass_repeats: int,
            groups: list | None = None) -> tuple[dict, dict, dict | None]:
    """Start every runner of a group in its own process, load them one at a time, interleave `repeats` repeats across
    them, time passes in `pass_runner`'s process, close them, then the next group (`groups`: lists of names, the
    memory plan's; default one group of all): ({name: what it reported on loading}, {name: [results]}, pass times)."""
    loaded, samples, passes = {}, {}, None
    for group in groups or [list(specs)]:
        with Workers(group) as w:
            loaded |= w.load_all({name: specs[name] for name in group})
            samples |= w.interleave(repeats)
            if pass_runner in group:
                passes = dict(w[pass_runner].request("pass_times", repeats=pass_repeats), runner=pass_runner,
                              pid=loaded[pass_runner]["pid"])
    return loaded, samples, passes


def run_entry(runs: list[dict], loaded: dict, read_gbps: float | None) -> dict:
    """One runner's JSON entry: median tok/s and its samples, its pid, the last repeat's statistics, the weight GB/s
    it reached and that over the probe's bandwidth."""
    rates = [r["tok_s"] for r in runs]
    entry = {"tok_s": round(statistics.median(rates), 2), "tok_s_samples": rates, "pid": loaded["pid"]}
    entry.update({k: loaded[k] for k in ("gguf", "mmap", "draft_gguf", "draft_max", "system_info") if k in loaded})
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


def paired_ratios(samples: dict, mine=MINE, peers=RATIO_PEERS) -> dict:
    """The ratios of `ratios` taken repeat by repeat, then their median: {name: {"median", "samples"}}. Repeat r of
    every runner runs before repeat r + 1 of any (Workers.interleave), so a runner's r-th tok/s and a peer's r-th were
    timed seconds apart; on a host whose memory bandwidth a neighbour's traffic moves between repeats (this one's
    probe: 40-78 GB/s within a run), the ratio of two medians can set one runner's fast phase against another's
    slow one, and the paired ratios do not."""
    rates = {name: [r["tok_s"] for r in runs] for name, runs in samples.items()}
    out = {}
    for m in mine:
        for p, label in peers.items():
            if m in rates and p in rates and m != p and len(rates[m]) == len(rates[p]) and all(rates[p]):
                each = [round(a / b, 3) for a, b in zip(rates[m], rates[p])]
                out[f"{m}_vs_{label}"] = {"median": round(statistics.median(each), 3), "samples": each}
    return out


def identical_to_target(runs: dict, lossless=("speculative", "adaptive", "auto")) -> dict:
    """{policy: prompts whose new tokens (their digests, the last repeat's) equal the target's}, for every lossless
    policy the run timed beside the target (the draft's output is its own)."""
    want = runs.get("target", {}).get("outputs")
    if want is None:
        return {}
    return {p: sum(a == b for a, b in zip(runs[p]["outputs"], want)) for p in lossless
            if p in runs and runs[p].get("outputs") is not None}


def pass_ratios(passes: dict, gamma: int) -> dict:
    """What a verification (γ + 1 tokens) and a draft pass cost against a 1-token target pass, from the pass times."""
    ms = passes["ms"]
    verify = ms["target"].get(str(gamma + 1))
    return {"verification_pass_vs_target_pass": None if verify is None else round(verify / ms["target"]["1"], 3),
            "draft_pass_vs_target_pass": round(ms["draft"]["1"] / ms["target"]["1"], 3)}
