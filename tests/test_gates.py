"""Gated escalation on the real model (`conftest.policy_backend`): escalation counts and byte accounting, the lagged
gate's single pass per step, the phase switch at the closing tag, the seeded random gate, threshold
calibration on its own calibration trajectories, and adaptive speculation staying lossless."""

import json
import shutil

import pytest
import torch

from edge.analysis.calibrate import (
    calibration_traces,
    order_by_uncertainty,
    thresholds_from_traces,
)
from edge.analysis.compare import departures, target_choices
from edge.analysis.replay.trace import trace_prompt
from edge.decode.adaptive import AdaptiveConfig
from edge.decode.config import GateConfig, GenerateConfig
from edge.decode.gates import random_schedule
from edge.decode.sampling import SamplingConfig
from edge.decode.signals import is_uncertain
from edge.decode.thresholds import (
    RATES,
    THRESHOLDS_FILE,
    rate_key,
    read_thresholds,
    resolve_gate,
    save_thresholds,
)
from edge.errors import BitNestError
from edge.llm import LLM
from tests.conftest import draft_steps_after_target_prefill, policy_backend, tag_from_output

PROMPTS = ["Write a short poem about the sea.", "What is the capital of France? Explain briefly.",
           "List three uses of a paperclip."]
# Raw text with thinking spans (the phase tests take their tag from what the model writes after it).
PHASE_PROMPT = "<think>one</think> <think>two</think> <think>three</think> <think>four</think> <think>five"


@pytest.fixture(scope="module")
def rt(rtn_checkpoint):
    return LLM(rtn_checkpoint, policy="target", meter="none", backend=policy_backend(), max_context=512)


def _run(rt, prompt, chat=True, **kw):
    return rt.generate(rt.encode(prompt, chat), config=GenerateConfig(**kw))


def _bytes(rt, draft_passes, target_passes):
    emb = rt.engine.embed_row_bytes              # a row of the nested head's planes (the default export)
    w = rt.engine.pass_weight_bytes
    return draft_passes * (w["draft"] + emb) + target_passes * (w["target"] + emb)


@pytest.fixture(scope="module")
def median_entropy(rt):
    tr = trace_prompt(rt.engine, rt.encode(PROMPTS[0]), 24, rt.eos)
    return float(torch.tensor(tr.entropy).median())


def test_entropy_gate_counts_escalations_and_their_bytes(rt, median_entropy):
    r = _run(rt, PROMPTS[0], policy="gate-entropy", max_new_tokens=24, gate=GateConfig(threshold=median_entropy))
    s = r.stats
    steps = len(r.tokens) - 1
    assert s.steps == steps == s.draft_passes, "every step pays for a low pass"
    assert 0 < s.escalated < steps and s.target_passes == s.escalated
    assert s.summary()["escalation_rate"] == round(s.escalated / steps, 4)
    assert s.weight_bytes == _bytes(rt, s.draft_passes, s.target_passes), "the head is counted in every pass"


def test_gate_that_always_escalates_is_the_target_and_never_is_the_draft(rt):
    target = _run(rt, PROMPTS[1], policy="target", max_new_tokens=16)
    always = _run(rt, PROMPTS[1], policy="gate-margin", max_new_tokens=16, gate=GateConfig(threshold=1e9))
    never = _run(rt, PROMPTS[1], policy="gate-margin", max_new_tokens=16, gate=GateConfig(threshold=-1.0))
    assert always.tokens == target.tokens, "the escalated pass must overwrite the low pass's KV entry"
    assert never.tokens == draft_steps_after_target_prefill(rt, rt.encode(PROMPTS[1]), 16)
    a, t = always.stats, target.stats
    assert a.escalated == a.steps == a.draft_passes == a.target_passes == t.target_passes
    # both passes read the same KV8 history at every step: twice the target's KV bytes
    assert a.kv_bytes == 2 * t.kv_bytes and a.weight_bytes == _bytes(rt, a.draft_passes, a.target_passes)
    n = never.stats
    assert n.escalated == 0 and n.target_passes == 0 and n.weight_bytes == _bytes(rt, n.draft_passes, 0)


