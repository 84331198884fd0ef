"""Row invariance of the `cpu` backend's GEMMs, the property lossless speculation rests on: every row of a pass of
M tokens equals the single-token result bit for bit, for every M a verification or draft pass can have, on the
real model's shapes. The raw GEMMs (without RowInvariance) are measured directly, and which path each pass took
(batched or row by row, RowInvariance.paths) is asserted against that measurement: a GEMM falls back exactly when
its raw rows differ, and an exact GEMM (the torch reference's integer sums, row-invariant by construction) stays
batched while one whose rows depend on M on every CPU (float64 sums for M > 1) runs row by row and still gives the
single-token rows. tests/test_dispatch.py repeats the property under every CPU dispatch torch offers here."""

import json
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

from edge.backends.cpu import CpuInt4Backend
from edge.backends.row_check import RowInvariance
from edge.model.checkpoint import HEAD, load_checkpoint
from plugins.decoder_math import ROWWISE_MAX

PASS_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 16, 17, ROWWISE_MAX)     # drafting 1, verification γ+1, adaptive up to 9


def cpu_backend_row_report(checkpoint, sizes=PASS_SIZES, seed: int = 0) -> dict:
    """Run every distinct GEMM of the `cpu` backend (one layer's linears, both views, and the head) over the pass
    sizes on activations of the model's scale, through the backend and raw (`gemm`, without RowInvariance):
    {"exact_failures": [(gemm, view, M)...] through the backend, "raw_failures": the same of the raw GEMMs,
    "expected_row_by_row": the keys whose first checked GEMM's raw rows differ (what RowInvariance must send row by
    row), "row_by_row": the keys it did, "paths": {key: {"batched": n, "row_by_row": n}}, "checks": n,
    "capability": torch's CPU dispatch}."""
    ck = load_checkpoint(checkpoint)
    names = [n for n in ck.linears if n.startswith("model.layers.0.")]        # every distinct linear shape
    kept = names + [HEAD] * ck.head_nested                                   # a nested head reads its own planes
    be = CpuInt4Backend(replace(ck, linears={n: ck.linears[n] for n in kept}, tensors=dict(ck.tensors)))
    gen = torch.Generator().manual_seed(seed)
    failures, raw_failures, expected, first = [], [], set(), set()
    head_views = ("draft", "target") if ck.head_nested else ("target",)     # 4bit, shortlist: the base plane
    for name, view in [(n, v) for n in names for v in ("draft", "target")] + [(None, v) for v in head_views]:
        k = ck.linears[name].shape[1] if name else ck.config.hidden_size
        x = torch.randn(max(sizes), k, generator=gen) * 2                           # [M, K]
        run = (lambda xx: be.linear(name, xx, view)) if name else (lambda xx: be.head(xx, view))
        key, raw = be.gemm(name, view) if name else be.head_gemm(view)
        single = torch.cat([raw(x[i:i + 1]) for i in range(max(sizes))])           # [M, N]
        raw_bad = [m for m in sizes if not torch.equal(raw(x[:m]), single[:m])]
        raw_failures += [(name or "head", view, m) for m in raw_bad]
        if key not in first:                 # RowInvariance checks a key's M on the first GEMM that has it
            first.add(key)
            expected |= {key} if raw_bad else set()
        bias = be.ckpt.tensors.get(name + ".bias") if name else None
        single = single if bias is None else single + bias.float()
        failures += [(name or "head", view, m) for m in sizes if not torch.equal(run(x[:m]), single[:m])]
    report = be.numerics()
    paths = {}
    for (key, path), n in be.rows.paths.items():
        paths.setdefault(key, {"batched": 0, "row_by_row": 0})[path] = n
    return {"exact_failures": failures, "raw_failures": raw_failures, "expected_row_by_row": sorted(expected),
            "row_by_row": report["gemm_row_by_row"], "paths": paths, "checks": report["gemm_row_checks"],
            "capability": torch.backends.cpu.get_cpu_capability()}


def test_cpu_backend_gemms_are_row_exact_for_every_pass_size(rtn_checkpoint):
    """Through the backend every row is exact; a key runs row by row exactly where its raw GEMM's rows differ
    (measured here, whatever kernels torch picks on this CPU), and every pass of the others took the batched path."""
    report = cpu_backend_row_report(rtn_checkpoint)
    print(json.dumps(report))
    assert report["exact_failures"] == []
    assert report["checks"] >= 16           # every GEMM was checked where it ran (7 linears x 2 views + head x 2)
    assert report["row_by_row"] == report["expected_row_by_row"], report
    for key, taken in report["paths"].items():
        fell_back = key in report["row_by_row"]
        assert (taken["row_by_row"] > 0) == fell_back and (taken["batched"] > 0 or fell_back), (key, taken)


