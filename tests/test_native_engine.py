"""The `native` backend on real exports of the default model: greedy speculative output equals greedy target output
on 20 real prompts (KV8, KV4 and recent-N drafting, online rotations), chunked passes equal whole ones bit for bit,
the step agrees with the torch reference backend, the engine interface counts its bytes, and what the kernels do
not take is a one-line error naming the fallback."""

from dataclasses import replace

import pytest
import torch

from edge.corpora import shakespeare_prompts, sharegpt_prompts
from edge.backends import make_engine, resolve_backend
from edge.backends.native import NativeEngine, native_unavailable
from edge.backends.torch_ref import TorchBackend
from edge.decode.config import DraftKVPolicy, GenerateConfig
from edge.engine.interface import PassEngine
from edge.engine.stats import embedding_row_bytes
from edge.errors import BitNestError
from edge.model.checkpoint import load_checkpoint, set_draft_head
from edge.llm import Runtime
from tests.conftest import stored_tensor_bytes
from tests.reference_pairs import bound_after, engines, explain, first_layers, row_errors, run_traced

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason=f"native backend: {native_unavailable()}")
IDS = [1, 504, 3145, 282, 260, 3622, 30, 5000, 77, 78, 900, 1200]


# Speculative acceptance (γ = 4, 24 tokens) of the RTN export's draft on the prompts of the test below, by draft KV read.
# Measured here (AMD EPYC, avx512-vnni): kv8 0.42, kv4 0.45, recent-8 0.49 (7/7/6 prompts); on 8 other prompts x 32
# tokens kv8 0.48, kv4 0.37, recent-8 0.44, single prompts as low as 0.23. A draft reading the refinement plane as
# its KV4 base plane (planted in attend.h) measured kv4 0.006 and recent-8 0.002 there. The floors sit at about half
# the lowest aggregate: portable across CPUs (a flipped code moves a few tokens, not half the acceptance) and far
# above such garbage. A subtler wrong read (the previous scratch slot, planted) only lowered acceptance to 0.32-0.44:
# the floor is no substitute for tests/test_native_draft_paths.py, which fails on it.
ACCEPTANCE_FLOOR = {"kv8": 0.25, "kv4": 0.2, "recent": 0.2}


@pytest.fixture(scope="module")
def native_rt(rtn_checkpoint):
    return Runtime(rtn_checkpoint, backend="native", max_context=512)


def test_auto_picks_native_where_it_runs():
    assert resolve_backend("auto") == "native"


def test_speculative_equals_target_on_twenty_real_prompts(native_rt):
    prompts = [(p, True) for p in sharegpt_prompts(10)] + [(p, False) for p in shakespeare_prompts(10)]
    drafts = [DraftKVPolicy(), DraftKVPolicy(kv8_below=0), DraftKVPolicy(0, "recent", 8)]
    counts = {d: [0, 0] for d in drafts}                                         # accepted, drafted
    for i, (text, chat) in enumerate(prompts):
        ids = native_rt.encode(text, chat)[-200:]
        target = native_rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=24))
        spec = native_rt.generate(ids, GenerateConfig(policy="speculative", gamma=4, max_new_tokens=24,
                                                      draft_kv=drafts[i % 3]))
        assert spec["tokens"] == target["tokens"], f"prompt {i} ({drafts[i % 3]}): {text[:50]!r}"
        s = spec["stats"]
        assert s.draft_passes == s.drafted and s.target_passes == s.rounds and 0 <= s.accepted <= s.drafted
        counts[drafts[i % 3]][0] += s.accepted
        counts[drafts[i % 3]][1] += s.drafted
    acceptance = {d.long_view if d.kv8_below == 0 else "kv8": a / n for d, (a, n) in counts.items()}
    print("acceptance", acceptance)
    for view, floor in ACCEPTANCE_FLOOR.items():
        assert acceptance[view] >= floor, (view, acceptance)


