"""Elastic KV (docs/memory.md): the refinement plane as a ring and a per-query KV8 window. The attention of every
implementation (the float64 reference op, the cache's dequantize + SDPA path, the native kernels) against a direct
computation from unwrapped planes, and greedy speculation lossless against the elastic target on the real model, on
the native and cpu backends, with a window and ring small enough that the ring wraps within the run."""

import pytest
import torch

from edge.backends import make_engine
from edge.backends.native import native_unavailable
from edge.corpora import shakespeare_prompts
from edge.decode.config import GenerateConfig
from edge.decode.generate import generate
from edge.engine.kv_cache import KV8, CachedAttention, ElasticKV, KVRead, NestedKVCache
from edge.errors import BitNestError
from edge.model.checkpoint import load_checkpoint
from plugins import reference
from plugins.kv import dequantize_kv, quantize_kv

NATIVE = native_unavailable()
HKV, HPK, D = 3, 3, 64
# float32 attention against float64 over <= 80 positions (as tests/native/check_kernels.cpp bounds it): 1e-5
FLOAT32 = 1e-5


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def filled_cache(gen, capacity: int, window: int, ring: int, length: int, written: int, chunk: int):
    """A one-layer elastic cache with the first `written` of `length` positions of random K/V [2, Hkv, S, D] written
    `chunk` at a time (the ring wraps); the K/V, and the unwrapped planes of all of them (every refinement kept)."""
    c = NestedKVCache(1, HKV, D, capacity, scratch=4, elastic=ElasticKV(window, ring))
    kv = torch.randn(2, HKV, length, D, generator=gen)                              # [2, Hkv, S, D]
    for s in range(0, written, chunk):
        e = min(written, s + chunk)
        c.write(0, s, kv[0, :, s:e], kv[1, :, s:e])
    return c, kv, quantize_kv(kv)


def direct(q: torch.Tensor, planes, start: int, window: int, kv8_from: int = 0) -> torch.Tensor:
    """Attention computed straight from unwrapped planes, float64, one query at a time: query i (position
    start + i) reads KV8 for positions >= max(kv8_from, start + i + 1 - window), KV4 (base only) before."""
    base, refine, scale = planes
    kv8, kv4 = (dequantize_kv(base, refine, scale, v).double() for v in ("kv8", "kv4"))   # [2, Hkv, S, D]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q.shape[1]):
        end, first = start + i + 1, max(kv8_from, start + i + 1 - window)
        kv = torch.cat((kv4[:, :, :first], kv8[:, :, first:end]), dim=2).repeat_interleave(HPK, dim=1)
        p = torch.softmax(q[:, i:i + 1].double() @ kv[0].transpose(1, 2) / D ** 0.5, dim=-1)   # [Hq, 1, end]
        out[:, i:i + 1] = p @ kv[1]
    return out


# (capacity, window, ring, committed, pass tokens, write chunk): decode-sized passes (row by row) and a prefill-sized
# one (one masked SDPA), each with the ring wrapped several times
CASES = [(48, 5, 11, 30, 5, 6), (48, 7, 12, 40, 1, 5), (96, 9, 50, 50, 41, 41)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"S{c[3] + c[4]}-W{c[1]}-R{c[2]}-T{c[4]}")
def test_cache_and_reference_attention_read_the_ring_per_query(gen, case):
    capacity, window, ring, committed, t, chunk = case
    total = committed + t
    c, kv, planes = filled_cache(gen, capacity, window, ring, total, committed, chunk)
    q = torch.randn(HKV * HPK, t, D, generator=gen)
    want = direct(q, planes, committed, window)
    got = CachedAttention(c, committed, KV8)(0, q, kv[0, :, committed:], kv[1, :, committed:])   # writes, then reads
    assert rel(got, want) < FLOAT32, f"cache path vs direct: {rel(got, want):.2e}"
    ref = reference.nested_kv_attention(q, c.main.base[0], c.main.refine[0], c.main.scale[0], total, 0, window=window)
    assert rel(ref, want) < 1e-12, f"reference op vs direct: {rel(ref, want):.2e}"


