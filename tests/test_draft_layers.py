"""The shallower-draft analysis (edge.analysis.draft_layers): the draft view skips exactly the layers asked for and
the target view none, the skipped layers' bytes are the draft pass's own accounting, and the projection follows
auto's rule. (The command runs end to end in tests/test_commands.py.)"""

import pytest
import torch

from edge.analysis.draft_layers import ShallowDraft, layer_draft_bytes, projected_speedup
from edge.backends.torch_ref import TorchBackend
from edge.engine.cost_table import CostTable
from edge.engine.stats import head_bytes_per_pass, head_row_bytes_per_token, weight_bytes_per_pass
from edge.model.checkpoint import load_checkpoint
from edge.model.decoder import causal_attention
from plugins.contracts import DRAFT, TARGET


@pytest.fixture(scope="module")
def ckpt(rtn_checkpoint):
    return load_checkpoint(rtn_checkpoint)


def test_only_the_draft_view_skips_and_only_the_layers_asked(ckpt):
    w = TorchBackend(ckpt)
    ids = torch.arange(5, 21)                                                     # [16] token ids
    full, shallow = ShallowDraft(ckpt, w), ShallowDraft(ckpt, w, frozenset({3, 7}))
    assert torch.equal(shallow.forward(ids, TARGET), full.forward(ids, TARGET))   # the target reads every layer
    x = full.embed(ids)                                                           # [16, H]
    cos, sin = full.rope(ids.numel())
    for layer in range(ckpt.config.num_layers):
        if layer not in (3, 7):
            x = full.block(layer, x, cos, sin, DRAFT, causal_attention)
    assert torch.equal(shallow.forward(ids, DRAFT), full.final(x, DRAFT))        # layers 3 and 7 pass x on
    assert not torch.equal(shallow.forward(ids, DRAFT), full.forward(ids, DRAFT))


def test_the_layers_bytes_are_the_draft_pass_accounting(ckpt):
    """Every layer's draft bytes, the head as the draft reads it and the final norm: a draft pass's weight bytes."""
    layers = sum(layer_draft_bytes(ckpt, l) for l in range(ckpt.config.num_layers))
    rest = head_bytes_per_pass(ckpt, DRAFT) + head_row_bytes_per_token(ckpt, DRAFT) + \
        ckpt.tensors["model.norm.weight"].numel() * ckpt.tensors["model.norm.weight"].element_size()
    assert layers + rest == weight_bytes_per_pass(ckpt, DRAFT)
    assert len({layer_draft_bytes(ckpt, l) for l in range(ckpt.config.num_layers)}) == 1      # alike layers, alike bytes


def test_the_projection_is_autos_rule():
    flat = CostTable(target=(1.0,) * 9, draft=0.25, source="test", path=None, context=1)
    # α = 0.5: γ = 1 emits 1.5 tokens for 1.25 target steps (1.2x), γ = 2 1.75 for 1.5 (1.17x)
    assert projected_speedup(0.5, 0.25, flat, 8) == (1, pytest.approx(1.2))
    # α = 1 and a free draft: the most proposals win, γ + 1 tokens a target step; the ceiling bounds γ
    assert projected_speedup(1.0, 0.0, flat, 8) == (8, pytest.approx(9.0))
    assert projected_speedup(1.0, 0.0, flat, 3) == (3, pytest.approx(4.0))