def test_speculative_equals_target_with_online_rotations(rotated_checkpoint):
    rt = Runtime(rotated_checkpoint, backend="native", max_context=256)
    assert rt.ckpt.rotations.r1 is not None and rt.ckpt.rotations.r4_size == 1536
    for text in sharegpt_prompts(3):
        ids = rt.encode(text)
        target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=24))
        for policy in ("speculative", "adaptive"):
            assert rt.generate(ids, GenerateConfig(policy=policy, max_new_tokens=24))["tokens"] == target["tokens"]


def test_chunked_passes_equal_whole_ones(rtn_checkpoint):
    """A prefill in chunks of 3 gives bit for bit the logits of one pass, and a 12-token pass that the step splits
    at its workspace (9 rows here) the logits of one 12-row pass: rows and queries do not depend on M."""
    one = NativeEngine(load_checkpoint(rtn_checkpoint), 64, prefill_chunk=64)
    chunked = NativeEngine(load_checkpoint(rtn_checkpoint), 64, prefill_chunk=3)
    assert torch.equal(one.prefill(IDS), chunked.prefill(IDS))
    assert torch.equal(one.forward(IDS, "target"), chunked.forward(IDS, "target"))


def _layers(path, n):
    return first_layers(path, n)


def _agreement_scenario(view):
    def scenario(eng):
        eng.prefill(IDS[:6])
        yield eng.forward(IDS[6:], view)                                                       # [6, V]
    return scenario


@pytest.mark.parametrize("isa", ["best", "generic"])
@pytest.mark.parametrize("view", ["draft", "target"])
def test_the_step_agrees_with_the_torch_reference(rotated_checkpoint, view, isa, monkeypatch):
    """Two real layers (R1, R2, R4 online) of the default model, with this CPU's kernel set and the portable one:
    every row at float32 rounding (ROUNDING), or explained. A last-bit difference before a per-token INT8 quantizer
    can move one activation code to its neighbour (docs/runtime.md); such a row is allowed FLIPPED only where giving
    the reference that neighbour code (x/s_x within float32 rounding of k + 1/2) brings it back within ROUNDING, so a
    loose row is a shown flip, never a tolerance. Measured here (AMD EPYC, avx512-vnni): no flip with the best
    kernels; with `generic`, at the draft view, layer 1's q/k/v input of the 4th token, x/s_x = -6.5 exactly
    (reference -6, half to even; native -7), its row 7.0e-3 away and the two rows after it through attention."""
    if isa == "generic":
        monkeypatch.setenv("BITNEST_NATIVE_ISA", "generic")
    path = rotated_checkpoint
    native, ref = engines(path, 2)
    scenario = _agreement_scenario(view)
    got = list(scenario(native))
    flips = explain(path, 2, scenario, got)
    print(native.isa, view, flips)
    rows = row_errors(got, run_traced(ref, scenario)[0])[0]
    assert max(rows) < bound_after(flips), rows


@pytest.mark.parametrize("setting", ["8bit", "4bit", "shortlist"])
def test_each_draft_head_is_lossless_on_real_prompts(rtn_checkpoint, setting):
    rt = Runtime(rtn_checkpoint, backend="native", max_context=256, draft_head=setting, shortlist_k=32)
    assert rt.engine.draft_head == setting
    for i, text in enumerate(sharegpt_prompts(4)):
        ids = rt.encode(text)[-120:]
        target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=20))
        spec = rt.generate(ids, GenerateConfig(policy="speculative", gamma=4, max_new_tokens=20))
        assert spec["tokens"] == target["tokens"], f"{setting}, prompt {i}"
        assert spec["stats"].summary()["draft_head"] == setting


