"""The fused SwiGLU + R4 + quantization launch (plugins.kernels.swiglu) against the decoder's torch ops
(plugins.decoder_math.silu_mul, hadamard_rows) and the decode quantizer, in the Triton interpreter here and on the
GPU where there is one: float32-accurate rows, the quantizer's bits, rows independent of the other tokens, its
counters left zero for the next launch."""

import pytest
import torch

from plugins.decoder_math import hadamard_rows, silu_mul
from tests.conftest import KERNEL_DEVICE as DEV


def gated_inputs(gen, m, n):
    """gate and up as the stacked gate/up GEMV gives them: column views of one [M, 2I] output."""
    y = (torch.randn(m, 2 * n, generator=gen) * 2).to(DEV)
    return y[:, :n], y[:, n:]


# (12, 128): the 1.5B's R4 layout at a smaller dense factor; (20, 32): a dense factor over 32 columns, C = 16 rows a
# program so the second program's rows are partly masked; (32, 12): a non-power-of-two last factor (masked
# columns); (256,): one Sylvester factor (the small test model's); (): no R4.
@pytest.mark.parametrize("m,n,factors,g", [(5, 1536, (12, 128), 128), (3, 640, (20, 32), 64), (2, 384, (32, 12), 128),
                                           (8, 256, (256,), 32), (4, 896, (), 64)])
def test_swiglu_decode_is_the_decoders_gated_rotation_and_its_quantization(gen, m, n, factors, g):
    """Rows within float32 rounding of torch's silu_mul then hadamard_rows; activations bit for bit quantize_decode
    of the rows."""
    from plugins.kernels import quantize_decode, swiglu_decode
    gate, up = gated_inputs(gen, m, n)
    out, acts = swiglu_decode(gate, up, factors, g)
    want = silu_mul(gate.double().cpu(), up.double().cpu())
    if factors:
        want = hadamard_rows(want, n, factors)
    assert ((out.double().cpu() - want).norm() / want.norm()).item() < 2e-6
    ref = quantize_decode(out, g)
    assert torch.equal(acts[0], ref[0]) and torch.equal(acts[2], ref[2])
    assert torch.equal(acts[1][:, :m], ref[1][:, :m])                       # the slots past M are never read


def test_a_factor_applied_transposed_is_caught(gen, monkeypatch):
    """The accuracy check above fails where the kernel reads a factor matrix transposed (Paley factors are not
    symmetric): the planted regression moves the rows by order 1, not 1e-6."""
    import plugins.kernels.swiglu as swiglu
    gate, up = gated_inputs(gen, 2, 1536)
    want = hadamard_rows(silu_mul(gate.double().cpu(), up.double().cpu()), 1536, (12, 128))
    real = swiglu.factor_on
    monkeypatch.setattr(swiglu, "factor_on", lambda order, dtype, dev: real(order, dtype, dev).T.contiguous())
    out, _ = swiglu.swiglu_decode(gate, up, (12, 128), 64)
    assert ((out.double().cpu() - want).norm() / want.norm()).item() > 0.1


def test_swiglu_decode_rows_do_not_depend_on_the_other_tokens(gen):
    """A token's row and its activations are the same bits alone as among five (a verification pass computes what
    single-token steps compute), and the per-token counters and running maxima are zero after each launch."""
    from plugins.kernels import swiglu_decode
    from plugins.kernels.gemv import split_counters
    gate, up = gated_inputs(gen, 5, 1536)
    out, (xq, xsum, sx) = swiglu_decode(gate, up, (12, 128), 64)
    words = xq.view(1536 // 32, 5, 8)                                       # the decode layout [K/32, M, 8]
    for i in range(5):
        one, (q1, s1, x1) = swiglu_decode(gate[i:i + 1], up[i:i + 1], (12, 128), 64)
        assert torch.equal(one[0], out[i]) and torch.equal(x1[0], sx[i]), i
        assert torch.equal(q1.view(1536 // 32, 1, 8)[:, 0], words[:, i]) and torch.equal(s1[:, 0], xsum[:, i]), i
        assert not split_counters(gate.device, 16)[:16].any()      # tokens' counters, then their maxima


def test_swiglu_decode_refuses_what_it_does_not_serve(gen):
    from plugins.kernels import swiglu_decode
    gate, up = gated_inputs(gen, 2, 1536)
    with pytest.raises(ValueError, match="at most 2 factors"):
        swiglu_decode(gate, up, (12, 8, 16), 64)
    with pytest.raises(ValueError, match="do not fit"):
        swiglu_decode(*gated_inputs(gen, 9, 1536), (12, 128), 64)
    with pytest.raises(ValueError, match="multiply to"):
        swiglu_decode(gate, up, (12, 64), 64)
