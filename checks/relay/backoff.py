"""Step 5 of lab `relay`: backoff — full jitter under a cap, drawn once from the rng passed in:
fixed cases, refusals, huge attempts, then inputs Hypothesis draws against the oracle."""

from __future__ import annotations

import math
import random

from checks.relay import oracle
from checks.relay.common import BOOL_HINT
from labkit.judge.expect import Miss, Plan, both, describe, raises, value_of
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def check_backoff(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    plans, calls = [], []

    def add(label: str, attempt, base, cap, check, clauses: tuple[str, ...], hint: str = "", hang: str = "") -> None:
        seed = rng.randrange(2**31)
        plans.append(Plan(label, f"backoff({attempt!r}, {base!r}, {cap!r}, random.Random({seed}))",
                         _expected_wait(attempt, base, cap), check(seed, attempt, base, cap), hint, clauses=clauses,
                         hang_clause=hang))
        calls.append({"name": label, "seed": seed, "args": [encode(attempt), encode(base), encode(cap)]})

    fixed = [
        ("attempt 1", 1, 2.0, 60.0),
        ("attempt 2 doubles the ceiling", 2, 2.0, 60.0),
        ("attempt 4", 4, 0.5, 60.0),
        ("the cap", 9, 2.0, 60.0),
        ("exactly at the cap", 6, 1.875, 60.0),
        ("base == cap", 3, 5.0, 5.0),
        ("int base and cap", 3, 1, 30),
        ("a tiny base, a large cap", 70, 1e-20, 3600.0),
        # 2 ** 1099 is past the largest float, yet base * 2 ** 1099 is about 1.4e30, below the cap:
        # neither a float power nor "past 1024 the cap bites" gives this ceiling.
        ("a tiny base past 2 ** 1024", 1100, 1e-300, 1e300),
    ]
    # Last, after the refusals: a solution that builds 2 ** attempt spends seconds on 10**9 and,
    # on a busy machine, hangs there; a hang ends the child, and no case after it runs.
    large = [
        ("attempt 10**6", 10**6, 0.25, 30.0),
        ("attempt 10**6 with an int base", 10**6, 1, 3600),
        ("attempt 10**9", 10**9, 0.5, 60.0),
    ]
    # Randomness adds cases, never replaces them, and never changes what a case can catch: each
    # random case stays in its category (below the cap with room to spare, or capped) under every seed.
    for n in (1, 2):
        attempt, base = rng.randint(1, 12), round(rng.uniform(0.01, 10), 3)
        fixed.append((f"random, below the cap ({n})", attempt, base,
                     round(base * 2 ** (attempt - 1) * rng.uniform(2.5, 50), 3)))
        attempt, base = rng.randint(8, 60), round(rng.uniform(0.01, 5), 3)
        # base <= cap < the ceiling: the contract's precondition holds and the cap really bites.
        fixed.append((f"random, capped ({n})", attempt, base, round(base * rng.uniform(1, 2 ** (attempt - 1) / 1.5), 3)))
    def drawn(label: str, attempt: int, base, cap) -> None:
        clauses = ("5.full-jitter", "5.seeded-rng") + (("5.cap",) if oracle.ceiling(attempt, base, cap) == cap else ()) + \
                 (("5.large-attempt",) if attempt > 1024 else ())
        add(label, attempt, base, cap, _drawn, clauses, hang="5.large-attempt" if attempt >= 10**6 else "")

    for label, attempt, base, cap in fixed:
        drawn(label, attempt, base, cap)
    for label, attempt, base, cap, hint in (
            ("attempt 0", 0, 1.0, 10.0, "attempt starts at 1."),
            ("attempt -1", -1, 1.0, 10.0, "attempt starts at 1."),
            ("attempt True", True, 1.0, 10.0, BOOL_HINT),
            ("attempt 2.0", 2.0, 1.0, 10.0, "attempt must be an int."),
            ("base 0", 1, 0, 10.0, "base must be more than 0."),
            ("base -1", 1, -1.0, 10.0, "base must be more than 0."),
            ("base nan", 1, float("nan"), 10.0, "nan compares false with everything: test `math.isfinite`."),
            ("base True", 1, True, 10.0, BOOL_HINT),
            ("cap below base", 1, 5.0, 4.0, "0 < base <= cap."),
            ("cap inf", 1, 1.0, float("inf"), "cap must be finite."),
            ("cap nan", 1, 1.0, float("nan"), "nan compares false with everything: test `math.isfinite`."),
            ("cap a str", 1, 1.0, "10", "cap must be an int or a float."),
            ("cap True", 1, 1.0, True, BOOL_HINT)):
        add(f"{label} is refused", attempt, base, cap, lambda *a, hint=hint: both(raises("ValueError", hint), _no_draw(a[0])),
            ("5.arg-ranges",), hint)
    for label, attempt, base, cap in large:
        drawn(label, attempt, base, cap)
    from labkit.judge.differential import after_fixed

    return after_fixed(lambda: ctx.cases("backoffs", plans, {"calls": calls}), BACKOFF_PROPERTY,
                       "backoff on generated inputs", lambda: _backoff_property(ctx))


BACKOFF_PROPERTY = "backoff agrees with the contract on generated inputs"  # differential's default name


def _backoff_property(ctx: StepContext) -> list[Case]:
    """backoff against the oracle on inputs Hypothesis draws (and shrinks), in one child that
    stays up; the adapter builds each Random(seed) in the child."""
    from hypothesis import strategies as st

    from labkit.judge.differential import differential

    sizes = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False) | st.integers(1, 100)
    # Small attempts and roomy caps are where a wrong exponent or jitter shows; weight them.
    attempts = st.integers(1, 8) | st.integers(1, 8) | st.integers(9, 80) | st.sampled_from((1_000, 4_321, 10**6))
    factors = st.sampled_from((1, 1.5, 2, 3, 7.5, 64, 1000)) | st.floats(min_value=1.0, max_value=1e4)
    valid = st.tuples(attempts, sizes, factors).map(lambda t: (t[0], t[1], t[1] * t[2]))
    # Valid inputs only: whether a random search meets one bad argument depends on the seed, and
    # a verdict must not; every bad argument has its own case above, in every run.
    strategy = st.tuples(valid, st.integers(0, 2**32 - 1)).map(lambda t: (*t[0], t[1]))
    return differential(ctx, "backoff", strategy, oracle.backoff_triple, _backoff_clause,
                       clauses=("5.full-jitter", "5.cap", "5.seeded-rng", "5.large-attempt"),
                       adapter="checks.relay.probes:backoff_adapter", examples=100,
                       show_call=lambda a, b, c, seed: f"backoff({a!r}, {b!r}, {c!r}, random.Random({seed}))")