@pytest.mark.parametrize("setting", ["8bit", "4bit", "shortlist"])
def test_the_draft_head_agrees_with_the_torch_reference(rotated_checkpoint, setting):
    """Two real layers at the draft view, each draft-head setting, native against the torch backend: the same
    logits up to float32 summation order (as the test above), and for the shortlist the same re-scored rows (a
    near-tie at the shortlist's edge may swap one row) with -inf everywhere else."""
    k = 32
    native = NativeEngine(set_draft_head(_layers(rotated_checkpoint, 2), setting, k), 64)
    ck = set_draft_head(_layers(rotated_checkpoint, 2), setting, k)
    ref = PassEngine(ck, TorchBackend(ck), 64)
    native.prefill(IDS[:6])
    ref.prefill(IDS[:6])
    for t, token in enumerate(IDS[6:9]):
        got, want = native.forward([token], "draft")[0], ref.forward([token], "draft")[0]       # [V]
        native.commit(native.length + 1), ref.commit(ref.length + 1)
        if setting != "shortlist":
            assert float((got - want).norm() / want.norm()) < 5e-3, (setting, t)
            continue
        g_ids, w_ids = set(torch.isfinite(got).nonzero().flatten().tolist()), set(torch.isfinite(want).nonzero().flatten().tolist())
        assert len(g_ids) == len(w_ids) == k and len(g_ids & w_ids) >= k - 1, (t, g_ids ^ w_ids)
        common = sorted(g_ids & w_ids)
        assert float((got[common] - want[common]).norm() / want[common].norm()) < 5e-3, t


@pytest.mark.parametrize("setting", ["4bit", "shortlist"])
def test_a_draft_vocabulary_agrees_with_the_torch_reference(rotated_checkpoint, setting):
    """With a draft vocabulary of N ids the native step scores ids [0, N) as the torch reference does (the test
    above's tolerances) and sets every logit past them to -inf; the target pass scores the whole vocabulary."""
    k, n = 32, 3000
    native = NativeEngine(set_draft_head(_layers(rotated_checkpoint, 2), setting, k, n), 64)
    ck = set_draft_head(_layers(rotated_checkpoint, 2), setting, k, n)
    ref = PassEngine(ck, TorchBackend(ck), 64)
    native.prefill(IDS[:6])
    ref.prefill(IDS[:6])
    got, want = native.forward([IDS[6]], "draft")[0], ref.forward([IDS[6]], "draft")[0]          # [V]
    assert bool((got[n:] == float("-inf")).all()) and bool((want[n:] == float("-inf")).all())
    finite = torch.isfinite(want[:n])
    assert int(finite.sum()) == (k if setting == "shortlist" else n)
    same = finite & torch.isfinite(got[:n])
    assert int(same.sum()) >= int(finite.sum()) - 1                       # a near-tie at the shortlist's edge
    assert float((got[:n][same] - want[:n][same]).norm() / want[:n][same].norm()) < 5e-3
    assert bool(torch.isfinite(native.forward([IDS[7]], "target")[0]).all())


def test_a_draft_vocabulary_is_lossless_on_real_prompts(rtn_checkpoint):
    """A draft that cannot propose most ids (2,048 of 49,152) is rejected more often, never followed."""
    rt = Runtime(rtn_checkpoint, backend="native", max_context=256, draft_head="shortlist", shortlist_k=32,
                 draft_vocab=2048)
    for i, text in enumerate(sharegpt_prompts(3)):
        ids = rt.encode(text)[-120:]
        target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=20))
        spec = rt.generate(ids, GenerateConfig(policy="speculative", gamma=4, max_new_tokens=20))
        assert spec["tokens"] == target["tokens"], f"prompt {i}"
        assert spec["stats"].summary()["draft_vocab"] == 2048


