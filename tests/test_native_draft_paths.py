"""The native step's draft paths against the torch reference backend (PassEngine over TorchBackend, the reference
semantics): draft-slot passes under KV4, Recent-N (a window across the committed history and the scratch slots)
and KV8 reads, on two real layers row by row at float32 rounding, and on the whole model by greedy tokens; the
whole model's target view against the reference as `bitnest lossless --reference` measures it."""

from types import SimpleNamespace

import pytest
import torch

from edge.analysis.corpora import shakespeare_prompts, sharegpt_prompts
from edge.analysis.lossless import against_reference
from edge.backends.native import native_unavailable
from edge.decode.config import GenerateConfig
from edge.decode.kv_cache import KV8, KVRead
from edge.runtime import Runtime
from tests.reference_pairs import FLIPPED, ROUNDING, engines, explain, row_errors, run_traced

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
    assert max(errs) < (FLIPPED if flips else ROUNDING), errs
    _, other = engines(path, 2)
    apart = row_errors(want, run_traced(other, draft_round(NEIGHBOUR[name]))[0])
    draft_rows = [e for p, rows in enumerate(apart) if p != 3 for e in rows]          # pass 3 reads KV8 in both
    assert max(draft_rows) > 100 * ROUNDING, (name, apart)
