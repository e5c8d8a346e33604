"""A step's cases served one at a time by one child, within the step's CPU budget.

Between two cases the child waits (the lab's `serve` probe), so the judge can look at what a case
left behind (files, locks, sockets) before the next one starts; those looks cost the student nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from labkit.judge import expect
from labkit.judge.child import child_session
from labkit.judge.expect import Miss, Plan
from labkit.judge.processes import cpu_seconds
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.limits import (
    WALL_FACTOR,  # a served step's calls may wait this many step budgets in all
)


def served(ctx: StepContext, kind: str, plans: list[Plan], specs: list[dict],
           observe: Callable[[int, dict], dict] | None = None, call_timeout: float = 5.0) -> list[Case]:
    """Run each plan's case in one child that waits between cases (the lab's `probes:serve`).

    The step's budget is the child's: `ctx.timeout` seconds of its CPU time (a loaded machine
    cannot tell slow code from a slow machine by the clock), within `WALL_FACTOR` times that of
    waiting for its replies (every wait stays bounded; each call also has its own guard). The
    judge's own looks between cases cost the student nothing. After each reply, and before the
    next case starts, `observe(child_pid, spec)` makes the judge's own observations (the store
    through its own connection, its locks, the files and sockets the child still holds); they go
    under the case's `observed["judge"]`."""
    records: list[dict] = []
    waited = cpu = 0.0  # the child's time only, never the judge's own looks
    started, marker = ctx.first_child()
    with child_session(ctx.solution, workdir=ctx.workdir, timeout=ctx.timeout, marker=marker,
                       started=started, module_name=ctx.lab.module_name, probe=f"{ctx.lab.probes}:serve") as session:
        for plan, spec in zip(plans, specs, strict=True):
            left = WALL_FACTOR * ctx.timeout - waited
            if not session.imported:
                break
            records.append({"event": "start", "case": plan.name})
            if left <= 0 or cpu > ctx.timeout:  # the step's budget is spent: this case is where it ran out
                session.run.timed_out = True
                break
            started = time.monotonic()
            reply = session.call({"kind": spec.get("kind", kind), "case": spec},
                                 timeout=min(left, spec.get("guard", 0) + call_timeout))
            waited += time.monotonic() - started
            cpu = cpu_seconds(session.proc.pid)
            if reply["outcome"].get("kind") in ("timed_out", "died", "memory_limit", "aborted"):
                break  # the session says how the child ended; this case is the one it ended in
            observed = dict(reply.get("observed") or {})
            observed["judge"] = observe(session.proc.pid, spec) if observe else {}
            records.append({"event": "case", "case": plan.name, "outcome": reply["outcome"],
                            "observed": observed})
    run = session.run
    run.records = [*run.records, *records]
    return expect.judge(run, [observable(p) for p in plans], ctx.timeout)  # via the module: tests wrap it


def observable(plan: Plan) -> Plan:
    """`plan`, whose check first says so when the child could not observe the call at all."""

    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome.get("kind") == "probe_failed":
            return Miss(f"after the call, the judge could not look at what it left: {outcome.get('message')}",
                        "Leave the objects you were given usable: e.g. never close the DB connection "
                        "or the writer you were handed, unless the contract says so.")
        return inner(record)

    inner = plan.check
    return Plan(plan.name, plan.called, plan.expected, check, plan.hint, plan.clauses)
