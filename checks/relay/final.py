"""Lab `relay`'s final check: two publishers, a kill and a pause; then a poison pill and a redrive.

Real processes, real 0.3 s leases, one warehouse (in the judge's process, with per-event faults
and a log of the token each request carried):

1-2. On one outbox: publisher A #1 claims snack-1 and dies in after_claim (the judge kills it there);
     publisher A #2 (A restarted) claims snack-2 and is stopped by the judge (SIGSTOP from outside) in after_claim —
     the judge sees the stop in /proc; B takes both over once the leases ran out; then the judge
     sends SIGCONT and A #2's complete must be refused by its stale token.
3-4. On a second outbox, on the judge's clock: five events, one refused for good (422), one twice
     (503); then the refusal is lifted, the quarantined row redriven and delivered.

This module sets the scene and runs the processes; the cases are in `final_owners.py` (1-2)
and `final_pills.py` (3-4), the timeline and the ladder in `final_evidence.py`, what they
share in `final_scene.py`.

Every case rests on the judge's own observations: the audit of every row change (recorded by
SQLite in the writer's transaction), the warehouse's request log, exit codes and /proc. The
children's reports are used for return values only (A #2's counts).
"""

from __future__ import annotations

import time

from checks.outbox import schema as stores
from checks.relay.final_evidence import add_ladder, add_timeline
from checks.relay.final_owners import owner_cases
from checks.relay.final_pills import pill_cases
from checks.relay.final_scene import COUNTER_START, LEASE, Scene
from checks.relay.outbox import audit, claims_in, event, make_outbox, name, row, rows_of
from labkit.judge import freeze
from labkit.judge import timeline as evidence
from labkit.judge.hooks import release, run_to_hook
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case

DRAIN_SECONDS = 3.0  # B stops trying after this long (a correct B needs about one lease)


