"""Hadamard and random orthogonal matrices for rotations, and the fast Kronecker-factored apply that backends use for
online rotations (R4 before down_proj). Two factorization rules: `online_hadamard_factors`, the cheapest to apply at
run time (what a new export fuses into down_proj and records), and `hadamard_factors`, the legacy rule (R1/R2, and
the R4 of a manifest that records no factors). The matrix each factor order names: plugins.hadamard_constructions."""

from functools import lru_cache
from math import log2
from typing import Optional, Sequence

import torch

from plugins.hadamard_constructions import construction, hadamard_of_order, is_power_of_two


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def _paley_orders(limit: int) -> list[int]:
    return [q + 1 for q in range(3, limit) if q % 4 == 3 and _is_prime(q)]


@lru_cache(maxsize=None)
def hadamard_factors(n: int) -> Optional[tuple[int, ...]]:
    """The legacy rule: orders whose Kronecker product is a Hadamard matrix of order n (Paley I orders of a prime,
    smallest first, then one power of two), e.g. 1536 -> (12, 128), 576 -> (12, 12, 4), 8960 -> (20, 224, 2); None
    where it has none. R1/R2 use it, and it is the R4 of every checkpoint whose manifest records no factors: never
    change what it returns for an order."""
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


LANES = 16     # floats in one vector register of the widest kernel set (AVX-512): the unit of `apply_cost`
# The largest Sylvester factor the online rule records: a larger power of two is recorded as several (H_a kron H_b is
# H_ab exactly), so no backend forms an [n, n] matrix for it (8,192^2 float32 is 256 MB; the ONNX function would
# carry it as a constant). Butterflies cost log2(n) whatever the split.
MAX_SYLVESTER = 1024


def apply_cost(factors: Sequence[int], lanes: int = LANES) -> float:
    """Vector operations per element of a row x @ (F_1 kron F_2 ...) as the native step applies it
    (plugins/native/step.cpp kron_rows, kron_apply): factor i acts on [pre_i, f_i, post_i], its registers running
    along the post_i columns, so a dense (Paley) factor costs f_i / min(post_i, lanes) multiply-adds and a
    Sylvester factor log2(f_i) / lanes butterflies where they fill a register (post_i a multiple of 8, or post_i = 1
    with f_i a multiple of 8), log2(f_i) where they do not."""
    n = 1
    for f in factors:
        n *= f
    cost, pre = 0.0, 1
    for f in factors:
        post = n // (pre * f)
        if is_power_of_two(f):
            filled = post % 8 == 0 or (post == 1 and f % 8 == 0)
            cost += log2(f) / (lanes if filled else 1)
        else:
            cost += f / min(post, lanes)
        pre *= f
    return cost


def _dense_orders(n: int) -> list[int]:
    """The orders f > 1 dividing n, not powers of two, with a construction (Paley I or II)."""
    return [f for f in range(3, n + 1) if n % f == 0 and not is_power_of_two(f) and construction(f) is not None]


