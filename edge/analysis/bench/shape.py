"""`bitnest bench --shape NAME`: the memory-bound regime, measured at a real model's shapes that this machine's cache
cannot hold (edge.memory.model_shapes.BENCH_SHAPES). A synthetic nested checkpoint of those shapes (random planes and a
default export's online rotations, built in each runner's process) gives pass times per view and width and target and
draft AR tok/s; llama.cpp decodes a GGUF of the same shapes (random Q8_0 blocks, the model's architecture, biases and
head, the default model's tokenizer padded to the shape's vocabulary: edge.analysis.bench.synthetic_gguf); the read probe
gives the DRAM roofline. Random weights have no meaningful acceptance, so speculation is **replayed** (real passes, the
accept/reject decisions of rounds recorded on the default model at the same γ on the same prompts: in this run, or
from --acceptance-from FILE) and **projected** from the pass times and the real model's acceptance
(edge.analysis.bench.replay). Every runner in its own process, same threads, repeats interleaved."""

import json
from pathlib import Path

from edge.analysis.bench.common import (
    ISOLATION,
    cache_folder,
    default_threads,
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
from edge.analysis.bench.process import Workers
from edge.analysis.bench.replay import alpha_from_tokens_per_round, judged_acceptance, projected
from edge.analysis.bench.machine import load_average, machine
from edge.analysis.bench.peers import shipped_gguf
from edge.options.groups import draft_head_options
from edge.errors import BitNestError
from edge.model.arch import ModelConfig

SHAPE_RUNS = {"target": "target", "draft": "draft", "speculative_replayed": "replay"}   # run name -> synthetic mode


def recorded_acceptance(a, checkpoint: str, prompts: list, threads: int) -> dict:
    """Per-prompt rounds [[drafted, accepted], ...] of the real model's speculative policy at --gamma on `prompts`,
    recorded in its own process (one untimed repeat), with the acceptance and tokens per round they give."""
    spec = policy_spec(a, checkpoint, "speculative", prompts, threads, record_rounds=True)
    with Workers(["acceptance"]) as w:
        loaded = w["acceptance"].load(**spec)
        run = w["acceptance"].request("run")
    return {"source": "this run", "checkpoint": checkpoint, "gamma": a.gamma, "acceptance": run["acceptance"],
            "judged_acceptance": judged_acceptance(run["rounds"]), "tokens_per_round": run["tokens_per_round"],
            "rounds": run["rounds"], "pid": loaded["pid"]}


def acceptance_from(path: str, a, prompts: list) -> dict:
    """The recorded acceptance of an earlier bench JSON (runs.speculative): its rounds where it holds them for the same
    prompts and γ (a replay follows them), else its acceptance alone (a projection only)."""
    try:
        d = json.loads(Path(path).read_text())
        spec = d["runs"]["speculative"]
        alpha = float(spec["acceptance"])
    except FileNotFoundError:
        raise BitNestError(f"--acceptance-from {path}: no such file") from None
    except (ValueError, KeyError, TypeError):
        raise BitNestError(f"--acceptance-from {path}: not a bench JSON with runs.speculative.acceptance") from None
    if d.get("gamma") != a.gamma:
        raise BitNestError(f"--acceptance-from {path}: recorded at γ = {d.get('gamma')}, not --gamma {a.gamma}")
    rounds = spec.get("rounds")
    same = rounds is not None and d.get("prompts") == len(prompts) and d.get("max_new_tokens") == a.max_new_tokens
    return {"source": str(path), "checkpoint": d.get("checkpoint"), "gamma": a.gamma, "acceptance": alpha,
            "judged_acceptance": judged_acceptance(rounds), "tokens_per_round": spec.get("tokens_per_round"),
            "rounds": rounds if same else None}


def projection_alpha(acc: dict, gamma: int) -> tuple[float, str]:
    """(α, what it is) for the projection: the judged acceptance of the recorded rounds; without rounds, the one
    the recorded tokens per round imply (`alpha_from_tokens_per_round`); only without either, accepted / drafted
    (below the judged acceptance the formula means, so the projection reads low)."""
    if acc.get("judged_acceptance") is not None:
        return acc["judged_acceptance"], "accepted / judged"
    if acc.get("tokens_per_round"):
        return alpha_from_tokens_per_round(acc["tokens_per_round"], gamma), \
            "accepted / judged, solved from the recorded tokens per round (no rounds recorded)"
    return acc["acceptance"], "accepted / drafted (no rounds recorded: below the judged acceptance the formula means)"


def synthetic_spec(a, cfg: ModelConfig, mode: str, prompts: list, threads: int, rounds=None) -> dict:
    return {"kind": "synthetic", "threads": threads, "config": cfg.to_dict(), "backend": a.backend, "mode": mode,
            "max_new_tokens": a.max_new_tokens, "prompts": prompts, "gamma": a.gamma, "rounds": rounds,
            **draft_head_options(a)}


def bench_shape(a, cfg: ModelConfig, name: str, checkpoint: str, command: str = "") -> dict:
    """Every runner at `cfg`'s shapes, interleaved, each in its own process; replayed and projected speculation; the
    ratios against target AR and llama.cpp Q8_0."""
    if a.policy:
        raise BitNestError("--shape times target and draft AR and replays speculation: leave out --policy")
    peers = set(a.peer or ("llamacpp",)) - {"none"}
    if "hf" in peers:
        raise BitNestError("--shape has no transformers peer (no float model of those shapes): use --peer llamacpp")
    if peers - {"llamacpp"}:           # never dropped in silence
        raise BitNestError(f"--shape decodes beside the llamacpp wheel only, not --peer {sorted(peers - {'llamacpp'})[0]}:"
                           " llama.cpp built for this CPU times the same shapes with --passes-only --peer llamacpp-native")
    if "llamacpp" in peers:            # refused before any work (the acceptance recording takes minutes)
        from edge.analysis.bench.synthetic_gguf import synthetic_gguf_problem
        problem = synthetic_gguf_problem(cfg, shipped_gguf())
        if problem:
            raise BitNestError(f"--shape {name}: no llama.cpp peer ({problem}): use --peer none, or --passes-only")
    threads = a.threads or default_threads()
    mach = machine(threads)
    texts, prompts = prompt_set(checkpoint, a.prompts)
    if max(max(p) for p in prompts) >= cfg.vocab_size:
        raise BitNestError(f"the prompts' token ids pass the shape's vocabulary ({cfg.vocab_size})")
    acc = acceptance_from(a.acceptance_from, a, prompts) if a.acceptance_from else \
        recorded_acceptance(a, checkpoint, prompts, threads)
    method = "replayed" if acc["rounds"] else "projected"
    specs = {run: synthetic_spec(a, cfg, mode, prompts, threads, acc["rounds"]) for run, mode in SHAPE_RUNS.items()
             if mode != "replay" or method == "replayed"}
    gguf = None
    if "llamacpp" in peers:
        from edge.analysis.bench.synthetic_gguf import synthetic_gguf
        gguf = synthetic_gguf(cfg, name, shipped_gguf(), cache_folder() / "gguf")
        specs["llamacpp_q8_0"] = llama_spec(gguf, texts, a.max_new_tokens, threads)
    specs["probe"] = probe_spec(mach)
    loaded, samples, passes = run_all(specs, a.repeats, "target", a.pass_repeats)
    mach["load_average_after"] = load_average()
    read_gbps, probe = probe_entry(samples.pop("probe"), loaded["probe"])
    runs = {run: run_entry(s, loaded[run], read_gbps) for run, s in samples.items()}
    alpha, kind = projection_alpha(acc, a.gamma)
    proj = dict(projected(passes["ms"], alpha), gamma=a.gamma, alpha_kind=kind)
    proj["speculative_tok_s"] = proj["tok_s_by_gamma"][str(a.gamma)]
    tok = {k: v["tok_s"] for k, v in runs.items()}
    r = ratios(tok, mine=("target", "draft", "speculative_replayed"))
    r["projected_speculative_vs_target"] = proj["vs_target_by_gamma"][str(a.gamma)]
    r["projected_best_gamma_vs_target"] = proj["vs_target_by_gamma"][str(proj["best_gamma"])]
    if method == "replayed":
        r["replayed_speculative_vs_target"] = r.pop("speculative_replayed_vs_target")
    if "llamacpp_q8_0" in tok:
        r["target_vs_llamacpp_q8"] = round(tok["target"] / tok["llamacpp_q8_0"], 3)
        if method == "projected":        # no replay ran: the projection's speed against the peer
            r["projected_speculative_vs_llamacpp_q8"] = round(proj["speculative_tok_s"] / tok["llamacpp_q8_0"], 3)
    r.update(pass_ratios(passes, a.gamma))
    out = {"command": command, "shape": name, "config": cfg.to_dict(), "checkpoint": checkpoint,
           "backend": loaded["target"]["backend"], "isa": loaded["target"]["isa"],
           **{k: loaded["target"][k] for k in ("draft_head", "shortlist_k", "draft_vocab", "r4_factors")
              if k in loaded["target"]},
           "isolation": ISOLATION,
           "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "gamma": a.gamma,
           "threads": threads, "machine": mach, "read_gbps": read_gbps, "read_gbps_samples": probe["gbps_samples"],
           "probe": probe, "speculative_method": method,
           "acceptance_source": {k: v for k, v in acc.items() if k != "rounds"} | {
               "rounds": sum(len(x) for x in acc["rounds"]) if acc["rounds"] else None,
               "borrowed": f"recorded on {acc.get('checkpoint') or 'another model'}, a real model: this shape's "
                           "random weights have no acceptance of their own, so its speculation is "
                           f"{method} with that model's"},
           "runs": runs, "projection": proj, "gguf": None if gguf is None else gguf.name,
           "pass_times": passes}
    out["ratios"] = r                  # no "best policy": the best of noisy medians picked after the run flatters
    out["paired_ratios"] = paired_ratios(samples, mine=("target", "draft", "speculative_replayed"))
    out["target_roofline_fraction"] = runs["target"].get("roofline_fraction")
    return out