def test_lagged_gate_runs_one_pass_per_step(rt, median_entropy):
    s = _run(rt, PROMPTS[0], policy="gate-lagged", max_new_tokens=24, gate=GateConfig(threshold=median_entropy)).stats
    assert s.draft_passes + s.target_passes == s.steps, "no wasted low pass"
    assert s.target_passes == s.escalated and 0 < s.escalated < s.steps
    assert s.weight_bytes == _bytes(rt, s.draft_passes, s.target_passes)
    # always uncertain: the first step has no previous signal (low), every later step is high
    s = _run(rt, PROMPTS[0], policy="gate-lagged", max_new_tokens=8, gate=GateConfig(threshold=-1.0)).stats
    assert s.draft_passes == 1 and s.target_passes == s.steps - 1


@pytest.mark.parametrize("order", ["low-high", "high-low"])
def test_phase_gate_switches_after_the_closing_tag(rt, order):
    """The tag is taken from the output of the view the gate starts with (the draft's for low-high), which the gate
    reproduces until the tag: the switch point is known exactly whatever the model writes on this machine."""
    first = "draft" if order == "low-high" else "target"
    ref = _run(rt, PHASE_PROMPT, chat=False, policy=first, max_new_tokens=16).tokens
    tag, at = tag_from_output(rt.tokenizer, ref)
    r = _run(rt, PHASE_PROMPT, chat=False, policy="gate-phase", max_new_tokens=16, gate=GateConfig(tag=tag, order=order))
    s, tokens = r.stats, r.tokens
    assert tokens[:at] == ref[:at] and s.extra["phase_switch_at"] == at
    before, after = at - 1, s.steps - (at - 1)       # steps deciding tokens 1..at-1, then the rest
    assert after > 0
    low, high = (before, after) if order == "low-high" else (after, before)
    assert (s.draft_passes, s.target_passes, s.escalated) == (low, high, high)


def test_random_gate_is_seeded_at_its_rate(rt):
    def run(seed):
        runs = [_run(rt, p, policy="gate-random", max_new_tokens=32, gate=GateConfig(rate=0.3, seed=seed))
                for p in PROMPTS[:2]]
        return [r.tokens for r in runs], [r.stats for r in runs]
    toks_a, stats_a = run(11)
    toks_b, stats_b = run(11)
    assert toks_a == toks_b and [s.escalated for s in stats_a] == [s.escalated for s in stats_b]
    planned = random_schedule(0.3, 31, 11)     # 31 planned steps at 30%: floor(9.3 + u) = 9 or 10 of them
    assert len(planned) in (9, 10)
    for s in stats_a:      # a run that ends at EOS escalates the planned steps it reached, one pass each
        assert s.escalated == sum(i < s.steps for i in planned) and s.draft_passes + s.target_passes == s.steps
    assert max(s.steps for s in stats_a) == 31
    others = {frozenset(random_schedule(0.3, 31, seed)) for seed in range(8)}
    assert len(others) == 8, "different seeds must escalate different steps"


def test_random_schedule_realises_its_rate():
    # Within one step of rate * steps in every generation, and the rate on average over seeds, even on the
    # short runs where independent per-step coins missed it (seed 0 at 16.7% over 7 steps escalated none).
    for rate, steps in [(0.167, 7), (0.03, 40), (0.5, 9), (0.0, 10), (1.0, 10)]:
        counts = [len(random_schedule(rate, steps, seed)) for seed in range(400)]
        assert all(abs(c - rate * steps) < 1 for c in counts)
        assert abs(sum(counts) / len(counts) / steps - rate) < 0.02
        assert all(0 <= i < steps for i in random_schedule(rate, steps, 3))
    assert random_schedule(0.3, 0, 0) == set()


