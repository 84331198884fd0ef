"""The `auto` policy: the choice rule on hand-made cost tables, the acceptance estimate, the cost table's cache
(fingerprint, corrupt and stale tables re-measured) on a real engine, and greedy output identical to the target's
on the real model, both with the costs measured here and with hand-made tables that force γ = 0 steps, probe
rounds and longer rounds in one generation."""

import json
import math

import pytest
import torch

from edge.backends import make_engine
from edge.engine import costs
from edge.decode.auto import (
    PROBE_MAX,
    PROBE_MIN,
    WIN_MARGIN,
    AcceptanceEstimate,
    AutoConfig,
    best_gamma,
    expected_tokens,
    probe_interval,
)
from edge.decode.config import GenerateConfig
from edge.engine.cost_table import CostTable
from edge.engine.costs import MAX_GAMMA, engine_costs, fingerprint, read_table, table_path
from edge.decode.generate import generate
from edge.decode.registry import most_proposals
from edge.decode.sampling import SamplingConfig
from edge.engine.stats import DecodeStats
from edge.model.checkpoint import load_checkpoint
from edge.model.manifest import manifest_seal, read_manifest
from edge.llm import Runtime
from tests.conftest import policy_backend

PROMPTS = ["Write a short poem about the sea.", "List three uses of a paperclip."]
TOKENS = 24                  # per generation: enough for target steps, a probe and rounds after it
LINEAR = tuple(float(w) for w in range(1, MAX_GAMMA + 2))        # a target pass costs its width: compute-bound
FLAT = (1.0,) * (MAX_GAMMA + 1)                                  # a target pass costs one token's: weight-bound
BACKEND = policy_backend()   # the policy is the same code on every engine: the fastest that runs here (conftest)


def rate(alpha: float, g: int, t_draft: float, t_target) -> float:
    """Expected tokens per second of a round of g proposals, the sum written out (not the closed form)."""
    return sum(alpha ** i for i in range(g + 1)) / (g * t_draft + t_target[g])


# -- the choice rule ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t_target", [LINEAR, FLAT], ids=["linear", "flat"])
def test_a_draft_as_dear_as_the_target_never_speculates(t_target):
    for alpha in (0.0, 0.3, 0.7, 0.9, 0.99, 1.0):
        assert best_gamma(alpha, t_target[0], t_target, MAX_GAMMA) == 0, alpha
    assert probe_interval(0.5, t_target[0], t_target, MAX_GAMMA, 0.01) is None      # not even α = 1 wins: no probes


def test_a_flat_verification_and_a_cheap_draft_speculate_long_at_high_acceptance():
    assert best_gamma(0.95, 0.05, FLAT, MAX_GAMMA) == MAX_GAMMA
    assert best_gamma(1.0, 0.05, FLAT, MAX_GAMMA) == MAX_GAMMA
    assert best_gamma(0.95, 0.05, FLAT, 3) == 3                                     # the ceiling bounds it
    assert best_gamma(0.0, 0.05, FLAT, MAX_GAMMA) == 0                              # nothing is ever accepted


@pytest.mark.parametrize("t_draft, t_target", [
    (0.05, FLAT), (0.3, FLAT), (0.6, tuple(1 + 0.1 * w for w in range(9))), (0.4, tuple(1 + 0.35 * w for w in range(9))),
    (0.55, (1.0, 1.1, 1.2, 1.3, 2.4, 2.5, 2.6, 2.7, 3.8)),      # a 4-token tile, then a second tile for the fifth
], ids=["flat-cheap", "flat", "gentle", "steep", "tiled"])
def test_the_choice_is_the_argmax_at_every_acceptance(t_draft, t_target):
    chosen = []
    for alpha in [i / 100 for i in range(101)]:
        g = best_gamma(alpha, t_draft, t_target, MAX_GAMMA)
        rates = [rate(alpha, k, t_draft, t_target) for k in range(MAX_GAMMA + 1)]
        assert rates[g] == pytest.approx(max(rates), rel=1e-12), (alpha, g, rates)
        assert all(r < rates[g] * (1 + 1e-12) for r in rates[:g]), (alpha, g)     # ties go to the smaller γ
        chosen.append(g)
    assert chosen == sorted(chosen), chosen          # more acceptance never asks for shorter rounds on these tables


