"""The Hadamard matrix of one order, with entries +1 and -1 (exact, float64): Sylvester's for powers of two, Paley's
first construction (order q + 1, q a prime power = 3 mod 4) and his second (order 2(q + 1), q a prime power = 1 mod 4),
over the finite field GF(q). Which matrix an order names is part of the checkpoint format: a manifest records only
the orders of R4's Kronecker factors (docs/contracts.md, rotations), so the rule below and the field's representation
must never change for an order some checkpoint may hold.

The rule for an order f: a power of two is Sylvester's; else Paley I where f - 1 is a prime power = 3 mod 4 (for a
prime, the construction every checkpoint before issue 34 used); else Paley II where f / 2 - 1 is a prime power
= 1 mod 4; else none. GF(p^k) is GF(p)[x] / (g), g the first monic irreducible polynomial of degree k in the order
of its coefficients read as a base-p number (constant term lowest digit); element a0 + a1 x + ... is numbered
a0 + a1 p + ...."""

from functools import lru_cache
from typing import Optional

import torch


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@lru_cache(maxsize=None)
def prime_power(q: int) -> Optional[tuple[int, int]]:
    """(p, k) with q = p^k, p prime, k >= 1; None where q is not a prime power."""
    if q < 2:
        return None
    p = next(d for d in range(2, q + 1) if q % d == 0)     # the smallest prime dividing q
    k = 0
    while q % p == 0:
        q //= p
        k += 1
    return (p, k) if q == 1 else None


def construction(order: int) -> Optional[tuple[str, int]]:
    """("sylvester", order), ("paley1", q) or ("paley2", q): what the matrix of `order` is made by; None: no
    construction here."""
    if is_power_of_two(order):
        return ("sylvester", order)
    q = order - 1
    if q % 4 == 3 and prime_power(q):
        return ("paley1", q)
    if order % 2 == 0:
        q = order // 2 - 1
        if q % 4 == 1 and prime_power(q):
            return ("paley2", q)
    return None


# ---- GF(p^k) --------------------------------------------------------------------------------------------------

def _poly_mod(a: list[int], g: list[int], p: int) -> list[int]:
    """a mod g over GF(p), coefficient lists lowest degree first, g monic."""
    a = a[:]
    while len(a) >= len(g):
        c = a[-1]
        if c:
            shift = len(a) - len(g)
            for i, gc in enumerate(g):
                a[shift + i] = (a[shift + i] - c * gc) % p
        a.pop()
    return a


def _monic(p: int, k: int, number: int) -> list[int]:
    """The monic polynomial of degree k whose lower coefficients are the base-p digits of `number`."""
    return [(number // p ** i) % p for i in range(k)] + [1]


@lru_cache(maxsize=None)
def irreducible(p: int, k: int) -> tuple[int, ...]:
    """The first monic irreducible polynomial of degree k over GF(p) (coefficients lowest degree first): no monic
    polynomial of degree 1 .. k/2 divides it."""
    for number in range(p ** k):
        g = _monic(p, k, number)
        if all(any(_poly_mod(g, _monic(p, d, m), p)) for d in range(1, k // 2 + 1) for m in range(p ** d)):
            return tuple(g)
    raise ValueError(f"no irreducible polynomial of degree {k} over GF({p})")   # never: one exists for every k


def _digits(q: int, p: int, k: int) -> torch.Tensor:
    """[q, k] int64: the base-p digits of every element's number (its coefficients)."""
    a = torch.arange(q)
    return torch.stack([(a // p ** i) % p for i in range(k)], dim=1)


def quadratic_character(q: int) -> torch.Tensor:
    """chi [q] float64 over GF(q)'s elements by number: 0 at 0, +1 at a nonzero square, -1 elsewhere."""
    p, k = prime_power(q)
    if k == 1:                                  # GF(p): the integers mod p (the pre-issue-34 code, value for value)
        squares = {(i * i) % q for i in range(1, q)}
    else:
        g = list(irreducible(p, k))
        squares = set()
        for a in range(1, q):
            c = [(a // p ** i) % p for i in range(k)]
            sq = [0] * (2 * k - 1)
            for i, ci in enumerate(c):
                for j, cj in enumerate(c):
                    sq[i + j] = (sq[i + j] + ci * cj) % p
            r = _poly_mod(sq, g, p) + [0] * k
            squares.add(sum(r[i] * p ** i for i in range(k)))
    return torch.tensor([0.0] + [1.0 if a in squares else -1.0 for a in range(1, q)], dtype=torch.float64)


def jacobsthal(q: int) -> torch.Tensor:
    """Q [q, q] float64, Q[i, j] = chi(j - i) over GF(q) (elements by number)."""
    p, k = prime_power(q)
    chi = quadratic_character(q)
    if k == 1:
        idx = torch.arange(q)
        return chi[(idx.unsqueeze(0) - idx.unsqueeze(1)) % q]
    d = _digits(q, p, k)                                                      # [q, k]
    diff = torch.zeros(q, q, dtype=torch.int64)                               # [q, q]: the number of j - i
    for i in range(k):
        diff += ((d[:, i].unsqueeze(0) - d[:, i].unsqueeze(1)) % p) * p ** i
    return chi[diff]


# ---- the matrices ---------------------------------------------------------------------------------------------

def sylvester(n: int) -> torch.Tensor:
    """Sylvester's H_n [n, n], n a power of two: H_2n = [[H, H], [H, -H]]."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def paley1(q: int) -> torch.Tensor:
    """Paley I [q + 1, q + 1], q a prime power = 3 mod 4: I + S, S = [[0, 1^T], [-1, Q]] (skew: chi(-1) = -1)."""
    n = q + 1
    s = torch.zeros(n, n, dtype=torch.float64)
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = jacobsthal(q)
    return s + torch.eye(n, dtype=torch.float64)


def paley2(q: int) -> torch.Tensor:
    """Paley II [2(q + 1), 2(q + 1)], q a prime power = 1 mod 4: the symmetric conference matrix C = [[0, 1^T],
    [1, Q]] with each 0 replaced by [[1, -1], [-1, -1]] and each +-1 by +-[[1, 1], [1, -1]]."""
    c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    c[0, 1:] = 1.0
    c[1:, 0] = 1.0
    c[1:, 1:] = jacobsthal(q)
    one = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    zero = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    return torch.kron(c, one) + torch.kron(torch.eye(q + 1, dtype=torch.float64), zero)


def hadamard_of_order(order: int) -> torch.Tensor:
    """The +-1 Hadamard matrix [order, order] (float64, H H^T = order I) that `order` names (module docstring)."""
    how = construction(order)
    if how is None:
        raise ValueError(f"no Hadamard construction of order {order} here")
    kind, q = how
    return sylvester(order) if kind == "sylvester" else paley1(q) if kind == "paley1" else paley2(q)
