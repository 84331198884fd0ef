"""The native step's draft paths against the torch reference backend (PassEngine over TorchBackend, the reference
semantics): draft-slot passes under KV4, Recent-N (a window across the committed history and the scratch slots)
and KV8 reads, on two real layers row by row at float32 rounding, and on the whole model by greedy tokens; the
whole model's target view against the reference as `bitnest lossless --reference` measures it."""

from types import SimpleNamespace

import pytest
import torch

from edge.corpora import shakespeare_prompts, sharegpt_prompts
from edge.analysis.lossless import against_reference
from edge.backends.native import native_unavailable
from edge.decode.config import GenerateConfig
from edge.engine.kv_cache import KV8, KVRead
from edge.llm import Runtime
from tests.reference_pairs import ROUNDING, bound_after, engines, explain, row_errors, run_traced

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason=f"native backend: {native_unavailable()}")
IDS = [1, 504, 3145, 282, 260, 3622, 30, 5000, 77, 78, 900, 1200]
OTHER = 4321                  # a token no earlier pass wrote at its position


def draft_round(kv: KVRead):
    """Two speculative rounds' passes over real ids: prefill 7 (committed 7, pending IDS[7]); a 2-token draft pass
    at scratch slots 0-1 (several entries written at once, as the cost probe's) and 1-token ones at slots 2 and 3,
    each attending the committed history and the drafts so far; the verification pass (target, KV8) over
    [pending, 4 drafts], writing the real entries; commit 2 of them (rollback of the rest); a second round's
    draft pass at slot 0 with a token other than the one verification left at that position, then slot 1."""
    def scenario(eng):
        eng.prefill(IDS[:7])
        yield eng.forward(IDS[7:9], "draft", kv, draft_slot=0)
        yield eng.forward(IDS[9:10], "draft", kv, draft_slot=2)
        yield eng.forward(IDS[10:11], "draft", kv, draft_slot=3)
        yield eng.forward(IDS[7:12], "target", KV8)
        eng.commit(7 + 1 + 2)
        yield eng.forward([OTHER], "draft", kv, draft_slot=0)
        yield eng.forward([IDS[3]], "draft", kv, draft_slot=1)
    return scenario


# Recent-3 reads KV8 over 3 of the positions only; recent-6 reaches back from the scratch slots into the committed
# history; KV4 reads the base plane everywhere; KV8 is the view every draft pass below the context threshold reads.
VIEWS = {"kv4": KVRead("kv4"), "recent3": KVRead("recent", 3), "recent6": KVRead("recent", 6), "kv8": KV8}
# The view a wrong window or plane would read instead: the reference tells each apart from it by far more than
# ROUNDING, so the comparison below can fail when the native step reads the neighbouring view.
NEIGHBOUR = {"kv4": KV8, "recent3": KVRead("recent", 2), "recent6": KVRead("recent", 7), "kv8": KVRead("kv4")}


@pytest.mark.parametrize("name", list(VIEWS))
def test_draft_slot_passes_agree_with_the_torch_reference(rotated_checkpoint, name):
    """Two real layers (R1, R2, R4 online): every row of every pass at float32 rounding, or a shown flipped code
    (tests/reference_pairs.py, as the target view's test in test_native_engine.py)."""
    path, scenario = rotated_checkpoint, draft_round(VIEWS[name])
    native, ref = engines(path, 2)
    got = list(scenario(native))
    flips = explain(path, 2, scenario, got)
    print(name, native.isa, flips)
    want = run_traced(ref, scenario)[0]
    errs = [e for rows in row_errors(got, want) for e in rows]
    assert max(errs) < bound_after(flips), errs
    _, other = engines(path, 2)
    apart = row_errors(want, run_traced(other, draft_round(NEIGHBOUR[name]))[0])
    draft_rows = [e for p, rows in enumerate(apart) if p != 3 for e in rows]          # pass 3 reads KV8 in both
    assert max(draft_rows) > 100 * ROUNDING, (name, apart)


class _Recorded:
    """An engine's reset / prefill / forward, each pass's logits kept (what `against_reference` computes from)."""

    def __init__(self, engine):
        self.engine, self.logits = engine, []

    def reset(self, policy=""):
        return self.engine.reset(policy)

    def prefill(self, ids):
        self.logits.append(self.engine.prefill(ids).unsqueeze(0))
        return self.logits[-1][0]

    def forward(self, ids, view, *args, **kw):
        self.logits.append(self.engine.forward(ids, view, *args, **kw))
        return self.logits[-1]


def _agreement(mine: torch.Tensor, want: torch.Tensor) -> tuple[int, int, int, int]:
    """(equal argmax, rows, equal argmax where the reference's top-2 gap exceeds DECISIVE, such rows)."""
    top = torch.topk(want, 2).values
    decisive = (top[:, 0] - top[:, 1]) > DECISIVE
    same = mine.argmax(-1) == want.argmax(-1)
    return int(same.sum()), len(same), int(same[decisive].sum()), int(decisive.sum())


