"""Elastic KV in the runtime (docs/memory.md): a request past what the device's plan holds at KV8 runs elastically
from memory allocated up front (no growth during the run, resident memory sampled), losslessly against the elastic
target; the planner's bitnest-elastic row; and the one-line refusals."""

import os

import pytest

from edge.backends import make_engine
from edge.backends.native import native_unavailable
from edge.corpora import shakespeare_text
from edge.decode.config import GenerateConfig
from edge.engine.kv_cache import ElasticKV
from edge.errors import BitNestError
from edge.memory.alloc_trace import storage_bytes
from edge.memory.devices import MiB, get_profile, release_freed_heap
from edge.memory.plan import plan_for_runtime
from edge.memory.verify import AnonSampler, _status
from edge.model.checkpoint import load_checkpoint
from tests.conftest import ROOT

NATIVE = native_unavailable()
# Anonymous memory a run may add over the one before it: Python objects of the tokens and stats, the logits of a
# pass (196 KB a row); the KV planes and the step's workspace are allocated when the engine is built.
RUN_GROWTH = 8 * MiB


def small_device(total_mib: float):
    return get_profile("local").override(total_mib=total_mib, os_reserve_mib=0, context_reserve_mib=0)


@pytest.mark.skipif(NATIVE is not None, reason=f"native backend: {NATIVE}")
def test_a_context_past_the_kv8_plan_runs_elastically_from_the_plan(rtn_checkpoint):
    """`run_past_the_plan` in a process of its own: resident memory sampled in the test's process can depend on what
    the suite's earlier tests left of its heap (one full run measured 8.9 MiB of growth there; fresh processes 1.5 to
    3.6 MiB)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", f"import sys; from {__name__} import run_past_the_plan; "
                        "run_past_the_plan(sys.argv[1])", str(rtn_checkpoint)], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sampled growth" in r.stdout


def run_past_the_plan(rtn_checkpoint: str) -> None:
    """A request past the default model's KV8 plan on a 156 MiB device runs elastically from memory allocated up front:
    the anonymous memory sampled during the run grows by at most RUN_GROWTH, and its tokens are the target's."""
    from edge.llm import Runtime
    dev = small_device(156)                     # the default model's KV8 plan holds ~800 positions here
    kv8 = plan_for_runtime(load_checkpoint(rtn_checkpoint), dev, "native", 64, 7).max_context
    rt = Runtime(rtn_checkpoint, backend="native", max_context=kv8 + 200, device=dev, prefill_chunk=64, gamma=7)
    eng = rt.engine
    assert rt.plan.config.name == "bitnest-elastic" and eng.capacity == kv8 + 200 <= rt.plan.max_context
    ring = eng.cache.main.refine.shape[3]
    assert ring == rt.plan.ring_slots == 256 + 64 < eng.capacity                 # window + the widest pass
    held = storage_bytes(eng.cache)
    assert held == eng.capacity * rt.plan.kv_per_position + rt.plan.ring_bytes + rt.plan.scratch_bytes
    prompt = rt.encode(shakespeare_text()[:12000], chat=False)[:eng.capacity - 48]
    rt.generate(prompt[:32], GenerateConfig(policy="speculative", max_new_tokens=8))     # thread pools, first passes
    release_freed_heap()
    before = _status("RssAnon")
    with AnonSampler() as sampler:
        spec = rt.generate(prompt, GenerateConfig(policy="speculative", gamma=4, max_new_tokens=48))
    growth = sampler.peak - before
    print(f"capacity {eng.capacity}, KV8 plan {kv8}, ring {ring}, sampled growth {growth / MiB:.1f} MiB",
          spec["stats"].summary())
    assert growth <= RUN_GROWTH, f"{growth / MiB:.1f} MiB allocated during the elastic run"
    assert eng.cache.main.refine.shape[3] == ring and storage_bytes(eng.cache) == held
    s = spec["stats"].summary()
    assert eng.length > kv8 and s["kv4_positions"] == eng.length - 256 > 0 and s["kv_window"] == 256
    from export.commands.chat import answer_line            # what the interactive chat prints after the answer
    assert f"{s['kv4_positions']:,} positions at KV4 (window 256)" in answer_line(s)
    target = rt.generate(prompt, GenerateConfig(policy="target", max_new_tokens=48))
    assert spec["tokens"] == target["tokens"]


def test_planner_counts_what_the_elastic_engine_allocates(rtn_checkpoint):
    """The plan's KV, ring and scratch bytes equal the elastic cache's tensors (cpu backend)."""
    ckpt = load_checkpoint(rtn_checkpoint)
    p = plan_for_runtime(ckpt, small_device(400), "cpu", 32, 7, kv_window=48)
    eng = make_engine("cpu", ckpt, 500, scratch=8, prefill_chunk=32, elastic=ElasticKV(48, p.ring_slots))
    assert p.ring_slots == 48 + 32
    assert storage_bytes(eng.cache) == 500 * p.kv_per_position + p.ring_bytes + p.scratch_bytes


def test_refusals_are_one_line(rtn_checkpoint):
    from edge.llm import Runtime
    cases = [
        (dict(max_context=300, kv_window=300), "not smaller than the context of 300"),           # window >= context
        (dict(max_context=None, kv_window=64, device=small_device(133)), "even with KV4 past a window"),  # no base planes
        (dict(max_context=10**6, device=small_device(156)), "the largest that fits is"),       # past the elastic plan
    ]
    for kw, words in cases:
        with pytest.raises(BitNestError, match=words) as e:
            Runtime(rtn_checkpoint, backend="cpu", prefill_chunk=64, gamma=7, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(BitNestError, match="runs on the native, cpu, torch backends, not triton"):
        make_engine("triton", load_checkpoint(rtn_checkpoint), 64, elastic=ElasticKV(16, 48))


def test_kv_window_option_is_range_checked(capsys):
    from export.commands.chat import main
    with pytest.raises(SystemExit) as e:
        main(["--kv-window", "-1", "--prompt", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-window" in err[0], err
