"""Bit-exact tests of signed-nibble plane packing (docs/contracts.md, weights)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.packing import pack_nibbles, unpack_nibbles


def test_byte_layout_low_nibble_is_even_column():
    codes = torch.tensor([[1, -1, -8, 7]], dtype=torch.int8)
    packed = pack_nibbles(codes)
    # column 0 (1) low, column 1 (-1 -> 0xF) high; column 2 (-8 -> 0x8) low, column 3 (7) high
    assert packed.tolist() == [[0xF1, 0x78]]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_round_trip_is_exact(rows, half_cols, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (rows, 2 * half_cols), generator=g, dtype=torch.int8)
    packed = pack_nibbles(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half_cols)
    assert torch.equal(unpack_nibbles(packed), codes)


def test_every_byte_unpacks_and_repacks():
    every = torch.arange(256, dtype=torch.uint8).view(16, 16)
    assert torch.equal(pack_nibbles(unpack_nibbles(every)), every)


@pytest.mark.parametrize("bad", [torch.tensor([[8, 0]]), torch.tensor([[-9, 0]]), torch.tensor([[1, 2, 3]])])
def test_rejects_out_of_range_or_odd(bad):
    with pytest.raises(ValueError):
        pack_nibbles(bad)
