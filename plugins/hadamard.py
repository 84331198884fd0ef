"""Hadamard and random orthogonal matrices for rotations, and the fast Kronecker-factored apply that
backends use for online rotations (e.g. R4 before down_proj)."""

from functools import lru_cache
from typing import Optional

import torch


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def _paley(n: int) -> torch.Tensor:
    """Paley construction I: a Hadamard matrix of order n = q + 1, q prime with q = 3 mod 4."""
    q = n - 1
    residues = {(i * i) % q for i in range(1, q)}
    chi = torch.tensor([0] + [1 if a in residues else -1 for a in range(1, q)], dtype=torch.float64)
    idx = torch.arange(q)
    jac = chi[(idx.unsqueeze(0) - idx.unsqueeze(1)) % q]      # [q, q], Q[i, j] = chi(j - i)
    s = torch.zeros(n, n, dtype=torch.float64)
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = jac
    return s + torch.eye(n, dtype=torch.float64)


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def _paley_orders(limit: int) -> list[int]:
    return [q + 1 for q in range(3, limit) if q % 4 == 3 and _is_prime(q)]


@lru_cache(maxsize=None)
def hadamard_factors(n: int) -> Optional[tuple[int, ...]]:
    """Orders whose Kronecker product is a Hadamard matrix of order n (Paley orders, then one power of
    two), e.g. 1536 -> (12, 128), 576 -> (12, 12, 4); None where this construction has none."""
    if n < 1:
        return None
    if n == 1:
        return ()
    if n & (n - 1) == 0:
        return (n,)
    for p in _paley_orders(n):
        if p & (p - 1) and n % p == 0:
            rest = hadamard_factors(n // p)
            if rest is not None:
                return (p,) + rest
    return None


@lru_cache(maxsize=None)
def _factor_matrix(order: int) -> torch.Tensor:
    with torch.device("cpu"):     # cached for every caller: never on a caller's default device (meta dry runs)
        h = _sylvester(order) if order & (order - 1) == 0 else _paley(order)
        return h / order ** 0.5                               # orthonormal


@lru_cache(maxsize=None)
def _factor_on(order: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The factor matrix in `dtype` on `device`, made once: no host-to-device copy per call (a CUDA graph capture
    refuses one)."""
    return _factor_matrix(order).to(dtype=dtype, device=device)


def hadamard_factor_matrices(n: int) -> list[torch.Tensor]:
    """The orthonormal factor matrices (float64) whose Kronecker product is H_n, in `hadamard_factors` order."""
    factors = hadamard_factors(n)
    if factors is None:
        raise ValueError(f"no Hadamard construction of order {n} here: use a random orthogonal matrix")
    return [_factor_matrix(f) for f in factors]


def hadamard_matrix(n: int) -> torch.Tensor:
    """Orthonormal Hadamard matrix [n, n] (float64) as a Kronecker product of its factors."""
    factors = hadamard_factors(n)
    if factors is None:
        raise ValueError(f"no Hadamard construction of order {n} here: use a random orthogonal matrix")
    h = torch.ones(1, 1, dtype=torch.float64)
    for f in factors:  # Kronecker product of orthonormal factors is orthonormal
        h = torch.kron(h, _factor_matrix(f))
    return h


def apply_hadamard(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[..., n] @ H_n without forming H_n: contract each Kronecker factor along its own axis."""
    factors = hadamard_factors(n)
    if factors is None or x.shape[-1] != n:
        raise ValueError(f"cannot apply a Hadamard of order {n} to a last dimension of {x.shape[-1]}")
    lead = x.shape[:-1]
    y = x.reshape(*lead, *factors)
    for axis, f in enumerate(factors):
        m = _factor_on(f, x.dtype, x.device)
        # move this factor's axis last, multiply, move it back
        y = torch.movedim(torch.movedim(y, len(lead) + axis, -1) @ m, -1, len(lead) + axis)
    return y.reshape(*lead, n)


def random_orthogonal(n: int, seed: int) -> torch.Tensor:
    """Haar-random orthogonal matrix [n, n] (float64) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def random_signs(n: int, seed: int) -> torch.Tensor:
    """Seeded +-1 vector [n] (float64)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1


def randomized_hadamard(n: int, seed: int) -> torch.Tensor:
    """diag(random signs) @ H_n (float64), orthonormal; falls back to a random orthogonal matrix
    where no Hadamard of order n is constructed here."""
    if hadamard_factors(n) is None:
        return random_orthogonal(n, seed)
    return random_signs(n, seed).unsqueeze(1) * hadamard_matrix(n)
