"""Bit-exact tests of nested KV quantization (docs/contracts.md, KV cache)."""

import torch

from plugins.kv import dequantize_kv, quantize_kv
from plugins.packing import unpack_nibbles


def test_kv_codes_follow_the_contract(gen):
    x = torch.randn(2, 5, 3, 64, generator=gen) * 3          # [layer, token, head, D]
    base, refine, scale = quantize_kv(x)
    assert base.shape == (2, 5, 3, 32) and scale.shape == (2, 5, 3) and scale.dtype == torch.float16
    s = scale.float().unsqueeze(-1)
    q4 = torch.clamp(torch.round(x / s), -8, 7)
    qr = torch.clamp(torch.round((x - q4 * s) / (s / 16)), -8, 7)
    assert torch.equal(unpack_nibbles(base).float(), q4)
    assert torch.equal(unpack_nibbles(refine).float(), qr)
    assert torch.equal(dequantize_kv(base, refine, scale, "kv4"), q4 * s)
    assert torch.equal(dequantize_kv(base, refine, scale, "kv8"), (16 * q4 + qr) * (s / 16))


def test_kv8_is_far_closer_than_kv4(gen):
    x = torch.randn(64, 3, 64, generator=gen)
    b, r, s = quantize_kv(x)
    e4 = (dequantize_kv(b, r, s, "kv4") - x).norm() / x.norm()
    e8 = (dequantize_kv(b, r, s, "kv8") - x).norm() / x.norm()
    assert e8 < e4 / 8, f"KV8 error {e8:.3g} vs KV4 {e4:.3g}"
