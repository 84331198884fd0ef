"""Live comparison of every decoding policy on one task the shipped data allow: reproduce the target's
greedy continuation of held-out ShareGPT requests (exact match of the first K tokens, and the share of
tokens before the first departure), with bytes per token, escalation rate, paired bootstrap differences
and exact McNemar tests against `target` and against `draft`; for every gate, how often its low and its
escalated steps leave the target's choice on the gate's own history. The phase gate runs on a second prompt
set whose continuations contain a closing tag (edge/analysis/phase_prompts.py); `--speculation-sweep` compares
adaptive speculation with fixed γ."""

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch

from edge.analysis.calibrate import calibrated_gate
from edge.corpora import sharegpt_prompts
from edge.analysis.phase_prompts import TAG, phase_prompts
from edge.analysis.significance import mcnemar_exact, paired_bootstrap_diff
from edge.decode.adaptive import AdaptiveConfig
from edge.decode.config import GateConfig, GenerateConfig
from edge.engine import MAX_PROPOSALS
from edge.engine.kv_cache import KV8
from edge.llm import LLM, Answer
from edge.engine.stats import merged_summary

# The repaired gate (margin signal) and its two controls at its realised rate: random steps escalated with one
# target pass, and random steps escalated with the same repair pass.
REPAIR, REPAIR_RANDOM, REPAIR_RANDOM_REPAIRED = "gate-repair", "gate-random@repair", "gate-random-repair"
STAT_KEYS = ("acceptance", "tokens_per_round", "escalation_rate", "weight_bytes_per_token", "kv_bytes_per_token",
             "tok_s", "draft_passes", "target_passes")


@dataclass(frozen=True)
class CompareOptions:
    checkpoint: str
    backend: str = "auto"
    prompts: int = 24
    max_new_tokens: int = 24
    match_tokens: int = 8              # the binary outcome: the first K tokens equal the target's
    phase_prompts: int = 12
    phase_tokens: int = 48
    rate: float = 0.15                 # calibrated escalation rate of the entropy, margin and lagged gates
    gamma: int = 4
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    resamples: int = 2000
    seed: int = 0
    speculation_sweep: bool = False
    phase_tag: str = TAG               # the closing tag of the phase set and of gate-phase
    draft_head: str | None = None      # what the draft reads of a nested head (None: the checkpoint's setting)
    shortlist_k: int | None = None
    draft_vocab: int | None = None     # ids the draft scores, [0, N) (None: the checkpoint's setting)

    def __post_init__(self):
        if min(self.prompts, self.max_new_tokens, self.match_tokens) < 1 or self.phase_prompts < 0:
            raise ValueError("need --prompts, --max-new-tokens and --match-tokens >= 1 and --phase-prompts >= 0")
        if self.match_tokens > self.max_new_tokens:
            raise ValueError("--match-tokens cannot exceed --max-new-tokens")
        if not self.phase_tag:
            raise ValueError("--phase-tag must not be empty")


def first_departure(ref: list[int], out: list[int]) -> int:
    """Number of leading tokens `out` shares with `ref` (all of them if one ends where the other does)."""
    n = 0
    while n < min(len(ref), len(out)) and ref[n] == out[n]:
        n += 1
    return n


def _outcomes(ref: list[list[int]], runs: list[Answer], k: int) -> tuple[list[bool], list[float]]:
    match = [first_departure(r, x.tokens) >= min(k, len(r)) for r, x in zip(ref, runs)]
    share = [first_departure(r, x.tokens) / len(r) for r, x in zip(ref, runs)]
    return match, share


def _run_all(rt: LLM, prompts: list[list[int]], configs: dict[str, GenerateConfig]) -> dict[str, list[Answer]]:
    return {name: [rt.generate(p, config=cfg) for p in prompts] for name, cfg in configs.items()}


def _escalation(runs: list[Answer]) -> float:
    return merged_summary([r.stats for r in runs])["escalation_rate"]


@torch.no_grad()
def target_choices(rt: LLM, prompt: list[int], tokens: list[int]) -> list[int]:
    """The target's greedy choice at every position of a generation, on that generation's own token history
    with target-view KV throughout: element i is what the target would have chosen for token i."""
    eng = rt.engine
    eng.reset("target-on-history")      # fresh counters: not any run's
    first = int(torch.argmax(eng.prefill(prompt)))
    rest = eng.forward(tokens[:-1], "target", KV8).argmax(-1).tolist() if len(tokens) > 1 else []   # [n-1]
    return [first] + rest


