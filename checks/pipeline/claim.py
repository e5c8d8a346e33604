"""Lab `pipeline`, step 3: claim — arguments, order and limit, what may be claimed, whose clock,
where the fence comes from, and publishers claiming at once (one row never twice, never waiting
for another's locked rows)."""

from __future__ import annotations

import math

from checks.pipeline import schema
from checks.pipeline.common import (
    call,
    first_error,
    one,
    outcomes,
    query,
    race,
    racing,
    returned,
    run,
    servers,
)
from checks.pipeline.servers import Db
from labkit.judge.expect import Miss, Plan, describe, raises
from labkit.judge.run import StepContext, beside
from labkit.judge.verdict import Case
from labkit.values import show

SKIP_HINT = ("Your claim waited for a row another transaction had locked (the judge held it; the server's "
             "lock_timeout, 5 s here, ended the wait). Lock with `FOR UPDATE SKIP LOCKED`: a publisher passes over "
             "rows another one is claiming right now.")
FOR_UPDATE_HINT = ("Two publishers claiming at once got the same row: a plain SELECT, then an UPDATE, lets both "
                   "read it before either wrote. Select with `FOR UPDATE SKIP LOCKED` in the same transaction as "
                   "the UPDATE.")
CLOCK_HINT = ("This publisher's clock runs an hour ahead, and your claim followed it. Compare and set "
              "claim_until with the database's clock: `claim_until < clock_timestamp()` and "
              "`claim_until = clock_timestamp() + make_interval(secs => lease)`.")
SEQ_HINT = ("Take every fence from the sequence, `nextval('fence_seq')`: max(fence) + 1 hands two publishers "
            "one number, and forgets numbers it gave to rows that are gone.")
# In the race's database every row a racer updates is held (BEFORE UPDATE: the row is locked by
# then) while another racer has not yet reached its own hold or a lock wait: still running, or
# not started (its connection, opened before the barrier, has run nothing yet). At most 2 s.
# Then every racer has read what it will claim while this transaction still holds its rows:
# with SKIP LOCKED each takes other rows and is held, so all go on at once; a plain SELECT lets
# the others read this row and wait to overwrite it; a FOR UPDATE without SKIP LOCKED makes them
# wait here. The overlap is observed, not timed (it was a 0.1 s pause per row: 0.2 s of a check).
HOLD_UPDATES = ["""CREATE FUNCTION judge_hold_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  polls int := 0;
BEGIN
  LOOP
    PERFORM pg_stat_clear_snapshot();  -- pg_stat_activity is otherwise read once per transaction
    EXIT WHEN polls >= 200 OR NOT EXISTS (
      SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
        AND usename = session_user
        AND ((state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock'
              AND wait_event IS DISTINCT FROM 'PgSleep')
             OR (state = 'idle' AND query = '')));
    PERFORM pg_sleep(0.01);
    polls := polls + 1;
  END LOOP;
  RETURN NEW;
END $$""", "CREATE TRIGGER judge_hold_update BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION judge_hold_update()"]


def ev(i: int) -> dict:
    return {"id": f"ord-{i}", "sku": "apple", "qty": i}


EDGE_HINT = ("Every range includes its ends: owner 1-64 printable ASCII characters (space to '~'), limit 1-16, "
             "lease_s any int or finite float in (0, 3600].")


def fill(db: Db, count: int) -> None:
    schema.create(db)
    db.setup(*(("INSERT INTO outbox(id, body) VALUES (%s, %s)", (f"ord-{i}", schema.canonical(ev(i))))
               for i in range(1, count + 1)))


def state(db: Db) -> list[tuple]:
    return query(db, "SELECT seq, fence, claimed_by, claim_until, published_at FROM outbox ORDER BY seq")


BAD = [("owner is empty", ("", 1, 5)), ("owner has 65 characters", ("o" * 65, 1, 5)),
       ("owner has a tab", ("a\tb", 1, 5)), ("owner is not a str", (7, 1, 5)),
       ("limit is 0", ("p", 0, 5)), ("limit is 17", ("p", 17, 5)), ("limit is True", ("p", True, 5)),
       ("limit is a float", ("p", 2.0, 5)), ("lease_s is 0", ("p", 1, 0)), ("lease_s is negative", ("p", 1, -1)),
       ("lease_s is 3601", ("p", 1, 3601)), ("lease_s is nan", ("p", 1, math.nan)),
       ("lease_s is inf", ("p", 1, math.inf)), ("lease_s is True", ("p", 1, True)),
       ("lease_s is a str", ("p", 1, "5"))]


