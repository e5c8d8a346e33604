"""Lab `pipeline`, step 8: lag — nothing at all, then a backlog in both servers; and lag changes
nothing it reads."""

from __future__ import annotations

from checks.pipeline import schema
from checks.pipeline.claim import fill
from checks.pipeline.common import call, first_error, returned, run, servers
from checks.pipeline.consume import GROUP
from checks.pipeline.reclaim import Stream
from labkit.judge.expect import Miss, Plan
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import show

KEYS = ("unpublished", "oldest_unpublished_s", "pending", "oldest_pending_ms", "max_deliveries", "dead")


def pel(stream: Stream) -> list[tuple]:
    with stream.srv.judge_valkey() as judge:
        return [(p["message_id"], p["consumer"], p["times_delivered"], p["time_since_delivered"] // 1000)
                for p in judge.xpending_range(stream.key, GROUP, min="-", max="+", count=100)]


def check_lag(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    empty_db, empty_user = srv.database(ctx.step), srv.user(ctx.step)
    schema.create(empty_db)

    def zeros(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return Miss(miss.got, "An empty measure is 0, and a stream that does not exist yet has no group: "
                        "catch its error.", clause="8.zero-not-none")
        got = returned(record)
        if not isinstance(got, dict) or set(got) != set(KEYS) or any(
                type(got[k]) not in (int, float) or got[k] != 0 for k in KEYS):
            return Miss(f"returned {show(got)}", "Every measure is a number: 0 when there is nothing, never None.",
                        clause="8.zero-not-none")
        return None

    db = srv.database(ctx.step)
    fill(db, 3)
    db.setup("UPDATE outbox SET accepted_at = now() - interval '5 seconds' WHERE seq = 1",
             "UPDATE outbox SET accepted_at = now() - interval '900 seconds', published_at = now(),"
             " stream_id = '1-0' WHERE seq = 2")
    stream = Stream(ctx, srv)
    stream.deliver(1, "dead-c", idle=60_000, times=4, prefix="old")
    stream.deliver(2, "alive-c", prefix="new")
    with srv.judge_valkey() as judge:
        done = judge.xadd(stream.key, {"id": "x"})
        judge.xreadgroup(GROUP, "alive-c", {stream.key: ">"})
        judge.xack(stream.key, GROUP, done)
        # another group, listed before 'g' (XINFO GROUPS is in name order), with 1 entry pending:
        # its count is not the group's
        judge.xgroup_create(stream.key, "audit", id="0")
        judge.xreadgroup("audit", "auditor", {stream.key: ">"}, count=1)
        judge.xadd(stream.key + ".dead", {"entry_id": "0-1", "fields": "{}", "reason": "judge"})
        judge.xadd(stream.key + ".dead", {"entry_id": "0-2", "fields": "{}", "reason": "judge"})
    before_rows, before_pel = schema.rows(db, "outbox"), pel(stream)

    def measures(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = returned(record)
        if not isinstance(got, dict) or set(got) != set(KEYS):
            return Miss(f"returned {show(got)}", f"Return a dict with exactly {list(KEYS)}.")
        wrong = []
        if got["unpublished"] != 2:
            wrong.append(f"unpublished {got['unpublished']} (2 rows wait)")
        if not isinstance(got["oldest_unpublished_s"], (int, float)) or not 4.5 <= got["oldest_unpublished_s"] < 30:
            wrong.append(f"oldest_unpublished_s {got['oldest_unpublished_s']} (the oldest unpublished row was "
                         "accepted 5 s before; a published one 900 s before)")
        if got["pending"] != 3:
            wrong.append(f"pending {got['pending']} (3 entries pending in group 'g', 1 in group 'audit')")
        if not isinstance(got["oldest_pending_ms"], (int, float)) or not 60_000 <= got["oldest_pending_ms"] < 90_000:
            wrong.append(f"oldest_pending_ms {got['oldest_pending_ms']} (one entry idle 60 s)")
        if got["max_deliveries"] != 4:
            wrong.append(f"max_deliveries {got['max_deliveries']} (one entry delivered 4 times)")
        if got["dead"] != 2:
            wrong.append(f"dead {got['dead']} (2 dead letters)")
        if wrong:
            return Miss("; ".join(wrong), "Unpublished rows by accepted_at on the database's clock; pending, idle "
                        "and delivery counts from XPENDING; dead from XLEN of <stream>.dead.", clause="8.measures")
        after_pel = pel(stream)
        if schema.rows(db, "outbox") != before_rows or \
                [p[:3] for p in after_pel] != [p[:3] for p in before_pel] or after_pel[0][3] < 60:
            return Miss(f"the pending entries went from {before_pel} to {after_pel}", "lag only reads: no XCLAIM, "
                        "no XREADGROUP, no XAUTOCLAIM (each changes owners, idle times or counts).",
                        clause="8.read-only")
        return None

    plans = [
        Plan("nothing at all", "lag(conn, r, stream, 'g') with no rows and no stream", "every measure 0",
             zeros, clauses=("8.zero-not-none",)),
        Plan("a backlog in both servers", "lag(conn, r, stream, 'g') with 2 unpublished rows (oldest 5 s), 3 "
             "pending entries (one idle 60 s, delivered 4 times; 1 more in another group) and 2 dead letters",
             "{'unpublished': 2, 'oldest_unpublished_s': ≈5, 'pending': 3, 'oldest_pending_ms': ≈60000, "
             "'max_deliveries': 4, 'dead': 2}; nothing changed", measures, clauses=("8.measures", "8.read-only")),
    ]
    specs = [{"name": plans[0].name, "dsn": empty_db.dsn(ctx.workdir), "valkey": empty_user.kwargs,
              "ops": [call("lag", "$conn", "$r", empty_user.prefix + "orders", GROUP)]},
             {"name": plans[1].name, "dsn": db.dsn(ctx.workdir), "valkey": stream.user.kwargs,
              "ops": [call("lag", "$conn", "$r", stream.key, GROUP)]}]
    return run(ctx, plans, specs)
