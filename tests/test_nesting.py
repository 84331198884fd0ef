"""Bit-exact tests of the nesting rules: eq. 9, the views, the draft as an exact subset, top-4-of-8."""

import torch

from plugins.contracts import group_size_for
from plugins.nesting import (
    NestedCodes,
    dequantize,
    nest_rtn,
    nest_top4of8,
    quantize_base,
    refine_codes,
    symmetric_scale,
)
from plugins.packing import pack_nibbles, unpack_nibbles
from plugins.reference import dequantized_weight


def _weights(gen, n=48, k=256):
    w = torch.randn(n, k, generator=gen) * 0.02
    w[0, :64] = -w[0, :64].abs() * 4     # a group whose extreme is negative: exercises q4 = -8
    return w


def test_group_size_rule():
    assert group_size_for(1536) == 128
    assert group_size_for(576) == 64
    assert group_size_for(96) == 32
    assert group_size_for(576, 32) == 32


def test_refinement_follows_eq9(gen):
    w = _weights(gen)
    scale = symmetric_scale(w, 64)
    q4 = quantize_base(w, scale)
    # force base codes at the bottom of the range: refinement there must be in [0, 7]
    q4[1, :10] = -8
    qr = refine_codes(w, q4, scale)
    s = scale.float().repeat_interleave(64, 1)
    expect = torch.round((w - q4.float() * s) / (s / 16))
    lo = torch.where(q4 == -8, 0.0, -8.0)
    assert torch.equal(qr.float(), torch.minimum(torch.maximum(expect, lo), torch.tensor(7.0)))
    code8 = 16 * q4.int() + qr.int()
    assert int(code8.min()) >= -128 and int(code8.max()) <= 127
    assert bool((qr[q4 == -8] >= 0).all())


def test_target_equals_composed_code(gen):
    c = nest_rtn(_weights(gen), 64)
    s = c.scale.float().repeat_interleave(64, 1)
    assert torch.equal(dequantize(c, "target"), (16 * c.q4.float() + c.qr.float()) * (s / 16))
    assert torch.equal(dequantize(c, "draft"), c.q4.float() * s)


def test_base_plane_alone_reproduces_the_draft_bit_for_bit(gen):
    c = nest_rtn(_weights(gen), 64)
    base, refine = pack_nibbles(c.q4), pack_nibbles(c.qr)
    draft_from_base = dequantized_weight(base, None, c.scale, "draft")
    assert torch.equal(draft_from_base, dequantize(c, "draft"))
    # the refinement plane never changes the draft: scramble it and the draft is the same
    assert torch.equal(dequantized_weight(base, torch.randint(0, 256, refine.shape, dtype=torch.uint8),
                                          c.scale, "draft"), draft_from_base)
    assert torch.equal(unpack_nibbles(refine), c.qr)


def test_refinement_reduces_error(gen):
    w = _weights(gen)
    c = nest_rtn(w, 64)
    e_draft = (dequantize(c, "draft") - w).norm() / w.norm()
    e_target = (dequantize(c, "target") - w).norm() / w.norm()
    assert e_target < e_draft / 8, f"target error {e_target:.4g} not far below draft error {e_draft:.4g}"


def test_top4of8_target_is_the_asymmetric_8bit_grid(gen):
    w = _weights(gen)
    c = nest_top4of8(w, 64)
    step = c.scale.float() / 16                                       # [N, K/G]
    wg = w.view(w.shape[0], -1, 64)
    zero = torch.clamp(torch.round(-wg.amin(-1) / step), 0, 255)
    code = torch.clamp(torch.round(wg / step.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 255)
    grid = ((code - zero.unsqueeze(-1)) * step.unsqueeze(-1)).view_as(w)
    # the float16 offset s(136 - z) is at most 136 steps, so its rounding is at most 136 * 2^-11 < 0.07 step
    tol = 0.07 * step.repeat_interleave(64, 1)
    assert bool(((dequantize(c, "target") - grid).abs() <= tol).all())
    # the draft sits at the middle code (16h + 8) of the dropped cell
    h = torch.div(code, 16, rounding_mode="floor")
    mid = ((16 * h + 8 - zero.unsqueeze(-1)) * step.unsqueeze(-1)).view_as(w)
    assert bool(((dequantize(c, "draft") - mid).abs() <= tol).all())
    assert c.offset is not None and c.offset.dtype == torch.float16


def test_nested_codes_group_size(gen):
    c = nest_rtn(_weights(gen, k=1536), 128)
    assert isinstance(c, NestedCodes) and c.group_size == 128 and c.scale.shape == (48, 12)
