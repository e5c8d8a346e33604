"""Lab `pipeline`, step 4: publish — what goes into the stream and when "published" is saved; an
XADD that fails; another publisher claiming the row between the XADD and the save; no trimming."""

from __future__ import annotations

from checks.pipeline import schema
from checks.pipeline.claim import ev, fill
from checks.pipeline.common import call, first_error, query, returned, run, servers
from checks.pipeline.servers import Db, Stream
from labkit.judge.expect import Miss, Plan, describe
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import show

ORDER_HINT = ("For each claimed row: XADD first, then after_add(id), then save published_at and stream_id. "
              "Saved before the XADD, a crash in between leaves a row marked published that no consumer "
              "will ever see.")
FENCE_HINT = ("Save 'published' only `WHERE seq = %s AND fence = %s`: another publisher claimed the row after "
              "your XADD (a larger fence), so your save must find nothing, count it as stale and go on.")
MAXLEN_HINT = ("XADD without MAXLEN or MINID: trimming drops the oldest entries, and no consumer may have read "
               "them yet.")


SAVE_ERROR_HINT = ("Only StaleClaim means the row has another owner: catch that alone. Any other error saving the "
                   "row (a lost connection) propagates, and the row stays claimed until its lease expires.")


def stream_entries(srv, key: str) -> list:
    with srv.judge_valkey() as judge:
        return judge.xrange(key) if judge.exists(key) else []


def place(ctx: StepContext, rows: int) -> tuple[Db, Stream, str]:
    """A case's own database with `rows` outbox rows, Valkey user, and stream key."""
    srv = servers(ctx)
    db, user = srv.database(ctx.step), srv.user(ctx.step)
    fill(db, rows)
    return db, user, user.prefix + "orders"


def publish_spec(ctx: StepContext, plan: Plan, db: Db, user: Stream, owner: str, key: str, hook: dict) -> dict:
    """The case `plan`: one publish(conn, r, owner, 16, 30, key) with `hook` as its after_add."""
    return {"name": plan.name, "dsn": db.dsn(ctx.workdir), "valkey": user.kwargs,
            "ops": [call("publish", "$conn", "$r", owner, 16, 30, key, hooks={"after_add": hook} if hook else None)]}


