"""Lab `relay`'s oracles: what the contract says `backoff` and `fail` compute, on the judge's side.

Never imported by a child: the judge draws from its own `random.Random(seed)` and compares.
"""

from __future__ import annotations

import math
import random

# Past this exponent, base * 2 ** exponent exceeds any finite cap for any positive base
# (the smallest positive float is 2 ** -1074 and the largest below 2 ** 1024).
EXPONENT_ENOUGH = 1074 + 1024


def ceiling(attempt: int, base: float, cap: float) -> float:
    """min(cap, base * 2 ** (attempt - 1)), exactly, without ever building 2 ** attempt."""
    exponent = min(attempt - 1, EXPONENT_ENOUGH)
    try:
        doubled = math.ldexp(float(base), exponent)
    except OverflowError:
        doubled = math.inf
    return min(float(cap), doubled)


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: one uniform draw from [0, ceiling]."""
    return rng.uniform(0, ceiling(attempt, base, cap))


def draws(seed: int, attempts: list[tuple[int, float, float]]) -> list[float]:
    """The waits a fresh Random(seed) gives for these (attempt, base, cap), in order."""
    rng = random.Random(seed)
    return [backoff(a, b, c, rng) for a, b, c in attempts]


def next_draw(seed: int, used: int) -> float:
    """rng.random() after `used` draws from Random(seed): shows how many draws a call consumed."""
    rng = random.Random(seed)
    for _ in range(used):
        rng.random()
    return rng.random()


def last_error(type_name: str, message: str) -> str:
    return f"{type_name}: {message}"[:200]
