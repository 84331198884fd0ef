"""Row invariance of a backend's batched GEMMs, checked where they run: the first pass of each (GEMM, M) with
1 < M <= ROWWISE_MAX computes the batched and the row-by-row result; a GEMM whose rows differ runs row by row
from then on, so a verification pass over γ+1 tokens still equals γ+1 single-token steps bit for bit on a CPU
whose kernels (chosen by CPU dispatch and by M) are not row-invariant. What was checked and what fell back is
reported in the decode stats."""

from collections import Counter

import torch

from plugins.decoder_math import ROWWISE_MAX, rowwise


class RowInvariance:
    """Wraps batched GEMMs: `run(key, fn, x)` is fn(x) [M, N] with row i equal to fn(x[i:i+1]) whenever
    1 < M <= ROWWISE_MAX (larger passes, the prefill chunks, need no invariance and run batched)."""

    def __init__(self):
        self.checked: dict[str, set[int]] = {}   # GEMM key -> the M found row-invariant
        self.fallback: set[str] = set()           # GEMMs run row by row since a check failed
        # passes of 1 < M <= ROWWISE_MAX by the path whose result they returned: (key, "batched" or "row_by_row")
        self.paths: Counter = Counter()

    def run(self, key: str, fn, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if m == 1 or m > ROWWISE_MAX or x.is_meta:     # meta: the memory planner's dry runs compute nothing
            return fn(x)
        if key in self.fallback:
            self.paths[key, "row_by_row"] += 1
            return rowwise(fn, x)
        seen = self.checked.setdefault(key, set())
        if m in seen:
            self.paths[key, "batched"] += 1
            return fn(x)
        batched, rows = fn(x), rowwise(fn, x)
        if torch.equal(batched, rows):
            seen.add(m)
            self.paths[key, "batched"] += 1
            return batched
        self.fallback.add(key)
        self.paths[key, "row_by_row"] += 1
        return rows

    def report(self) -> dict:
        """{"gemm_row_checks": (GEMM, M) pairs checked, "gemm_row_by_row": the GEMMs that fell back}."""
        return {"gemm_row_checks": sum(len(v) for v in self.checked.values()) + len(self.fallback),
                "gemm_row_by_row": sorted(self.fallback)}
