"""Row invariance of the `cpu` backend's GEMMs, the property lossless speculation rests on: every row of a pass of
M tokens equals the single-token result bit for bit, for every M a verification or draft pass can have, on the
real model's shapes. Where a kernel is not row-invariant the backend falls back to row-by-row calls and says so in
its stats; the fallback is checked on a real GEMM that is not row-invariant on this machine (float32 matmul).
tests/test_dispatch.py repeats the property under every CPU dispatch torch offers here."""

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
    sizes on activations of the model's scale: {"exact_failures": [(gemm, view, M)...], "row_by_row": [...],
    "checks": n, "capability": torch's CPU dispatch}."""
    ck = load_checkpoint(checkpoint)
    names = [n for n in ck.linears if n.startswith("model.layers.0.")]        # every distinct linear shape
    kept = names + [HEAD] * ck.head_nested                                   # a nested head reads its own planes
    be = CpuInt4Backend(replace(ck, linears={n: ck.linears[n] for n in kept}, tensors=dict(ck.tensors)))
    gen = torch.Generator().manual_seed(seed)
    failures = []
    head_views = ("draft", "target") if ck.head_nested else ("target",)     # 4bit, shortlist: the base plane
    for name, view in [(n, v) for n in names for v in ("draft", "target")] + [(None, v) for v in head_views]:
        k = ck.linears[name].shape[1] if name else ck.config.hidden_size
        x = torch.randn(max(sizes), k, generator=gen) * 2                           # [M, K]
        run = (lambda xx: be.linear(name, xx, view)) if name else (lambda xx: be.head(xx, view))
        single = torch.cat([run(x[i:i + 1]) for i in range(max(sizes))])            # [M, N]
        failures += [(name or "head", view, m) for m in sizes if not torch.equal(run(x[:m]), single[:m])]
    report = be.numerics()
    return {"exact_failures": failures, "row_by_row": report["gemm_row_by_row"], "checks": report["gemm_row_checks"],
            "capability": torch.backends.cpu.get_cpu_capability()}


def test_cpu_backend_gemms_are_row_exact_for_every_pass_size(rtn_checkpoint):
    report = cpu_backend_row_report(rtn_checkpoint)
    print(json.dumps(report))
    assert report["exact_failures"] == []
    assert report["checks"] >= 16           # every GEMM was checked where it ran (7 linears x 2 views + head x 2)


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


def test_prefill_sized_passes_stay_batched_and_unchecked():
    rows = RowInvariance()
    calls = []
    x = torch.randn(ROWWISE_MAX + 1, 8)
    rows.run("g", lambda xx: calls.append(xx.shape[0]) or xx * 2, x)
    assert calls == [ROWWISE_MAX + 1] and rows.report()["gemm_row_checks"] == 0


if __name__ == "__main__":      # tests/test_dispatch.py runs this under another CPU dispatch
    print(json.dumps(cpu_backend_row_report(sys.argv[1], tuple(int(m) for m in sys.argv[2].split(",")))))
