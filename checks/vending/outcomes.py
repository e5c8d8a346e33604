"""Lab `vending`: checks on how a call ended — the module's own exceptions, one of several errors,
the very error a hook raised, a cancellation, and how long it took (virtual or real clock).
"""

from __future__ import annotations

from labkit.judge.expect import Miss, describe, is_module_exception, outcome_hint


def module_exception(cls: str, hint: str, clause: str):
    """The module's own `cls` (a miss under `clause`), a direct subclass of Exception (else 3.exceptions)."""
    check = is_module_exception(cls, hint)

    def tagged(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None:
            outcome = record["outcome"]
            raised_it = outcome.get("kind") == "raised" and outcome.get("type") == cls
            miss.clause = {"Gap": "3.exceptions", "Conflict": "3.exceptions",
                          "ResyncRequired": "4.exception"}[cls] if raised_it else clause
        return miss

    return tagged


def raises_any(names: tuple[str, ...], hint: str):
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and any(n in outcome.get("mro", []) for n in names):
            return None
        return Miss(describe(outcome), outcome_hint(outcome, hint))

    return check


def same_error(hint: str, clause: str):
    def check(record: dict) -> Miss | None:
        if not record["observed"].get("same_error"):
            return Miss(describe(record["outcome"]), hint, clause=clause)
        return None

    return check


def cancelled(clause: str):
    def check(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "cancelled":
            return Miss(describe(record["outcome"]),
                       "Let CancelledError propagate: no `except BaseException` or `except CancelledError` that "
                       "swallows it; clean up in `finally`.", clause=clause)
        return None

    return check


def took(seconds: float, hint: str, clause: str, slack: float = 0.05):
    """Virtual-clock cases: the call lasted `seconds` (exact, whatever the machine's load)."""

    def check(record: dict) -> Miss | None:
        spent = record["observed"].get("seconds")
        if spent is None or abs(spent - seconds) > slack:
            return Miss(f"the call took {spent} s of (virtual) time; expected {seconds:g} s", hint, clause=clause)
        return None

    return check


def within(low: float, high: float, expected: str, hint: str, clause: str):
    """Real-clock cases: wide bounds, so a busy machine cannot change the verdict."""

    def check(record: dict) -> Miss | None:
        spent = record["observed"].get("seconds")
        if spent is None or not low <= spent <= high:
            return Miss(f"{describe(record['outcome'])} after {spent} s; expected {expected}", hint, clause=clause)
        return None

    return check