def _backoff_clause(attempt, base, cap, seed) -> tuple[str, str]:
    try:
        oracle.backoff_triple(attempt, base, cap, seed)
    except ValueError:
        return "5.arg-ranges", ("attempt is an int >= 1; base and cap finite ints or floats with 0 < base <= cap; "
                               "bool is never a number. Anything else is ValueError.")
    if attempt >= 1_000:
        return "5.large-attempt", "Stop doubling once the ceiling has reached the cap: never build 2 ** attempt."
    if oracle.ceiling(attempt, base, cap) == cap and oracle.ceiling(attempt, base, math.inf) > cap:
        return "5.cap", "The ceiling is min(cap, base * 2 ** (attempt - 1)): never more than cap."
    return "5.full-jitter", ("The result is (wait, next draw, global random used): one rng.uniform(0, ceiling) from "
                            "the rng passed in, with ceiling = base * 2 ** (attempt - 1) for this attempt.")


def _expected_wait(attempt, base, cap) -> str:
    try:
        return f"a uniform draw from [0, {oracle.ceiling(attempt, base, cap):g}], from that Random"
    except (TypeError, ValueError):
        return "ValueError"


def _no_draw(seed: int):
    def check(record: dict) -> Miss | None:
        if record["observed"].get("rng_next") != oracle.next_draw(seed, 0):
            return Miss("ValueError, but only after drawing from rng", "Validate before drawing.")
        return None

    return check