def test_draft_view_and_window_combine(gen):
    """A draft row reads KV8 only where both its view (Recent-3) and the window (6) allow: the later of the two."""
    c, kv, planes = filled_cache(gen, 40, 6, 12, 24, 23, 4)
    q = torch.randn(HKV * HPK, 1, D, generator=gen)
    for view, first in ((KVRead("recent", 3), 21), (KVRead("recent", 9), 18), (KVRead("kv4"), 24)):
        got = CachedAttention(c, 23, view)(0, q, kv[0, :, 23:], kv[1, :, 23:])
        assert rel(got, direct(q, planes, 23, 6, kv8_from=first)) < FLOAT32, view


@pytest.mark.skipif(NATIVE is not None, reason=f"native backend: {NATIVE}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"S{c[3] + c[4]}-W{c[1]}-R{c[2]}-T{c[4]}")
def test_native_attention_reads_the_ring_per_query(gen, case):
    """The native kernels (plugins/native/attend.h) against the direct computation and the reference, row by row."""
    from plugins import native
    capacity, window, ring, committed, t, chunk = case
    total = committed + t
    c, _, planes = filled_cache(gen, capacity, window, ring, total, total, chunk)
    q = torch.randn(HKV * HPK, t, D, generator=gen)
    got = native.nested_kv_attention(q, c.main.base[0], c.main.refine[0], c.main.scale[0], total, 0, window=window)
    want = direct(q, planes, committed, window)
    ref = reference.nested_kv_attention(q, c.main.base[0], c.main.refine[0], c.main.scale[0], total, 0, window=window)
    for i in range(t):
        assert rel(got[:, i], want[:, i]) < FLOAT32, f"row {i} (position {committed + i}): {rel(got[:, i], want[:, i]):.2e}"
        assert rel(got[:, i], ref[:, i]) < FLOAT32, f"row {i} vs the reference op"


PROMPT_TOKENS, NEW_TOKENS, WINDOW = 40, 56, 16          # a context of 96 positions


@pytest.fixture(scope="module")
def prompt(rtn_checkpoint):
    from edge.model.tokenizer import load_tokenizer
    tok = load_tokenizer(rtn_checkpoint)
    return tok(shakespeare_prompts(1)[0])["input_ids"][:PROMPT_TOKENS]


@pytest.mark.parametrize("backend,chunk", [("native", 16), ("cpu", 24)])
def test_speculation_is_lossless_against_the_elastic_target(rtn_checkpoint, prompt, backend, chunk):
    """Greedy speculative (γ = 4) equals greedy target-only under the same window; the ring (window + widest pass)
    wraps: 96 positions through 16 + 17 (native: a 16-token prefill chunk, a verification pass of at most 17 rows) or
    16 + 24 slots (cpu: 24-token prefill chunks)."""
    if backend == "native" and NATIVE is not None:
        pytest.skip(f"native backend: {NATIVE}")
    ring = WINDOW + max(chunk, 17)
    runs = {}
    for policy in ("target", "speculative"):
        eng = make_engine(backend, load_checkpoint(rtn_checkpoint), PROMPT_TOKENS + NEW_TOKENS, scratch=16,
                          prefill_chunk=chunk, elastic=ElasticKV(WINDOW, ring))
        runs[policy] = generate(eng, prompt, GenerateConfig(policy=policy, gamma=4, max_new_tokens=NEW_TOKENS), set())
    (target, _), (spec, stats) = runs["target"], runs["speculative"]
    s = stats.summary()
    print(backend, s["acceptance"], s["kv4_positions"], spec)
    assert ring < PROMPT_TOKENS + NEW_TOKENS and s["kv4_positions"] > 0       # the ring wrapped, KV4 was read
    assert s["acceptance"] < 1                                                 # rejections rolled entries back
    assert spec == target


def test_elastic_output_differs_from_kv8(rtn_checkpoint, prompt):
    """The window changes what the target reads: its logits past the window differ from the KV8 run's (the lossless
    test above compares two elastic runs; this one shows they are not plain KV8 runs)."""
    logits = {}
    for elastic in (None, ElasticKV(WINDOW, WINDOW + 24)):
        eng = make_engine("cpu", load_checkpoint(rtn_checkpoint), 64, prefill_chunk=24, elastic=elastic)
        logits[elastic is None] = eng.prefill(prompt)
    assert not torch.allclose(logits[True], logits[False], atol=1e-3)


def test_a_ring_too_small_for_the_passes_is_refused(rtn_checkpoint):
    with pytest.raises(BitNestError, match="too small") as e:
        make_engine("cpu", load_checkpoint(rtn_checkpoint), 96, prefill_chunk=24, elastic=ElasticKV(16, 30))
    assert "\n" not in str(e.value)
