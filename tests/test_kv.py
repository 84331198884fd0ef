"""Bit-exact tests of nested KV quantization (docs/contracts.md, KV cache): `plugins.kv.quantize_kv` against codes
computed here, independently, from the contract's formula (numpy, and by hand for two small vectors), and the Triton
KV write (`plugins.kernels.write_kv`, in the interpreter on CPU) against `quantize_kv`: the positions it writes and
nothing else, out-of-range positions refused."""

import numpy as np
import pytest
import torch

from plugins.kernels import write_kv
from plugins.kv import dequantize_kv, quantize_kv
from plugins.packing import unpack_nibbles
from tests.conftest import KERNEL_DEVICE as DEV


def contract_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q4, qr, scale float16) of x float32 [..., D], written from the contract alone: s = max|x| / 7 (at least
    2^-24), stored as float16 and the stored value used; q4 = clip(round(x / s), -8, 7), qr = clip(round((x - q4 s) /
    (s / 16)), -8, 7), round half to even. The arithmetic is float32 with IEEE division, as every implementation
    (torch, the Triton kernel's div_rn, the C++ kernels) evaluates it: q4 s is exact (4-bit by 11-bit), x - q4 s is
    exact (|x - q4 s| <= s), so only the two quotients round, once each, here as there."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=-1)                                                  # exact
    s = np.maximum(amax / np.float32(7), np.float32(2.0 ** -24)).astype(np.float16)   # [...]
    sf = s.astype(np.float32)[..., None]                                           # [..., 1]
    q4 = np.clip(np.rint(x / sf), -8, 7)
    qr = np.clip(np.rint((x - q4 * sf) / (sf / np.float32(16))), -8, 7)
    return q4.astype(np.int8), qr.astype(np.int8), s


def packed(codes: np.ndarray) -> np.ndarray:
    """Signed nibbles [..., D] -> bytes [..., D/2]: column 2j in the low nibble, 2j+1 in the high one, code & 0xF."""
    u = codes.astype(np.int16) & 0xF
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def test_kv_codes_follow_the_contract(gen):
    x = torch.randn(2, 5, 3, 64, generator=gen) * torch.rand(2, 5, 3, 1, generator=gen) * 6   # [layer, token, head, D]
    x[0, 0, 0] = 0.0                                          # an all-zero vector takes the smallest scale, 2^-24
    x[1, 2, 1, :2] = torch.tensor([7.0, -3.5])                # s = 1: exact ties of x / s and of the residual
    x[1, 2, 1, 2:] = 0.5
    base, refine, scale = quantize_kv(x)
    assert base.shape == (2, 5, 3, 32) and scale.shape == (2, 5, 3) and scale.dtype == torch.float16
    q4, qr, s = contract_codes(x.numpy())
    assert np.array_equal(scale.numpy().view(np.uint16), s.view(np.uint16)), "scales differ from max|x| / 7 in float16"
    assert np.array_equal(unpack_nibbles(base).numpy(), q4) and np.array_equal(unpack_nibbles(refine).numpy(), qr)
    assert np.array_equal(base.numpy(), packed(q4)) and np.array_equal(refine.numpy(), packed(qr))
    sf = s.astype(np.float64)[..., None]
    assert np.array_equal(dequantize_kv(base, refine, scale, "kv4").double().numpy(), q4 * sf)
    assert np.array_equal(dequantize_kv(base, refine, scale, "kv8").double().numpy(), (16.0 * q4 + qr) * sf / 16)


# Worked by hand. s = 1: q4 = round(x) (half to even: -3.5 -> -4, 0.5 -> 0), residuals 0, 0.5, 0.5, 0.25, 0, 0, -0.25,
# 0.03125 times 16 = 0, 8 (clipped to 7), 8 (7), 4, 0, 0, -4, 0.5 (to even: 0).
# max|x| = 1: s = fp16(1/7) = 585/4096 (0x3092), 1/s = 4096/585 = 7.0017; x/s = 7.0017, 3.5009 (-> 4, where the
# unrounded 1/7 would give a tie), -3.5009, 1.7504, 0, -7.0017, 5.2513, 0.4376; residuals x - q4 s in 1/4096:
# 1, -292, 292, -146, 0, -1, 147, 256, times 16/585: 0.03, -7.99, 7.99 (clipped to 7), -3.99, 0, -0.03, 4.02, 7.0017.
HAND = [([7.0, -3.5, 0.5, 1.25, -7.0, 0.0, 2.75, 0.03125], 0x3C00, [7, -4, 0, 1, -7, 0, 3, 0], [0, 7, 7, 4, 0, 0, -4, 0]),
        ([1.0, 0.5, -0.5, 0.25, 0.0, -1.0, 0.75, 0.0625], 0x3092, [7, 4, -4, 2, 0, -7, 5, 0], [0, -8, 7, -4, 0, 0, 4, 7])]


@pytest.mark.parametrize("x, scale_bits, q4, qr", HAND)
def test_kv_codes_of_hand_worked_vectors(x, scale_bits, q4, qr):
    base, refine, scale = quantize_kv(torch.tensor(x))
    assert int(scale.view(torch.int16)) & 0xFFFF == scale_bits
    assert unpack_nibbles(base).tolist() == q4 and unpack_nibbles(refine).tolist() == qr
    assert base.tolist() == [(q4[2 * j] & 15) | (q4[2 * j + 1] & 15) << 4 for j in range(4)]


def test_kv8_is_far_closer_than_kv4(gen):
    x = torch.randn(64, 3, 64, generator=gen)
    b, r, s = quantize_kv(x)
    e4 = (dequantize_kv(b, r, s, "kv4") - x).norm() / x.norm()
    e8 = (dequantize_kv(b, r, s, "kv8") - x).norm() / x.norm()
    assert e8 < e4 / 8, f"KV8 error {e8:.3g} vs KV4 {e4:.3g}"


@pytest.mark.parametrize("hkv,t,d", [(3, 1, 64), (2, 5, 32), (8, 3, 128)])
def test_write_kv_matches_quantize_kv_bit_for_bit(gen, hkv, t, d):
    """The Triton KV write puts quantize_kv's bytes at [pos, pos + T) of every plane and writes nothing else."""
    k, v = torch.randn(hkv, t, d, generator=gen) * 3, torch.randn(hkv, t, d, generator=gen)
    cap, pos = 20, 7
    base = torch.randint(0, 256, (2, hkv, cap, d // 2), generator=gen, dtype=torch.uint8)
    refine = torch.randint(0, 256, base.shape, generator=gen, dtype=torch.uint8)
    scale = torch.randn(2, hkv, cap, generator=gen).half()
    bd, rd, sd = (p.to(DEV, copy=True) for p in (base, refine, scale))    # a copy: on CPU .to() would alias
    kd = k.transpose(0, 1).contiguous().to(DEV).transpose(0, 1)        # [Hkv, T, D] strided, as the decoder's views
    write_kv(kd, v.to(DEV), bd, rd, sd, pos)
    wb, wr, ws = quantize_kv(torch.stack((k, v)))                      # [2, Hkv, T, D/2], [2, Hkv, T]
    inside = slice(pos, pos + t)
    assert torch.equal(bd[:, :, inside].cpu(), wb) and torch.equal(rd[:, :, inside].cpu(), wr)
    assert torch.equal(sd[:, :, inside].cpu().view(torch.int16), ws.view(torch.int16))
    outside = torch.ones(cap, dtype=torch.bool)
    outside[inside] = False
    for got, was, name in ((bd, base, "base"), (rd, refine, "refine"), (sd, scale, "scale")):   # nothing else written
        assert torch.equal(got[:, :, outside].cpu().view(torch.uint8), was[:, :, outside].view(torch.uint8)), name


@pytest.mark.parametrize("pos", [8, -1, 10])
def test_write_kv_rejects_out_of_range_positions(gen, pos):
    """3 positions at `pos` of a 10-slot cache do not fit: a ValueError, and the planes untouched."""
    base = torch.randint(0, 256, (2, 2, 10, 16), generator=gen, dtype=torch.uint8)
    refine, scale = base.clone(), torch.randn(2, 2, 10, generator=gen).half()
    planes = [p.to(DEV, copy=True) for p in (base, refine, scale)]
    k = torch.randn(2, 3, 32, generator=gen).to(DEV)
    with pytest.raises(ValueError, match="do not fit"):
        write_kv(k, k, *planes, pos)
    assert all(torch.equal(p.cpu().view(torch.uint8), w.view(torch.uint8)) for p, w in zip(planes, (base, refine, scale)))


@pytest.mark.parametrize("hq,hkv,t,d", [(9, 3, 5, 64), (4, 4, 1, 128)])
def test_rope_write_kv_is_rope_then_the_write_bit_for_bit(gen, hq, hkv, t, d):
    """RoPE and the KV write in one launch (the static passes'): q comes back rotated, bit for bit `rope`'s, and the
    planes hold what `write_kv_at` of the rotated k and of v writes, at [end - T, end) and nowhere else, from the
    strided views the decoder hands over (heads split out of one projection's output)."""
    from plugins.kernels import rope, rope_write_kv_at, write_kv_at
    from plugins.kernels.attention import device_scalar
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=gen) * 3).to(DEV)
    q, k, v = (x.view(t, -1, d).transpose(0, 1) for x in qkv.split([hq * d, hkv * d, hkv * d], dim=1))
    ang = torch.arange(30, 30 + t)[:, None] * (1e4 ** (-torch.arange(0, d, 2) / d))[None, :]
    cos, sin = [f(torch.cat((ang, ang), dim=-1)).float().to(DEV) for f in (torch.cos, torch.sin)]   # [T, D]
    cap = 16
    planes = (torch.randint(0, 256, (2, hkv, cap, d // 2), generator=gen, dtype=torch.uint8),
              torch.randint(0, 256, (2, hkv, cap, d // 2), generator=gen, dtype=torch.uint8),
              torch.randn(2, hkv, cap, generator=gen).half())
    fused, apart = [[p.to(DEV, copy=True) for p in planes] for _ in range(2)]
    end = device_scalar(9 + t, DEV)
    qo = rope_write_kv_at(q, k, v, cos, sin, *fused, end)
    want_q, ko = rope(q, k, cos, sin)
    write_kv_at(ko, v, *apart, end)
    assert torch.equal(qo, want_q) and qo.is_contiguous()
    for got, want in zip(fused, apart):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(apart[0].cpu(), planes[0])                  # (the write did write)
