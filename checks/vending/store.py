"""Lab `vending`: the judge's own view of a store — the contract's schema, stores made as a correct
client leaves them, snapshots read through the judge's connections, and the checks built on them.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from labkit.judge.expect import TRANSACTION_HINT, Miss
from labkit.judge.processes import held_files
from labkit.values import show

STORE_SCHEMA = """
CREATE TABLE checkpoint(id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL,
    total INTEGER NOT NULL);
CREATE TABLE ledger(seq INTEGER PRIMARY KEY, delta INTEGER NOT NULL);
"""

STORE_COLUMNS = {
    "checkpoint": [("id", "INTEGER", 0, 1), ("last", "INTEGER", 1, 0), ("total", "INTEGER", 1, 0)],
    "ledger": [("seq", "INTEGER", 0, 1), ("delta", "INTEGER", 1, 0)],
}


def make_store(path: Path, applied: list[tuple[int, int]] = ()) -> Path:
    """A store as a correct client would have left it after applying `applied`."""
    with closing(stores.connect(path)) as con:
        con.execute("PRAGMA synchronous = OFF")  # a temp seed file: no fsync, other processes still see it
        con.execute("BEGIN")
        for statement in STORE_SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        con.executemany("INSERT INTO ledger(seq, delta) VALUES (?, ?)", list(applied))
        last = applied[-1][0] if applied else -1
        con.execute("INSERT INTO checkpoint VALUES (1, ?, ?)", (last, sum(d for _, d in applied)))
        con.execute("COMMIT")
    return path


def snapshot(path: Path) -> dict | None:
    """last, total and the ledger, read through the judge's own connection."""
    if not Path(path).exists():
        return None
    try:
        with closing(stores.reader(path)) as con:  # one connection for both reads
            return _read_state(con)
    except sqlite3.Error:
        return None


def _read_state(con: sqlite3.Connection) -> dict | None:
    row = con.execute("SELECT last, total FROM checkpoint WHERE id = 1").fetchall()
    ledger = con.execute("SELECT seq, delta FROM ledger ORDER BY seq").fetchall()
    if not row:
        return None
    return {"last": row[0][0], "total": row[0][1], "ledger": [list(r) for r in ledger]}


def store_state(applied: list[tuple[int, int]]) -> dict:
    return {"last": applied[-1][0] if applied else -1, "total": sum(d for _, d in applied),
            "ledger": [list(e) for e in applied]}


def shown(snap: dict | None) -> str:
    if snap is None:
        return "no readable store"
    seqs = [s for s, _ in snap["ledger"]]
    ledger = "empty" if not seqs else (f"seqs {seqs[0]}–{seqs[-1]}" if seqs == list(range(seqs[0], seqs[-1] + 1))
                                      else f"seqs {seqs}")
    return f"last {snap['last']}, total {snap['total']}, ledger {ledger}"


def show_rows(rows: list) -> str:
    """Rows as the student would write them: (1, -1, 0), (2, 5); "none" for no rows."""
    return ", ".join(show(tuple(r)) for r in rows) if rows else "no rows"


def state_after(expected: dict, hint: str):
    """The store, as the judge's own connection read it right after the call returned, is `expected`."""

    def check(record: dict) -> Miss | None:
        have = judged(record).get("after")
        if have is None:
            return Miss("the store could not be read afterwards", hint)
        if (have["last"], have["total"], have["ledger"]) != (expected["last"], expected["total"], expected["ledger"]):
            return Miss(f"right after the call the judge read {shown(have)}; expected {shown(expected)}", hint)
        return None

    return check


def judge_reads(path: Path, expected: dict, hint: str):
    """The judge's own connection, after the child has ended, sees `expected`."""

    def check(record: dict) -> Miss | None:
        have = snapshot(path)
        if have != expected:
            return Miss(f"the judge then read {shown(have)}; expected {shown(expected)}", hint)
        return None

    return check


def no_open_transaction(record: dict) -> Miss | None:
    """No write lock left (the judge's own BEGIN IMMEDIATE succeeded right after the call) and no
    transaction open on the connection the call was given (a deferred BEGIN holds no lock yet)."""
    if judged(record).get("can_write") is False:
        return Miss("right after the call the judge could not BEGIN IMMEDIATE: a write lock was still held",
                   TRANSACTION_HINT)
    if record["observed"].get("in_transaction"):
        return Miss("the call returned with a transaction still open", TRANSACTION_HINT)
    return None


def judged(record: dict) -> dict:
    """What the judge itself observed around a case (never what the child reported)."""
    return record["observed"].get("judge") or {}


def can_write(path: Path, wait: float = 0.05) -> bool:
    """Can the judge enter a write transaction on `path` right now? (A real lock test.)

    `wait`: how long a lock may take to go. Right after a call, a moment (the student's
    connection may still be closing); while the child is held inside fault() its locks cannot
    change, so no wait (a correct solution holds the lock there: 50 ms a look, 0.25 s a step)."""
    with closing(stores.connect(path, wait)) as con:  # refuses a link or FIFO in place of the file
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        con.execute("ROLLBACK")
        return True


def look_after(path: Path, wait: float = 0.05) -> tuple[bool | None, dict | None]:
    """(`can_write`, `snapshot`) on one connection: the judge's BEGIN IMMEDIATE, then, while it
    holds that lock (nothing can change), its reads; ROLLBACK. A store it cannot lock is read as
    `snapshot` reads it; one that is not a database at all has None for `can_write`."""
    try:
        with closing(stores.connect(path, wait)) as con:
            try:
                con.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return False, snapshot(path)
            try:
                return True, _read_state(con)
            except sqlite3.Error:
                return True, None
            finally:
                con.execute("ROLLBACK")
    except sqlite3.DatabaseError:  # not a database, or a file the judge refuses to open
        return None, snapshot(path)


def committed_last(path: Path | None) -> int | None:
    """The cursor saved in `path`, read by the judge's own read-only connection (None if unreadable)."""
    if path is None:
        return None
    try:
        with closing(stores.reader(path, 0.5)) as con:
            row = con.execute("SELECT last FROM checkpoint WHERE id = 1").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def observe_store(pid: int, spec: dict) -> dict:
    """After a call on a store: does the child still hold the file open, can the judge write it,
    and what does the judge's own connection read there?"""
    path = Path(spec.get("path") or spec["db"])
    writable, after = look_after(path)
    return {"holds_file": os.path.realpath(path) in held_files(pid), "can_write": writable, "after": after}
