"""Lab `vending`, step 3: apply_event with something happening between two of its statements.

Each plan here is one sweep: the child runs the call once per statement k, each run on its own
copy of a store, with one interference at statement k (`checks/vending/sweep_probes.py`): another
connection applying the same event, SQLite failing statement k, or a KeyboardInterrupt right
after it. The judge then reads every copy through its own connection and tries its own write
lock there, and compares with what the contract allows for that run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from labkit.judge.expect import Miss, Plan, describe
from labkit.values import decode

RUNS = 12  # copies of the store per sweep: more statements than any apply_event needs

READ_INSIDE_HINT = ("Read `last` and the ledger inside the write transaction that applies the event: "
                    "`BEGIN IMMEDIATE` first, then SELECT, decide, write, COMMIT. A value read before it "
                    "may be stale by the time you write.")
IMMEDIATE_HINT = ("Open the transaction with `BEGIN IMMEDIATE`: it takes the write lock first and waits "
                  "for another writer (the 1 s busy timeout). A deferred `BEGIN` that has already read "
                  "cannot wait: SQLite refuses its first write at once with 'database is locked'.")
ENDED_HINT = ("A failed statement may have ended the transaction itself (SQLite rolls back an "
              "interrupted write): roll back only `if con.in_transaction`, then re-raise the original "
              "error with a bare `raise`.")
SWALLOWED_HINT = ("Only `seq <= last` with the same delta in the ledger is a duplicate. Any other error (a "
                  "locked or failing database, an interrupted statement) is not an answer: roll back and let it "
                  "propagate with a bare `raise`.")
WHOLE_TRY_HINT = ("Put every statement from BEGIN IMMEDIATE to COMMIT inside one `try:` whose "
                  "`except BaseException:` rolls back and re-raises: a failing SELECT or COMMIT, or a "
                  "Ctrl-C between two statements, must roll back too.")


def copies(template: Path, stem: str, modes: int = 1) -> list[Path]:
    """RUNS copies of a judge-made store per mode, one per run of a sweep."""
    paths = []
    for k in range(RUNS * modes):
        path = template.with_name(f"{stem}-{k}.db")
        shutil.copyfile(template, path)
        paths.append(path)
    return paths


def where(run: dict) -> str:
    """"your INSERT (statement 3 of the call)"."""
    return f"your {run['fired'] or 'call'} (statement {run['k'] + 1} of the call)"


def seen_on(record: dict, run: dict) -> dict:
    """What the judge itself saw on the copy `run` used: the store, and whether it could write."""
    looks = (record["observed"].get("judge") or {}).get("sweep", [])
    return looks[run["copy"]] if run.get("copy", len(looks)) < len(looks) else {}


def control(record: dict, mode: str) -> dict | None:
    """The store after the mode's undisturbed run (the one that ended before its statement k)."""
    for run in record["observed"].get("runs", []):
        if run.get("mode") == mode and run["fired"] is None and run["outcome"].get("kind") == "returned":
            return seen_on(record, run).get("after")
    return None


def left_clean(record: dict, run: dict, allowed: list[dict], shown, happened: str) -> Miss | None:
    """No lock left, no transaction open, and the copy holds one of the `allowed` states."""
    seen = seen_on(record, run)
    if seen.get("can_write") is False or run.get("in_transaction"):
        return Miss(f"{happened}; then apply_event returned with a transaction still open (the judge could not "
                    "BEGIN IMMEDIATE)", WHOLE_TRY_HINT, clause="3.no-open-transaction")
    after = seen.get("after")
    if after not in allowed:
        return Miss(f"{happened}; afterwards the judge read {shown(after)}; expected "
                    + " or ".join(shown(a) for a in allowed),
                    "Roll back every change when anything fails inside the transaction.", clause="3.rollback")
    return None


def nothing_swept(record: dict, key: str, clause: str) -> Miss | None:
    """A sweep in which no run reached a statement tried nothing: a miss, never a vacuous pass."""
    runs = record["observed"].get("runs", [])
    if any(run.get(key) for run in runs):
        return None
    outcome = runs[0]["outcome"] if runs else record["outcome"]
    return Miss(f"apply_event {describe(outcome)} before running any SQL statement, so nothing could be tried "
                "between its statements", "Make the plain call work first: this case interrupts each SQL "
                "statement the call runs.", clause=clause)


