"""Child side: step into a student's SQLite work between two of its statements.

Two ways to probe what a function does around a transaction, both deterministic (a statement
number, never a timer), both on the connection the probe hands the student:

- `before_statement(con, k, act)`: just before the k-th statement starts, `act(sql)` runs
  (e.g. the judge commits a competing write with its own connection). Counted by SQLite's own
  trace hook, so every statement counts whatever API ran it (execute, a cursor, executescript).
- `faulty(path, k, fault)`: a connection whose k-th statement raises `fault` instead of running
  (an exception, or a KeyboardInterrupt as Ctrl-C would deliver it), once; `faulty_connects`
  does the same to the connections a function opens itself (an `open_*` function).
- `faulty(path, k, fault, after_end=True)`: the k-th statement that *ends* a transaction
  (COMMIT, ROLLBACK, or `commit()`/`rollback()`) runs, and then `fault` is raised — Ctrl-C
  landing just after the transaction is over, when there is nothing left to roll back.

Statements a trigger runs inside another statement are not counted: they are not boundaries
where anything else can happen.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Counter:
    """How many statements a connection has started, and the text of the one at `k`."""

    def __init__(self, k: int):
        self.k, self.count, self.sql = k, 0, ""

    def step(self, sql: str) -> bool:
        """Count one statement; True when it is the k-th."""
        if sql.lstrip().startswith("--"):  # a trigger's inner statement
            return False
        self.count += 1
        if self.count == self.k:
            self.sql = " ".join(sql.split())[:160]
            return True
        return False

    @property
    def reached(self) -> bool:
        return self.count >= self.k

    def stop(self) -> bool:
        """Step in no more (the probe's own statements after the call must run); whether the
        k-th statement was reached."""
        reached, self.k = self.reached, 0
        return reached


def before_statement(con: sqlite3.Connection, k: int, act: Callable[[str], None]) -> Counter:
    """Run `act(sql)` just before the k-th statement on `con` starts (SQLite's trace hook fires
    before the statement takes any lock)."""
    counter = Counter(k)

    def trace(sql: str) -> None:
        if counter.step(sql):
            act(counter.sql)

    con.set_trace_callback(trace)
    return counter


def gated(base: type[sqlite3.Connection], gate: Callable[[str], None],
          ended: Callable[[str], None] | None = None) -> type[sqlite3.Connection]:
    """A connection class (a subclass of `base`) that calls `gate(sql)` before every statement its
    cursors run: execute, executemany, executescript (a script counts as one); and `ended(sql)`
    right after one of them, or `commit()`/`rollback()`, ended the transaction that was open."""

    def around(con, sql, run):
        was = con.in_transaction
        result = run()
        if ended is not None and was and not con.in_transaction:
            ended(sql)
        return result

    class Cursor(sqlite3.Cursor):
        def execute(self, sql, *a, **kw):
            gate(sql)
            return around(self.connection, sql, lambda: super(Cursor, self).execute(sql, *a, **kw))

        def executemany(self, sql, *a, **kw):
            gate(sql)
            return around(self.connection, sql, lambda: super(Cursor, self).executemany(sql, *a, **kw))

        def executescript(self, script, *a, **kw):
            gate(script)
            return around(self.connection, script, lambda: super(Cursor, self).executescript(script, *a, **kw))

    class Connection(base):
        def commit(self):
            return around(self, "commit()", super().commit)

        def rollback(self):
            return around(self, "rollback()", super().rollback)

        def cursor(self, factory=Cursor):
            return super().cursor(factory)

        def execute(self, sql, *a, **kw):
            return self.cursor().execute(sql, *a, **kw)

        def executemany(self, sql, *a, **kw):
            return self.cursor().executemany(sql, *a, **kw)

        def executescript(self, script, *a, **kw):
            return self.cursor().executescript(script, *a, **kw)

    return Connection


def _raising_at(counter: Counter, fault: BaseException) -> Callable[[str], None]:
    def gate(sql: str) -> None:
        if counter.step(sql if isinstance(sql, str) else "?"):
            raise fault

    return gate


def faulty(path: str, k: int, fault: BaseException, timeout: float = 1.0,
           after_end: bool = False) -> tuple[sqlite3.Connection, Counter]:
    """A connection (isolation_level None) whose k-th statement raises `fault` before running; with
    `after_end`, the k-th statement that ends a transaction runs, then raises `fault`."""
    counter = Counter(k)
    if after_end:
        factory = gated(sqlite3.Connection, lambda sql: None, _raising_at(counter, fault))
    else:
        factory = gated(sqlite3.Connection, _raising_at(counter, fault))
    return sqlite3.connect(path, isolation_level=None, timeout=timeout, factory=factory), counter


@contextmanager
def faulty_connects(k: int, fault: BaseException) -> Iterator[tuple[Counter, list[sqlite3.Connection]]]:
    """While the block runs, every `sqlite3.connect` (the student's own, inside an `open_*`
    function) opens a connection whose k-th statement, counted over all of them, raises `fault`
    before running; yields the counter and the connections opened."""
    counter = Counter(k)
    real_connect = sqlite3.connect
    opened: list[sqlite3.Connection] = []

    def connect(*a, factory=sqlite3.Connection, **kw):
        con = real_connect(*a, factory=gated(factory, _raising_at(counter, fault)), **kw)
        opened.append(con)
        return con

    sqlite3.connect = connect
    try:
        yield counter, opened
    finally:
        sqlite3.connect = real_connect
