"""Lab `pipeline`: what the step checks share — how a step's cases run in a child, how racers
start at one moment, and the judge's own looks at the database and the stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from checks.pipeline.servers import Db, Servers
from labkit.judge.expect import Miss, Plan, describe
from labkit.judge.run import StepContext, together
from labkit.judge.verdict import Case, Outcome
from labkit.values import encode

BARRIER = (31337, 4242)  # probes.BARRIER
# PL/pgSQL (declare `polls int := 0`): wait, at most 2 s, until another session of this database
# waits on a lock. A race's trigger holds its first writer's transaction open with it, so the other
# racers meet that transaction whatever the machine's load; it ends as soon as they do.
# "Waits" is read from the lock table (pg_locks: a lock not granted), never from pg_stat_activity's
# wait_event: a racer let through the barrier keeps showing its advisory wait there until its own
# backend next runs, and on a loaded machine that ended the hold before the others had even read
# (ci17: accept_select_then_insert passed step 2 under one seed). The barrier's own key never counts.
UNTIL_ANOTHER_WAITS = f"""LOOP
      PERFORM pg_stat_clear_snapshot();  -- pg_stat_activity is otherwise read once per transaction
      EXIT WHEN polls >= 200 OR EXISTS (
        SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE NOT l.granted AND l.pid <> pg_backend_pid() AND a.datname = current_database()
          AND NOT (l.locktype = 'advisory' AND l.classid = {BARRIER[0]} AND l.objid = {BARRIER[1]}));
      PERFORM pg_sleep(0.01);
      polls := polls + 1;
    END LOOP;"""
BARRIER_WAIT = 20.0  # the longest the judge waits for every racer to reach the barrier


def servers(ctx: StepContext) -> Servers:
    if ctx.shared is None:  # a check run outside `run_lab` (a test calling a step directly)
        raise RuntimeError("lab pipeline's checks need the lab's session (labkit.judge.run.run_lab)")
    return ctx.shared


def args(*values) -> list:
    """Arguments for a `call` op: `$name` strings pass as they are, everything else encoded."""
    return [v if isinstance(v, str) and v.startswith("$") else encode(v) for v in values]


def call(fn: str, *values, keep: str | None = None, hooks: dict | None = None, **flags) -> dict:
    op = {"call": fn, "args": args(*values), **flags}
    if keep:
        op["keep"] = keep
    if hooks:
        op["hooks"] = hooks
    return op


def run(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """Every case in one child, in order; each spec names its case, DSN, Valkey user and ops."""
    return ctx.cases("script", plans, {"cases": specs})


def racing(ctx: StepContext) -> StepContext:
    """Where a race runs: a folder of its own and its child started now, so the interpreter and
    the student's module load while the judge prepares the race's database."""
    return ctx.apart("race", early=True)


def race(where: StepContext, db: Db, name: str, called: str, expected: str, clauses: tuple[str, ...], count: int,
         ops: Callable[[int], list[dict]], verdict: Callable[[list[dict]], Miss | None]) -> list[Case]:
    """ONE case: `count` racers, each in its own process (forked from one child that imported the
    module: `probes.race`), wait at a barrier (an advisory lock the judge holds) and go at once
    when the last one arrived; `verdict(records)` judges what they all did. Which racer wins is
    the scheduler's choice, so no case is about one racer. `where`: a `racing` context, made
    before the race's database so that its child starts meanwhile."""
    records: list[dict] = []

    def keep(record: dict) -> Miss | None:
        records.append(record)
        return None

    labels = [f"{name} ({i + 1})" for i in range(count)]
    with db.judge() as judge:
        judge.execute("SELECT pg_advisory_lock(%s, %s)", BARRIER)
        ended = threading.Event()  # the racers' child has ended (one that never loads never arrives)

        def release() -> None:
            deadline = time.monotonic() + BARRIER_WAIT
            try:
                while time.monotonic() < deadline and not ended.is_set():
                    waiting = judge.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                        " AND classid = %s AND objid = %s AND database = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database())", BARRIER).fetchone()[0]
                    if waiting >= count:
                        break
                    time.sleep(0.01)
            finally:
                judge.execute("SELECT pg_advisory_unlock(%s, %s)", BARRIER)

        def racers() -> list[Case]:
            dsn = db.dsn(where.workdir)
            try:
                return where.cases("race", [Plan(label, called, expected, keep, clauses=clauses) for label in labels],
                                   {"cases": [{"name": label, "dsn": dsn, "ops": [{"barrier": True}, *ops(i)]}
                                              for i, label in enumerate(labels)]})
            finally:
                ended.set()

        _, cases = together([release, racers])
    unfinished = sorted((c for c in cases if c.outcome is not Outcome.PASSED), key=lambda c: (str(c.outcome), c.got))
    if unfinished:  # the skeleton, a hang, a death: as any case says it
        first = unfinished[0]
        return [Case(name, first.outcome, called, expected, first.got, first.hint, first.trace, clauses=first.clauses)]
    miss = verdict(records)
    if miss is None:
        return [Case(name, Outcome.PASSED, called, expected, clauses=clauses)]
    raised = any(r["outcome"]["kind"] == "raised" for r in records)
    return [Case(name, Outcome.RAISED if raised else miss.outcome, called, expected, miss.got, miss.hint,
                 clauses=(miss.clause,) if miss.clause else clauses)]


def outcomes(records: list[dict]) -> list[str]:
    """What each racer's last call did, sorted: the same list whichever racer won."""
    return sorted(describe(r["outcome"]) for r in records)


def returned(record: dict):
    from labkit.judge.expect import value_of

    return value_of(record) if record["outcome"]["kind"] == "returned" else None


def raised_with(fragment: str, hint: str) -> Callable[[dict], Miss | None]:
    """The call raised the error the judge provoked (its message contains `fragment`), not any error."""

    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and fragment in outcome.get("message", ""):
            return None
        return Miss(describe(outcome), hint)

    return check


def first_error(record: dict) -> Miss | None:
    """A call of the case that raised where none should have."""
    for outcome in record["observed"].get("calls", []):
        if outcome["kind"] != "returned":
            return Miss(describe(outcome))
    return None


def query(db: Db, sql: str, params=None) -> list[tuple]:
    return db.look(sql, params)


def one(db: Db, sql: str, params=None):
    found = query(db, sql, params)
    return found[0][0] if found else None


def idle_killed(srv: Servers, db: Db) -> bool:
    """The server ended a connection of this database for sitting idle inside a transaction."""
    return any(f"@{db.name} " in line and "idle-in-transaction timeout" in line for line in srv.log().splitlines())