def check_claim(ctx: StepContext) -> list[Case]:
    # the race in a child of its own beside the batch, from the step's first moment: its database
    # and process start while the batch's cases are prepared
    with beside(lambda: check_claim_race(ctx)) as raced:
        cases = claim_batch(ctx)
    return cases + raced.result()


def claim_batch(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    plans, specs = [], []

    # Bad arguments: ValueError before any statement — no token taken, nothing changed.
    bad = srv.database(ctx.step)
    fill(bad, 2)
    before_bad = state(bad)

    def refused(record: dict) -> Miss | None:
        miss = raises("ValueError", "Check owner, limit and lease_s first (bool is never a number).")(record)
        if miss is not None:
            return miss
        if state(bad) != before_bad or one(bad, "SELECT is_called FROM fence_seq"):
            return Miss("ValueError, but a row changed or a token was taken", "Validate before any statement.")
        return None

    for label, (owner, limit, lease) in BAD:
        plans.append(Plan(f"bad argument: {label}", f"claim(conn, {show(owner)}, {show(limit)}, {show(lease)})",
                          "ValueError, nothing changed", refused, clauses=("3.arg-ranges",)))
        specs.append({"name": plans[-1].name, "dsn": bad.dsn(ctx.workdir),
                      "ops": [call("claim", "$conn", owner, limit, lease)]})

    # Order, limit, the row update, the fence from the sequence.
    basic = srv.database(ctx.step)
    fill(basic, 5)
    basic.setup("SELECT setval('fence_seq', 500)",
                "UPDATE outbox SET fence = 7 WHERE seq = 5")  # a max(fence) + 1 would give 8

    def ordered(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = returned(record)
        if not isinstance(got, list) or len(got) != 3 or not all(isinstance(d, dict) for d in got):
            return Miss(f"returned {show(got)}", "Return a list of up to `limit` dicts.", clause="3.seq-order-limit")
        if [d.get("seq") for d in got] != [1, 2, 3] or [d.get("id") for d in got] != ["ord-1", "ord-2", "ord-3"] \
                or [d.get("event") for d in got] != [ev(1), ev(2), ev(3)] \
                or any(set(d) != {"seq", "id", "event", "fence"} for d in got):
            return Miss(f"returned {show(got)}", "The first `limit` unpublished rows in seq order, each "
                        "{seq, id, event (the decoded body), fence}.", clause="3.seq-order-limit")
        fences = [d["fence"] for d in got]
        if sorted(set(fences)) != fences or fences[0] <= 500:
            return Miss(f"fences {fences} (fence_seq stood at 500, the largest stored fence was 7)", SEQ_HINT,
                        clause="3.sequence-fence")
        rows = query(basic, "SELECT seq, fence, claimed_by, EXTRACT(epoch FROM claim_until - clock_timestamp())"
                            " FROM outbox ORDER BY seq")
        for (seq, fence, owner, left), want in zip(rows[:3], fences, strict=True):
            if fence != want or owner != "pub-1" or left is None or not 20 < float(left) <= 30:
                return Miss(f"row {seq}: fence {fence}, claimed_by {owner!r}, claim ends in "
                            f"{None if left is None else round(float(left), 1)} s",
                            "Set fence, claimed_by = owner and claim_until = clock_timestamp() + lease.",
                            clause="3.row-update")
        if rows[3][2] is not None or rows[4][2] is not None:
            return Miss("rows beyond the limit were claimed too", "LIMIT the SELECT.", clause="3.seq-order-limit")
        return None

    plans.append(Plan("three of five rows, in seq order", "claim(conn, 'pub-1', 3, 30)",
                      "rows 1-3 with fresh fences from fence_seq (> 500), claimed for 30 s on the database's clock",
                      ordered, clauses=("3.seq-order-limit", "3.sequence-fence", "3.row-update")))
    specs.append({"name": plans[-1].name, "dsn": basic.dsn(ctx.workdir), "ops": [call("claim", "$conn", "pub-1", 3, 30)]})

    # What may be claimed: published and live claims never, expired claims again.
    mixed = srv.database(ctx.step)
    fill(mixed, 4)
    mixed.setup("UPDATE outbox SET published_at = now(), stream_id = '1-0' WHERE seq = 1",
                "UPDATE outbox SET claimed_by = 'other', fence = 3, claim_until = clock_timestamp()"
                " + interval '20 seconds' WHERE seq = 2",
                "UPDATE outbox SET claimed_by = 'dead', fence = 4, claim_until = clock_timestamp()"
                " - interval '1 second' WHERE seq = 3",
                "SELECT setval('fence_seq', 10)")

    def claimable(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = [d.get("seq") for d in returned(record) or [] if isinstance(d, dict)]
        if got != [3, 4]:
            return Miss(f"claimed the rows with seq {got}", "Claim unpublished rows whose claim is absent or "
                        "expired (claim_until < clock_timestamp()): row 1 is published, row 2 claimed for 20 s "
                        "more, row 3's claim expired a second ago.", clause="3.claimable")
        owners = query(mixed, "SELECT claimed_by FROM outbox WHERE seq IN (3, 4) ORDER BY seq")
        if owners != [("pub-2",), ("pub-2",)]:
            return Miss(f"the claimed rows name {[o for (o,) in owners]} as their owner",
                        "Set claimed_by = owner on every row you claim, also one another publisher held before.",
                        clause="3.row-update")
        return None

    plans.append(Plan("published, live and expired claims", "claim(conn, 'pub-2', 16, 5) over a published row, "
                      "a live claim, an expired claim and a new row", "the expired claim and the new row only",
                      claimable, clauses=("3.claimable", "3.row-update")))
    specs.append({"name": plans[-1].name, "dsn": mixed.dsn(ctx.workdir), "ops": [call("claim", "$conn", "pub-2", 16, 5)]})

    # The caller's clock is an hour ahead: a live claim must stay, the new one ends on the db's clock.
    skewed = srv.database(ctx.step)
    fill(skewed, 2)
    skewed.setup("UPDATE outbox SET claimed_by = 'other', fence = 1, claim_until = clock_timestamp()"
                 " + interval '60 seconds' WHERE seq = 1")
    before = one(skewed, "SELECT clock_timestamp()")  # the claim comes after this

    def db_clock(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = [d.get("seq") for d in returned(record) or [] if isinstance(d, dict)]
        # Between `before` + 10 s and now + 10 s on the database's clock, however long the batch
        # took to be judged: the lease was counted from a moment of the database's clock in between.
        ends = query(skewed, "SELECT EXTRACT(epoch FROM claim_until - clock_timestamp()),"
                             " EXTRACT(epoch FROM claim_until - %s::timestamptz) FROM outbox WHERE seq = 2", (before,))
        left, after_before = ends[0] if ends and ends[0][0] is not None else (None, None)
        if got != [2] or left is None or float(left) > 10 or float(after_before) < 10:
            return Miss(f"claimed {got}; row 2's claim ends in {None if left is None else round(float(left))} s",
                        CLOCK_HINT)
        return None

    plans.append(Plan("the caller's clock is an hour ahead", "claim(conn, 'pub-3', 16, 10) in a process whose "
                      "clock runs 3600 s fast", "row 1's live claim kept; row 2 claimed for 10 s by the database's "
                      "clock", db_clock, clauses=("3.db-clock",)))
    specs.append({"name": plans[-1].name, "dsn": skewed.dsn(ctx.workdir),
                  "ops": [{"skew": 3600}, call("claim", "$conn", "pub-3", 16, 10)]})

    # The ends of every range are allowed: a 1-character owner with a float lease, a 64-character
    # one (space and '~' are printable) with limit 16 and an hour's lease.
    edges = srv.database(ctx.step)
    fill(edges, 3)
    wide = "~" + "o" * 62 + " "

    def edge_args(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return Miss(miss.got, EDGE_HINT, clause="3.arg-ranges")
        owners = query(edges, "SELECT claimed_by, EXTRACT(epoch FROM claim_until - clock_timestamp()) FROM outbox"
                              " ORDER BY seq")
        if [o for o, _left in owners] != ["p", wide, wide] or not 3500 < float(owners[2][1]) <= 3600:
            return Miss(f"the rows are claimed by {[o for o, _left in owners]}", EDGE_HINT, clause="3.arg-ranges")
        return None

    plans.append(Plan("arguments at the ends of their ranges", f"claim(conn, 'p', 1, 0.5), then claim(conn, "
                      f"{show(wide)}, 16, 3600)", "row 1 claimed by 'p', rows 2 and 3 by the 64-character owner "
                      "for an hour", edge_args, clauses=("3.arg-ranges",)))
    specs.append({"name": plans[-1].name, "dsn": edges.dsn(ctx.workdir),
                  "ops": [call("claim", "$conn", "p", 1, 0.5), call("claim", "$conn", wide, 16, 3600)]})

    # A row locked by another transaction: skipped, never waited for.
    locked = srv.database(ctx.step)
    fill(locked, 3)
    judge = locked.judge()
    judge.execute("BEGIN")
    judge.execute("SELECT * FROM outbox WHERE seq = 1 FOR UPDATE")

    def skipped(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and "LockNotAvailable" in outcome.get("mro", []):
            return Miss(describe(outcome), SKIP_HINT)
        miss = first_error(record)
        if miss is not None:
            return miss
        got = [d.get("seq") for d in returned(record) or [] if isinstance(d, dict)]
        if got != [2, 3]:
            return Miss(f"claimed {got}", SKIP_HINT if 1 in got or not got else "Claim rows 2 and 3.")
        return None

    plans.append(Plan("a row locked by another publisher", "claim(conn, 'pub-4', 16, 5) while another "
                      "transaction holds row 1 FOR UPDATE", "rows 2 and 3 at once, without waiting for row 1",
                      skipped, clauses=("3.skip-locked",)))
    specs.append({"name": plans[-1].name, "dsn": locked.dsn(ctx.workdir), "ops": [call("claim", "$conn", "pub-4", 16, 5)]})
    try:
        return run(ctx, plans, specs)
    finally:
        judge.close()


RACERS, ROWS, LIMIT = 3, 9, 2


def check_claim_race(ctx: StepContext) -> list[Case]:
    where = racing(ctx)  # its child starts while the database is made
    srv = servers(ctx)
    db = srv.database(ctx.step)
    fill(db, ROWS)
    db.setup(*HOLD_UPDATES)

    def one_owner(records: list[dict]) -> Miss | None:
        errors = [r for r in records if r["outcome"]["kind"] != "returned"]
        if errors:
            text = "; ".join(outcomes(errors))
            return Miss(text, SKIP_HINT if "LockNotAvailable" in text else FOR_UPDATE_HINT)
        got = sorted([d.get("seq") for d in returned(r) or [] if isinstance(d, dict)] for r in records)
        seqs = [s for rows in got for s in rows]
        owners = query(db, "SELECT seq, claimed_by, fence FROM outbox WHERE claimed_by IS NOT NULL ORDER BY seq")
        fences = [f for _s, _o, f in owners]
        if len(seqs) != len(set(seqs)):
            return Miss(f"the racers got rows {got}: one row twice", FOR_UPDATE_HINT)
        if len(fences) != len(set(fences)):
            return Miss(f"the claimed rows carry fences {fences}: one twice", SEQ_HINT, clause="3.sequence-fence")
        if len(seqs) != RACERS * LIMIT:
            return Miss(f"the racers got rows {got}", "Each publisher takes up to `limit` rows nobody else holds.")
        return None

    return race(where, db, f"{RACERS} publishers claim at once", f"claim(conn, 'racer-N', {LIMIT}, 30) in {RACERS} "
                "processes at the same moment", f"{RACERS * LIMIT} different rows, each with its own fence",
                ("3.for-update", "3.sequence-fence"), RACERS,
                lambda i: [call("claim", "$conn", f"racer-{i + 1}", LIMIT, 30)], one_owner)
