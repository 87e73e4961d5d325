"""How a plan splits its batch: divisors of a batch size, found without scanning up to it.

A plan's per-rank batch is micro-batch × accumulation, so the micro-batch must divide it.
Batches come from users and runs (a ``micro_batch`` of 10¹² is a valid int), so the largest
divisor under a memory cap is taken from the batch's prime factors (trial division by small
primes, then Pollard's rho) and never from a scan over candidate divisors.
"""

from __future__ import annotations

import bisect
import math
import random
from functools import lru_cache

_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
#: Trial division covers factors below this; larger ones are found by Pollard's rho.
_TRIAL_LIMIT = 1000


def _is_probable_prime(n: int) -> bool:
    """Miller–Rabin with the first 12 primes as bases: exact for n < 3.3·10²⁴."""
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _SMALL_PRIMES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_rho(n: int, rng: random.Random) -> int:
    """A non-trivial factor of the odd composite ``n`` (Brent's variant)."""
    while True:
        y, c, m = rng.randrange(1, n), rng.randrange(1, n), 128
        g = r = q = 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of ``n`` >= 1."""
    if n < 1:
        raise ValueError(f"cannot factor {n}")
    out: dict[int, int] = {}
    for p in range(2, _TRIAL_LIMIT):
        if p * p > n:
            break
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    rng = random.Random(n)  # deterministic: the same batch always factors the same way
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_probable_prime(m):
            out[m] = out.get(m, 0) + 1
            continue
        f = _pollard_rho(m, rng)
        stack.extend((f, m // f))
    return out


@lru_cache(maxsize=512)
def divisors(n: int) -> tuple[int, ...]:
    """Every divisor of ``n`` >= 1, ascending (built from its prime factors)."""
    divs = [1]
    for p, e in prime_factors(n).items():
        divs = [d * p ** k for d in divs for k in range(e + 1)]
    return tuple(sorted(divs))


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is <= ``cap`` (1 when ``cap`` < 1)."""
    if cap >= n:
        return n
    if cap < 1:
        return 1
    divs = divisors(n)
    return divs[max(0, bisect.bisect_right(divs, cap) - 1)]