def test_expected_tokens_at_and_near_full_acceptance():
    for g in range(MAX_GAMMA + 1):
        assert expected_tokens(1.0, g) == g + 1
        assert expected_tokens(1 - 1e-9, g) == pytest.approx(g + 1, rel=1e-6)
        assert expected_tokens(0.0, g) == 1.0
        assert expected_tokens(0.6, g) == pytest.approx(sum(0.6 ** i for i in range(g + 1)))


def test_probes_only_where_speculation_can_win_and_rarer_the_more_they_lose():
    t_target = tuple(1 + 0.2 * w for w in range(9))
    assert best_gamma(1.0, 0.5, t_target, MAX_GAMMA) > 0 and best_gamma(0.2, 0.5, t_target, MAX_GAMMA) == 0
    hopeful, hopeless = (probe_interval(a, 0.5, t_target, MAX_GAMMA, 0.01) for a in (0.6, 0.0))
    assert PROBE_MIN <= hopeful < hopeless <= PROBE_MAX
    # a probe of one proposal loses 0.5 + 1.2 - 1 = 0.7 target passes at α = 0: 70 passes keep it to 1%
    assert hopeless == 70
    assert probe_interval(0.0, 0.5, t_target, 0, 0.01) is None                     # a ceiling of 0 cannot probe


def test_a_round_must_beat_a_target_step_by_the_margin():
    # α = 0.8, draft 0.5, t(2) = 1.25: one proposal gives 1.8 tokens in 1.75 against 1 in 1, a 2.9% gain
    t_target = (1.0, 1.25) + tuple(1.25 + w for w in range(1, MAX_GAMMA))
    assert rate(0.8, 1, 0.5, t_target) == pytest.approx(1.8 / 1.75)
    assert best_gamma(0.8, 0.5, t_target, MAX_GAMMA) == 1                        # the bare argmax takes the 2.9%
    assert best_gamma(0.8, 0.5, t_target, MAX_GAMMA, margin=0.02) == 1
    assert best_gamma(0.8, 0.5, t_target, MAX_GAMMA, margin=0.03) == 0           # within the margin: a target step
    assert AutoConfig().margin == WIN_MARGIN > 0.03                              # the policy's default refuses it
    # ... and never probes where even α = 1 gains less than the margin (2 tokens in 1.75: 14.3%)
    assert probe_interval(0.5, 0.5, t_target, MAX_GAMMA, 0.01, margin=0.14) is not None
    assert probe_interval(0.5, 0.5, t_target, MAX_GAMMA, 0.01, margin=0.15) is None
    # where speculation pays, the margin changes nothing: a flat verification and a cheap draft
    assert best_gamma(0.95, 0.05, FLAT, MAX_GAMMA, margin=WIN_MARGIN) == MAX_GAMMA
    with pytest.raises(ValueError, match="margin"):
        AutoConfig(margin=1.0)


def test_the_acceptance_estimate_counts_what_verification_judged():
    cfg = AutoConfig(prior=0.8, prior_weight=2.0, decay=1.0)
    a = AcceptanceEstimate(cfg)
    assert a.value == 0.8
    a.observe(4, 1)                   # one accepted, the second rejected; the last two were never judged
    assert (a.hits, a.trials) == (1, 2)
    a.observe(0, 0)                   # a target step says nothing
    a.observe(3, 3)
    assert (a.hits, a.trials) == (4, 5) and a.value == pytest.approx((4 + 1.6) / 7)
    fading = AcceptanceEstimate(AutoConfig(decay=0.9))
    for _ in range(30):
        fading.observe(4, 0)
    low = fading.value
    for _ in range(10):
        fading.observe(4, 4)
    assert low < 0.15 and fading.value > 0.9            # recent rounds outweigh old ones: α follows the text


def test_auto_settings_refuse_a_ceiling_past_the_measured_widths():
    for bad in (0, MAX_GAMMA + 1):
        with pytest.raises(ValueError, match=rf"must be in \[1, {MAX_GAMMA}\]"):
            AutoConfig(gamma_max=bad)
    assert most_proposals(GenerateConfig(policy="auto")) == MAX_GAMMA


