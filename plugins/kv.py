"""Nested KV quantization (docs/contracts.md, KV cache, paper A.2): per-vector KV4 base and KV4 refinement planes."""

import torch

from plugins.contracts import KV_QMAX, Q4_MAX, Q4_MIN, REFINE_DIVISOR
from plugins.packing import pack_nibbles, unpack_nibbles


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., D] -> (base uint8 [..., D/2], refine uint8 [..., D/2], scale float16 [...]).

    s = max|x|/7 (stored as float16, and the stored value is the one used), q4 = clip(round(x/s), -8, 7),
    qr = clip(round((x - q4 s)/(s/16)), -8, 7).
    """
    s = (x.float().abs().amax(dim=-1) / KV_QMAX).clamp_min(2.0 ** -24).to(torch.float16)  # [...]
    sf = s.float().unsqueeze(-1)                                                           # [..., 1]
    q4 = torch.clamp(torch.round(x.float() / sf), Q4_MIN, Q4_MAX)
    qr = torch.clamp(torch.round((x.float() - q4 * sf) / (sf / REFINE_DIVISOR)), Q4_MIN, Q4_MAX)
    # codes are clamped above, so the packer's range check (a hot-path sync per KV write) is skipped
    return pack_nibbles(q4.to(torch.int8), check=False), pack_nibbles(qr.to(torch.int8), check=False), s


def dequantize_kv(base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor, view: str) -> torch.Tensor:
    """float32 [..., D] of a KV view: kv4 = q4 s, kv8 = (16 q4 + qr) s/16."""
    sf = scale.float().unsqueeze(-1)
    q4 = unpack_nibbles(base).float()
    if view == "kv4":
        return q4 * sf
    if view == "kv8":
        return (REFINE_DIVISOR * q4 + unpack_nibbles(refine).float()) * (sf / REFINE_DIVISOR)
    raise ValueError(f"unknown KV view {view!r}: use kv4 or kv8 (recent-N is a mix chosen per position)")


def dequantize_kv_mixed(base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor, kv8_from: int) -> torch.Tensor:
    """float32 [..., S, D] of planes [..., S, D/2] read at KV4 before position `kv8_from` and at KV8 from it on
    (every KV view: kv8 -> 0, kv4 -> S, recent-N -> S - N). KV4 positions never touch the refinement plane."""
    s = base.shape[-2]
    split = min(max(kv8_from, 0), s)
    out = []
    if split:
        out.append(dequantize_kv(base[..., :split, :], None, scale[..., :split], "kv4"))
    if s > split:
        out.append(dequantize_kv(base[..., split:, :], refine[..., split:, :], scale[..., split:], "kv8"))
    return torch.cat(out, dim=-2) if len(out) > 1 else out[0]