# Whole model (30 layers): float32 rounding does not stay at rounding. A last-bit difference flips an INT8 code (a row
# moves ~5e-3 on two layers, above) and each flip flips more in the layers after it: the torch reference against
# itself with its embedding moved by one ulp agrees on 85% of greedy tokens at a median 7% logit error (RTN export,
# 160 positions), as native against torch does (86%). So agreement on every token cannot be asked of any float32
# implementation; what a flip cannot move is a clear choice: over 480 positions (both exports, 12 real prompts) every
# disagreement had a reference top-2 gap below 0.8 logit, and every position above 1 logit agreed. Measured on this
# rotated export (AMD EPYC, avx512-vnni): 96.3% of 240 positions (40 tokens), 90.6% of the 96 below, 100% of those
# above DECISIVE; draft passes 21/24 under KV4 and Recent-6, 10/10 above DECISIVE.
DECISIVE = 1.0            # logits: the reference's top-2 gap above which a greedy token may not differ
ALL_TOKENS = 0.8          # share of all teacher-forced positions (measured 0.91-0.96; the one-ulp chaos floor 0.85)
CLEAR_TOKENS = 0.99       # share of positions above DECISIVE (measured 1.0)
DRAFT_TOKENS = 0.5        # share of draft-pass rows under KV4 / Recent-6 (measured 0.875; 0.75-0.81 on the RTN export)
KV_APART = 1.3            # the reference KV8 pass's median row error from the native KV4 pass over the reference KV4 pass's (measured 1.68; 0.15 with the native pass reading KV8)


@pytest.fixture(scope="module")
def whole_model(rotated_checkpoint):
    """Native and torch (the reference semantics) on the whole rotated export, on 3 real prompts (16 tokens each)
    and the native step's greedy 32 tokens after each: per prompt, `lossless --reference`'s teacher-forced
    comparison of the target view (each pass's logits kept), then, over the entries that comparison wrote, 20
    output tokens committed and one 8-token draft-slot pass of the next output tokens under KV4 and Recent-6."""
    nat = Runtime(rotated_checkpoint, backend="native", max_context=96)
    ref = Runtime(rotated_checkpoint, backend="torch", max_context=96)
    mine, want = _Recorded(nat.engine), _Recorded(ref.engine)
    reports, drafts = [], {}
    for text, chat in [(p, True) for p in sharegpt_prompts(2)] + [(p, False) for p in shakespeare_prompts(1)]:
        ids = nat.encode(text, chat)[-16:]
        out = nat.generate(ids, GenerateConfig(policy="target", max_new_tokens=32))["tokens"]
        reports.append(against_reference(SimpleNamespace(engine=mine), SimpleNamespace(engine=want, backend="torch"),
                                         [(ids, out)]))
        for rec in (mine, want):
            rec.engine.commit(len(ids) + 20)            # position len(ids) + j holds out[j] (teacher-forced)
            for view in (KVRead("kv4"), KVRead("recent", 6)):
                drafts.setdefault((view.view, rec is want), []).append(
                    rec.engine.forward(out[20:28], "draft", view, draft_slot=0))
        drafts.setdefault(("kv8", True), []).append(want.engine.forward(out[20:28], "draft", KV8, draft_slot=0))
    target = [torch.cat(r.logits[i:i + 2]) for r in (mine, want) for i in range(0, len(r.logits), 2)]
    return reports, target, drafts


def test_whole_model_target_agrees_with_the_reference(whole_model):
    reports, target, _ = whole_model
    half = len(target) // 2
    counts = [_agreement(target[i], target[half + i]) for i in range(half)]
    same, rows, clear, clear_rows = map(sum, zip(*counts))
    print(reports, f"all {same}/{rows}, gap > {DECISIVE}: {clear}/{clear_rows}")
    for report, (s, n, _, _) in zip(reports, counts):        # what `lossless --reference` reports, from these logits
        assert report["positions"] == n and report["argmax_agreement"] == round(s / n, 4), report
    assert same >= ALL_TOKENS * rows, (same, rows)
    assert clear_rows >= rows // 4 and clear >= CLEAR_TOKENS * clear_rows, (clear, clear_rows)


def _median_error(mine: list, want: list) -> float:
    return float(torch.tensor([e for rows in row_errors(mine, want) for e in rows]).median())


def test_whole_model_draft_slot_passes_agree_with_the_reference(whole_model):
    """Greedy agreement with the reference's draft passes (a floor of decisive rows, all of them equal), and the
    native KV4 pass nearer the reference's KV4 pass than its KV8 one by logits: a draft that read KV8 instead (which
    agrees with the KV4 reference on most greedy tokens) fails the second."""
    drafts = whole_model[2]
    for view in ("kv4", "recent"):
        mine, want = drafts[view, False], drafts[view, True]
        same, rows, clear, clear_rows = map(sum, zip(*[_agreement(a, b) for a, b in zip(mine, want)]))
        print(view, f"all {same}/{rows}, gap > {DECISIVE}: {clear}/{clear_rows}")
        assert same >= DRAFT_TOKENS * rows and clear_rows >= rows // 4 and clear >= CLEAR_TOKENS * clear_rows, \
            (view, same, rows, clear, clear_rows)
    near, far = _median_error(drafts["kv4", False], drafts["kv4", True]), \
        _median_error(drafts["kv4", False], drafts["kv8", True])
    print(f"native KV4 draft pass: median row error {near:.3g} from the reference's KV4, {far:.3g} from its KV8")
    assert near * KV_APART < far, (near, far)
