"""The judge's own operations on lab 01's DB files, on its own connections.

Two kinds: attempts that another party of the story makes for real (write something and
commit it, accept a new order) while the student's code holds the file, and reads that must
never crash the judge whatever the student's code did to the file (a dropped table, a
renamed column, a file that is no longer a database): those return a `Broken` instead.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from checks.outbox import schema as stores

# How long the judge's own writer waits for a lock. Correct code holds none at these moments,
# so the attempt succeeds at once whatever the load; only a held lock makes it wait this long.
WRITE_WAIT = 0.1

_counter = itertools.count(1)


@dataclass(frozen=True)
class Broken:
    """A read of the student's DB file that failed: the file is not what the contract says."""

    error: str

    def __str__(self) -> str:
        return self.error


def _connect(path: Path, timeout: float = 2.0) -> sqlite3.Connection:
    con = stores.connect(path, timeout)  # refuses a link or FIFO in place of the file
    con.execute("PRAGMA synchronous = OFF")  # the judge's writes need no durability, only the locks
    return con


def read(fn, *args):
    """`fn(*args)` from checks/outbox/schema.py, or a Broken saying why the file could not be read."""
    try:
        return fn(*args)
    except sqlite3.Error as exc:
        return Broken(f"{type(exc).__name__}: {exc}")


def sent_flags(path: Path) -> dict[str, int] | Broken:
    return read(stores.sent_flags, path)


def stock(path: Path) -> dict[str, int] | Broken:
    return read(stores.stock, path)


def inbox_ids(path: Path) -> list[str] | Broken:
    return read(stores.inbox_ids, path)


def fingerprint(path: Path) -> list | Broken:
    return read(stores.fingerprint, path)


def orders(path: Path) -> dict[str, tuple] | Broken:
    rows = read(stores.rows, path, "SELECT id, sku, qty FROM orders")
    return rows if isinstance(rows, Broken) else {r[0]: r for r in rows}


def outbox(path: Path) -> list[tuple] | Broken:
    return read(stores.outbox, path)


def try_write(path: Path) -> str:
    """Write and commit as another connection would: "" when it worked, else why not.

    Commits, because a COMMIT needs the lock an open read transaction or an unfinished
    cursor still blocks (BEGIN IMMEDIATE alone would pass). Writes only the header's
    user_version, so no table the checks compare changes.
    """
    try:
        with closing(_connect(path, WRITE_WAIT)) as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute(f"PRAGMA user_version = {next(_counter) % 1_000_000}")
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        return ""
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"


def accept_order(path: Path, event: dict) -> str:
    """Accept a new order as the intake service would, in one committed transaction: "" when
    it worked, else why not."""
    try:
        with closing(_connect(path, WRITE_WAIT)) as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("INSERT INTO orders VALUES (?, ?, ?)", (event["id"], event["sku"], event["qty"]))
                con.execute("INSERT INTO outbox(id, body) VALUES (?, ?)", (event["id"], stores.canonical(event)))
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        return ""
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"


def _quick(path: Path) -> sqlite3.Connection:
    """For files the judge prepares before a child runs: no fsync, the journal in memory (per
    connection only: the file itself keeps the default rollback journal)."""
    con = stores.connect(path)
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA journal_mode = MEMORY")
    return con


def script(path: Path, sql: str) -> Path:
    """Run SQL statements in one transaction (a new file is created)."""
    with closing(_quick(path)) as con:
        con.execute("BEGIN")
        for statement in _statements(sql):
            con.execute(statement)
        con.execute("COMMIT")
    return path


def _statements(sql: str) -> list[str]:
    """Split a script into statements (sqlite3 knows where a trigger's BEGIN … END ends)."""
    out, current = [], ""
    for char in sql:
        current += char
        if char == ";" and sqlite3.complete_statement(current):
            out.append(current)
            current = ""
    return [s for s in out if s.strip()] + ([current] if current.strip() else [])


def make_source(path: Path, events: list[dict] = (), sent: set[str] = frozenset()) -> Path:
    """The contract's source file holding `events` in this order (the ones in `sent` marked)."""
    with closing(_quick(path)) as con:
        con.execute("BEGIN")
        for statement in _statements(stores.SOURCE_SCHEMA):
            con.execute(statement)
        for e in events:
            con.execute("INSERT INTO orders VALUES (?, ?, ?)", (e["id"], e["sku"], e["qty"]))
            con.execute("INSERT INTO outbox(id, body, sent) VALUES (?, ?, ?)",
                        (e["id"], stores.canonical(e), int(e["id"] in sent)))
        con.execute("COMMIT")
    return path


def make_sink(path: Path, sql: str = "") -> Path:
    return script(path, stores.SINK_SCHEMA + sql)


class Competing:
    """Another party's transaction on the file, started at a moment the student's code chose
    (see checks/outbox/interleave.py): `error` is "" when it got the write lock and wrote
    (`rows` rows changed), else why not. It keeps the lock in a thread of its own until
    `hold` seconds pass (then commits) or, with `commit` False, until `finish()` (then rolls
    back); `finish()` always waits for it to end."""

    def __init__(self, path: Path, statements: list[tuple[str, tuple]], hold: float, commit: bool = True):
        self.error, self.rows, self._thread = "", 0, None
        self._released = threading.Event()
        try:
            stores.check_db(path)  # a link or FIFO in place of the file is refused, never followed
            # timeout 0: where the student holds the lock, it fails at once; its own thread ends it
            con = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
        except sqlite3.Error as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return
        try:
            con.execute("PRAGMA synchronous = OFF")
            con.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                self.rows += max(con.execute(sql, params).rowcount, 0)
        except sqlite3.Error as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            if con.in_transaction:
                con.execute("ROLLBACK")
            con.close()
            return

        def end() -> None:
            self._released.wait(hold if commit else 30.0)
            try:
                # The student's BEGIN, retrying for the lock, holds the file's SHARED lock for a
                # moment each time: with no busy timeout, a COMMIT landing in that moment failed
                # (and rolled back) on a busy machine, and the reference "missed" the other write.
                con.execute("PRAGMA busy_timeout = 5000")
                con.execute("COMMIT" if commit else "ROLLBACK")
            except sqlite3.Error:
                if con.in_transaction:
                    con.execute("ROLLBACK")
            finally:
                con.close()

        self._thread = threading.Thread(target=end, name="outbox-competing-writer", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self._released.set()
        if self._thread is not None:
            self._thread.join(5.0)
