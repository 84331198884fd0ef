"""The warp-tiled plane layout (plugins/kernels/tiling.py) and the decode GEMV on it: the layout round-trips, the rows
are bit for bit the canonical launch's at every M (the `triton` backend's prefill chunks included, through the
tensor-core kernel), and, what the
SASS proxy cannot see, every 128-bit load a warp issues on it reads 512 contiguous bytes (recorded from the loads
the compiled form's code issues, run in the interpreter), where the canonical layout's touch 32 rows."""

import numpy as np
import pytest
import torch

from plugins.kernels import dual_plane_linear, dual_plane_linear_tiled
from plugins.kernels.tiling import WARP_ROWS, tile_planes
from tests.conftest import KERNEL_DEVICE as DEV
from tests.test_kernels import nested_planes, to_dev


def test_tiling_round_trips_and_pads_with_zero_rows(gen):
    base, refine, scale, offset = nested_planes(gen, 70, 512, 128, "top4of8")
    t = tile_planes(base, refine, scale, offset)
    assert t.base.shape == (3, 4, 4, WARP_ROWS, 16) and t.scale.shape == (3, 4, WARP_ROWS)
    for got, want in zip(t.canonical(), (base, refine, scale, offset)):
        assert torch.equal(got, want)
    assert not t.base[2, :, :, 70 - 64:].any() and not t.scale[2, :, 70 - 64:].any()      # rows 70..95: zeros
    ids = torch.tensor([69, 0, 33, 33])
    assert all(torch.equal(a, b[ids]) for a, b in zip(t.rows(ids), (base, refine, scale, offset)))
    with pytest.raises(ValueError, match="power of two"):
        tile_planes(base, refine, scale[:, :3], None)


@pytest.mark.parametrize("fused", [True, False])
def test_a_residual_added_in_the_launch_is_torchs_add(gen, monkeypatch, fused):
    """o_proj / down_proj add the residual stream in the GEMV's own launch: residual + y bit for bit as torch adds
    it, unsplit (K of 2 groups) and split (K of 16 groups on the interpreter's 8 SMs: the last program of each row
    tile adds it after the ordered sum, or, with the separate reduction, torch after it), at 1, 5 and 12 tokens."""
    from plugins.kernels import gemv
    monkeypatch.setattr(gemv, "FUSED_SPLIT_REDUCE", fused)
    for k in (256, 2048):
        tiled = tile_planes(*to_dev(*nested_planes(gen, 64, k, 128, "rtn")))
        assert (gemv.plan_split(64, k, 128, gemv._sm_count(torch.device(DEV)))[0] > 1) == (k == 2048)
        for m in (1, 5, 12):
            x, res = torch.randn(m, k, generator=gen).to(DEV), torch.randn(m, 64, generator=gen).to(DEV)
            for view in ("draft", "target"):
                want = res + dual_plane_linear_tiled(x, tiled, view)
                assert torch.equal(dual_plane_linear_tiled(x, tiled, view, residual=res), want), (k, m, view)
    with pytest.raises(ValueError, match="residual"):
        dual_plane_linear_tiled(x, tiled, "target", residual=res[:, :32])


def test_stacked_planes_hold_each_linears_rows_as_a_view(gen):
    """q/k/v stacked (the triton backend's one launch a group): the stack's rows are the parts' rows in order, each
    part is a view of its own blocks in the stack (no second copy), and the stacked launch gives each part's rows
    what the part's own launch gives at the same split of K (the stack's plan, forced on both here)."""
    from plugins.kernels import gemv
    from plugins.kernels.tiling import stack_rows
    parts = [nested_planes(gen, n, 256, 64, "top4of8") for n in (96, 32, 32)]
    whole, views = stack_rows([tile_planes(*to_dev(*p)) for p in parts])
    assert whole.n == 160 and [v.n for v in views] == [96, 32, 32]
    for got, want in zip(whole.canonical(), [torch.cat(ts) for ts in zip(*parts)]):
        assert torch.equal(got.cpu(), want)
    for v, p in zip(views, parts):
        assert v.base.untyped_storage().data_ptr() == whole.base.untyped_storage().data_ptr()
        assert all(torch.equal(a.cpu(), b) for a, b in zip(v.canonical(), p))
    x = torch.randn(5, 256, generator=gen).to(DEV)
    split = gemv.plan_split(whole.n, whole.k, whole.g, gemv._sm_count(x.device))
    y = dual_plane_linear_tiled(x, whole, "target")
    for v, cols in zip(views, y.split([96, 32, 32], dim=1)):
        own = torch.empty(5, v.n, device=DEV)
        gemv._launch_decode(x, v.base, v.refine, v.scale, v.offset, own, True, None, *split, n=v.n, g=v.g, tiled=True)
        assert torch.equal(own, cols)
    with pytest.raises(ValueError, match="whole 32-row blocks"):
        stack_rows([tile_planes(*to_dev(*nested_planes(gen, 40, 256, 64, "rtn"))), views[1]])


