"""The Precision on Demand command lines on a real small export: calibrate_gates, replay (JSON shape,
figures), compare_policies (every policy, tests against target and draft), chat with a gate, and
one-line errors for bad input."""

import json
import shutil
import subprocess
import sys

import pytest

from edge.analysis import compare
from export.commands import calibrate, replay
from export.commands import compare as compare_cmd
from edge.backends import resolve_backend
from edge.analysis.phase_prompts import phase_candidates
from edge.decode import thresholds
from edge.decode.config import GateConfig, GenerateConfig
from edge.llm import LLM
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def calibrated(rtn_checkpoint, tmp_path_factory):
    """A copy of the RTN export with thresholds calibrated on a few short trajectories."""
    ck = tmp_path_factory.mktemp("pod") / "ckpt"
    shutil.copytree(rtn_checkpoint, ck)
    assert calibrate.main(["--checkpoint", str(ck), "--prompts", "2", "--max-new-tokens", "12", "--json"]) == 0
    return ck


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_calibrate_writes_thresholds_beside_the_checkpoint(calibrated):
    data = json.loads((calibrated / thresholds.THRESHOLDS_FILE).read_text())
    entry = data["backends"][resolve_backend("auto")]       # the chat's default backend, calibrated by default
    assert set(entry["entropy"]) == set(entry["margin"]) == {"0.03", "0.07", "0.15", "0.3"}
    assert entry["steps"] >= 10


def test_replay_json_and_figures(calibrated, tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Name three rivers."}) + "\n" +
                 json.dumps({"prompt": "To be, or not to be,", "chat": False}) + "\n")
    rc = replay.main(["--checkpoint", str(calibrated), "--prompts-file", str(f), "--max-new-tokens", "16",
                      "--resamples", "50", "--plots", str(tmp_path / "figs"), "--json"])
    assert rc == 0
    out = _last_json(capsys)
    assert out["prompts"] == 2 and out["steps"] >= 20 and 0 <= out["flip_rate"] <= 1
    for signal in ("entropy", "margin"):
        a = out["auc"][signal]
        assert a["low"] <= a["value"] <= a["high"], a
    assert set(out["budgets"]) == {"0.03", "0.07", "0.15", "0.3"}
    for b in out["budgets"].values():
        assert b["oracle"]["kl_removed"] >= max(b["entropy"]["kl_removed"], b["margin"]["kl_removed"]) - 1e-9
    assert set(out["speculation"]) == {"k2", "k4", "k6", "k8"}
    assert all(1 <= s["tokens_per_round"] <= int(k[1:]) + 1 and s["bytes_vs_high"] > 0
               for k, s in out["speculation"].items())
    c = out["cost_model"]
    assert c["high_pass"] == c["blocks_high"] + c["head_high"] and 0 < c["low_share_of_high"] < 1
    assert out["calibrated"] is not None and len(out["plots"]) == 4
    assert all((tmp_path / "figs" / p.split("/")[-1]).stat().st_size > 10_000 for p in out["plots"])


def test_compare_runs_every_policy(calibrated, capsys):
    rc = compare_cmd.main(["--checkpoint", str(calibrated), "--prompts", "3", "--max-new-tokens", "6",
                       "--match-tokens", "4", "--phase-prompts", "0", "--resamples", "100", "--json"])
    assert rc == 0
    out = _last_json(capsys)
    table = out["policies"]
    assert set(table) == {"target", "draft", "speculative", "adaptive", "gate-entropy", "gate-margin", "gate-lagged",
                          "gate-random", "gate-repair", "gate-random@repair", "gate-random-repair"}
    for lossless in ("target", "speculative", "adaptive"):
        assert table[lossless]["match"] == 1.0 and table[lossless]["prefix_share"] == 1.0
    assert table["target"]["escalation_rate"] is None and 0 <= table["gate-entropy"]["escalation_rate"] <= 1
    m = table["draft"]["vs_target"]["mcnemar"]
    assert m["a_only"] == 0 and m["b_only"] == round(3 * (1 - table["draft"]["match"]))
    assert "vs_draft" in table["gate-margin"] and table["gate-random"]["matched_to"] == "gate-entropy"
    # the random control realises the entropy gate's rate: 3 prompts x 5 steps, within one step per prompt
    rand = table["gate-random"]
    assert rand["matched_rate"] == table["gate-entropy"]["escalation_rate"]
    assert abs(rand["escalation_rate"] - rand["matched_rate"]) < 3 / 15 + 1e-9
    for gate in ("gate-entropy", "gate-margin", "gate-lagged", "gate-random", "gate-repair", "gate-random@repair",
                 "gate-random-repair"):   # 3 prompts x 5 gated steps
        own = table[gate]["own_history"]
        assert own["low_steps"] + own["escalated_steps"] == 15
    # the repaired gate is tested against gate-margin and both random controls, matched to its own rate
    repair = table["gate-repair"]
    assert {"vs_gate-margin", "vs_gate-random@repair", "vs_gate-random-repair"} <= set(repair)
    for control in ("gate-random@repair", "gate-random-repair"):
        assert table[control]["matched_to"] == "gate-repair"
        assert table[control]["matched_rate"] == repair["escalation_rate"]
    for repaired in ("gate-repair", "gate-random-repair"):     # an escalated step sees the target's own history
        own = table[repaired]["own_history"]
        assert own["escalated_departures"] == (0.0 if own["escalated_steps"] else None), (repaired, own)