def check_final(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import refused, start_warehouse, unavailable

    rng = ctx.rng
    scene = Scene(ctx.path("outbox.db"), ctx.path("pills.db"))
    pills = [event(name(rng, "pill"), "snack", rng.randint(1, 1000)) for _ in range(5)]
    # Fixed places: the refused event second, the flaky one fourth, plain events around them. The
    # events behind each show the price of quarantine and retries, and a wrong publisher meets
    # the same situation under every seed.
    refused_at, flaky_at = 1, 3
    scene.ids = {"refused": pills[refused_at]["id"], "flaky": pills[flaky_at]["id"]}
    scene.ids.update({f"plain{k}": e["id"] for k, e in enumerate(
        e for i, e in enumerate(pills) if i not in (refused_at, flaky_at))})
    reason = f"sku {name(rng, 'old', 3)} is discontinued"
    scene.policy = {"base": rng.choice((0.5, 1.0, 2.0)), "cap": 30.0, "max_attempts": 5,
                    "seed": rng.randrange(2**31)}
    make_outbox(scene.db, [row("snack-1", qty=1), row("snack-2", qty=2)])
    make_outbox(scene.pills, [row(e["id"], qty=e["qty"]) for e in pills], counter=COUNTER_START)  # tokens 101, ...
    wh = start_warehouse(ctx.path("warehouse.jsonl"),
                         event_faults={scene.ids["refused"]: refused(reason), scene.ids["flaky"]: unavailable(2)},
                         on_request=lambda: _audit_marks(scene))
    try:
        common = {"url": wh.url, "lease": LEASE, **scene.policy}
        _two_publishers(ctx, scene, {**common, "db": str(scene.db)})
        scene.start = float(int(time.time())) + 1000.0  # the judge's clock, ahead of the wall clock
        scene.runs["C"] = ctx.child("poison", {**common, "db": str(scene.pills), "owner": "C", "start": scene.start,
                                               "limit": 16, "rounds": 6, "cases": ["relay"]})
        if not scene.runs["C"].timed_out:  # a publisher that hangs costs its time limit once, not twice
            wh.lift(scene.ids["refused"])  # the cause is fixed
            scene.notes.append(evidence.event(time.time(), "warehouse", "note",
                                              f"the refusal of {scene.ids['refused']} is lifted (cause fixed)"))
            scene.runs["D"] = ctx.child("redriving", {**common, "db": str(scene.pills), "owner": "D",
                                                      "ids": [scene.ids["refused"]], "now": scene.start + 100.0,
                                                      "limit": 16, "cases": ["redrive"]})
        scene.requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    scene.entries = sorted([{**e, "file": "outbox"} for e in audit(scene.db)]
                           + [{**e, "file": "pills"} for e in audit(scene.pills)], key=lambda e: e["t"])
    for path in (scene.db, scene.pills):
        for seq, r in rows_of(path).items():
            scene.rows[r["id"]], scene.seq[r["id"]] = r, seq
    cases = owner_cases(ctx, scene) + pill_cases(ctx, scene, reason)
    add_timeline(ctx, scene)
    add_ladder(ctx, scene)
    return cases


def _audit_marks(scene: Scene) -> dict[str, int]:
    """How far each outbox's audit had got (its last `n`), read by the judge as a POST arrives:
    every later entry was written after that POST arrived. The timeline's order rests on this,
    not on comparing the warehouse's clock with the audit's (whole milliseconds)."""
    return {label: int(stores.rows(path, "SELECT coalesce(max(n), 0) FROM judge_audit")[0][0])
            for label, path in (("outbox", scene.db), ("pills", scene.pills))}


def _two_publishers(ctx: StepContext, scene: Scene, common: dict) -> None:
    """A #1 is killed right after its claim; A #2 is frozen right after its own; B takes both over.

    Both from outside: each after_claim reports the claim and waits; on that report the judge
    SIGKILLs A #1's whole sandbox, and SIGSTOPs every process of A #2's (`labkit.judge.freeze`),
    runs B, then SIGCONTs A #2 and lets its after_claim return."""
    # The judge chooses the `now` of the first calls (A's claims, B's first round) on the wall
    # clock it reads here, so they happen inside the leases whatever the machine's load; from
    # then on the leases run out in real time.
    t1 = time.time()
    claimed = lambda r: r.get("kind") == "claimed"  # noqa: E731
    run, hook = run_to_hook(ctx.solution, f"{ctx.lab.probes}:publisher",
                            {**common, "owner": "A", "mode": "die", "limit": 1, "nows": [t1], "cases": ["relay"]},
                            workdir=ctx.workdir, timeout=ctx.timeout, marker=ctx.marker(),
                            module_name=ctx.lab.module_name, at_hook=claimed)
    scene.runs["A #1"] = run
    if hook is not None:
        scene.killed.add("A #1")
    scene.after_death = rows_of(scene.db).get(1)
    if run.timed_out:
        return  # it hangs: the others would too, each for its full time limit
    first = [e for e in claims_in(audit(scene.db)) if e["id"] == "snack-1"]
    a_ends = first[0]["lease_until"] if first else t1 + LEASE
    scene.b_first_now = a_ends - LEASE / 3  # shortly before A's lease ends: B must take nothing yet
    marker = ctx.marker()

    def paused(record: dict, session) -> str:
        if "B" in scene.runs:  # a second after_claim: nothing more to do there
            release(session)
            return "continue"
        pids = freeze.freeze(session.proc, marker)
        if pids and all(freeze.stopped(p) for p in pids):
            scene.stopped_at = time.time()
        try:
            # B's first round is at a moment inside both leases (the judge's clock): it must take
            # nothing; then it claims on the wall clock until both rows are settled.
            scene.runs["B"] = ctx.child("publisher", {**common, "owner": "B", "mode": "drain", "limit": 16,
                                                      "nows": [scene.b_first_now], "until": ["snack-1", "snack-2"],
                                                      "seconds": DRAIN_SECONDS, "cases": ["relay"]})
            scene.after_b = rows_of(scene.db).get(2)
        finally:
            if pids:
                scene.continued_at = time.time()  # stamped before the signal: nothing it wakes can precede it
                freeze.thaw(pids)
            release(session)
        return "continue"

    scene.runs["A #2"], _ = run_to_hook(
        ctx.solution, f"{ctx.lab.probes}:publisher",
        {**common, "owner": "A", "mode": "pause", "limit": 1, "nows": [t1 + 0.01], "cases": ["relay"]},
        workdir=ctx.workdir, timeout=ctx.timeout, marker=marker, module_name=ctx.lab.module_name,
        at_hook=claimed, on_hook=paused)