@pytest.mark.parametrize("n,k,g,method", [(300, 1024, 128, "rtn"), (100, 576, 64, "top4of8"), (40, 256, 32, "rtn")])
def test_tiled_rows_equal_the_canonical_decode_rows_bit_for_bit(gen, monkeypatch, n, k, g, method):
    """Every M (1 and 5: the decode kernel; 12 and 70: a prefill chunk through the tensor-core kernel, 70 in two
    programs of 64 tokens (12 at most at the widest shape), and through the decode kernel in passes of 8 where PREFILL_GEMM is off), both views,
    offsets of a top-4-of-8 nest: the tiled launch gives each row exactly what the canonical decode launch gives
    that token alone."""
    from plugins.kernels import gemv
    base, refine, scale, offset = nested_planes(gen, n, k, g, method)
    tiled = tile_planes(*to_dev(base, refine, scale, offset))
    cb, cr, cs, co = to_dev(base, refine, scale, offset)
    m = 12 if n >= 300 else 70                  # the widest shape: one program of tokens (the interpreter's time)
    x = torch.randn(m, k, generator=gen).to(DEV)
    for view in ("draft", "target"):      # canonical decode launches of <= 8 tokens: rows equal to single tokens'
        want = torch.cat([dual_plane_linear(x[i:i + 8], cb, cr, cs, view, co) for i in range(0, m, 8)])
        assert torch.equal(dual_plane_linear_tiled(x, tiled, view), want), view
        assert torch.equal(dual_plane_linear_tiled(x[:12], tiled, view), want[:12]), view
        assert torch.equal(dual_plane_linear_tiled(x[:5], tiled, view), want[:5]), view
        assert torch.equal(dual_plane_linear_tiled(x[7:8], tiled, view), want[7:8]), view
        monkeypatch.setattr(gemv, "PREFILL_GEMM", False)
        assert torch.equal(dual_plane_linear_tiled(x[:12], tiled, view), want[:12]), view
        monkeypatch.setattr(gemv, "PREFILL_GEMM", True)


@pytest.mark.parametrize("m", [3, 12])
def test_tiled_draft_never_reads_the_refinement_plane(gen, m):
    """A decode pass (3 tokens) and a prefill chunk (12: the tensor-core kernel) of the draft view: junk in the
    refinement plane, or none, changes no bit (the run-time view's draft code too)."""
    from plugins.kernels import dual_plane_linear_tiled_coded
    base, refine, scale, _ = nested_planes(gen, 64, 256, 64, "rtn")
    tiled = tile_planes(*to_dev(base, refine, scale))
    x = torch.randn(m, 256, generator=gen).to(DEV)
    want = dual_plane_linear_tiled(x, tiled, "draft")
    target = dual_plane_linear_tiled(x, tiled, "target")
    code = torch.ones(1, dtype=torch.int32, device=DEV)
    assert torch.equal(dual_plane_linear_tiled_coded(x, tiled, code), target)
    tiled.refine = torch.full_like(tiled.refine, 0x77)            # junk: a draft that read it would change
    assert torch.equal(dual_plane_linear_tiled(x, tiled, "draft"), want)
    assert torch.equal(dual_plane_linear_tiled_coded(x, tiled, code - 1), want)
    tiled.refine = None
    assert torch.equal(dual_plane_linear_tiled(x, tiled, "draft"), want)
    with pytest.raises(ValueError, match="refinement plane"):
        dual_plane_linear_tiled(x, tiled, "target")


