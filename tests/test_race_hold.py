"""Lab 04's race hold (`checks/pipeline/common.py: UNTIL_ANOTHER_WAITS`) on a real PostgreSQL.

A race's trigger keeps its first writer's transaction open until another session really waits on
a lock. A racer just let through the judge's barrier is not waiting any more, but until its own
backend runs again pg_stat_activity still shows its advisory wait: the hold must not take that
for a waiter (it did, and a loaded machine let a missing lock pass, ci17). The stale state is made
here for certain: the racer's backend is stopped (SIGSTOP) before the barrier opens.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psycopg
import pytest
from server_folders import temp_base

from checks.pipeline.common import BARRIER, UNTIL_ANOTHER_WAITS
from labkit.servers import postgres

CAP = 30  # polls (10 ms each) in the test's copy of the loop


@pytest.fixture(scope="module")
def server():
    for folder in temp_base():
        with postgres.running(folder / "pg") as running:
            yield running


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def _polls_function(conn: psycopg.Connection) -> None:
    """The hold's loop, as a function that says how many polls it made before it ended."""
    conn.execute("CREATE FUNCTION hold_polls() RETURNS int LANGUAGE plpgsql AS $$ DECLARE polls int := 0; BEGIN "
                 + UNTIL_ANOTHER_WAITS.replace("polls >= 200", f"polls >= {CAP}") + " RETURN polls; END $$")


def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _ungranted(judge: psycopg.Connection, pid: int) -> bool:
    return judge.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)).fetchone()[0] > 0


def test_a_racer_let_through_the_barrier_is_not_a_waiter_even_before_it_runs(server):
    db = postgres.fresh_database(server, f"hold_{os.getpid()}")
    with connect(db.judge_dsn) as judge, connect(db.dsn) as racer, connect(db.dsn) as holder:
        _polls_function(holder)
        judge.execute("SELECT pg_advisory_lock(%s, %s)", BARRIER)
        waiting = threading.Thread(target=racer.execute, args=("SELECT pg_advisory_lock_shared(%s, %s)", BARRIER))
        waiting.start()
        backend, stopped = racer.info.backend_pid, False
        try:
            _until(lambda: _ungranted(judge, backend))
            queued = holder.execute("SELECT hold_polls()").fetchone()[0]
            os.kill(backend, signal.SIGSTOP)
            stopped = True
            judge.execute("SELECT pg_advisory_unlock(%s, %s)", BARRIER)
            _until(lambda: not _ungranted(judge, backend))  # granted, yet its backend has not run since
            stale = judge.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()[0]
            polls = holder.execute("SELECT hold_polls()").fetchone()[0]
        finally:  # the racer is let go on every path, or closing its connection would wait for it
            if stopped:
                os.kill(backend, signal.SIGCONT)
            judge.execute("SELECT pg_advisory_unlock_all()")
            waiting.join(10)
        assert queued == CAP  # queued at the barrier: not a waiter
        assert stale == "advisory"  # what the old hold read as "another session waits"
        assert polls == CAP


def test_a_racer_waiting_for_the_first_writers_row_ends_the_hold_at_once(server):
    db = postgres.fresh_database(server, f"hold_row_{os.getpid()}")
    with connect(db.dsn) as first, connect(db.dsn) as second, connect(db.dsn) as holder:
        _polls_function(holder)
        first.execute("CREATE TABLE t (id text PRIMARY KEY)")
        first.execute("BEGIN")
        first.execute("INSERT INTO t VALUES ('race-1')")
        blocked = threading.Thread(target=lambda: _insert_again(second))
        blocked.start()
        try:
            _until(lambda: _ungranted(holder, second.info.backend_pid))
            assert holder.execute("SELECT hold_polls()").fetchone()[0] < CAP
        finally:
            first.execute("COMMIT")
            blocked.join(10)


def _insert_again(conn: psycopg.Connection) -> None:
    try:
        conn.execute("INSERT INTO t VALUES ('race-1')")
    except psycopg.errors.UniqueViolation:
        pass