def another_writer(seq: int, delta: int, before: dict, after: dict, shown) -> Plan:
    """Another connection applies (seq, delta) at statement k. Where it got in, the call must find
    the event applied (False) and leave it counted once. Where the call's own lock kept it out,
    the run was undisturbed: the other cases judge that."""

    def check(record: dict) -> Miss | None:
        miss = nothing_swept(record, "acted", "3.concurrent-writer")
        if miss is not None:
            return miss
        for run in record["observed"].get("runs", []):
            if not run.get("acted"):
                continue
            outcome = run["outcome"]
            happened = (f"another connection applied seq {seq} (delta {delta}) just before {where(run)} "
                        "and committed it a moment later")
            if outcome.get("kind") != "returned" or decode(outcome["value"]) is not False:
                locked = "database is locked" in outcome.get("message", "")
                return Miss(f"{happened}: apply_event {describe(outcome)}; expected False (the event was saved "
                            "by then: a duplicate)", IMMEDIATE_HINT if locked else READ_INSIDE_HINT,
                            clause="3.concurrent-writer")
            miss = left_clean(record, run, [after], shown, happened)
            if miss is not None:
                miss.clause, miss.hint = "3.concurrent-writer", READ_INSIDE_HINT
                return miss
        return None

    return Plan("another writer applies the same event at each statement of the call",
                f"apply_event(con, {seq}, {delta}) on a store at last {before['last']}, once per statement; "
                f"just before statement k another connection applies seq {seq} itself, if it can get the lock",
                "False wherever the other writer got in first (the event is a duplicate by then); the event "
                "counted once", check, READ_INSIDE_HINT, clauses=("3.concurrent-writer", "3.one-transaction"))


def faults_between(what: str, call: str, before: dict, shown) -> Plan:
    """At each statement k in turn: SQLite fails it ('error'), or a KeyboardInterrupt lands right
    after it ('interrupt'). That error propagates; the store holds nothing of the call, or (an
    interrupt after the COMMIT) all of what the undisturbed call left; nothing stays open."""

    def check(record: dict) -> Miss | None:
        miss = nothing_swept(record, "fired", "3.original-error")
        if miss is not None:
            return miss
        for run in record["observed"].get("runs", []):
            # Right after BEGIN returns, before `try:` is entered, no code can roll back: the usual
            # `BEGIN; try: ...` (the reference's) leaves that one bytecode open, as `lock.acquire()` does.
            if run["fired"] is None or (run["mode"] == "interrupt" and run["fired"].startswith("BEGIN")):
                continue
            miss = (failed_at if run["mode"] == "error" else interrupted_at)(record, run, before, shown)
            if miss is not None:
                return miss
        return None

    return Plan(f"a failure at each statement of {what} in turn",
                f"{call} on a store at last {before['last']}, once per statement and fault: statement k fails "
                "with sqlite3.OperationalError 'interrupted', or a KeyboardInterrupt lands right after it",
                "that error each time; the store as before (or, after the COMMIT, as committed); no transaction "
                "open", check, WHOLE_TRY_HINT, clauses=("3.original-error", "3.rollback", "3.no-open-transaction"))


def failed_at(record: dict, run: dict, before: dict, shown) -> Miss | None:
    outcome = run["outcome"]
    happened = f"when {where(run)} failed with SQLite's OperationalError 'interrupted'"
    if outcome.get("type") != "OperationalError" or "interrupted" not in outcome.get("message", ""):
        if outcome.get("kind") == "returned":
            return Miss(f"{happened}, apply_event {describe(outcome)}: an error taken for an answer",
                        SWALLOWED_HINT, clause="3.original-error")
        return Miss(f"{happened}, apply_event {describe(outcome)}", ENDED_HINT, clause="3.original-error")
    return left_clean(record, run, [before], shown, happened)


def interrupted_at(record: dict, run: dict, before: dict, shown) -> Miss | None:
    outcome = run["outcome"]
    happened = f"when a KeyboardInterrupt (Ctrl-C) landed right after {where(run)}"
    if outcome.get("type") != "KeyboardInterrupt":
        return Miss(f"{happened}, apply_event {describe(outcome)}",
                    "Let a KeyboardInterrupt propagate after the rollback: catch `BaseException`, roll back, then "
                    "a bare `raise`.", clause="3.original-error")
    done = control(record, "interrupt")
    return left_clean(record, run, [before] + ([done] if done is not None and done != before else []), shown,
                      happened)


def observe_sweep(spec: dict, look_after) -> dict:
    """The judge's own look at every copy a sweep used (the store, and its write lock)."""
    seen = []
    for db in spec["dbs"]:
        writable, after = look_after(Path(db))
        seen.append({"after": after, "can_write": writable})
    return {"sweep": seen}


def spec(fn: str, args: list, template: Path, stem: str, modes: list[str]) -> dict:
    dbs = copies(template, stem, len(modes))
    # guard: a wrong solution may make each run wait (a lock left held costs the competitor 2 s)
    return {"kind": "sweep", "fn": fn, "args": args, "dbs": [str(p) for p in dbs], "modes": modes, "runs": RUNS,
            "name": f"{fn} {'/'.join(modes)} sweep", "db": str(dbs[0]), "guard": 15.0}
