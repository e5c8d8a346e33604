"""Lab 01's `validate_event`, written again from the contract alone, for the differential test.

Judge-side only: the child never sees this file. It shares no code with the reference
(solutions/worker.py, generated from the lesson): the grammar is walked character by
character here, where the reference uses a regular expression, so a bug in one is unlikely
to hide the same bug in the other.

`violation(event)` names the first clause an event breaks (None when it is valid);
`validate_event(event)` is what the contract says the student's function does.
"""

from __future__ import annotations

FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
REST = FIRST | frozenset("._-")
KEYS = ("id", "sku", "qty")
LONGEST = {"id": 64, "sku": 32}
WHITESPACE_AND_CONTROL = frozenset(chr(c) for c in range(0x20)) | frozenset(" \x7f\x85\xa0\u1680\u2028\u2029\u3000") \
    | frozenset(chr(c) for c in range(0x2000, 0x200B))


def _name_violation(field: str, value: object) -> str | None:
    if type(value) is not str:
        return f"1.{field}-type"
    if len(value) < 1:
        return f"1.{field}-min"
    if len(value) > LONGEST[field]:
        return f"1.{field}-max"
    for position, char in enumerate(value):
        if char in (FIRST if position == 0 else REST):
            continue
        if char == "\n" and position == len(value) - 1:
            return f"1.{field}-newline"
        if char in WHITESPACE_AND_CONTROL or char.isspace():
            return f"1.{field}-space"
        if not char.isascii():
            return f"1.{field}-ascii"
        return f"1.{field}-first" if position == 0 else f"1.{field}-rest"
    return None


def violation(event: object) -> str | None:
    """The clause of the first rule `event` breaks, in the contract's order; None if valid."""
    if type(event) is not dict:
        return "1.event-dict"
    if any(key not in event for key in KEYS):
        return "1.keys-missing"
    if len(event) != len(KEYS):
        return "1.keys-extra"
    for field in ("id", "sku"):
        broken = _name_violation(field, event[field])
        if broken:
            return broken
    qty = event["qty"]
    if type(qty) is bool:
        return "1.qty-bool"
    if type(qty) is not int:
        return "1.qty-type"
    if qty < 1:
        return "1.qty-min"
    if qty > 1000:
        return "1.qty-max"
    return None


def validate_event(event: object) -> dict:
    broken = violation(event)
    if broken:
        raise ValueError(f"the event breaks {broken}")
    return {"id": event["id"], "sku": event["sku"], "qty": event["qty"]}
