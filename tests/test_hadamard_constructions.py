"""The Hadamard matrix each factor order names (plugins.hadamard_constructions): H H^T = n I exactly for every
construction (Sylvester, Paley I over a prime and a prime power, Paley II over a prime and a prime power), and the
matrices pinned bit for bit, since a manifest records only the orders: a checkpoint that recorded an order must get
the same matrix from every later version."""

import hashlib

import pytest
import torch

from plugins.hadamard_constructions import construction, hadamard_of_order, irreducible, prime_power

# (order, construction, q): each kind of construction at small orders, and the orders the model shapes use.
ORDERS = [
    (16, "sylvester", 16),
    (12, "paley1", 11), (20, "paley1", 19), (140, "paley1", 139),            # GF(p)
    (28, "paley1", 27), (244, "paley1", 243), (344, "paley1", 343),         # GF(3^3), GF(3^5), GF(7^3)
    (36, "paley2", 17), (76, "paley2", 37), (148, "paley2", 73),            # GF(p)
    (52, "paley2", 25), (100, "paley2", 49), (340, "paley2", 169),          # GF(5^2), GF(7^2), GF(13^2)
]

# sha256 (first 16 hex digits) of the +-1 matrix as int8 bytes. The first five are what the code before issue 34 built
# (Paley I over a prime, the orders its checkpoints record: 20 and 224 of Qwen2.5-1.5B's (20, 224, 2), 152 of
# Qwen2.5-Coder-0.5B's (152, 32), 12 of SmolLM2's (12, 128)), measured with that code; the rest pin the constructions
# added with it (the orders the online rule records). Never edit one: a changed matrix silently breaks every
# checkpoint whose down_proj was multiplied by the old one.
PINNED = {12: "96c4e95b8f52c8de", 20: "e5d1e5dd287996d7", 140: "6f6c84c918ab7eff", 152: "7f17aee2f17dbd53",
          224: "77a94f091e6473a5",
          28: "f156de3682c33f2f", 36: "1a7aed2f42a8c71d", 52: "f50db5d0f93762d3", 76: "290dc2c593bbcba4",
          100: "89d400ecb6ea82c8", 148: "1a8964dfe75c61f5", 344: "33951b7f456040bf"}


@pytest.mark.parametrize("order,kind,q", ORDERS)
def test_each_construction_is_a_hadamard_matrix_exactly(order, kind, q):
    assert construction(order) == (kind, q)
    h = hadamard_of_order(order)
    assert h.shape == (order, order) and bool(((h == 1) | (h == -1)).all()), f"order {order}: entries not +-1"
    assert torch.equal(h @ h.T, order * torch.eye(order, dtype=torch.float64)), f"order {order} ({kind}, q={q})"


@pytest.mark.parametrize("order", sorted(PINNED))
def test_the_matrix_of_an_order_never_changes(order):
    h = hadamard_of_order(order).to(torch.int8).numpy()
    assert hashlib.sha256(h.tobytes()).hexdigest()[:16] == PINNED[order], f"the matrix of order {order} changed"


def test_paley_one_comes_first_where_both_constructions_exist():
    # 12 = 11 + 1 = 2 (5 + 1) and 28 = 27 + 1 = 2 (13 + 1): Paley I, as the code before issue 34 built 12
    assert construction(12) == ("paley1", 11) and construction(28) == ("paley1", 27)


@pytest.mark.parametrize("order", [6, 10, 14, 22, 30, 34, 86, 172])
def test_orders_without_a_construction(order):
    assert construction(order) is None
    with pytest.raises(ValueError, match=f"order {order}"):
        hadamard_of_order(order)


def test_prime_powers_and_the_field_polynomial():
    assert prime_power(343) == (7, 3) and prime_power(243) == (3, 5) and prime_power(139) == (139, 1)
    assert prime_power(171) is None and prime_power(1) is None
    assert irreducible(3, 3) == (1, 2, 0, 1)       # x^3 + 2x + 1: the first monic irreducible cubic over GF(3)
    assert irreducible(5, 2) == (2, 0, 1)          # x^2 + 2 over GF(5)
