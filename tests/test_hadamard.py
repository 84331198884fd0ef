"""The factorization rules (legacy and online), the factored apply used for online rotations, and the check of a
manifest's recorded factors."""

import pytest
import torch

from plugins.hadamard import (
    apply_cost,
    apply_hadamard,
    check_factors,
    hadamard_factor_matrices,
    hadamard_factors,
    hadamard_matrix,
    online_hadamard_factors,
    random_orthogonal,
    randomized_hadamard,
)


@pytest.mark.parametrize("n,factors", [(64, (64,)), (576, (12, 12, 4)), (1536, (12, 128)), (12, (12,)),
                                       (896, (224, 4))])
def test_legacy_orders(n, factors):
    assert hadamard_factors(n) == factors
    h = hadamard_matrix(n)
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(h.abs(), torch.full_like(h, n ** -0.5), atol=1e-15)


def test_no_construction_falls_back_to_random_orthogonal():
    assert hadamard_factors(36) is None
    q = randomized_hadamard(36, seed=3)
    assert torch.allclose(q @ q.T, torch.eye(36, dtype=torch.float64), atol=1e-12)
    assert torch.equal(q, random_orthogonal(36, 3))


@pytest.mark.parametrize("n", [1536, 576, 64])
def test_fast_apply_matches_dense(gen, n):
    x = torch.randn(7, n, generator=gen, dtype=torch.float64)
    assert torch.allclose(apply_hadamard(x, n), x @ hadamard_matrix(n), atol=1e-12)


# The legacy rule's R4 of the checkpoints exported before issue 34, which a manifest without factors still names: it
# must never change.
LEGACY_R4 = {8960: (20, 224, 2), 4864: (152, 32), 14336: (224, 64), 11008: (5504, 2), 18944: None, 8192: (8192,),
             1536: (12, 128), 448: (224, 2)}


@pytest.mark.parametrize("n", sorted(LEGACY_R4))
def test_the_legacy_rule_never_changes(n):
    assert hadamard_factors(n) == LEGACY_R4[n]


# The online rule on every intermediate size of the shapes of issue 34 (one dense factor first, over the columns of the
# power of two after it), the default model's and two small test orders.
ONLINE_R4 = {
    4864: (76, 64),       # Qwen2.5-0.5B: Paley II, q = 37
    8960: (140, 64),      # Qwen2.5-1.5B: Paley I, q = 139
    11008: (344, 32),     # Qwen2.5-3B (and Llama-2-7B): Paley I over GF(7^3)
    18944: (148, 128),    # Qwen2.5-7B: Paley II, q = 73 (the legacy rule had none)
    8192: (8, 1024),      # Llama-3.2-1B and 3B: Sylvester, recorded in two factors (no [8192, 8192] matrix)
    14336: (28, 512),     # Llama-3-8B: Paley I over GF(3^3)
    1536: (12, 128),      # SmolLM2-135M, the default model: the legacy rule's own, so its exports do not change
    448: (28, 16),
    576: (36, 16),
}


@pytest.mark.parametrize("n", sorted(ONLINE_R4))
def test_the_online_rule(n):
    got = online_hadamard_factors(n)
    assert got == ONLINE_R4[n]
    assert check_factors(n, list(got)) == got
    if hadamard_factors(n) is not None:   # never dearer to apply than the legacy layout
        assert apply_cost(got) <= apply_cost(hadamard_factors(n))


def test_the_online_rule_prices_a_dense_factor_over_few_columns():
    # (20, 224, 2): the 224 runs over 2 columns of 16 lanes; (140, 64): one factor over 64 columns
    assert apply_cost((20, 224, 2)) > 10 * apply_cost((140, 64))
    assert online_hadamard_factors(6) is None and online_hadamard_factors(1) == ()


@pytest.mark.parametrize("n,factors", [(448, (224, 2)), (448, (28, 16)), (576, (36, 16)), (576, (12, 12, 4)),
                                       (1216, (152, 8)), (1216, (76, 16)), (2048, (2, 1024))])
def test_explicit_factors_apply_as_their_kronecker_product(gen, n, factors):
    h = hadamard_matrix(n, factors)
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    k = torch.ones(1, 1, dtype=torch.float64)
    for m in hadamard_factor_matrices(n, factors):
        k = torch.kron(k, m)
    assert torch.equal(h, k)
    x = torch.randn(3, n, generator=gen, dtype=torch.float64)
    assert torch.allclose(apply_hadamard(x, n, factors), x @ h, atol=1e-12)


def test_two_factorizations_of_one_order_are_different_matrices():
    # what makes a runtime that re-derives factors from the size compute garbage on an older checkpoint
    a, b = hadamard_matrix(448, (224, 2)), hadamard_matrix(448, (28, 16))
    assert (a - b).abs().max() > 0.05


@pytest.mark.parametrize("factors,says", [((20, 224), "multiply to"), ((20, 224, 2.0), "positive integers"),
                                          ("20,224,2", "positive integers"), ((10, 448, 2), "no construction"),
                                          ((True, 8960), "positive integers")])
def test_recorded_factors_are_checked(factors, says):
    with pytest.raises(ValueError, match=says):
        check_factors(8960, factors)
