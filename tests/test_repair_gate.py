"""The repaired gate (gate-repair) on the real model (`conftest.policy_backend`): an escalated step re-runs the
target view over the low steps since the last escalation, so it chooses what the target chooses on the gate's own
history, its wider pass is counted in the bytes, and its random control (gate-random-repair) does the same on seeded
steps."""

import pytest
import torch

from edge.analysis.compare import departures
from edge.analysis.replay.trace import trace_prompt
from edge.decode.config import GateConfig, GenerateConfig
from edge.llm import LLM
from tests.conftest import draft_steps_after_target_prefill, policy_backend

PROMPTS = ["Write a short poem about the sea.", "What is the capital of France? Explain briefly.",
           "List three uses of a paperclip."]


@pytest.fixture(scope="module")
def rt(rtn_checkpoint):
    return LLM(rtn_checkpoint, policy="target", meter="none", backend=policy_backend(), max_context=512)


@pytest.fixture(scope="module")
def prompts(rt):
    return [rt.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def margin_gate(rt, prompts):
    """A margin threshold at the median of the low pass's margins on the target's own trajectory: about half
    of the steps escalate, so repair passes of several widths occur."""
    tr = trace_prompt(rt.engine, prompts[0], 24, rt.eos)
    return GateConfig(threshold=float(torch.tensor(tr.margin).median()), signal="margin")


def _runs(rt, prompts, policy, gate, n=24):
    return [rt.generate(p, config=GenerateConfig(policy=policy, max_new_tokens=n, gate=gate)) for p in prompts]


@pytest.fixture(scope="module")
def repair_runs(rt, prompts, margin_gate):
    return _runs(rt, prompts, "gate-repair", margin_gate)


def test_escalated_steps_choose_the_targets_token_on_their_own_history(rt, prompts, repair_runs):
    runs = repair_runs
    d = departures(rt, prompts, runs)
    assert d["escalated_steps"] > 0 and d["low_steps"] > 0
    assert d["escalated_departures"] == 0, "an escalated step must read target-view K/V for its whole history"
    assert sum(r.stats.extra.get("repaired_positions", 0) for r in runs) > 0


def test_repair_pass_width_and_bytes(rt, repair_runs):
    """Every step pays a low pass; an escalated step one target pass over the low steps since the last
    escalation and its own token, each counted with its embedding rows and its KV reads."""
    w, row = rt.engine.pass_weight_bytes, rt.engine.embed_row_bytes
    for r in repair_runs:
        s = r.stats
        repaired = s.extra.get("repaired_positions", 0)
        assert s.draft_passes == s.steps and s.target_passes == s.escalated
        low_run = widths = 0                      # the repair widths the escalation pattern implies
        escalated = set(s.escalated_at)
        for step in range(s.steps):
            if step in escalated:
                widths, low_run = widths + low_run, 0
            else:
                low_run += 1
        assert repaired == widths
        assert s.weight_bytes == s.draft_passes * (w["draft"] + row) + s.target_passes * w["target"] + \
            (s.escalated + repaired) * row


@pytest.mark.parametrize("policy", ["gate-repair", "gate-random-repair"])
def test_always_escalating_is_the_target_and_never_is_the_draft(rt, prompts, policy):
    always = GateConfig(threshold=1e9, signal="margin", rate=1.0)
    never = GateConfig(threshold=-1.0, signal="margin", rate=0.0)
    target = _runs(rt, prompts[1:2], "target", GateConfig(), 16)[0]
    a = _runs(rt, prompts[1:2], policy, always, 16)[0]
    z = _runs(rt, prompts[1:2], policy, never, 16)[0]
    assert a.tokens == target.tokens and z.tokens == draft_steps_after_target_prefill(rt, prompts[1], 16)
    assert "repaired_positions" not in a.stats.extra and z.stats.escalated == 0


def test_random_repair_control_repairs_its_seeded_steps(rt, prompts):
    runs = _runs(rt, prompts, "gate-random-repair", GateConfig(rate=0.3, seed=5))
    d = departures(rt, prompts, runs)
    assert d["escalated_steps"] > 0 and d["escalated_departures"] == 0
    assert all(r.stats.draft_passes + r.stats.target_passes == r.stats.steps for r in runs)
