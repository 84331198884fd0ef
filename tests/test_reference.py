"""The pure-torch `dual_plane_linear` reference against independent computations."""

import pytest
import torch

from plugins.nesting import nest_rtn, nest_top4of8, quantize_activations
from plugins.packing import pack_nibbles
from plugins.reference import dequantized_weight, dual_plane_linear


def _planes(gen, n, k, g, method="rtn"):
    w = torch.randn(n, k, generator=gen) * 0.05
    c = nest_top4of8(w, g) if method == "top4of8" else nest_rtn(w, g)
    return pack_nibbles(c.q4), pack_nibbles(c.qr), c.scale, c.offset


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("k,g", [(64, 64), (576, 64), (1536, 128), (96, 32)])
@pytest.mark.parametrize("method", ["rtn", "top4of8"])
def test_float_activations_match_dequantized_matmul(gen, m, k, g, method):
    base, refine, scale, offset = _planes(gen, 40, k, g, method)
    x = torch.randn(m, k, generator=gen)
    for view in ("draft", "target"):
        y = dual_plane_linear(x, base, refine, scale, view, offset)
        ref = x.double() @ dequantized_weight(base, refine, scale, view, offset).double().T
        err = ((y - ref).norm() / ref.norm()).item()
        assert err < 1e-12, f"{method} {view} M={m} K={k}: rel err {err:.3g}"


def test_int8_activations_are_exact_integer_group_sums(gen):
    base, refine, scale, _ = _planes(gen, 24, 256, 64)
    x = torch.randn(3, 256, generator=gen) * 4
    xq, sx = quantize_activations(x)
    assert xq.dtype == torch.int8 and int(xq.abs().max()) == 127
    w8 = dequantized_weight(base, refine, scale, "target").double()
    y = dual_plane_linear(x, base, refine, scale, "target", act_int8=True)
    ref = (xq.double() * sx.double()) @ w8.T
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_draft_reads_no_refinement(gen):
    base, refine, scale, _ = _planes(gen, 24, 128, 64)
    x = torch.randn(2, 128, generator=gen)
    assert torch.equal(dual_plane_linear(x, base, None, scale, "draft"),
                       dual_plane_linear(x, base, refine, scale, "draft"))
    with pytest.raises(ValueError):
        dual_plane_linear(x, base, None, scale, "target")
    with pytest.raises(ValueError):
        dual_plane_linear(x, base, refine, scale, "full")


def test_nested_kv_attention_reference_matches_dequantized_attention(gen):
    """The attention oracle equals plain causal attention over the dequantized KV view, for every view
    (kv8_from = 0, S, S - N) and with part of the sequence held in scratch planes."""
    from plugins.decoder_math import attention
    from plugins.kv import dequantize_kv, quantize_kv
    from plugins.reference import nested_kv_attention

    hq, hkv, d, cap, t, length = 6, 2, 16, 20, 3, 13
    b, r, s = quantize_kv(torch.randn(2, hkv, cap, d, generator=gen))
    q = torch.randn(hq, t, d, generator=gen)
    for kv8_from in (0, length, length - 4):
        lo = dequantize_kv(b[..., :kv8_from, :], None, s[..., :kv8_from], "kv4")
        hi = dequantize_kv(b[..., kv8_from:length, :], r[..., kv8_from:length, :], s[..., kv8_from:length], "kv8")
        kv = torch.cat((lo, hi), dim=2)
        want = attention(q, kv[0], kv[1], length - t)
        got = nested_kv_attention(q, b, r, s, length, kv8_from)
        assert torch.allclose(got.float(), want, atol=1e-5), kv8_from
    split = nested_kv_attention(q, b, r, s, 10, 0, scratch=(b[..., 10:, :], r[..., 10:, :], s[..., 10:]), scratch_len=3)
    assert torch.equal(split, nested_kv_attention(q, b, r, s, 13, 0))


def test_every_op_is_found_from_its_one_name():
    """Each op of plugins.contracts names its reference and its Triton launcher (python name) and its ONNX schema
    (graph name): renaming one side without the other fails here."""
    import onnx

    from plugins import kernels, reference
    from plugins.contracts import DOMAIN, DOMAIN_VERSION, OPS
    from plugins.onnx.schemas import register_schemas

    register_schemas()
    for op in OPS:
        assert callable(getattr(reference, op.python)), op
        assert callable(getattr(kernels, op.python)), op
        assert onnx.defs.get_schema(op.graph, DOMAIN_VERSION, DOMAIN).name == op.graph