def test_repair_gates_escalated_steps_equal_the_target_on_their_own_history(calibrated):
    """gate-random-repair on schedules fixed by their seeds (not by what the model writes): every prompt has low
    steps before an escalated one, so each escalation repairs draft-view KV, and every escalated token is the
    target's greedy choice on the gate's own history (0 departures, exactly: the backend computes a row the same
    whatever the pass's width); gate-repair with a margin threshold no margin reaches escalates every step."""
    from edge.decode.config import GateConfig
    from edge.decode.gates import random_schedule
    rt = LLM(calibrated, policy="target", meter="none", backend="auto", max_context=1024)
    prompts = [rt.encode(p) for p in ("Name three rivers.", "Say hi.", "What is two plus two?")]
    steps, seeds = 7, []
    for seed in range(100):                        # schedules with a low step before an escalated one
        plan = random_schedule(0.5, steps, seed)
        if plan and min(plan) > 0:
            seeds.append(seed)
    seeds = seeds[:len(prompts)]
    runs = [rt.generate(p, config=GenerateConfig(policy="gate-random-repair", max_new_tokens=steps + 1,
                                          gate=GateConfig(rate=0.5, seed=s))) for p, s in zip(prompts, seeds)]
    assert all(len(r.tokens) == steps + 1 for r in runs), "a prompt's answer ended early: pick another prompt"
    own = compare.departures(rt, prompts, runs)
    assert own["escalated_steps"] == sum(len(random_schedule(0.5, steps, s)) for s in seeds)
    assert own["escalated_departures"] == 0.0 and own["low_steps"] > 0
    assert all(r.stats.extra.get("repaired_positions", 0) > 0 for r in runs)
    always = [rt.generate(p, config=GenerateConfig(policy="gate-repair", max_new_tokens=steps + 1,
                                            gate=GateConfig(threshold=1e9, signal="margin"))) for p in prompts]
    own = compare.departures(rt, prompts, always)
    assert own["escalated_steps"] == sum(len(r.tokens) - 1 for r in always) and own["escalated_departures"] == 0.0


def test_speculation_sweep_is_lossless_and_counts_its_drafting(calibrated, capsys):
    rc = compare_cmd.main(["--checkpoint", str(calibrated), "--prompts", "2", "--max-new-tokens", "10",
                       "--speculation-sweep", "--json"])
    assert rc == 0
    sweep = _last_json(capsys)["speculation_sweep"]
    assert set(sweep) == {"target", "fixed-g2", "fixed-g4", "fixed-g6", "fixed-g8", "adaptive-g4-stop",
                          "adaptive-g4-stop-extend8"}
    assert all(r["identical_to_target"] == 2 for r in sweep.values())
    for g in (2, 4, 6, 8):     # a fixed round always drafts gamma proposals, one draft pass each
        r = sweep[f"fixed-g{g}"]
        assert r["drafted"] == g * r["rounds"] == r["draft_passes"] and r["target_passes"] == r["rounds"]
    stop, extend = sweep["adaptive-g4-stop"], sweep["adaptive-g4-stop-extend8"]
    assert stop["rounds"] <= stop["drafted"] <= 4 * stop["rounds"]
    assert extend["rounds"] <= extend["drafted"] <= 8 * extend["rounds"]
    assert stop["weight_bytes_per_token"] > 0 and 0 < stop["acceptance"] <= 1


