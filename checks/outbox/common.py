"""Lab `outbox`: what every step's check shares (names, wording of got lines, the judge's look after a call)."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

from checks.outbox import db
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    describe,
)
from labkit.judge.verdict import Case, Outcome
from labkit.judge.witness import Witness
from labkit.values import Opaque, decode, show

Check = Callable[[dict], Miss | None]

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."
INPUT_HINT = "Never modify the input: build and return a new dict."
CLOSED_HINT = "The caller owns the connection: use it, but don't close it."


def event(event_id: str, sku: str, qty: int) -> dict:
    return {"id": event_id, "sku": sku, "qty": qty}


def name(rng: random.Random, prefix: str, length: int = 6) -> str:
    return prefix + "-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=length))


def listing(items: list) -> str:
    """Items in prose, not as a Python list: 'a, b and c' ('nothing' when empty)."""
    words = [str(i) for i in items]
    if not words:
        return "nothing"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def flags_text(flags: dict | db.Broken, ids: list[str] | None = None) -> str:
    if isinstance(flags, db.Broken):
        return f"the outbox could not be read ({flags})"
    ids = list(flags) if ids is None else ids
    return listing([f"{i} {'sent' if flags.get(i) == 1 else 'pending' if flags.get(i) == 0 else 'missing'}"
                    for i in ids])


def value_text(value: Any, limit: int = 120) -> str:
    if isinstance(value, Opaque):
        article = "an" if value.type_name[:1].lower() in "aeiou" else "a"
        return f"{article} {value.type_name} ({show(value, 60)})"
    return show(value, limit)


def outcome_text(outcome: dict, limit: int = 120) -> str:
    if outcome.get("kind") == "returned":
        return f"returned {value_text(decode(outcome['value']), limit)}"
    return describe(outcome)


def seen_after(witness: Witness, case: str, point: str = "after") -> dict | None:
    sightings = witness.sightings(case, point)
    return sightings[-1].saw if sightings else None


NOT_SEEN = Miss("the judge was never asked to look after this call (the probe's request did not arrive)",
                "Don't patch or replace the checker's code, and don't close sockets or files you did not open.")


def writable_after(witness: Witness, case: str, hint: str = TRANSACTION_HINT) -> Check:
    """The judge itself wrote and committed to the file right after the call."""

    def check(record: dict) -> Miss | None:
        if record["observed"].get("connection_open") is False:
            return Miss("the function closed the connection it was given", CLOSED_HINT)
        saw = seen_after(witness, case)
        if saw is None:
            return NOT_SEEN
        if saw.get("write"):
            return Miss(f"right afterwards the judge's own connection could not write and commit: {saw['write']}",
                        hint)
        return None

    return check




DRAWN_NOTE = "not judged: the fixed cases above fail; fix them first"


def drawn_after_fixed(cases: list[Case], drawn: set[str]) -> list[Case]:
    """Cases whose input the seed draws add to a step whose fixed cases pass. When a fixed case
    fails they are not judged: a drawn input would find the same mistake under some seeds and
    not others, and one submission would get different verdicts."""
    if all(case.passed for case in cases if case.name not in drawn):
        return cases
    return [case if case.name not in drawn else
            Case(case.name, Outcome.NOT_REACHED, case.called, case.expected, DRAWN_NOTE) for case in cases]


def told(data: Any) -> Any:
    """A value the child sent along with a sighting or a note (tagged as labkit.values does), or
    an Opaque when it is not one: what the child says must never crash the judge."""
    try:
        return decode(data)
    except Exception:
        return Opaque("?", "<unreadable>")