def _warp_loads(monkeypatch, tensor_ranges: dict, run) -> dict:
    """{name: [byte-address arrays [rows, ...] of each load from that tensor]} of the loads `run()` issues in the
    interpreter (axis 0 of a decode tile is the thread axis: one row per lane, 32 lanes a warp)."""
    import triton.runtime.interpreter as interp
    seen = {name: [] for name in tensor_ranges}
    original = interp.InterpreterBuilder.create_masked_load

    def record(self, ptrs, mask, other, *args):
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        for name, (lo, hi) in tensor_ranges.items():
            if addr.size and lo <= int(addr.min()) and int(addr.max()) < hi:
                seen[name].append(addr)
        return original(self, ptrs, mask, other, *args)
    monkeypatch.setattr(interp.InterpreterBuilder, "create_masked_load", record)
    run()
    return seen


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _warp_spans(loads: list, width: int) -> set:
    """The byte spans (max - min + width) each warp's slice of each recorded [rows, ...] load covers."""
    spans = set()
    for addr in loads:
        for w in range(addr.shape[0] // WARP_ROWS):
            a = addr[w * WARP_ROWS:(w + 1) * WARP_ROWS].reshape(-1)
            assert len(np.unique(a)) == a.size                      # no lane reads what another lane reads
            spans.add(int(a.max() - a.min()) + width)
    return spans


@pytest.mark.parametrize("m", [1, 5])
def test_each_warp_load_of_the_tiled_planes_reads_512_contiguous_bytes(gen, monkeypatch, m):
    """The compiled form's loads (INTERP_CHAINS: the dp4a chains' own tl.load calls), recorded: on tiled planes a
    warp's 128-bit load of a plane covers 512 contiguous bytes (4 cache lines) and its scale load 64; on canonical
    planes (the layout it replaced) the same load spans 31 rows, 32 lines. N = 256: every warp's rows are real."""
    if DEV != "cpu":
        pytest.skip("records the interpreter's loads")
    from plugins.kernels import gemv_decode
    monkeypatch.setattr(gemv_decode, "interp_form", int(gemv_decode.INTERP_CHAINS))
    n, k, g = 256, 512, 128
    base, refine, scale, _ = nested_planes(gen, n, k, g, "rtn")
    tiled = tile_planes(base, refine, scale)
    x = torch.randn(m, k, generator=gen)
    seen = _warp_loads(monkeypatch, {"base": _span(tiled.base), "refine": _span(tiled.refine),
                                     "scale": _span(tiled.scale)},
                       lambda: dual_plane_linear_tiled(x, tiled, "target"))
    assert seen["base"] and seen["refine"] and seen["scale"]
    assert _warp_spans(seen["base"], 4) == {512} and _warp_spans(seen["refine"], 4) == {512}
    assert _warp_spans(seen["scale"], 2) == {64}
    canonical = _warp_loads(monkeypatch, {"base": _span(base)},
                            lambda: dual_plane_linear(x, base, refine, scale, "target"))
    assert min(_warp_spans(canonical["base"], 4)) >= 31 * k // 2


def test_the_fused_split_reduction_gives_the_separate_reductions_bits(gen, monkeypatch):
    """A split launch reduces its partials itself (the last program of each row tile): the same rows bit for bit as
    the separate reduction launch, every counter back at zero after each launch (a replayed graph starts clean), and
    no second kernel launched. K = 1024 at G = 128 splits over the interpreter's 8 SMs (4 ways: 8 groups)."""
    from plugins.kernels import gemv
    base, refine, scale, offset = nested_planes(gen, 300, 1024, 128, "top4of8")
    tiled = tile_planes(*to_dev(base, refine, scale, offset))
    assert gemv.plan_split(300, 1024, 128, gemv._sm_count(tiled.base.device))[0] > 1
    x = torch.randn(5, 1024, generator=gen).to(DEV)
    reductions = []
    real_reduce = gemv._reduce
    monkeypatch.setattr(gemv, "_reduce", lambda *a: (reductions.append(a[5]), real_reduce(*a)))
    fused = {v: dual_plane_linear_tiled(x, tiled, v) for v in ("draft", "target")}
    assert not [s for s in reductions if s > 1]                       # the split launch reduced itself
    assert not gemv.split_counters(tiled.base.device, 1).any()
    monkeypatch.setattr(gemv, "FUSED_SPLIT_REDUCE", False)
    for view, got in fused.items():
        assert torch.equal(got, dual_plane_linear_tiled(x, tiled, view)), view
    assert [s for s in reductions if s > 1]                           # the separate launch ran
    old = gemv.split_counters(tiled.base.device, 1)
    grown = gemv.split_counters(tiled.base.device, old.numel() + 1)   # a wider head: new counters, and the old
    assert grown.numel() > old.numel() and not grown.any()            # ones kept for graphs that captured them
    assert any(t is old for t in gemv._RETIRED)