def shared_tag(tok, target: list[int], draft: list[int]) -> tuple[str, int, int]:
    """A closing tag both runs wrote: the text of one token of the target's output (past its middle where one is
    shared, not the last), and where it first appears in each, (tag, at_target, at_draft): the number of tokens
    after which the run's text holds it, each < the run's length (some step comes after it)."""
    first = lambda tokens, tag: next((i for i in range(1, len(tokens)) if tag in tok.decode(tokens[:i])), None)
    order = list(range(len(target) // 2, len(target) - 1)) + list(range(1, len(target) // 2))
    for k in order:
        tag = tok.decode(target[k:k + 1])
        if tag.strip() and tag.isascii() and first(draft, tag) is not None:
            return tag, first(target, tag), first(draft, tag)
    raise AssertionError("the target's and the draft's outputs share no printable token")


def test_phase_comparison_on_its_tagged_prompt_set(calibrated):
    """The phase set and both phase gates with the tag taken from what both views wrote on the first candidate:
    the candidate is kept; the reversed gate (target view until the tag) writes the target's tokens, so it switches
    exactly where the target wrote the tag, and the forward gate (draft view until the tag) writes the draft's, so
    it switches exactly where the draft wrote it, on any machine."""
    rt = LLM(calibrated, policy="target", meter="none", backend="auto", max_context=4096)       # the backend the fixture calibrated
    first = next(phase_candidates(rt))
    tokens = rt.generate(first, config=GenerateConfig(policy="target", max_new_tokens=40)).tokens
    # what the forward gate writes until its tag: draft steps after the target's prefill (a gate that never escalates;
    # the draft policy prefills with the draft view)
    drafted = rt.generate(first, config=GenerateConfig(policy="gate-margin", gate=GateConfig(threshold=-1.0),
                                                max_new_tokens=40)).tokens
    tag, at, at_draft = shared_tag(rt.tokenizer, tokens, drafted)
    o = compare.CompareOptions(str(calibrated), prompts=1, max_new_tokens=2, match_tokens=1, phase_prompts=1,
                               phase_tokens=40, resamples=50, phase_tag=tag)
    phase = compare.phase_comparison(rt, o)
    assert phase["tag"] == tag and phase["kept"] == phase["prompts"] == phase["candidates"] == 1
    table = phase["policies"]
    assert set(table) == {"target", "draft", "gate-phase", "gate-phase-reverse", "gate-entropy", "gate-random"}
    assert table["target"]["match"] == 1.0
    reverse = table["gate-phase-reverse"]          # steps deciding tokens 1..at-1 ran high, the rest low
    assert reverse["target_passes"] == at - 1 and reverse["draft_passes"] == len(tokens) - at
    low_high = table["gate-phase"]                 # steps deciding tokens 1..at_draft-1 ran low, then high
    assert low_high["switched"] == 1
    assert low_high["draft_passes"] == at_draft - 1 and low_high["target_passes"] >= 1
    assert table["gate-random"]["matched_rate"] == low_high["escalation_rate"]


def test_phase_tag_must_not_be_empty(calibrated, capsys):
    assert compare_cmd.main(["--checkpoint", str(calibrated), "--phase-tag", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--phase-tag" in err[0]


def test_chat_with_a_calibrated_gate(calibrated):
    r = subprocess.run([sys.executable, "scripts/chat.py", "--checkpoint", str(calibrated), "--prompt", "Say hi.",
                        "--policy", "gate-margin", "--gate-rate", "0.3", "--max-new-tokens", "8", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert s["policy"] == "gate-margin" and s["escalation_rate"] is not None


def test_bad_input_is_one_line(calibrated, tmp_path, capsys):
    assert replay.main(["--checkpoint", str(calibrated), "--prompts-file", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert compare_cmd.main(["--checkpoint", str(calibrated), "--gate-threshold", "1"]) == 2
    assert "--gate-rate" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "scripts/chat.py", "--checkpoint", str(calibrated), "--prompt", "x",
                        "--policy", "gate-entropy", "--gate-rate", "0.5"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no threshold calibrated for rate 0.5" in lines[0], r.stderr