def test_a_gemm_that_is_not_row_invariant_falls_back_row_by_row(rtn_checkpoint):
    """float32 F.linear over the real model's up-projection: on this machine MKL/oneDNN blocks M > 1 differently
    from M = 1. Through RowInvariance every pass size gives the single-token rows, and the fallback is reported;
    where a CPU happens to make it row-invariant, nothing falls back and the rows are still exact."""
    ck = load_checkpoint(rtn_checkpoint)
    from plugins.reference import dequantized_weight
    w = dequantized_weight(*ck.planes("model.layers.0.mlp.up_proj")[:3], "target")         # [N, K] float32
    x = torch.randn(ROWWISE_MAX, w.shape[1], generator=torch.Generator().manual_seed(1))
    gemm = lambda xx: F.linear(xx, w)
    single = torch.cat([gemm(x[i:i + 1]) for i in range(ROWWISE_MAX)])
    raw_invariant = all(torch.equal(gemm(x[:m]), single[:m]) for m in PASS_SIZES)
    rows = RowInvariance()
    for m in PASS_SIZES:
        assert torch.equal(rows.run("float32 up_proj", gemm, x[:m]), single[:m]), m
    report = rows.report()
    assert report["gemm_row_by_row"] == ([] if raw_invariant else ["float32 up_proj"])
    print("float32 F.linear row-invariant here:", raw_invariant, report)


def _planes(checkpoint, name):
    ck = load_checkpoint(checkpoint)
    x = torch.randn(ROWWISE_MAX, ck.linears[name].shape[1], generator=torch.Generator().manual_seed(2)) * 2  # [M, K]
    return ck.planes(name), x


def test_an_exact_gemm_is_row_invariant_raw_and_stays_batched(rtn_checkpoint):
    """The torch reference's INT8 GEMM over the real k-projection (exact integer group sums: its rows do not depend
    on M, docs/contracts.md), both views: raw, every pass size gives the single-token rows bit for bit; through
    RowInvariance each (GEMM, M) is checked once and every pass takes the batched path."""
    from plugins.reference import dual_plane_linear_int8
    (base, refine, scale, offset), x = _planes(rtn_checkpoint, "model.layers.0.self_attn.k_proj")
    rows = RowInvariance()
    for view, ref_plane in (("draft", None), ("target", refine)):
        gemm = lambda xx: dual_plane_linear_int8(xx, base, ref_plane, scale, offset)
        single = torch.cat([gemm(x[i:i + 1]) for i in range(ROWWISE_MAX)])              # [M, N]
        for m in PASS_SIZES:
            assert torch.equal(gemm(x[:m]), single[:m]), (view, m)                      # raw
            assert torch.equal(rows.run(view, gemm, x[:m]), single[:m]), (view, m)
            assert torch.equal(rows.run(view, gemm, x[:m]), single[:m]), (view, m)      # checked M: batched
        assert rows.paths[view, "batched"] == 2 * len(PASS_SIZES) and rows.paths[view, "row_by_row"] == 0
    assert rows.report() == {"gemm_row_checks": 2 * len(PASS_SIZES), "gemm_row_by_row": []}


def test_a_gemm_whose_rows_depend_on_m_runs_row_by_row(rtn_checkpoint):
    """A GEMM whose rows differ between M = 1 and M > 1 on every CPU (float32 sums for one token, float64 sums
    rounded to float32 for more, as a kernel chosen by M may): raw, no pass size gives the single-token rows;
    through RowInvariance every pass size does, the first pass is checked and falls back, every later one runs
    row by row without a check."""
    from plugins.reference import dequantized_weight
    (base, refine, scale, offset), x = _planes(rtn_checkpoint, "model.layers.0.mlp.up_proj")
    w = dequantized_weight(base, refine, scale, "target", offset)                     # [N, K] float32
    gemm = lambda xx: xx @ w.T if xx.shape[0] == 1 else (xx.double() @ w.double().T).float()
    single = torch.cat([gemm(x[i:i + 1]) for i in range(ROWWISE_MAX)])
    assert not any(torch.equal(gemm(x[:m]), single[:m]) for m in PASS_SIZES)         # raw: every M differs
    rows = RowInvariance()
    for m in PASS_SIZES:
        assert torch.equal(rows.run("by M", gemm, x[:m]), single[:m]), m
    assert rows.paths["by M", "row_by_row"] == len(PASS_SIZES) and rows.paths["by M", "batched"] == 0
    assert rows.report() == {"gemm_row_checks": 1, "gemm_row_by_row": ["by M"]}


def test_prefill_sized_passes_stay_batched_and_unchecked():
    rows = RowInvariance()
    calls = []
    x = torch.randn(ROWWISE_MAX + 1, 8)
    rows.run("g", lambda xx: calls.append(xx.shape[0]) or xx * 2, x)
    assert calls == [ROWWISE_MAX + 1] and rows.report()["gemm_row_checks"] == 0


if __name__ == "__main__":      # tests/test_dispatch.py runs this under another CPU dispatch
    print(json.dumps(cpu_backend_row_report(sys.argv[1], tuple(int(m) for m in sys.argv[2].split(",")))))