def test_stats_merge_the_gamma_mix_and_keep_the_latest_estimate():
    a, b = DecodeStats("auto", "cpu"), DecodeStats("auto", "cpu")
    for g in (0, 0, 4):
        a.record_choice(g, 0.5)
    b.record_choice(2, 0.9, probe=True)
    a.add(b)
    s = a.summary()
    assert s["gamma_histogram"] == {"0": 2, "2": 1, "4": 1} and s["probe_rounds"] == 1 and s["alpha_estimate"] == 0.9
    assert "gamma_histogram" not in DecodeStats("target", "cpu").summary()


# -- greedy output on the real model --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(rtn_checkpoint):
    return make_engine(BACKEND, load_checkpoint(rtn_checkpoint), 256, scratch=MAX_GAMMA + 1)


def _table(t_draft: float, t_target) -> CostTable:
    return CostTable(tuple(t_target), t_draft, "hand-made", None, 0)


def _generate(eng, prompt, table=None, **kw):
    eng.costs = table if table is not None else eng.costs
    cfg = GenerateConfig(max_new_tokens=kw.pop("max_new_tokens", TOKENS), **kw)
    return generate(eng, prompt, cfg, set())


def _check_rounds(stats: DecodeStats) -> dict[int, int]:
    """Every auto round ran one target pass and exactly γ draft passes (a γ = 0 step drafts nothing)."""
    hist = stats.gammas
    assert sum(hist.values()) == stats.rounds == stats.target_passes, (hist, stats.rounds, stats.target_passes)
    assert stats.draft_passes == stats.drafted == sum(g * n for g, n in hist.items()), (hist, stats.draft_passes)
    return hist