def test_calibration_hits_its_target_rates_and_is_saved_beside_the_checkpoint(rt, rtn_checkpoint, tmp_path):
    traces = calibration_traces(rt, prompts=2, max_new_tokens=32)
    entry = dict(thresholds_from_traces(traces), backend=rt.engine.name)
    n = entry["steps"]
    assert n == sum(len(t) for t in traces) >= 40
    for signal in ("entropy", "margin"):
        values = [x for t in traces for x in getattr(t, signal)]
        ordered = order_by_uncertainty(values, signal)
        thresholds = [entry[signal][rate_key(r)] for r in RATES]
        assert thresholds == sorted(thresholds, reverse=signal == "entropy"), "higher rates, laxer thresholds"
        for r, thr in zip(RATES, thresholds):
            k = round(r * n)
            count = sum(is_uncertain(signal, v, thr) for v in values)
            assert count == k or ordered[k - 1] == ordered[k], f"{signal} at {r}: {count} of {n}, want {k}"
    ck = tmp_path / "ckpt"
    shutil.copytree(rtn_checkpoint, ck)
    rt.ckpt.path, saved = ck, rt.ckpt.path
    try:
        path = save_thresholds(rt.ckpt, entry)
        assert path == ck / THRESHOLDS_FILE and read_thresholds(rt.ckpt)[rt.engine.name] == \
            json.loads(path.read_text())["backends"][rt.engine.name]
        gate = resolve_gate(rt.ckpt, rt.engine.name, "gate-margin", GateConfig(rate=0.07))
        assert gate.threshold == entry["margin"]["0.07"]
        with pytest.raises(BitNestError, match="bitnest calibrate --checkpoint"):   # the runtime never calibrates
            resolve_gate(rt.ckpt, "torch", "gate-margin", GateConfig(rate=0.07))
        data = json.loads(path.read_text())
        data["weights_sha256"] = "0" * 64                 # thresholds of another export are not used
        path.write_text(json.dumps(data))
        assert read_thresholds(rt.ckpt) == {}
    finally:
        rt.ckpt.path = saved


@pytest.fixture(scope="module")
def target_tokens(rt):
    return [_run(rt, p, policy="target", max_new_tokens=24).tokens for p in PROMPTS[:2]]


@pytest.mark.parametrize("adaptive", [AdaptiveConfig(), AdaptiveConfig("entropy", stop=2.0, extend=0.5, gamma_max=7)])
def test_adaptive_speculation_is_lossless(rt, target_tokens, adaptive):
    rounds = drafted = 0
    for prompt, target in zip(PROMPTS, target_tokens):
        r = _run(rt, prompt, policy="adaptive", gamma=4, max_new_tokens=24, adaptive=adaptive)
        assert r.tokens == target, f"divergence on {prompt!r}"
        s = r.stats
        assert s.draft_passes == s.drafted and s.target_passes == s.rounds
        rounds, drafted = rounds + s.rounds, drafted + s.drafted
    assert drafted != 4 * rounds, "the rule should change some round's length"


def test_sampled_adaptive_is_seeded(rt):
    cfg = dict(policy="adaptive", max_new_tokens=8, sampling=SamplingConfig(0.8, top_k=40, seed=3))
    a = _run(rt, PROMPTS[2], **cfg).tokens
    assert a == _run(rt, PROMPTS[2], **cfg).tokens
    others = [_run(rt, PROMPTS[2], **{**cfg, "sampling": SamplingConfig(0.8, top_k=40, seed=s)}).tokens
              for s in (4, 5, 6)]
    assert any(o != a for o in others), "three other seeds gave the same tokens: the seed is not what draws them"


def test_threshold_gate_without_threshold_is_refused(rt):
    with pytest.raises(ValueError, match="needs a threshold"):
        _run(rt, PROMPTS[0], policy="gate-entropy", max_new_tokens=4)


def test_departures_on_a_gates_own_history(rt):
    """The target reproduces its own run on its own history; a gate that always escalates never departs;
    one that never escalates departs exactly where the draft's own run leaves the target's choices."""
    prompts = [rt.encode(p) for p in PROMPTS[:2]]
    run = lambda policy, **kw: [rt.generate(p, config=GenerateConfig(policy=policy, max_new_tokens=16, **kw)) for p in prompts]
    target = run("target")
    assert all(target_choices(rt, p, r.tokens) == r.tokens for p, r in zip(prompts, target))
    always = departures(rt, prompts, run("gate-random", gate=GateConfig(rate=1.0)))
    assert always["low_steps"] == 0 and always["escalated_steps"] > 0 and always["escalated_departures"] == 0
    never = departures(rt, prompts, run("gate-random", gate=GateConfig(rate=0.0)))
    draft = [draft_steps_after_target_prefill(rt, p, 16) for p in prompts]     # what `never` writes
    flips = sum(t != w for p, d in zip(prompts, draft) for t, w in zip(d[1:], target_choices(rt, p, d)[1:]))
    steps = sum(len(d) - 1 for d in draft)
    assert never["escalated_steps"] == 0 and never["low_steps"] == steps
    assert never["low_departures"] == round(flips / steps, 4) and flips > 0

