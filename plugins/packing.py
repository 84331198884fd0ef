"""Signed-nibble plane packing (docs/contracts.md, weights): two 4-bit two's-complement codes per byte, low nibble first."""

import sys

import torch

from plugins.contracts import Q4_MAX, Q4_MIN


def pack_nibbles(codes: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Pack signed 4-bit codes [..., K] (any integer dtype, values in [-8, 7], K even) into uint8 [..., K/2].

    Byte j holds column 2j in its low nibble and column 2j+1 in its high nibble, each as `code & 0xF`.
    `check=False` skips the range check (two reductions) for callers whose codes are clamped already.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number of columns ({codes.shape[-1]}) into nibbles")
    c = codes.to(torch.int16)
    if check and c.numel() and (int(c.min()) < Q4_MIN or int(c.max()) > Q4_MAX):
        raise ValueError(f"nibble codes must lie in [{Q4_MIN}, {Q4_MAX}], got [{int(c.min())}, {int(c.max())}]")
    u = c & 0xF                                       # [..., K] two's-complement nibbles
    packed = u[..., 0::2] | (u[..., 1::2] << 4)       # [..., K/2]
    return packed.to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`: uint8 [..., K/2] -> int8 codes [..., K] in [-8, 7].

    Each byte widened to 16 bits with its high nibble moved up to the second byte: on a little-endian machine the
    int16 [..., K/2] seen as bytes is [..., K] in column order (elementwise ops only: interleaving two int8 tensors
    with torch.stack ran ~3x slower on a CPU); each nibble is then sign-extended by arithmetic shifts on int8."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed planes must be uint8, got {packed.dtype}")
    if sys.byteorder != "little":
        lo = (packed << 4).view(torch.int8) >> 4                   # [..., K/2]
        hi = packed.view(torch.int8) >> 4                          # [..., K/2]
        return torch.stack((lo, hi), dim=-1).flatten(-2)           # [..., K]
    w = packed.to(torch.int16, memory_format=torch.contiguous_format)      # [..., K/2]
    w = (w | (w << 4)) & 0x0F0F                     # byte 0: the low nibble, byte 1: the high one
    return (w.view(torch.int8) << 4) >> 4                                  # [..., K]
