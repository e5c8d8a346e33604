"""Lab `pipeline`: what the step checks share — how a step's cases run in a child, how racers
start at one moment, and the judge's own looks at the database and the stream."""

from __future__ import annotations

import time
from collections.abc import Callable

from checks.pipeline.servers import Db, Servers
from labkit.judge.expect import Miss, Plan, describe
from labkit.judge.run import StepContext, together
from labkit.judge.verdict import Case
from labkit.values import encode

BARRIER = (31337, 4242)  # probes.BARRIER
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


def race(ctx: StepContext, db: Db, racers: list[tuple[list[Plan], Callable[[str], list[dict]]]]) -> list[Case]:
    """Each racer in its own child and folder; all wait at a barrier (an advisory lock the judge
    holds) and go at once when the last one arrived. `specs(dsn)` makes a racer's cases."""
    with db.judge() as judge:
        judge.execute("SELECT pg_advisory_lock(%s, %s)", BARRIER)

        def release() -> None:
            deadline = time.monotonic() + BARRIER_WAIT
            try:
                while time.monotonic() < deadline:
                    waiting = judge.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                        " AND classid = %s AND objid = %s AND database = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database())", BARRIER).fetchone()[0]
                    if waiting >= len(racers):
                        break
                    time.sleep(0.01)
            finally:
                judge.execute("SELECT pg_advisory_unlock(%s, %s)", BARRIER)

        def racer(i: int, plans: list[Plan], specs: Callable[[str], list[dict]]) -> list[Case]:
            apart = ctx.apart(f"racer{i}")
            return apart.cases("script", plans, {"cases": specs(db.dsn(apart.workdir))})

        results = together([release, *[lambda i=i, p=p, s=s: racer(i, p, s) for i, (p, s) in enumerate(racers)]])
    return [case for cases in results[1:] for case in cases]


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


def query(db: Db, sql: str, params=()) -> list[tuple]:
    with db.judge() as judge:
        return judge.execute(sql, params).fetchall()


def one(db: Db, sql: str, params=()):
    found = query(db, sql, params)
    return found[0][0] if found else None


def idle_killed(srv: Servers, db: Db) -> bool:
    """The server ended a connection of this database for sitting idle inside a transaction."""
    return any(f"@{db.name} " in line and "idle-in-transaction timeout" in line for line in srv.log().splitlines())


