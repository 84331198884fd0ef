"""Nested KV cache: views, scratch area, and commit / rollback (writes past the committed length, then a shorter
committed length) as a property over random operation sequences."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.engine.kv_cache import KVRead, NestedKVCache
from plugins.kv import dequantize_kv, quantize_kv

L, H, D = 2, 3, 16


def _kv(gen, t):
    return torch.randn(H, t, D, generator=gen), torch.randn(H, t, D, generator=gen)


def test_views_read_the_planes(gen):
    c = NestedKVCache(L, H, D, capacity=32, scratch=4)
    k, v = _kv(gen, 10)
    c.write(1, 0, k, v)
    b, r, s = quantize_kv(k)
    k8, _ = c.read(1, 10, KVRead("kv8"))
    k4, _ = c.read(1, 10, KVRead("kv4"))
    kr, _ = c.read(1, 10, KVRead("recent", recent=3))
    assert torch.equal(k8, dequantize_kv(b, r, s, "kv8")) and torch.equal(k4, dequantize_kv(b, r, s, "kv4"))
    assert torch.equal(kr[:, :7], k4[:, :7]) and torch.equal(kr[:, 7:], k8[:, 7:])


def test_kv4_reads_never_touch_the_refinement(gen):
    c = NestedKVCache(L, H, D, capacity=16)
    k, v = _kv(gen, 8)
    c.write(0, 0, k, v)
    before, _ = c.read(0, 8, KVRead("kv4"))
    c.main.refine.random_(0, 255)                     # scramble the refinement plane
    after, _ = c.read(0, 8, KVRead("kv4"))
    assert torch.equal(before, after)


def test_scratch_follows_committed_history(gen):
    c = NestedKVCache(L, H, D, capacity=16, scratch=4)
    k, v = _kv(gen, 5)
    c.write(0, 0, k, v)
    dk, dv = _kv(gen, 2)
    c.write_scratch(0, 0, dk, dv)
    keys, _ = c.read(0, 5, KVRead("kv8"), scratch_len=2)
    b, r, s = quantize_kv(dk)
    assert keys.shape == (H, 7, D) and torch.equal(keys[:, 5:], dequantize_kv(b, r, s, "kv8"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), min_size=1, max_size=12), st.integers(0, 2**31 - 1))
def test_commit_and_rollback_keep_exactly_the_accepted_prefix(ops, seed):
    """Model: each round writes T real entries past the committed length and commits a <= T of them;
    the cache must then read back exactly the entries of the kept prefix, whatever was rolled off."""
    g = torch.Generator().manual_seed(seed)
    c = NestedKVCache(1, H, D, capacity=64)
    kept, length = [], 0                            # reference: the committed K vectors; the committed length
    for t, a in ops:
        if length + t > c.capacity:
            break
        k, v = _kv(g, t)
        c.write(0, length, k, v)
        a = min(a, t)
        kept.extend(k[:, i] for i in range(a))
        length += a                                 # rejected entries fall off
    if kept:
        want = torch.stack(kept, dim=1)
        b, r, s = quantize_kv(want)
        got, _ = c.read(0, length, KVRead("kv8"))
        assert torch.equal(got, dequantize_kv(b, r, s, "kv8"))


def test_cache_refuses_overflow(gen):
    c = NestedKVCache(1, H, D, capacity=4, scratch=2)
    for bad in (lambda: c.write(0, 3, *_kv(gen, 2)), lambda: c.write(0, -1, *_kv(gen, 1)),
                lambda: c.write_scratch(0, 1, *_kv(gen, 2))):
        try:
            bad()
        except ValueError:
            continue
        raise AssertionError("cache accepted an invalid operation")