@pytest.fixture(scope="module")
def prompts(rtn_checkpoint):
    rt = Runtime(rtn_checkpoint, backend=BACKEND, max_context=64)
    return [rt.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def targets(engine, prompts):
    return [_generate(engine, p, policy="target")[0] for p in prompts]


def test_a_mix_of_target_steps_and_rounds_is_the_target_output(engine, prompts, targets):
    """With no margin, γ = 1 wins only for α > 0.81 and the prior is 0.8: the first steps are target steps, a probe
    round follows within PROBE_MIN + 1 steps, and whatever the draft does from there α crosses back and forth or
    settles, so one generation holds both kinds; every one of them must emit exactly the target's tokens."""
    mix = _table(0.81, FLAT)
    seen = {}
    for p, target in zip(prompts, targets):
        out, stats = _generate(engine, p, mix, policy="auto", auto=AutoConfig(margin=0.0))
        assert out == target
        hist = _check_rounds(stats)
        assert hist.get(0, 0) >= PROBE_MIN and stats.probes >= 1, hist
        for g, n in hist.items():
            seen[g] = seen.get(g, 0) + n
        assert stats.extra["cost_table"]["source"] == "hand-made"
    assert seen.get(0) and sum(n for g, n in seen.items() if g > 0), seen


@pytest.mark.parametrize("t_draft, t_target, expect", [(1.0, LINEAR, {0}), (0.01, FLAT, None)],
                         ids=["never-speculates", "speculates-long"])
def test_forced_tables_are_the_target_output(engine, prompts, targets, t_draft, t_target, expect):
    for p, target in zip(prompts[:1], targets):
        out, stats = _generate(engine, p, _table(t_draft, t_target), policy="auto")
        assert out == target
        hist = _check_rounds(stats)
        if expect is not None:
            assert set(hist) == expect and stats.draft_passes == 0 and stats.probes == 0
        else:
            assert 0 not in hist and max(hist) >= 4, hist


def test_the_policy_keeps_the_margin(engine, prompts, targets):
    """A draft at 0.98 of a flat target pass: even α = 1 gains under 2% (9 tokens in 8.84 passes), within the
    default margin, so auto decodes as the target, never drafting or probing; with no margin it probes."""
    near = _table(0.98, FLAT)
    out, stats = _generate(engine, prompts[0], near, policy="auto")
    assert out == targets[0] and set(_check_rounds(stats)) == {0} and stats.draft_passes == stats.probes == 0
    out, stats = _generate(engine, prompts[0], near, policy="auto", auto=AutoConfig(margin=0.0))
    assert out == targets[0] and stats.probes >= 1, _check_rounds(stats)


def test_the_ceiling_the_room_and_the_scratch_bound_the_choice(rtn_checkpoint, prompts, targets):
    ck = load_checkpoint(rtn_checkpoint)
    small = make_engine(BACKEND, ck, len(prompts[0]) + 13, scratch=3)
    small.costs = _table(0.01, FLAT)                                 # wants γ = 8 every round
    out, stats = _generate(small, prompts[0], policy="auto", max_new_tokens=64)
    assert out == targets[0][:len(out)] and stats.extra["stopped"] == "context full"
    hist = _check_rounds(stats)
    assert max(hist) == 3, hist           # 3 scratch slots; rounds near the end fit the room (or a pass would fail)
    out, stats = _generate(small, prompts[0], policy="auto", auto=AutoConfig(gamma_max=2), max_new_tokens=8)
    assert max(_check_rounds(stats)) <= 2


def test_sampled_auto_with_target_steps_is_seeded(engine, prompts):
    """A γ = 0 round under sampling takes the target's token as a target step does (it used to fail on an empty
    draft); the same seed and table give the same tokens."""
    cfg = dict(policy="auto", sampling=SamplingConfig(0.8, top_k=40, seed=3))
    a, sa = _generate(engine, prompts[1], _table(0.81, FLAT), **cfg)
    b, _ = _generate(engine, prompts[1], **cfg)
    assert a == b and sa.gammas.get(0)
    _check_rounds(sa)
    others = [_generate(engine, prompts[1], policy="auto", sampling=SamplingConfig(0.8, top_k=40, seed=s))[0]
              for s in (4, 5, 6)]
    assert any(o != a for o in others), "three other seeds gave the same tokens: the seed is not what draws them"


def test_measured_costs_keep_the_target_output(fresh, prompts, targets, tmp_path):
    """The table measured on this machine (whatever it says here) drives generations that are the target's."""
    for p, target in zip(prompts, targets):
        out, stats = generate(fresh, p, GenerateConfig(policy="auto", max_new_tokens=TOKENS), set())
        assert out == target
        _check_rounds(stats)
    t = stats.extra["cost_table"]
    assert t["source"] == "measured" and t["context"] == costs.CONTEXT and list(t["target_ms"]) == \
        [str(w) for w in range(1, MAX_GAMMA + 2)] and t["path"].startswith(str(tmp_path))
    assert stats.prefill_tokens == len(prompts[-1])         # the measuring passes are in no generation's stats


def test_a_wider_pass_never_costs_less_than_a_narrower_one():
    """A table a bench measured (scripts/results: a neighbour's burst lifted the 4-token pass's median to 25.8 ms
    between 14.4 ms passes of 3 and 5 tokens): each width takes the least of its own and every wider pass's median."""
    recorded = [12.095, 12.796, 14.371, 25.796, 14.447, 14.672, 14.957, 15.347, 17.428]
    assert costs.widening(recorded) == (12.095, 12.796, 14.371, 14.447, 14.447, 14.672, 14.957, 15.347, 17.428)
    assert costs.widening(LINEAR) == LINEAR and costs.widening(FLAT) == FLAT


# -- the cost table's cache -----------------------------------------------------------------------------------------
@pytest.fixture
def fresh(engine, tmp_path, monkeypatch):
    """The engine with no table kept and an empty cache folder (one sweep of real passes, no warm-up: these
    tests check where a table comes from, not what it says)."""
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "REPEATS", 1)
    monkeypatch.setattr(costs, "WARMUP", 0)
    monkeypatch.setattr(costs, "CHECK_SWEEPS", 0)    # no spot check of cached tables (its own tests turn it on)
    engine.costs = None
    return engine


TEXT = [504, 6376, 314, 4461, 281, 827, 8545, 975, 282, 260, 970]