def _candidates(n: int, prefix: tuple[int, ...] = ()):
    """Every sequence of dense factors (each with a construction) followed by the power of two left, whose product
    is n (the layouts `apply_cost` prices; the power of two last, where its butterflies run along whole rows)."""
    if is_power_of_two(n):
        yield prefix + ((n,) if n > 1 else ())
        return
    for f in _dense_orders(n):
        yield from _candidates(n // f, prefix + (f,))


def _preferred(factors: tuple[int, ...]) -> bool:
    """One dense factor, first, its registers full (at least LANES columns after it), then a power of two."""
    return len(factors) >= 1 and not is_power_of_two(factors[0]) and \
        all(is_power_of_two(f) for f in factors[1:]) and (factors[1] if len(factors) > 1 else 1) >= LANES


@lru_cache(maxsize=None)
def online_hadamard_factors(n: int) -> Optional[tuple[int, ...]]:
    """The rule for online rotations (R4), cheap at run time: with n = m 2^k (m odd), one dense factor h = m 2^j (Paley
    I or II over GF(q), q a prime power; plugins.hadamard_constructions) over the n / h >= LANES columns of the power
    of two that follows, the smallest such h; where none exists, the layout of least `apply_cost` (ties: fewer
    factors). 8960 -> (140, 64), 18944 -> (148, 128), 14336 -> (28, 512), 11008 -> (344, 32), 4864 -> (76, 64),
    1536 -> (12, 128); a power of two is itself, split at MAX_SYLVESTER (8192 -> (8, 1024)); None where no layout
    exists. (The legacy rule's 8960 -> (20, 224, 2) put its 224 over 2 columns: the ~47 ms a token of issue 34. A
    layout of several dense factors can price lower by `apply_cost`, e.g. 8960 as (20, 28, 16), but measured no
    faster than (140, 64) in the native step: one dense factor is kept.)"""
    if n < 1:
        return None
    best = min(_candidates(n), key=lambda c: (not _preferred(c), apply_cost(c), len(c), c), default=None)
    return None if best is None else _split_sylvester(best)


def _split_sylvester(factors: tuple[int, ...]) -> tuple[int, ...]:
    """`factors` with a trailing power of two above MAX_SYLVESTER recorded as (its quotient, MAX_SYLVESTER), in that
    order (the wide factor last, where its butterflies run along whole rows): 8192 -> (8, 1024)."""
    if not factors or not is_power_of_two(factors[-1]) or factors[-1] <= MAX_SYLVESTER:
        return factors
    return _split_sylvester(factors[:-1] + (factors[-1] // MAX_SYLVESTER,)) + (MAX_SYLVESTER,)


def check_factors(n: int, factors) -> tuple[int, ...]:
    """`factors` (a manifest's record) as a tuple after checking it names a Hadamard of order n: integers >= 1 whose
    product is n, each an order with a construction here; ValueError (one line) otherwise."""
    if not isinstance(factors, (list, tuple)) or \
            not all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in factors):
        raise ValueError(f"Hadamard factors {factors!r} are not a list of positive integers")
    prod = 1
    for f in factors:
        prod *= f
    if prod != n:
        raise ValueError(f"Hadamard factors {list(factors)} multiply to {prod}, not the order {n}")
    bad = [f for f in factors if construction(f) is None]
    if bad:
        raise ValueError(f"Hadamard factor order {bad[0]} has no construction here")
    return tuple(factors)


def _resolve(n: int, factors: Optional[Sequence[int]]) -> tuple[int, ...]:
    """The factors to apply: `factors` as given (checked), or the legacy rule's for n."""
    if factors is not None:
        return check_factors(n, tuple(factors))
    got = hadamard_factors(n)
    if got is None:
        raise ValueError(f"no Hadamard construction of order {n} here: use a random orthogonal matrix")
    return got


@lru_cache(maxsize=None)
def _factor_matrix(order: int) -> torch.Tensor:
    with torch.device("cpu"):     # cached for every caller: never on a caller's default device (meta dry runs)
        return hadamard_of_order(order) / order ** 0.5          # orthonormal


@lru_cache(maxsize=None)
def factor_on(order: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The factor matrix in `dtype` on `device`, made once: no host-to-device copy per call (a CUDA graph capture
    refuses one)."""
    return _factor_matrix(order).to(dtype=dtype, device=device)


def hadamard_factor_matrices(n: int, factors: Optional[Sequence[int]] = None) -> list[torch.Tensor]:
    """The orthonormal factor matrices (float64) whose Kronecker product is H_n: of `factors` (e.g. a manifest's
    record), or of the legacy rule `hadamard_factors(n)` where None."""
    return [_factor_matrix(f) for f in _resolve(n, factors)]


def hadamard_matrix(n: int, factors: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Orthonormal Hadamard matrix [n, n] (float64) as the Kronecker product of `factors` (None: the legacy rule's)."""
    factors = _resolve(n, factors)
    h = torch.ones(1, 1, dtype=torch.float64)
    for f in factors:  # Kronecker product of orthonormal factors is orthonormal
        h = torch.kron(h, _factor_matrix(f))
    return h


def apply_hadamard(x: torch.Tensor, n: int, factors: Optional[Sequence[int]] = None) -> torch.Tensor:
    """x[..., n] @ H_n without forming H_n: contract each Kronecker factor (of `factors`, None: the legacy rule's)
    along its own axis."""
    if x.shape[-1] != n:
        raise ValueError(f"cannot apply a Hadamard of order {n} to a last dimension of {x.shape[-1]}")
    factors = _resolve(n, factors)
    lead = x.shape[:-1]
    y = x.reshape(*lead, *factors)
    for axis, f in enumerate(factors):
        m = factor_on(f, x.dtype, x.device)
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