def departures(rt: LLM, prompts: list[list[int]], runs: list[Answer]) -> dict:
    """Where a gate's tokens leave the target's choice on the gate's own history, split by whether the step
    was escalated. A low step that departs is a flip the gate missed; an escalated step that departs can
    only come from the history's KV: earlier low steps left draft-view entries that the high pass reads,
    which the replay's first-order model (an escalated step equals the target's step) leaves out."""
    low = high = low_dep = high_dep = 0
    for p, r in zip(prompts, runs):
        want = target_choices(rt, p, r.tokens)
        escalated = set(r.stats.escalated_at)
        for step in range(r.stats.steps):          # step i chose token i + 1
            dep = r.tokens[step + 1] != want[step + 1]
            if step in escalated:
                high, high_dep = high + 1, high_dep + dep
            else:
                low, low_dep = low + 1, low_dep + dep
    share = lambda a, b: round(a / b, 4) if b else None
    return {"low_steps": low, "low_departures": share(low_dep, low),
            "escalated_steps": high, "escalated_departures": share(high_dep, high)}


def _table(runs: dict[str, list[Answer]], k: int, resamples: int, seed: int,
           controls: Optional[dict[str, tuple[str, ...]]] = None) -> dict:
    """Per policy: outcomes against the target's tokens, decode statistics, and paired tests vs target/draft
    (and vs the runs `controls` names for it)."""
    ref = [r.tokens for r in runs["target"]]
    outcomes = {name: _outcomes(ref, rs, k) for name, rs in runs.items()}
    table = {}
    for name, rs in runs.items():
        s = merged_summary([r.stats for r in rs])
        match, share = outcomes[name]
        row = {"policy": s["policy"], "match": sum(match) / len(match), "prefix_share": sum(share) / len(share),
               **{key: s.get(key) for key in STAT_KEYS}}
        for other in ("target", "draft") + (controls or {}).get(name, ()):
            if other in outcomes and other != name:
                om, osh = outcomes[other]
                row[f"vs_{other}"] = {"match_diff": paired_bootstrap_diff(match, om, resamples, seed),
                                      "prefix_diff": paired_bootstrap_diff(share, osh, resamples, seed),
                                      "mcnemar": mcnemar_exact(match, om)}
        table[name] = row
    return table


def _add_departures(rt: LLM, prompts: list[list[int]], runs: dict[str, list[Answer]], table: dict) -> None:
    for name, rs in runs.items():
        if name.startswith("gate-"):
            table[name]["own_history"] = departures(rt, prompts, rs)
            repaired = sum(r.stats.extra.get("repaired_positions", 0) for r in rs)
            if repaired:
                table[name]["repaired_positions"] = repaired


def main_configs(rt: LLM, o: CompareOptions) -> dict[str, GenerateConfig]:
    base = GenerateConfig(max_new_tokens=o.max_new_tokens, gamma=o.gamma, adaptive=o.adaptive)
    gate = GateConfig(rate=o.rate)
    entropy = calibrated_gate(rt, "gate-entropy", gate)
    return {"target": replace(base, policy="target"), "draft": replace(base, policy="draft"),
            "speculative": replace(base, policy="speculative"), "adaptive": replace(base, policy="adaptive"),
            "gate-entropy": replace(base, policy="gate-entropy", gate=entropy),
            "gate-margin": replace(base, policy="gate-margin", gate=calibrated_gate(rt, "gate-margin", gate)),
            "gate-lagged": replace(base, policy="gate-lagged", gate=entropy),
            REPAIR: replace(base, policy="gate-repair",
                            gate=calibrated_gate(rt, "gate-repair", replace(gate, signal="margin")))}


def matched_random(rt: LLM, prompts: list[list[int]], rate: float, base: GenerateConfig,
                   seed: int, policy: str = "gate-random", name: str = "gate-random") -> dict[str, list[Answer]]:
    """`policy` (gate-random or gate-random-repair) at the escalation rate another gate realised in this run:
    prompt i escalates a random subset of its steps drawn with seed + i (one seed for all would escalate the
    same steps of every prompt)."""
    return {name: [rt.generate(p, config=replace(base, policy=policy, gate=GateConfig(rate=rate, seed=seed + i)))
                   for i, p in enumerate(prompts)]}


def speculation_sweep(rt: LLM, prompts: list[list[int]], o: CompareOptions) -> dict:
    """Fixed γ = 2, 4, 6, 8 against adaptive (early stop only, and early stop plus extension): every
    output checked against the target's, token for token."""
    base = GenerateConfig(max_new_tokens=o.max_new_tokens)
    configs = {"target": replace(base, policy="target"),
               **{f"fixed-g{g}": replace(base, policy="speculative", gamma=g) for g in (2, 4, 6, 8)},
               f"adaptive-g{o.gamma}-stop": replace(base, policy="adaptive", gamma=o.gamma,
                                                    adaptive=replace(o.adaptive, extend=None)),
               f"adaptive-g{o.gamma}-stop-extend{o.adaptive.gamma_max}": replace(base, policy="adaptive",
                                                                                 gamma=o.gamma, adaptive=o.adaptive)}
    out = {}
    ref = None
    for name, cfg in configs.items():
        rs = [rt.generate(p, config=cfg) for p in prompts]
        ref = ref or [r.tokens for r in rs]
        s = merged_summary([r.stats for r in rs])
        out[name] = {**{k: s.get(k) for k in STAT_KEYS}, "drafted": sum(r.stats.drafted for r in rs),
                     "rounds": sum(r.stats.rounds for r in rs),
                     "identical_to_target": sum(r.tokens == t for r, t in zip(rs, ref))}
    return out


