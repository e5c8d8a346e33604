"""Lab `vending`, child side: step into apply_event's SQLite work between two of its statements.

A cursor read before `BEGIN IMMEDIATE`, a deferred `BEGIN`, a `COMMIT` outside the try, a
`ROLLBACK` after a fault that already ended the transaction: each is right on every quiet run
and wrong only when something happens *between two statements*. Waiting for a race to show
one is luck, so the probe runs the call once per statement k (each run on its own copy of the
store) and, when the connection's trace hook sees statement k start, does one of:

- "write": another connection of the probe's applies the same event, if it can take the write
  lock at once (inside the student's BEGIN IMMEDIATE it cannot: that is the point of the
  lock), and commits it HOLD seconds later from a thread: statement k meets a writer that is
  still working, as the busy timeout is made for;
- "error": statement k fails with SQLite's own OperationalError 'interrupted' (SQLite itself
  rolls back a transaction whose write was interrupted; an interrupted COMMIT leaves it open);
- "interrupt": a KeyboardInterrupt lands as soon as the call that ran statement k returns to
  Python (Ctrl-C between two statements). sqlite3 swallows exceptions raised in its own
  callbacks, so it is raised from a profile function at that C call's return.

COMMIT is faulted too: the contract says any failure leaves no open transaction.

(labkit/probe has two uncommitted helpers of this kind, statements.py and boundaries.py; both
skip COMMIT or fault before a statement only. Once one of them settles, this belongs there.)
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MODES = ("write", "error", "interrupt")
HOLD = 0.05  # how long the competing writer keeps its lock: well inside the 1 s busy timeout


def head(sql: str) -> str:
    """A statement's first word(s), upper case: 'BEGIN IMMEDIATE', 'SELECT', ..."""
    words = " ".join(sql.replace(";", " ").split()).upper().split(" ")
    return " ".join(words[:2]) if words[0] == "BEGIN" and len(words) > 1 else words[0]


def own_statement(sql: str) -> bool:
    """A statement of the connection's own, not a trigger's inner '-- ' line."""
    text = sql.lstrip()
    return bool(text) and not text.startswith("--")


class Competitor:
    """Another connection that applies (seq, delta) as a correct client would, starting at once
    or not at all, and commits HOLD seconds later."""

    def __init__(self, connect: Callable[..., sqlite3.Connection], db: str, seq: int, delta: int) -> None:
        self.connect, self.db, self.seq, self.delta = connect, db, seq, delta
        self.thread: threading.Thread | None = None
        self.committed = False

    def __call__(self) -> bool:
        other = self.connect(self.db, isolation_level=None, timeout=0, check_same_thread=False)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # the student holds the write lock: nothing can come between
            other.close()
            return False
        other.execute("INSERT INTO ledger(seq, delta) VALUES (?, ?)", (self.seq, self.delta))
        other.execute("UPDATE checkpoint SET total = total + ?, last = ? WHERE id = 1", (self.delta, self.seq))
        self.thread = threading.Thread(target=self._commit, args=(other,), daemon=True)
        self.thread.start()
        return True

    def _commit(self, other: sqlite3.Connection) -> None:
        time.sleep(HOLD)
        try:
            other.execute("PRAGMA busy_timeout = 2000")  # a reader of the student's may still hold the file
            other.execute("COMMIT")
            self.committed = True
        except sqlite3.Error:
            other.execute("ROLLBACK")
        finally:
            other.close()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(5.0)


def run_at(con: sqlite3.Connection, k: int, mode: str, call: Callable[[], Any],
           competitor: Callable[[], bool] | None = None) -> dict:
    """`call()` with `mode` applied at the k-th statement (0-based) that `con` runs. Returns
    {"ran": [heads of the statements run], "fired": the head at k or None, "acted": whether the
    competitor got in}; call() itself catches and describes the student's exceptions."""
    assert mode in MODES
    ran: list[str] = []
    state: dict[str, Any] = {"fired": None, "acted": None, "armed": False}

    def traced(sql: str) -> None:
        if not own_statement(sql):
            return
        ran.append(head(sql))
        state["current"] = len(ran) - 1
        if len(ran) - 1 != k:
            return
        state["fired"] = ran[-1]
        if mode == "write" and competitor is not None:
            state["acted"] = competitor()
        elif mode == "interrupt":
            state["armed"] = True

    def progress() -> int:  # "error": only statement k is interrupted, never the ROLLBACK after it
        return 1 if state.get("current") == k else 0

    def profiled(frame, event, arg) -> None:
        if state["armed"] and event == "c_return" and _on(arg, con):
            state["armed"] = False
            raise KeyboardInterrupt("Ctrl-C between two statements (injected by the judge)")

    con.set_trace_callback(traced)
    if mode == "error":
        con.set_progress_handler(progress, 1)
    if mode == "interrupt":
        sys.setprofile(profiled)
    try:
        call()
    finally:
        sys.setprofile(None)
        if mode == "error":
            con.set_progress_handler(None, 1)
        con.set_trace_callback(None)
    return {"ran": ran, "fired": state["fired"], "acted": state["acted"]}


def _on(fn: Any, con: sqlite3.Connection) -> bool:
    """Is `fn` a method of `con` or of one of its cursors?"""
    owner = getattr(fn, "__self__", None)
    return owner is con or (isinstance(owner, sqlite3.Cursor) and owner.connection is con)
