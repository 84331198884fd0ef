"""Hadamard constructions and the fast factored apply used for online rotations."""

import pytest
import torch

from plugins.hadamard import (
    apply_hadamard,
    hadamard_factors,
    hadamard_matrix,
    random_orthogonal,
    randomized_hadamard,
)


@pytest.mark.parametrize("n,factors", [(64, (64,)), (576, (12, 12, 4)), (1536, (12, 128)), (12, (12,)),
                                       (896, (224, 4))])
def test_hadamard_orders(n, factors):
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
