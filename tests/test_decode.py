"""Decoding on the real default model: greedy speculative output equals greedy target output (both
backends, KV8 and KV4 drafting), byte accounting, sampling, and bit-identical verification passes."""

import pytest
import torch

from edge.backends import make_backend
from edge.decode.config import DraftKVPolicy, GenerateConfig
from edge.engine.interface import PassEngine
from edge.decode.sampling import SamplingConfig
from edge.model.checkpoint import load_checkpoint
from edge.llm import Runtime
from tests.conftest import policy_backend

PROMPTS = ["Write a short poem about the sea.", "What is the capital of France? Explain briefly.",
           "List three uses of a paperclip."]


@pytest.fixture(scope="module")
def cpu_runtime(rtn_checkpoint):
    return Runtime(rtn_checkpoint, backend="cpu", max_context=256)


def _run(rt, prompt, **kw):
    return rt.generate(rt.encode(prompt), GenerateConfig(**kw))


@pytest.fixture(scope="module")
def cpu_targets(cpu_runtime):
    """The target's own greedy tokens for every prompt, decoded once for every draft KV policy below."""
    return {p: _run(cpu_runtime, p, policy="target", max_new_tokens=32)["tokens"] for p in PROMPTS}


@pytest.mark.parametrize("draft_kv", [DraftKVPolicy(), DraftKVPolicy(kv8_below=0), DraftKVPolicy(0, "recent", 8)])
def test_speculative_equals_target_on_cpu_backend(cpu_runtime, cpu_targets, draft_kv):
    for prompt in PROMPTS:
        spec = _run(cpu_runtime, prompt, policy="speculative", gamma=4, max_new_tokens=32, draft_kv=draft_kv)
        assert spec["tokens"] == cpu_targets[prompt], f"divergence on {prompt!r}"
        s = spec["stats"].summary()
        assert 0 <= s["acceptance"] <= 1 and 1 <= s["tokens_per_round"] <= 5
        assert s["draft_passes"] == 4 * spec["stats"].rounds
        assert s["gemm_row_checks"] > 0 and isinstance(s["gemm_row_by_row"], list)   # reported (row_check.py)


def test_speculative_equals_target_with_online_rotations(rotated_checkpoint):
    rt = Runtime(rotated_checkpoint, backend="cpu", max_context=256)
    assert rt.ckpt.rotations.r1 is not None and rt.ckpt.rotations.r4_size == 1536
    for prompt in PROMPTS[:2]:
        target = _run(rt, prompt, policy="target", max_new_tokens=24)
        spec = _run(rt, prompt, policy="speculative", gamma=4, max_new_tokens=24)
        assert spec["tokens"] == target["tokens"], f"divergence on {prompt!r}"


def test_speculative_equals_target_on_torch_backend(rtn_checkpoint):
    rt = Runtime(rtn_checkpoint, backend="torch", max_context=128)
    target = _run(rt, PROMPTS[1], policy="target", max_new_tokens=12)
    spec = _run(rt, PROMPTS[1], policy="speculative", gamma=3, max_new_tokens=12)
    assert spec["tokens"] == target["tokens"]


def test_verification_pass_is_bit_identical_to_ar_steps(rtn_checkpoint):
    for backend in ("cpu", "torch"):
        ck = load_checkpoint(rtn_checkpoint)
        eng = PassEngine(ck, make_backend(backend, ck), 32)
        ids = [1, 504, 3145, 282, 260, 3622, 30, 5000]
        eng.prefill(ids[:3])
        batch = eng.forward(ids[3:], "target")
        eng.reset()
        eng.prefill(ids[:3])
        steps = []
        for t in ids[3:]:
            steps.append(eng.forward([t], "target")[-1])
            eng.commit(eng.length + 1)
        assert torch.equal(batch, torch.stack(steps)), backend