def _drawn(seed: int, attempt: int, base: float, cap: float):
    """The wait Random(seed) gives, or a miss that names the mistake by the shape of what came
    back (the same draw times another ceiling, the ceiling itself, half plus half...): a rule of
    what was returned, not of which draw the seed happened to give."""
    ceiling = oracle.ceiling(attempt, base, cap)
    uncapped = oracle.ceiling(attempt, base, math.inf)
    doubled = oracle.ceiling(attempt + 1, base, cap)
    expected = oracle.backoff(attempt, base, cap, random.Random(seed))
    draw = random.Random(seed).random()  # the one random() behind the expected wait

    def like(got: float, want: float) -> bool:
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)

    def check(record: dict) -> Miss | None:
        outcome, seen = record["outcome"], record["observed"]
        if outcome["kind"] == "raised" and outcome["type"] == "OverflowError":
            return Miss(describe(outcome), "Don't compute 2 ** attempt as a float, nor base times an exact "
                                          "2 ** attempt (an int that large cannot become a float): double base step "
                                          "by step and stop once the ceiling has reached the cap, or use "
                                          "math.ldexp(base, attempt - 1).", clause="5.large-attempt")
        if outcome["kind"] != "returned":
            return Miss(describe(outcome), "backoff returns a float: the wait in seconds.")
        got = value_of(record)
        if seen.get("seconds", 0) > 0.5:
            return Miss(f"it took {seen['seconds']:.2f} s", "Don't loop up to `attempt`: stop doubling once the "
                                                          "ceiling has reached the cap.", clause="5.large-attempt")
        if seen.get("global_used"):
            return Miss(f"returned {show(got)} and used the global `random` module",
                       "Draw only from the rng passed in (`rng.uniform(0, ceiling)`): the global random module "
                       "cannot be replayed from a seed.", clause="5.seeded-rng")
        if type(got) not in (int, float) or isinstance(got, bool):
            return Miss(f"returned {show(got)}", "Return the wait as a float.")
        if like(got, expected):
            if seen.get("rng_next") != oracle.next_draw(seed, 1):
                used = "more than once" if seen.get("rng_next") != oracle.next_draw(seed, 0) else "not at all"
                return Miss(f"returned {show(got)}, but drew from rng {used}", "Draw exactly once, with rng.random() "
                           "or rng.uniform(): the same seed must give the same waits.", clause="5.seeded-rng")
            return None
        if uncapped > cap and (got > cap * (1 + 1e-12) or like(got, draw * uncapped)):
            return Miss(f"returned {got!r}, a draw below base * 2 ** (attempt - 1) = {uncapped:g}, past cap {cap!r}",
                       "The ceiling is `min(cap, base * 2 ** (attempt - 1))`: without the cap, waits grow without "
                       "bound.", clause="5.cap")
        if like(got, ceiling):
            return Miss(f"returned {got!r}, the ceiling itself", "Full jitter draws the wait: `rng.uniform(0, "
                                                                "ceiling)`. Without jitter every failed row comes "
                                                                "back at the same moment.", clause="5.full-jitter")
        if attempt > 1024 and ceiling < cap and like(got, draw * cap):
            return Miss(f"returned {got!r}: a draw below the cap {cap!r}, but base * 2 ** (attempt - 1) = {ceiling:g} "
                       "is below the cap here", "The cap does not always bite past attempt 1024: with a tiny base "
                       "the ceiling is still below it. Double base step by step and stop at the cap, or use "
                       "math.ldexp(base, attempt - 1).", clause="5.large-attempt")
        if like(got, ceiling / 2 + draw * ceiling / 2):
            return Miss(f"returned {got!r}: half the ceiling {ceiling:g} plus a random half",
                       "That is equal jitter. Full jitter draws from the whole range: `rng.uniform(0, ceiling)`.",
                       clause="5.full-jitter")
        if like(got, draw * doubled):
            return Miss(f"returned {got!r}: a draw below {doubled:g}, the ceiling of attempt {attempt + 1}",
                       "The ceiling for attempt k is base * 2 ** (k - 1): attempt 1 waits up to base.",
                       clause="5.full-jitter")
        return Miss(f"returned {got!r}; Random({seed}) gives {expected!r} for a ceiling of {ceiling:g}",
                   "The ceiling is min(cap, base * 2 ** (attempt - 1)), computed exactly; then one "
                   "rng.uniform(0, ceiling) from the rng passed in.", clause="5.full-jitter")

    return check
