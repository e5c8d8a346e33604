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


def _finite(value) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def backoff_triple(attempt, base, cap, seed: int) -> tuple[float, float, bool]:
    """What `checks.relay.probes.backoff_adapter` must return: (the wait to 12 digits, the next
    draw after exactly one, False: the global random module untouched); ValueError for bad input."""
    if type(attempt) is not int or attempt < 1:
        raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
    if not _finite(base) or not _finite(cap) or not 0 < base <= cap:
        raise ValueError(f"need finite 0 < base <= cap, not base={base!r}, cap={cap!r}")
    rng = random.Random(seed)
    wait = backoff(attempt, base, cap, rng)
    return (float(f"{wait:.12g}"), rng.random(), False)