def test_bytes_per_token_follow_the_passes(cpu_runtime):
    t = _run(cpu_runtime, PROMPTS[0], policy="target", max_new_tokens=8)["stats"]
    d = _run(cpu_runtime, PROMPTS[0], policy="draft", max_new_tokens=8)["stats"]
    eng, ck = cpu_runtime.engine, cpu_runtime.ckpt
    assert ck.embedding_from_head and ck.draft_head == "8bit"            # the default export's head
    emb = ck.config.hidden_size + 2 * ck.config.hidden_size // ck.linears["lm_head"].group_size   # a row of both planes
    assert t.weight_bytes == t.target_passes * (eng.pass_weight_bytes["target"] + emb)
    assert d.weight_bytes == d.draft_passes * (eng.pass_weight_bytes["draft"] + emb)
    # the draft reads the base plane only of every block linear (half the target's plane bytes, same scales) and the
    # head at 8 bits, as the target does
    planes = sum(s.shape[0] * s.shape[1] // 2 for n, s in ck.linears.items() if n != "lm_head")
    assert eng.pass_weight_bytes["target"] - eng.pass_weight_bytes["draft"] == planes
    # KV bytes: every AR step reads the whole committed history once at KV8
    kv8 = eng.kv_position_bytes[True]
    assert kv8 == eng.cache.main.nbytes() // eng.capacity        # what the cache stores per position
    assert t.kv_bytes == sum(kv8 * (t.prefill_tokens + 1 + i) for i in range(t.target_passes))


def test_sampled_speculation_is_seeded_and_runs(cpu_runtime):
    cfg = dict(policy="speculative", max_new_tokens=16, sampling=SamplingConfig(0.8, top_k=40, top_p=0.95, seed=7))
    a, b = _run(cpu_runtime, PROMPTS[2], **cfg), _run(cpu_runtime, PROMPTS[2], **cfg)
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) >= 1
    other = lambda s: _run(cpu_runtime, PROMPTS[2], **{**cfg, "sampling": SamplingConfig(0.8, top_k=40, top_p=0.95,
                                                                                          seed=s)})["tokens"]
    assert any(other(s) != a["tokens"] for s in (8, 9, 10)), "other seeds gave the same tokens"


def test_prompt_longer_than_cache(rtn_checkpoint):
    from edge.errors import BitNestError
    rt = Runtime(rtn_checkpoint, backend="cpu", max_context=16)
    with pytest.raises(BitNestError, match="does not fit the KV cache of 16"):
        _run(rt, PROMPTS[0] * 4, policy="target", max_new_tokens=4)


def test_engine_refuses_passes_past_its_capacity(rtn_checkpoint):
    ck = load_checkpoint(rtn_checkpoint)
    eng = PassEngine(ck, make_backend("torch", ck), 8)
    eng.prefill([1, 504, 3145])
    for bad in (lambda: eng.forward([1] * 6, "target"), lambda: eng.forward([1, 2], "draft", draft_slot=4),
                lambda: eng.commit(9), lambda: eng.forward([1], "half")):
        with pytest.raises(ValueError):
            bad()
    assert eng.length == 3 and eng.stats.target_passes == 0 and eng.stats.prefill_tokens == 3


@pytest.mark.parametrize("policy", ["speculative", "adaptive"])
def test_speculation_near_a_full_context_shrinks_gamma_and_stays_lossless(cpu_runtime, policy):
    """With room for fewer than γ + 1 positions, a round drafts what fits (it used to switch to target AR)."""
    ids = cpu_runtime.encode(PROMPTS[0])
    rt = Runtime(cpu_runtime.ckpt.path, backend="cpu", max_context=len(ids) + 11)
    target = _run(rt, PROMPTS[0], policy="target", max_new_tokens=64)
    spec = _run(rt, PROMPTS[0], policy=policy, gamma=4, max_new_tokens=64)
    s = spec["stats"]
    assert s.extra["stopped"] == "context full" and target["stats"].extra["stopped"] == "context full"
    assert spec["tokens"] == target["tokens"]
    assert s.target_passes == s.rounds and s.draft_passes == s.drafted          # every step was a round
    assert s.drafted < s.rounds * 4                                             # some round drafted fewer than γ


@pytest.mark.parametrize("policy,sampling,draft_on_device,verify_on_device", [
    ("target", SamplingConfig(), None, True), ("speculative", SamplingConfig(), True, True),
    ("adaptive", SamplingConfig(), True, True), ("speculative", SamplingConfig(0.8, seed=3), False, False)])
def test_greedy_passes_leave_their_logits_on_the_engines_device(rtn_checkpoint, monkeypatch, policy, sampling,
                                                                draft_on_device, verify_on_device):
    """A policy asks for logits on the engine's device (`on_device`: only argmaxes, and adaptive speculation's two
    signals, cross to the host on a GPU engine) wherever its sampler is greedy: target steps, draft proposals and
    verification; nowhere a sampler draws from a distribution. Every pass is the real engine's (the flag only
    recorded on its way through, on `conftest.policy_backend`'s engine: the flag is the policy's)."""
    from edge.backends import make_engine
    from edge.decode.generate import generate
    eng = make_engine(policy_backend(), load_checkpoint(rtn_checkpoint), 128, scratch=8)
    seen, real = {"draft": set(), "target": set()}, eng.forward

    def forward(ids, view, *a, on_device=False, **kw):
        seen[view].add(on_device)
        return real(ids, view, *a, on_device=on_device, **kw)
    monkeypatch.setattr(eng, "forward", forward)
    ids = list(range(300, 340))
    tokens, _ = generate(eng, ids, GenerateConfig(policy=policy, gamma=3, max_new_tokens=8, sampling=sampling), set())
    assert len(tokens) == 8
    assert seen["target"] == {verify_on_device}
    assert seen["draft"] == (set() if draft_on_device is None else {draft_on_device})