def test_bytes_are_counted_by_the_engine_interface(native_rt, rtn_checkpoint):
    """A target pass reads every stored tensor once (the default head nested at 8 bits, the embedding read from its
    rows: one row of both planes and its scales a token), counted from the shards' headers, not by the engine."""
    s = native_rt.generate(native_rt.encode("Name three colours."), GenerateConfig(policy="target", max_new_tokens=6))
    stats, stored = s["stats"], stored_tensor_bytes(rtn_checkpoint)
    vocab = native_rt.ckpt.config.vocab_size
    emb = sum(stored[f"lm_head.{p}"] for p in ("base", "refine", "scale")) // vocab
    assert native_rt.ckpt.embedding_from_head and emb == embedding_row_bytes(native_rt.ckpt)
    assert stats.weight_bytes == stats.target_passes * (sum(stored.values()) + emb) > 0
    assert stats.kv_bytes > 0 and stats.summary()["backend"] == "native"


def test_what_the_kernels_do_not_take_names_the_fallback(rtn_checkpoint):
    ck = load_checkpoint(rtn_checkpoint)
    name = "model.layers.0.mlp.up_proj"
    n, k = ck.linears[name].shape
    ck.tensors[name + ".scale"] = torch.ones(n, k // 32, dtype=torch.float16)        # groups of 32 columns
    ck.linears[name] = replace(ck.linears[name], group_size=32)
    with pytest.raises(BitNestError, match=r"group size 32.*use --backend cpu"):
        make_engine("native", ck, 64)


@pytest.mark.parametrize("fixture", ["rtn_checkpoint", "rotated_checkpoint"])
def test_the_memory_plan_is_what_the_step_allocates(request, fixture):
    """The planner's `native` workspace is the step's own allocation, byte for byte (plus this engine's RoPE
    tables), so a device profile's maximum context holds for this backend too."""
    from edge.backends.native import workspace_bytes, workspace_rows
    ck = load_checkpoint(request.getfixturevalue(fixture))
    eng = NativeEngine(ck, 300, scratch=9, prefill_chunk=40)
    planned = workspace_bytes(ck.config, workspace_rows(40, 9), eng.threads, 300, ck.rotations.r4_size is not None)
    assert planned["step_buffers"] == eng.step.workspace_bytes()
    assert planned["rope_tables"] == 2 * 300 * ck.config.head_dim * 4


def test_no_compiler_is_one_line_and_auto_falls_back(small_llama_checkpoint, tmp_path):
    """Where the plugins cannot be built (no C++ compiler, a fresh cache), `--backend native` is a one-line error
    naming the fallback and `auto` runs the cpu backend (on the 2-layer model: what is checked is the choice)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, CXX="no-such-c++", BITNEST_CACHE=str(tmp_path))
    run = lambda backend: subprocess.run([sys.executable, "scripts/chat.py", "--checkpoint",
                                          str(small_llama_checkpoint), "--backend", backend, "--prompt", "Hi.",
                                          "--max-new-tokens", "2", "--json"],
                                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    r = run("native")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "no C++ compiler" in line and "--backend cpu" in line, line
    r = run("auto")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["backend"] == "cpu"


@pytest.mark.parametrize("isa, says", [("avx9000", "names no kernel set"), ("neon-sdot", "this CPU does not run it")])
def test_a_forced_isa_that_cannot_run_is_one_line(small_llama_checkpoint, isa, says):
    """BITNEST_NATIVE_ISA naming no kernel set, or one this CPU lacks: one line naming the sets that run, exit 2, no
    traceback, with --backend native and with auto (which must not quietly run another backend)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, BITNEST_NATIVE_ISA=isa)
    for backend in ("native", "auto"):
        r = subprocess.run([sys.executable, "scripts/chat.py", "--checkpoint", str(small_llama_checkpoint), "--backend",
                            backend, "--prompt", "Hi.", "--max-new-tokens", "2", "--json"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert says in line and "generic" in line and "BITNEST_NATIVE_ISA" in line, line


def test_the_stats_name_the_kernel_set(native_rt):
    s = native_rt.generate(native_rt.encode("Hi."), GenerateConfig(policy="target", max_new_tokens=2))["stats"].summary()
    from plugins import native
    assert s["isa"] == native.best_isa() and s["threads"] >= 1
