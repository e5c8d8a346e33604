"""Child side: act at one statement boundary of a function that uses a connection the probe made.

A check-then-act across a transaction boundary, a handler that only catches `Exception`, a
`ROLLBACK` after a fault that already ended the transaction: these are right on every quiet run
and wrong only when something happens *between two statements*. Waiting for a race to show
them is luck. Instead the probe runs the student's function once per statement, and just
before statement k (the connection's trace callback sees it start) does one of:

- "write": calls `action()`, e.g. another connection that commits a competing change if it
  can take the write lock at once (inside the student's BEGIN IMMEDIATE it cannot: that is
  the point of the lock);
- "error": `con.interrupt()`, so statement k fails with sqlite3.OperationalError
  'interrupted' (SQLite itself rolls back a transaction whose write was interrupted);
- "interrupt": a KeyboardInterrupt raised in the student's code as soon as the call that ran
  statement k returns to Python (a Ctrl-C between two statements).

Exceptions raised inside an sqlite3 callback are swallowed by the sqlite3 module, so the
KeyboardInterrupt is raised from a profile function at the C call's return instead.

Imports: the standard library only.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from typing import Any

MODES = ("write", "error", "interrupt")
# Statements a fault skips. A COMMIT never fails here: one that fails leaves its transaction
# open by SQLite's design, and what to do then (retry or roll back) is beyond what these labs
# ask. No Ctrl-C comes right after a BEGIN: between BEGIN returning and the `try` that guards
# the transaction there is no place to catch it (the usual `BEGIN; try: ...` has that window).
NOT_FAULTED = {"error": ("COMMIT", "END"),
               "interrupt": ("BEGIN", "BEGIN IMMEDIATE", "BEGIN EXCLUSIVE", "BEGIN DEFERRED", "BEGIN TRANSACTION")}


def head(sql: str) -> str:
    """A statement's first word(s), upper case: 'BEGIN IMMEDIATE', 'SELECT', ..."""
    words = " ".join(sql.replace(";", " ").split()).upper().split(" ")
    return " ".join(words[:2]) if words[0] == "BEGIN" else words[0]


def statements(sql: str) -> bool:
    """Is this traced text a statement of the connection's own (not a trigger's '-- ' line)?"""
    text = sql.lstrip()
    return bool(text) and not text.startswith("--")


def run_at(con: sqlite3.Connection, k: int | None, mode: str, call: Callable[[], Any],
           action: Callable[[], Any] | None = None) -> dict:
    """`call()` with `mode` applied just before the k-th statement (0-based) that `con` runs
    (k None: undisturbed). Returns {"ran": [heads of the statements run], "fired": the head
    at k or None, "acted": what action() returned, "result": what call() returned}; call()
    itself is expected to catch and describe the student's exceptions."""
    assert mode in MODES
    ran: list[str] = []
    state: dict[str, Any] = {"fired": None, "acted": None, "armed": False}

    def traced(sql: str) -> None:
        if not statements(sql):
            return
        if sql == state.get("last"):
            # A trigger's program is traced again with its statement's text (sqlite3 passes
            # the expanded SQL): the same statement, already running, not a new one.
            return
        state["last"] = sql
        word = head(sql)
        ran.append(word)
        if k is None or len(ran) - 1 != k or word in NOT_FAULTED.get(mode, ()):
            return
        state["fired"] = word
        if mode == "write" and action is not None:
            state["acted"] = action()
        elif mode == "error":
            con.interrupt()
        elif mode == "interrupt":
            state["armed"] = True

    def profiled(frame, event, arg) -> None:
        if state["armed"] and event == "c_return" and _on(arg, con):
            state["armed"] = False
            raise KeyboardInterrupt("the judge's Ctrl-C between two statements")

    con.set_trace_callback(traced)
    if mode == "interrupt":
        sys.setprofile(profiled)
    try:
        result = call()
    finally:
        sys.setprofile(None)
        con.set_trace_callback(None)
    return {"ran": ran, "fired": state["fired"], "acted": state["acted"], "result": result}


def _on(fn: Any, con: sqlite3.Connection) -> bool:
    """Is `fn` a method of `con` or of one of its cursors?"""
    owner = getattr(fn, "__self__", None)
    return owner is con or (isinstance(owner, sqlite3.Cursor) and owner.connection is con)
