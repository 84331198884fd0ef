"""`bitnest bench --shape NAME --passes-only`: what one pass over 1..8 tokens costs per view at a real model's shapes,
for each R4 layout asked (edge.memory.synthetic.R4_LAYOUTS: the online rule's factors, the legacy rule's, none) on a
synthetic checkpoint with a default export's online rotations. No prompts, peers or acceptance: the question is how a
pass grows with its width (a verification of γ + 1 tokens against a 1-token step) and what a layout adds to it.
Each layout runs in a fresh process of its own, one at a time (two 7B-shaped checkpoints do not fit side by side),
`rounds` times in turn, so drift in the machine's speed falls on every layout; each figure is the median over the
rounds of the runner's medians (edge.analysis.bench_runners.pass_times)."""

import statistics

from edge.analysis.bench_process import Workers
from edge.analysis.machine import load_average, machine
from edge.model.arch import ModelConfig

PROMPT = list(range(100, 164))     # 64 token ids below every preset's vocabulary: the context the passes follow


def synthetic_pass_spec(cfg: ModelConfig, layout: str, backend: str, threads: int, gamma: int) -> dict:
    """A target-mode synthetic runner of `cfg` with R4 `layout` (edge.analysis.bench_runners.SyntheticRunner)."""
    return {"kind": "synthetic", "threads": threads, "config": cfg.to_dict(), "backend": backend, "mode": "target",
            "max_new_tokens": 8, "prompts": [PROMPT], "gamma": gamma, "r4": layout}


def median_passes(samples: list[dict]) -> dict:
    """{view: {width: median ms}} over several pass_times results."""
    first = samples[0]["ms"]
    return {view: {w: round(statistics.median(s["ms"][view][w] for s in samples), 2) for w in widths}
            for view, widths in first.items()}


def bench_passes(cfg: ModelConfig, name: str, layouts: list[str], rounds: int, pass_repeats: int, threads: int,
                 backend: str, gamma: int, command: str = "") -> dict:
    """Pass times per view and width for each R4 layout at `cfg`'s shapes, with the ratios that decide speculation:
    a (γ + 1)-token target pass and a 1-token draft pass against a 1-token target pass."""
    mach = machine(threads)
    samples = {layout: [] for layout in layouts}
    loaded = {}
    for _ in range(rounds):
        for layout in layouts:
            with Workers([layout]) as w:
                loaded[layout] = w[layout].load(**synthetic_pass_spec(cfg, layout, backend, threads, gamma))
                samples[layout].append(w[layout].request("pass_times", repeats=pass_repeats))
    mach["load_average_after"] = load_average()
    out = {}
    for layout, runs in samples.items():
        ms = median_passes(runs)
        t1 = ms["target"]["1"]
        out[layout] = {"r4_factors": loaded[layout].get("r4_factors"), "isa": loaded[layout].get("isa"),
                       "backend": loaded[layout].get("backend"), "pid": loaded[layout]["pid"], "ms": ms,
                       "ms_rounds": [r["ms"] for r in runs],
                       "target_pass_vs_1": {w: round(v / t1, 3) for w, v in ms["target"].items()},
                       "verification_pass_vs_target_pass": round(ms["target"][str(gamma + 1)] / t1, 3),
                       "draft_pass_vs_target_pass": round(ms["draft"]["1"] / t1, 3)}
    return {"command": command, "shape": name, "config": cfg.to_dict(), "gamma": gamma, "threads": threads,
            "rounds": rounds, "pass_repeats": pass_repeats, "context": len(PROMPT),
            "isolation": "process per layout, one at a time", "machine": mach, "layouts": out}
