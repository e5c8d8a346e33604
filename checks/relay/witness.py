"""Lab `relay`, judge side: look at an outbox file *while* a child holds it, with the judge's own connections.

A child's report is evidence about return values only: the student's code runs in the same
process as the probe and can patch anything there (the probe's helpers, sqlite3 itself). So
where a verdict rests on the state of the file at a moment only the child can time — right
after the student's function returned, while the probe still holds its connection ("after");
inside the fake `send` ("send"); inside `after_send` ("after_send") — the probe makes a real
HTTP request to the judge's witness (`labkit/judge/witness.py`) at that moment and
waits for the answer. Meanwhile the judge, in its own process, tries `BEGIN IMMEDIATE` on the
file with a short busy timeout (a write lock held anywhere makes it fail) and reads the row the
request is about. The cases then read these sightings from `observed["judge"]`, which the judge
fills in itself (whatever the child reported under that key is replaced).

A probe whose request never arrives leaves no sighting, and the case fails (`NOT_SEEN`).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

from checks.outbox import schema as stores
from labkit.judge.expect import TRANSACTION_HINT, Miss, Plan
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.judge.witness import Witness

# The judge's writer waits this long for a lock (as the probe's lock test did). Correct code
# holds none at these moments, so BEGIN IMMEDIATE succeeds at once whatever the load.
LOCK_WAIT = 0.05
READ_WAIT = 0.5  # a row read: WAL readers never wait for a writer, so this is only a bound
POINTS = ("after", "send", "after_send")

NOT_SEEN = ("the judge was never asked to look at the file {when} (the probe's request did not arrive)",
            "Don't patch or replace the checker's code, and don't close sockets or files you did not open.")


def can_write(path: Path) -> bool:
    """Can the judge enter a write transaction on `path` right now? (A real lock test.)"""
    with closing(stores.connect(path, LOCK_WAIT)) as con:  # refuses a link or FIFO in place of the file
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        con.execute("ROLLBACK")
        return True


def row_now(path: Path, column: str, key) -> dict | None:
    """One outbox row (state, owner, fence) as the judge's own connection reads it right now."""
    with closing(stores.reader(path, READ_WAIT)) as con:
        found = con.execute(f"SELECT seq, state, owner, fence FROM outbox WHERE {column} = ?", (key,)).fetchone()
    return None if found is None else {"seq": found[0], "state": found[1], "owner": found[2], "fence": found[3]}


def _look(paths: dict[str, Path]):
    def look(case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = paths.get(case)
        if path is None or point not in POINTS:
            return {}, {}
        if point == "after":
            return {"can_write": can_write(path)}, {}
        if point == "send":
            event_id = said.get("event_id")
            event_id = event_id if isinstance(event_id, str) else None
            row = row_now(path, "id", event_id) if event_id is not None else None
            return {"event_id": event_id, "row": row, "can_write": can_write(path)}, {}
        seq = said.get("seq")
        seq = seq if type(seq) is int else None
        return {"seq": seq, "row": row_now(path, "seq", seq) if seq is not None else None}, {}

    return look


def watched_cases(ctx: StepContext, probe: str, plans: list[Plan], args: dict, paths: dict[str, Path]) -> list[Case]:
    """`ctx.cases(probe, plans, args)` with the judge's witness listening for the probe's requests
    about the files in `paths` (case name → file); each plan's check then finds what the judge saw
    for its case under `observed["judge"]`: {"after": the last sighting or None, "send": [...],
    "after_send": [...]} in the order the requests arrived."""
    with Witness(_look(paths)) as witness:
        return ctx.cases(probe, [_judged(plan, witness) for plan in plans], {**args, "witness": witness.url})


def _judged(plan: Plan, witness: Witness) -> Plan:
    inner = plan.check

    def check(record: dict) -> Miss | None:
        afters = witness.sightings(plan.name, "after")
        judge = {"after": afters[-1].saw if afters else None,
                 "send": [s.saw for s in witness.sightings(plan.name, "send")],
                 "after_send": [s.saw for s in witness.sightings(plan.name, "after_send")],
                 # a case run once per statement (`checks/relay/boundaries.py`): "<name>#<mode>.<run>"
                 "runs": {s.case[len(plan.name) + 1:]: s.saw for s in witness.sightings(point="after")
                          if s.case.startswith(plan.name + "#")}}
        return inner({**record, "observed": {**(record.get("observed") or {}), "judge": judge}})

    return replace(plan, check=check)


def judged(record: dict) -> dict:
    """What the judge itself saw during a case (never what the child reported)."""
    return record["observed"].get("judge") or {}


def not_seen(when: str, clause: str = "") -> Miss:
    got, hint = NOT_SEEN
    return Miss(got.format(when=when), hint, clause=clause)


def look_failed(saw: dict, when: str, clause: str = "") -> Miss | None:
    if "look_error" in saw:
        return Miss(f"the judge could not look at the file {when}: {saw['look_error']}",
                    "Leave the database file the judge gave you where it is, as a database.", clause=clause)
    return None


def no_open_transaction(record: dict) -> Miss | None:
    """No transaction open on the connection the call was given (the child's view of its own
    connection: a deferred BEGIN holds no lock yet), and no write lock left anywhere: right after
    the call, while the probe still held the connection, the judge's own BEGIN IMMEDIATE succeeded."""
    if record["observed"].get("in_transaction"):
        return Miss("the call returned with a transaction still open", TRANSACTION_HINT)
    after = judged(record).get("after")
    if after is None:
        return not_seen("right after the call")
    failed = look_failed(after, "right after the call")
    if failed is not None:
        return failed
    if after.get("can_write") is False:
        return Miss("right after the call the judge's own connection could not BEGIN IMMEDIATE: a write lock was "
                    "still held", TRANSACTION_HINT)
    return None