def check_publish(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    plans, specs = [], []

    # Three rows, in order; the hook looks at the stream and the row at after_add.
    db, user, key = place(ctx, 3)

    def published(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = returned(record)
        entries = stream_entries(srv, key)
        rows = query(db, "SELECT id, fence, stream_id, claimed_by, claim_until, published_at IS NOT NULL"
                         " FROM outbox ORDER BY seq")
        for args in srv.commands(user.prefix):
            if args[0].upper() == "XADD" and any(a.upper() in ("MAXLEN", "MINID") for a in args[2:4]):
                return Miss(f"sent {' '.join(args[:5])} …", MAXLEN_HINT, clause="4.no-maxlen")
        want = [{"id": f"ord-{i}", "body": schema.canonical(ev(i)), "fence": str(rows[i - 1][1])} for i in (1, 2, 3)]
        if [fields for _id, fields in entries] != want:
            return Miss(f"the stream holds {show([f for _i, f in entries])}", "XADD stream * id <id> body "
                        "<canonical body> fence <fence>, one entry per row, in seq order.", clause="4.xadd-fields")
        hooks = record["observed"].get("hooks", [])
        if [h["arg"] for h in hooks] != ["ord-1", "ord-2", "ord-3"]:
            return Miss(f"after_add was called with {[h['arg'] for h in hooks]}", "Call after_add(id) once per "
                        "row, after its XADD.", clause="4.saved-after-xadd")
        for i, hook in enumerate(hooks):
            if hook.get("xlen") != i + 1 or hook.get("published"):
                return Miss(f"inside after_add('{hook['arg']}') the stream held {hook.get('xlen')} entries and the "
                            f"row was {'already' if hook.get('published') else 'not yet'} saved as published",
                            ORDER_HINT, clause="4.saved-after-xadd")
        if got != {"published": 3, "stale": 0}:
            return Miss(f"returned {show(got)}", "Return {'published': n, 'stale': m}.", clause="4.counts")
        for (id_, _fence, stream_id, owner, until, done), (entry_id, _f) in zip(rows, entries, strict=True):
            if not done or stream_id != entry_id or owner is not None or until is not None:
                return Miss(f"row {id_}: published {done}, stream_id {stream_id!r}, claimed_by {owner!r}",
                            "Save published_at, stream_id = the entry id XADD returned, and clear the claim.",
                            clause="4.counts")
        return None

    plans.append(Plan("three rows published", "publish(conn, r, 'pub-1', 16, 30, stream, after_add=…)",
                      "three entries in seq order with id, body and fence; each saved after its XADD; "
                      "{'published': 3, 'stale': 0}", published,
                      clauses=("4.xadd-fields", "4.saved-after-xadd", "4.counts", "4.no-maxlen")))
    specs.append(publish_spec(ctx, plans[-1], db, user, "pub-1", key, {"look": "row", "stream": key}))

    # The XADD fails (the key holds a string): the error propagates, the row stays claimed.
    db2, user2, key2 = place(ctx, 2)
    with srv.judge_valkey() as judge:
        judge.set(key2, "not a stream")

    def xadd_fails(record: dict) -> Miss | None:
        outcome = record["outcome"]
        rows = query(db2, "SELECT id, claimed_by, fence, published_at IS NOT NULL FROM outbox ORDER BY seq")
        if any(done for *_r, done in rows):
            return Miss(f"rows {[r[0] for r in rows if r[3]]} were saved as published although XADD failed",
                        ORDER_HINT)
        if outcome["kind"] != "raised" or "WRONGTYPE" not in outcome.get("message", ""):
            return Miss(describe(outcome), "An XADD error stops the batch and propagates.")
        if rows[0][1] != "pub-2" or rows[0][2] <= 0:
            return Miss(f"row ord-1 is claimed by {rows[0][1]!r} with fence {rows[0][2]}",
                        "Leave the row claimed: its lease expires and another publisher retries it.")
        return None

    plans.append(Plan("the XADD fails", "publish(conn, r, 'pub-2', 16, 30, stream) where the key holds a string",
                      "the error propagates; nothing saved as published; the row stays claimed", xadd_fails,
                      clauses=("4.saved-after-xadd",)))
    specs.append(publish_spec(ctx, plans[-1], db2, user2, "pub-2", key2, {}))

    # Another publisher claims row 1 between its XADD and the save.
    db3, user3, key3 = place(ctx, 2)

    def stale(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return Miss(miss.got, "StaleClaim is counted as stale, and the batch goes on.")
        rows = query(db3, "SELECT id, claimed_by, published_at IS NOT NULL FROM outbox ORDER BY seq")
        if rows[0][2] or rows[0][1] != "thief":
            return Miss(f"row ord-1 is {'published' if rows[0][2] else 'unpublished'}, claimed by {rows[0][1]!r}",
                        FENCE_HINT)
        if returned(record) != {"published": 1, "stale": 1} or not rows[1][2]:
            return Miss(f"returned {show(returned(record))}; ord-2 published: {rows[1][2]}",
                        "Count the stale row and publish the rest of the batch.")
        return None

    plans.append(Plan("another publisher claims the row meanwhile", "publish(conn, r, 'pub-3', 16, 30, stream, "
                      "after_add=…) where the row's fence changes inside after_add('ord-1')",
                      "ord-1 left to the new owner; ord-2 published; {'published': 1, 'stale': 1}", stale,
                      clauses=("4.fence-checked",)))
    specs.append(publish_spec(ctx, plans[-1], db3, user3, "pub-3", key3, {"do": "steal", "only": "ord-1"}))

    # The server ends the publisher's connection between its XADD and the save: not a StaleClaim.
    db4, user4, key4 = place(ctx, 2)

    def lost(record: dict) -> Miss | None:
        outcome = record["outcome"]
        rows = query(db4, "SELECT id, claimed_by, published_at IS NOT NULL FROM outbox ORDER BY seq")
        if outcome["kind"] == "returned":
            return Miss(f"returned {show(returned(record))} although its connection was gone",
                        SAVE_ERROR_HINT, clause="4.save-error")
        if outcome["kind"] != "raised" or any(done for *_r, done in rows) or rows[0][1] != "pub-4":
            return Miss(f"{describe(outcome)}; rows {show(rows)}", SAVE_ERROR_HINT, clause="4.save-error")
        return None

    plans.append(Plan("the connection is lost after the XADD", "publish(conn, r, 'pub-4', 16, 30, stream, "
                      "after_add=…) where the server ends conn inside after_add('ord-1')",
                      "the error propagates (it is no StaleClaim); nothing saved; ord-1 stays claimed", lost,
                      clauses=("4.save-error",)))
    specs.append(publish_spec(ctx, plans[-1], db4, user4, "pub-4", key4, {"do": "cut", "only": "ord-1"}))
    return run(ctx, plans, specs)
