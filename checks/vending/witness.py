"""Lab `vending`, judge side: look at a store *while* the student's transaction waits in fault().

The `fault` callable a case hands to `apply_event`/`consume_line` is the probe's; it asks the
judge's witness (`labkit/judge/witness.py`) to look, naming its case, and blocks until the judge
answers. Meanwhile the judge, in its own process and with its own connections, tries
`BEGIN IMMEDIATE` on that case's store (it must fail: the student's transaction holds the write
lock) and reads what is committed (it must still be the state before the event). A student who
patches the probe's request away leaves no sighting, which fails the case. (What the student's
*own* connection sees mid-transaction can only be seen inside the child: that stays its report.)

The child names a case, never a file: the judge looks only at the stores it registered.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from checks.vending import interference
from checks.vending.store import can_write, look_after, observe_store, snapshot
from labkit.judge.expect import Plan
from labkit.judge.run import StepContext
from labkit.judge.served import served
from labkit.judge.verdict import Case
from labkit.judge.witness import Look, Witness

POINT = "fault"  # the one moment this lab asks the judge to look at: inside fault()
REFUSED = {"refused": "not a store of this step"}


def look_mid_transaction(path: Path) -> dict:
    """While fault() waits: is the store write-locked, and what is committed? (The judge's own
    connections.)"""
    try:
        locked = not can_write(path, wait=0)
    except sqlite3.DatabaseError:
        locked = None
    return {"write_locked": locked, "outside": snapshot(path)}


def look_at(stores: dict[str, Path]) -> Look:
    """The witness's look for one step: case name → the store the judge made for it."""
    def look(case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = stores.get(case)
        if path is None or point != POINT:  # nothing the judge registered: it opens nothing
            return REFUSED, REFUSED
        return look_mid_transaction(path), {}

    return look


def served_with_witness(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """Store calls whose fault() is watched from the judge's side while it runs."""
    stores = {s["name"]: Path(s["db"]) for s in specs}
    with Witness(look_at(stores)) as witness:
        for spec in specs:
            spec["witness"] = witness.url
        return served(ctx, "call", plans, specs, lambda pid, spec: (
            interference.observe_sweep(spec, look_after) if spec.get("kind") == "sweep"
            else {**observe_store(pid, spec), "faults": faults_seen(witness, spec["name"])}))


def faults_seen(witness: Witness, case: str) -> list[dict]:
    """What the judge saw at each fault() call of `case`, in order."""
    return [s.saw for s in witness.sightings(case, POINT)]
