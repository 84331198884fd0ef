"""`bitnest bench --shape NAME --passes-only`: what one pass over 1..8 tokens costs per view at a real model's shapes,
for each R4 layout asked (edge.memory.synthetic.R4_LAYOUTS: the online rule's factors, the legacy rule's, none) on a
synthetic checkpoint with a default export's online rotations, and what a prefill of `prefill` tokens costs. No
prompts or acceptance: the question is how a pass grows with its width (a verification of γ + 1 tokens against a
1-token step), what a layout adds to it, and how the bare passes compare with llama.cpp built for this CPU
(edge.analysis.bench.llamacpp: `llama-bench` pp and tg on a GGUF of the same shapes, Q8_0 and Q4_K_M, each in its own
process; llama-bench's tg times bare decode passes as a 1-token target pass is timed here, no sampler on either side).
Each layout runs in a fresh process of its own, one at a time (two 7B-shaped checkpoints do not fit side by side),
`rounds` times in turn with the peer's runs between, so drift in the machine's speed falls on every runner; each
figure is the median over the rounds of the runner's medians (edge.analysis.bench.runners.pass_times)."""

import statistics

from edge.analysis.bench.common import probe_spec
from edge.analysis.bench.process import Workers
from edge.analysis.bench.machine import load_average, machine
from edge.model.arch import ModelConfig

PROMPT = list(range(100, 164))     # 64 token ids below every preset's vocabulary: the context the passes follow


NATIVE_QUANTS = ("q8_0", "q4_k_m")
DECODE_TOKENS = 64                 # llama-bench's tg test: tokens generated after PROMPT's length of context


def synthetic_pass_spec(cfg: ModelConfig, layout: str, backend: str, threads: int, gamma: int,
                        min_capacity: int = 0, draft: dict | None = None) -> dict:
    """A target-mode synthetic runner of `cfg` with R4 `layout` (edge.analysis.bench.runners.SyntheticRunner) and
    the draft-head options `draft` (edge.options.groups.draft_head_options; None: the head an export of a model from its
    own files records, edge.model.draft_head.DRAFT_HEAD_SOURCE_DEFAULT)."""
    return {"kind": "synthetic", "threads": threads, "config": cfg.to_dict(), "backend": backend, "mode": "target",
            "max_new_tokens": 8, "prompts": [PROMPT], "gamma": gamma, "r4": layout, "min_capacity": min_capacity,
            **(draft or {})}


def native_ggufs(cfg: ModelConfig, name: str, cache) -> dict:
    """{quant: GGUF of `cfg`'s shapes}: the synthetic Q8_0 and a Q4_K_M made from it by llama.cpp's own quantizer."""
    from edge.analysis.bench.llamacpp import quantized
    from edge.analysis.bench.peers import shipped_gguf
    from edge.analysis.bench.synthetic_gguf import synthetic_gguf
    q8 = synthetic_gguf(cfg, name, shipped_gguf(), cache / "gguf")
    return {"q8_0": q8, "q4_k_m": quantized(cache, q8, "Q4_K_M")}


def native_round(tool, ggufs: dict, threads: int, prefill: int) -> dict:
    """One llama-bench process per quantization: pp `prefill` and tg DECODE_TOKENS after PROMPT's context."""
    from edge.analysis.bench.llamacpp import llama_bench, system_info, test_rate
    out = {}
    for quant, gguf in ggufs.items():
        pp = llama_bench(tool, gguf, threads, prompt=prefill)
        tg = llama_bench(tool, gguf, threads, gen=DECODE_TOKENS, depth=len(PROMPT))
        out[quant] = {"pp": test_rate(pp, "pp"), "tg": test_rate(tg, "tg"), "system_info": system_info(tg)}
    return out


def median_passes(samples: list[dict]) -> dict:
    """{view: {width: median ms}} over several pass_times results."""
    first = samples[0]["ms"]
    return {view: {w: round(statistics.median(s["ms"][view][w] for s in samples), 2) for w in widths}
            for view, widths in first.items()}