def compare(o: CompareOptions) -> dict:
    t0 = time.time()
    rt = LLM(o.checkpoint, policy="target", backend=o.backend, max_context=4096,
             gamma=max(MAX_PROPOSALS, o.adaptive.gamma_max), draft_head=o.draft_head, shortlist_k=o.shortlist_k,
             draft_vocab=o.draft_vocab, meter="none")
    prompts = [rt.encode(p) for p in sharegpt_prompts(o.prompts)]
    out = {"checkpoint": str(rt.ckpt.path), "method": rt.ckpt.method, "backend": rt.backend, "prompts": len(prompts),
           "max_new_tokens": o.max_new_tokens, "match_tokens": o.match_tokens, "gate_rate": o.rate,
           "gamma": o.gamma, "adaptive": asdict(o.adaptive),
           "task": f"reproduce the target's greedy continuation of held-out ShareGPT requests: match = first "
                   f"{o.match_tokens} tokens identical; prefix_share = share of tokens before the first departure"}
    if o.speculation_sweep:
        out["speculation_sweep"] = speculation_sweep(rt, prompts, o)
        out["seconds"] = round(time.time() - t0, 1)
        return out
    configs = main_configs(rt, o)
    runs = _run_all(rt, prompts, configs)
    rate = _escalation(runs["gate-entropy"])
    runs.update(matched_random(rt, prompts, rate, configs["target"], o.seed))
    repair_rate = _escalation(runs[REPAIR])
    for policy, name in (("gate-random", REPAIR_RANDOM), ("gate-random-repair", REPAIR_RANDOM_REPAIRED)):
        runs.update(matched_random(rt, prompts, repair_rate, configs["target"], o.seed, policy, name))
    out["policies"] = _table(runs, o.match_tokens, o.resamples, o.seed,
                             {REPAIR: ("gate-margin", REPAIR_RANDOM, REPAIR_RANDOM_REPAIRED),
                              REPAIR_RANDOM_REPAIRED: (REPAIR_RANDOM,)})
    out["policies"]["gate-random"].update(matched_to="gate-entropy", matched_rate=rate)
    for name in (REPAIR_RANDOM, REPAIR_RANDOM_REPAIRED):
        out["policies"][name].update(matched_to=REPAIR, matched_rate=repair_rate)
    _add_departures(rt, prompts, runs, out["policies"])
    if o.phase_prompts:
        out["phase"] = phase_comparison(rt, o)
    out["seconds"] = round(time.time() - t0, 1)
    return out


def phase_comparison(rt: LLM, o: CompareOptions) -> dict:
    """gate-phase both ways, against target, draft, the entropy gate and a random gate at its matched rate,
    on few-shot prompts whose target continuation closes the thinking span."""
    base = GenerateConfig(max_new_tokens=o.phase_tokens)
    prompts, target_runs, info = phase_prompts(rt, o.phase_prompts, o.phase_tokens, o.phase_tag)
    if not prompts:
        return {**info, "prompts": 0, "error": "no candidate's target continuation wrote the tag: raise --phase-tokens"}
    configs = {"draft": replace(base, policy="draft"),
               "gate-phase": replace(base, policy="gate-phase", gate=GateConfig(tag=o.phase_tag)),
               "gate-phase-reverse": replace(base, policy="gate-phase", gate=GateConfig(tag=o.phase_tag,
                                                                                        order="high-low")),
               "gate-entropy": replace(base, policy="gate-entropy",
                                       gate=calibrated_gate(rt, "gate-entropy", GateConfig(rate=o.rate)))}
    runs = {"target": target_runs, **_run_all(rt, prompts, configs)}
    rate = _escalation(runs["gate-phase"])
    runs.update(matched_random(rt, prompts, rate, base, o.seed))
    table = _table(runs, o.match_tokens, o.resamples, o.seed)
    table["gate-random"].update(matched_to="gate-phase", matched_rate=rate)
    _add_departures(rt, prompts, runs, table)
    table["gate-phase"]["switched"] = sum("phase_switch_at" in r.stats.extra for r in runs["gate-phase"])
    return {**info, "prompts": len(prompts), "max_new_tokens": o.phase_tokens, "policies": table}
