"""scripts/gemv_sweep.py, the decode GEMV's launch sweep for a CUDA GPU, run here in the interpreter at one tiny
shape and one configuration (its code paths: probes, both layouts, the summary); and its read probes, which must
read every word of the planes in each access pattern (a probe that skipped words would report a bandwidth no kernel
can reach)."""

import pytest
import torch

from tests.conftest import KERNEL_DEVICE as DEV


@pytest.mark.parametrize("tiled", [False, True])
def test_the_read_probe_reads_every_word_of_the_planes(gen, tiled):
    if DEV != "cpu":
        pytest.skip("the interpreter's run; on a GPU the sweep itself runs")
    import triton.language  # noqa: F401
    from edge.analysis.gemv_sweep import _coalesced_probe, _row_per_thread_probe
    from plugins.kernels.tiling import tile_plane
    n, k = 64, 2048
    p = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    want = (p.view(torch.int32) ^ q.view(torch.int32)).numpy()
    want = torch.from_numpy(__import__("numpy").bitwise_xor.reduce(want, axis=1))        # [N] XOR of each row
    k_words, per = k // 8, 128                                                          # two splits of K
    out = torch.zeros(2, n, dtype=torch.int32)
    if tiled:
        _row_per_thread_probe[(1, 2)](tile_plane(p, 128).view(torch.int32), tile_plane(q, 128).view(torch.int32), out,
                                      n, k_words, per, TWO=True, BLOCK_S=64, TILED=True)
    else:
        _row_per_thread_probe[(1, 2)](p.view(torch.int32), q.view(torch.int32), out, n, k_words, per, TWO=True,
                                      BLOCK_S=64, TILED=False)
    assert torch.equal(out[0] ^ out[1], want)
    out.zero_()
    _coalesced_probe[(n // 4, 2)](p.view(torch.int32), q.view(torch.int32), out, n, k_words, per, TWO=True, BLOCK_N=4,
                                  BLOCK_W=128)
    assert torch.equal(out[0] ^ out[1], want)


def test_the_sweep_runs_every_kind_of_row_dry(monkeypatch):
    if DEV != "cpu":
        pytest.skip("the interpreter's run")
    from edge.analysis import gemv_sweep as s
    monkeypatch.setattr(s, "WARPS", (4,))
    monkeypatch.setattr(s, "ROWS", (1,))
    monkeypatch.setattr(s, "SPLIT_SCALES", (1.0,))
    monkeypatch.setattr(s, "TOKENS", (1,))
    saved = []
    r = s.run([(1024, 64)], 1, dry=True, save=saved.append)
    kinds = {(row["kind"], row.get("pattern") or row.get("layout"), row["view"]) for row in r["rows"]}
    assert kinds == {(kind, p, v) for v in ("draft", "target") for kind, p in
                     (("probe", "row_per_thread"), ("probe", "tiled"), ("probe", "coalesced"), ("decode", "tiled"),
                      ("decode", "canonical"))}
    assert all(row["fraction_of_copy"] > 0 for row in r["rows"]) and saved and saved[-1]["best"]
    assert any(row.get("default") for row in r["rows"] if row.get("layout") == "canonical")
