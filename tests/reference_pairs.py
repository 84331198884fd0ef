"""Native step and torch reference side by side on the first layers of a real export: the slice, the pair of
engines, and the explanation of a row that differs by more than float32 rounding: one INT8 activation code moved to
its neighbour by a last-bit difference before the per-token quantizer (docs/runtime.md), shown by moving that code
in the reference and finding the native row again at float32 rounding."""

from dataclasses import replace

import torch

from edge.backends.native import NativeEngine
from edge.backends.torch_ref import TorchBackend
from edge.engine.interface import PassEngine
from edge.model.checkpoint import load_checkpoint
from plugins.contracts import ACT_QMAX

# A row's relative error at float32 summation order: measured <= 5.2e-7 on two layers, every kernel set here.
ROUNDING = 1e-5
# A row after one flipped code (two layers): measured 5.5e-4 .. 7e-3, and rows after it in the same pass move too
# (it reaches them through the next layer's attention). Only an explained row may be this far.
FLIPPED = 5e-2
TIES = 12              # candidate codes tried for a row: the reference's activations nearest a rounding tie
MAX_FLIPS = 3
TIE = 1e-3             # a flip is a last-bit difference only where x/s_x lies this close to k + 1/2 (measured: 0 exactly)


def first_layers(path, n: int):
    """The checkpoint at `path` cut to its first `n` layers (embedding, final norm and head kept)."""
    c = load_checkpoint(path)
    keep = lambda name: not name.startswith("model.layers.") or int(name.split(".")[2]) < n
    c.config = replace(c.config, num_layers=n)
    c.tensors = {k: v for k, v in c.tensors.items() if keep(k)}
    c.linears = {k: v for k, v in c.linears.items() if keep(k)}
    return c


class TracingBackend(TorchBackend):
    """The torch reference, recording every linear's input [M, K], one entry per distinct input (q/k/v and gate/up
    share theirs, as the native step quantizes them once). Each of `flips` = (input index, row, column, code)
    gives that activation the INT8 code `code` (x set to code * s_x; s_x unchanged) in every linear reading it."""

    def __init__(self, ckpt, flips=()):
        super().__init__(ckpt)
        self.inputs: list[tuple[str, torch.Tensor]] = []       # (first linear reading it, the input)
        self.flips, self._last, self._used = list(flips), None, None

    def linear(self, name, x, view):
        if x is not self._last:
            self._last, self._used = x, x
            for i, row, col, code in self.flips:
                if i == len(self.inputs):
                    self._used = x.clone() if self._used is x else self._used
                    self._used[row, col] = code * (x[row].float().abs().max() / ACT_QMAX)
            self.inputs.append((name, x))
        return super().linear(name, self._used, view)


def engines(path, layers: int, capacity: int = 64, flips=()):
    """(native, reference) engines on the first `layers` layers; the reference's backend is a TracingBackend."""
    ck = first_layers(path, layers)
    return NativeEngine(first_layers(path, layers), capacity), PassEngine(ck, TracingBackend(ck, flips), capacity)


def row_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[list[float]]:
    """‖got_i − want_i‖ / ‖want_i‖ per row of each pass's logits [T, V]."""
    return [[float((g - w).norm() / w.norm()) for g, w in zip(gp, wp)] for gp, wp in zip(got, want)]


def run_traced(ref: PassEngine, scenario) -> tuple[list[torch.Tensor], list[range]]:
    """The logits of each pass of `scenario(engine)` (a generator of logits [T, V]) and the reference's input
    indices each pass made."""
    out, spans, start = [], [], 0
    for logits in scenario(ref):
        out.append(logits)
        spans.append(range(start, len(ref.backend.inputs)))
        start = len(ref.backend.inputs)
    return out, spans


def near_ties(inputs, indices, rows: int, row: int, count: int = TIES):
    """The `count` activations of row `row` of the inputs `indices` of `rows` tokens (a pass's, not its prefill's)
    nearest a rounding tie of the per-token INT8 quantizer: [(|x/s_x - (k + 1/2)|, input index, linear, column,
    x/s_x)], nearest first."""
    found = []
    for i in indices:
        name, x = inputs[i]
        if x.shape[0] != rows:
            continue
        r = x[row].float() / (x[row].float().abs().max() / ACT_QMAX).clamp_min(1e-12)        # [K]
        d = ((r - r.floor()) - 0.5).abs()
        found += [(float(d[c]), i, name, c, float(r[c])) for c in torch.topk(-d, min(count, d.numel())).indices.tolist()]
    return sorted(found)[:count]


def explain(path, layers: int, scenario, got: list[torch.Tensor]) -> list[dict]:
    """The flipped codes behind the rows of `got` (the native step's logits of each pass of `scenario`) that differ
    from the reference's by ROUNDING or more, found one at a time: for the earliest such row, of the codes of its
    pass and row nearest a rounding tie (nearest first), the first whose neighbour, given to the reference, leaves
    fewer rows (of all passes) at ROUNDING or more; none may be left once at most MAX_FLIPS are given.
    A flip in one token's q/k/v input reaches the later rows of its pass through the next layer's attention, so one
    flip may explain several rows and one row may need two. Raises AssertionError naming the row that no near-tie
    code explains; [] where every row is within ROUNDING already."""
    flips = []
    while True:
        _, ref = engines(path, layers, flips=[f for f, _ in flips])
        want, spans = run_traced(ref, scenario)
        errs = row_errors(got, want)
        bad = [(p, t) for p, rows in enumerate(errs) for t, e in enumerate(rows) if e >= ROUNDING]
        if not bad:
            return [f for _, f in flips]
        p, t = bad[0]
        assert len(flips) < MAX_FLIPS, f"more than {MAX_FLIPS} flipped codes would be needed: {errs}"
        best = None
        for dist, i, name, col, r in near_ties(ref.backend.inputs, spans[p], got[p].shape[0], t):
            code = int(torch.round(torch.tensor(r)))
            neighbour = code + 1 if r > code else code - 1
            _, trial = engines(path, layers, flips=[f for f, _ in flips] + [(i, t, col, neighbour)])
            e = [x for rows in row_errors(got, run_traced(trial, scenario)[0]) for x in rows]
            if sum(x >= ROUNDING for x in e) < len(bad):
                best = (i, t, col, neighbour), {"pass": p, "row": t, "error": errs[p][t], "linear": name, "column": col,
                                                "x_over_s": r, "tie_distance": dist, "reference_code": code,
                                                "native_code": neighbour}
                break
        assert best is not None, f"row {t} of pass {p} is {errs[p][t]:.2e} from the reference and no code near a " \
                                 f"rounding tie explains it: {errs}"
        flips.append(best)


def bound_after(flips: list[dict]) -> float:
    """The largest row error allowed once `explain` has shown `flips`: ROUNDING with none; FLIPPED only where every
    flip is what a last-bit difference can do (the code moved to its neighbour, |native - reference| = 1, from an
    activation within TIE of a rounding tie). A rounding bug moves codes far from any tie, or by more than one: it
    fails here instead of being explained."""
    for f in flips:
        assert abs(f["native_code"] - f["reference_code"]) == 1 and f["tie_distance"] < TIE, \
            f"a flipped code that no last-bit difference explains: {f}"
    return FLIPPED if flips else ROUNDING