def bench_passes(cfg: ModelConfig, name: str, layouts: list[str], rounds: int, pass_repeats: int, threads: int,
                 backend: str, gamma: int, command: str = "", prefill: int = 0, native: bool = False,
                 cache=None, draft: dict | None = None) -> dict:
    """Pass times per view and width for each R4 layout at `cfg`'s shapes, with the ratios that decide speculation:
    a (γ + 1)-token target pass and a 1-token draft pass against a 1-token target pass; with `prefill`, a prefill of
    that many tokens; with `native`, llama.cpp built for this CPU on GGUFs of the same shapes, and the ratios of the
    1-token target pass rate and the prefill against its tg and pp. `draft`: the draft head's options (a shortlist
    head, a draft vocabulary), which change the draft pass only."""
    tool = ggufs = None
    if native:                         # built and written before any timing (minutes, once per machine)
        from edge.analysis.bench.llamacpp import ensure_built
        tool = ensure_built(cache)
        ggufs = native_ggufs(cfg, name, cache)
    mach = machine(threads)
    samples = {layout: [] for layout in layouts}
    prefills = {layout: [] for layout in layouts}
    peer, probe = [], []
    loaded = {}
    for _ in range(rounds):
        with Workers(["probe"]) as w:           # the DRAM read roofline, in its own process, each round
            w["probe"].load(**probe_spec(mach))
            probe.append(w["probe"].request("run")["gbps"])
        for layout in layouts:
            with Workers([layout]) as w:
                spec = synthetic_pass_spec(cfg, layout, backend, threads, gamma, prefill + 1, draft)
                loaded[layout] = w[layout].load(**spec)
                samples[layout].append(w[layout].request("pass_times", repeats=pass_repeats))
                if prefill:
                    prefills[layout].append(w[layout].request("prefill_times", tokens=prefill))
        if native:
            peer.append(native_round(tool, ggufs, threads, prefill or 512))
    mach["load_average_after"] = load_average()
    read_gbps = round(statistics.median(probe), 2)
    native_out = native_entry(peer, ggufs) if native else None
    out = {}
    for layout, runs in samples.items():
        ms = median_passes(runs)
        t1 = ms["target"]["1"]
        out[layout] = {"r4_factors": loaded[layout].get("r4_factors"), "isa": loaded[layout].get("isa"),
                       "backend": loaded[layout].get("backend"), "pid": loaded[layout]["pid"], "ms": ms,
                       **{k: loaded[layout][k] for k in ("draft_head", "shortlist_k", "draft_vocab")
                          if k in loaded[layout]},
                       "ms_rounds": [r["ms"] for r in runs],
                       "target_pass_vs_1": {w: round(v / t1, 3) for w, v in ms["target"].items()},
                       "verification_pass_vs_target_pass": round(ms["target"][str(gamma + 1)] / t1, 3),
                       "draft_pass_vs_target_pass": round(ms["draft"]["1"] / t1, 3),
                       "target_pass_tok_s": round(1e3 / t1, 2),
                       "target_pass_gbps": round(loaded[layout]["target_bytes"] / t1 / 1e6, 2)}
        out[layout]["target_roofline_fraction"] = round(out[layout]["target_pass_gbps"] / read_gbps, 3)
        if prefill:
            pp = statistics.median(r["tok_s"] for r in prefills[layout])
            out[layout]["prefill"] = {"tokens": prefill, "tok_s": round(pp, 2),
                                      "tok_s_rounds": [r["tok_s"] for r in prefills[layout]]}
        if native_out:
            out[layout]["vs_llamacpp_native"] = native_ratios(out[layout], native_out)
    return {"command": command, "shape": name, "config": cfg.to_dict(), "gamma": gamma, "threads": threads,
            "rounds": rounds, "pass_repeats": pass_repeats, "context": len(PROMPT),
            "isolation": "process per layout, one at a time; llama-bench in a process per test",
            "machine": mach, "read_gbps": read_gbps, "read_gbps_rounds": probe, "layouts": out,
            "llamacpp_native": native_out}


def native_entry(rounds: list[dict], ggufs: dict) -> dict:
    """Per quantization: the median over rounds of llama-bench's pp and tg tok/s, the samples, its build."""
    out = {}
    for quant in ggufs:
        pp = [r[quant]["pp"]["tok_s"] for r in rounds]
        tg = [r[quant]["tg"]["tok_s"] for r in rounds]
        out[quant] = {"gguf": ggufs[quant].name, "pp_tokens": rounds[0][quant]["pp"]["tokens"],
                      "pp_tok_s": round(statistics.median(pp), 2), "pp_tok_s_rounds": pp,
                      "tg_tokens": rounds[0][quant]["tg"]["tokens"], "tg_depth": rounds[0][quant]["tg"]["depth"],
                      "tg_tok_s": round(statistics.median(tg), 2), "tg_tok_s_rounds": tg,
                      "system_info": rounds[0][quant]["system_info"]}
    return out


def native_ratios(layout: dict, native: dict) -> dict:
    """The 1-token target pass rate against llama-bench's tg, the prefill against its pp, per quantization."""
    out = {}
    for quant, n in native.items():
        out[f"target_vs_{quant}_tg"] = round(layout["target_pass_tok_s"] / n["tg_tok_s"], 3)
        if "prefill" in layout:
            out[f"prefill_vs_{quant}_pp"] = round(layout["prefill"]["tok_s"] / n["pp_tok_s"], 3)
    return out