def test_a_table_is_measured_once_then_read_and_remeasured_on_request(fresh, tmp_path):
    t = engine_costs(fresh, TEXT)
    path = table_path(fingerprint(fresh))
    assert t.source == "measured" and t.path == path and path.is_file() and path.parent == tmp_path / "costs"
    assert len(t.target) == MAX_GAMMA + 1 and all(x > 0 for x in t.target + (t.draft,)) and t.note is None
    assert list(t.target) == sorted(t.target)                            # widening(): never cheaper when wider
    assert fresh.length == 0 and fresh.stats.target_passes == 0         # nothing leaks into the next sequence
    assert engine_costs(fresh, TEXT) is t                                # kept on the engine
    fresh.costs = None
    cached = engine_costs(fresh, TEXT)
    assert cached.source == "cache" and cached.target == t.target and cached.draft == t.draft
    again = engine_costs(fresh, TEXT, remeasure=True)
    assert again.source == "measured" and again.note is None
    assert read_table(path, fingerprint(fresh), MAX_GAMMA + 1)[0].target == again.target


def test_each_draft_head_setting_has_its_own_table(engine):
    """A run's --draft-head changes the draft pass's bytes (not the checkpoint's seal): its table is its own, never
    one measured under another setting (a shortlist run's cheaper draft was read for an 8-bit-head run)."""
    ck = engine.ckpt
    kept = (ck.draft_head, ck.shortlist_k)
    try:
        paths = {}
        for head, k in (("8bit", None), ("shortlist", 64), ("shortlist", 32), ("4bit", None)):
            ck.draft_head, ck.shortlist_k = head, k or kept[1]
            paths[head, k] = table_path(fingerprint(engine))
    finally:
        ck.draft_head, ck.shortlist_k = kept
    assert len(set(paths.values())) == 4, paths


def _spoiled(how: str, fp: dict) -> str:
    """A cached table (hand-made times) spoiled one way."""
    data = {"fingerprint": fp, "context": costs.CONTEXT, "target_s": [0.01 * w for w in range(1, MAX_GAMMA + 2)],
            "draft_s": [0.008]}
    if how == "json":
        return "{not json"
    if how == "fingerprint":
        data["fingerprint"] = {**fp, "threads": fp["threads"] + 1}
    elif how == "widths":
        data["target_s"].pop()
    elif how == "zero":
        data["target_s"][3] = 0.0
    elif how == "text":
        data["draft_s"] = ["fast"]
    return json.dumps(data)


@pytest.mark.parametrize("how, why", [("json", "unreadable"), ("fingerprint", "stale"), ("widths", "wrong widths"),
                                      ("zero", "not positive"), ("text", "not positive"), ("sound", None)])
def test_a_spoiled_table_is_remeasured_never_trusted(fresh, how, why):
    fp = fingerprint(fresh)
    path = table_path(fp)
    path.parent.mkdir(parents=True)
    path.write_text(_spoiled(how, fp))
    t = engine_costs(fresh, TEXT)
    if why is None:                                                  # the same file unspoiled is read as it is
        assert t.source == "cache" and t.draft == 0.008 and t.note is None
        return
    assert t.source == "measured" and why in t.note and str(path) in t.note and "\n" not in t.note
    assert all(math.isfinite(x) and x > 0 for x in t.target + (t.draft,)) and t.draft != 0.008
    assert read_table(path, fp, MAX_GAMMA + 1)[0].target == t.target                # the file is sound again


def test_the_spot_check_judges_a_tables_shape_not_its_speed():
    """`auto` chooses from the table's ratios, so a host whose bandwidth moved keeps its table, and one whose
    1-token target pass was timed at 22 ms where it takes 6 beside a sound draft pass (a burst on those sweeps) does
    not."""
    table = costs.ratios(0.006, 0.0075, 0.004)
    assert costs.disagreement(table, costs.ratios(0.012, 0.015, 0.008), 1.5) is None       # everything 2x slower
    assert costs.disagreement(table, costs.ratios(0.006, 0.0075 * 1.3, 0.004), 1.5) is None  # within the noise
    why = costs.disagreement(costs.ratios(0.022, 0.024, 0.004), table, 1.5)
    assert why and "draft vs target 1 0.182 in the table, 0.667 timed now, 3.7x apart" in why and "\n" not in why
    assert "target 5 vs target 1" in costs.disagreement(table, costs.ratios(0.006, 0.006 * 2, 0.004), 1.5)


def test_a_cached_table_out_of_step_with_this_machine_is_remeasured(fresh, monkeypatch):
    """A sound file holding a draft pass 1/100 of a target pass (no engine's: the draft reads half the bytes and
    does the same attention) is re-measured with one line saying so; allowed any shape, the same file is read, the
    check's ratios beside it. The reference backends are not checked (seconds a start): the engine here reads the
    file as it is while its backend is not among the checked ones."""
    monkeypatch.setattr(costs, "CHECK_SWEEPS", 1)
    fp = fingerprint(fresh)
    path = table_path(fp)
    skewed = CostTable((0.1,) * (MAX_GAMMA + 1), 0.001, "measured", None, costs.CONTEXT)
    costs.write_table(skewed, path, fp)
    assert {"cpu", "torch"}.isdisjoint(costs.CHECKED_BACKENDS)
    monkeypatch.setattr(costs, "CHECKED_BACKENDS", tuple(b for b in costs.CHECKED_BACKENDS if b != fresh.name))
    assert engine_costs(fresh, TEXT).target == skewed.target
    fresh.costs = None
    monkeypatch.setattr(costs, "CHECKED_BACKENDS", (fresh.name,))
    again = engine_costs(fresh, TEXT)
    assert again.source == "measured" and "out of step" in again.note and str(path) in again.note
    assert read_table(path, fp, MAX_GAMMA + 1)[0].target == again.target != skewed.target       # the file re-written
    costs.write_table(skewed, path, fp)
    fresh.costs = None
    monkeypatch.setattr(costs, "CHECK_TOLERANCE", 1e9)
    kept = engine_costs(fresh, TEXT)
    assert kept.source == "cache" and kept.target == skewed.target and kept.note is None
    check = kept.summary()["check"]
    assert check["cached"]["draft_vs_target_1"] == 0.01 < 0.1 < check["timed"]["draft_vs_target_1"]


def test_the_fingerprint_covers_what_changes_the_costs(fresh, rotated_checkpoint):
    fp = fingerprint(fresh)
    for key in ("cpu", "torch", "backend", "threads", "checkpoint", "version"):
        assert fp[key], key
    assert fp["checkpoint"] == manifest_seal(fresh.ckpt.manifest) != manifest_seal(read_manifest(rotated_checkpoint))
    # the threads that run the passes: the native step's own (torch's do not run them), else torch's
    get, put = ((lambda: fresh.threads), (lambda n: setattr(fresh, "threads", n))) if fresh.name == "native" else \
        (torch.get_num_threads, torch.set_num_threads)
    threads = get()
    try:
        put(threads + 1)
        assert fingerprint(fresh) != fp and table_path(fingerprint(fresh)) != table_path(fp)
    finally:
        put(threads)


def test_a_small_context_or_an_unwritable_cache_measures_without_saving(fresh, rtn_checkpoint, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("BITNEST_CACHE", str(blocked))
    t = engine_costs(fresh, TEXT)
    assert t.source == "measured" and t.path is None and "could not be saved" in t.note
    ck = load_checkpoint(rtn_checkpoint)
    small = make_engine(BACKEND, ck, 40, scratch=MAX_GAMMA + 1)
    t = engine_costs(small, TEXT)
    assert t.source == "measured" and t.path is None and t.context == 40 - (MAX_GAMMA + 1) and t.note is None


def test_acceptance_per_draft_position_counts_accepted_prefixes():
    """A round keeps a prefix of its proposals: rounds keeping 2 of 4, 4 of 4 and 0 of 4 count positions 0 and 1
    twice, 2 and 3 once; two generations' counts add position by position (what /metrics exports per position)."""
    a, b = DecodeStats("speculative", "cpu"), DecodeStats("speculative", "cpu")
    for drafted, accepted in ((4, 2), (4, 4), (4, 0)):
        a.record_round(drafted, accepted)
    b.record_round(2, 1)
    assert a.accepted_per_pos == [2, 2, 1, 1] and sum(a.accepted_per_pos) == a.accepted
    a.add(b)
    assert a.accepted_per_pos == [3, 2, 1, 1] and sum(a.accepted_per_pos) == a.accepted
