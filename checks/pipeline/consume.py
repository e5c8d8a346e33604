"""Lab `pipeline`, step 6: consume — new events, a duplicate, poison, a failure before the commit
and before the XACK, a consumer's own pending entries, count and block_ms, and a dead-letter
stream that refuses the poison."""

from __future__ import annotations

import json

from checks.pipeline import schema
from checks.pipeline.common import call, first_error, query, raised_with, returned, run, servers
from labkit.judge.expect import Miss, Plan
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import show

ACK_HINT = ("XACK only after the transaction committed: acknowledged first, a crash before the commit loses the "
            "event for good (the group will never deliver it again).")
TX_HINT = ("Insert the inbox row and add to stock in ONE `with conn.transaction():`, calling before_commit inside "
           "it: a failure before the commit must leave neither.")
NOACK_HINT = ("Read with XREADGROUP without NOACK: with NOACK the entry never enters the pending list, so when the "
              "consumer dies before XACK nobody can ever reclaim it.")
DEAD_HINT = ("Add the poison entry to `<stream>.dead` first and acknowledge it only after that XADD succeeded: "
             "acknowledged first, a failure of the dead-letter XADD loses it without a trace.")
PEL_HINT = ("Read this consumer's own pending entries first (`XREADGROUP … {stream: '0'}`), then new ones "
            "(`>`): after a restart, `>` alone never delivers what the consumer was given before it died.")
GROUP = "g"


def ev(id_: str, sku: str = "apple", qty: int = 2) -> dict:
    return {"id": id_, "sku": sku, "qty": qty}


def entry(event: dict) -> dict:
    return {"id": event["id"], "body": schema.canonical(event), "fence": "1"}


class Setup:
    """One case's database, Valkey user, stream and group."""

    def __init__(self, ctx: StepContext, srv, entries: list[dict]) -> None:
        self.srv = srv
        self.db, self.user = srv.database(ctx.step), srv.user(ctx.step)
        schema.create(self.db)
        self.key = self.user.prefix + "orders"
        with srv.judge_valkey() as judge:
            judge.xgroup_create(self.key, GROUP, id="0", mkstream=True)
            self.ids = [judge.xadd(self.key, fields) for fields in entries]
        self.dsn = self.db.dsn(ctx.workdir)

    def pending(self) -> list[dict]:
        with self.srv.judge_valkey() as judge:
            return judge.xpending_range(self.key, GROUP, min="-", max="+", count=1000)

    def dead(self) -> list[tuple]:
        with self.srv.judge_valkey() as judge:
            return judge.xrange(self.key + ".dead") if judge.type(self.key + ".dead") == "stream" else []

    def stock(self) -> dict:
        return dict(query(self.db, "SELECT sku, qty FROM stock"))

    def inbox(self) -> list[tuple]:
        return query(self.db, "SELECT id, body, stream_id FROM inbox ORDER BY stream_id")

    def commands(self) -> list[list[str]]:
        return self.srv.commands(self.user.prefix)

    def spec(self, name: str, count: int = 10, block_ms: int = 0, hooks: dict | None = None,
             consumer: str = "c1") -> dict:
        return {"name": name, "dsn": self.dsn, "valkey": self.user.kwargs,
                "ops": [call("consume", "$conn", "$r", self.key, GROUP, consumer, count, block_ms, hooks=hooks)]}


def read_rules(setup: Setup) -> Miss | None:
    for args in setup.commands():
        words = [a.upper() for a in args]
        if words[0] == "XREADGROUP" and "NOACK" in words:
            return Miss(f"sent {' '.join(args[:8])} …", NOACK_HINT, clause="6.no-noack")
        if words[0] == "XREADGROUP" and "BLOCK" in words and words[words.index("BLOCK") + 1] == "0":
            return Miss(f"sent {' '.join(args[:8])} …", "BLOCK 0 waits forever: with block_ms 0 do not block.",
                        clause="6.count-block")
    return None


def check_consume(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    plans, specs = [], []

    def add(plan: Plan, spec: dict) -> None:
        plans.append(plan)
        specs.append(spec)

    # Three new events, with both hooks looking.
    events = [ev("e-1", "apple", 2), ev("e-2", "pear", 3), ev("e-3", "apple", 4)]
    a = Setup(ctx, srv, [entry(e) for e in events])

    def applied(record: dict) -> Miss | None:
        miss = first_error(record) or read_rules(a)
        if miss is not None:
            return miss
        if a.inbox() != [(e["id"], schema.canonical(e), i) for e, i in zip(events, a.ids, strict=True)]:
            return Miss(f"the inbox holds {show(a.inbox())}", "One inbox row per event: id, canonical body, the "
                        "entry id.", clause="6.apply")
        if a.stock() != {"apple": 6, "pear": 3}:
            return Miss(f"stock is {a.stock()}", "Add each new event's qty to its sku's stock.", clause="6.apply")
        if a.pending():
            return Miss(f"{len(a.pending())} entries still pending", "XACK each entry once applied.", clause="6.apply")
        hooks = record["observed"].get("hooks", [])
        commits = [h for h in hooks if h["hook"] == "before_commit"]
        acks = [h for h in hooks if h["hook"] == "before_ack"]
        if [h["arg"] for h in commits] != a.ids or any(h.get("in_transaction") != "INTRANS" for h in commits):
            return Miss(f"before_commit saw {[(h['arg'], h.get('in_transaction')) for h in commits]}",
                        "Call before_commit(entry id) inside the open transaction, once per entry.", clause="6.hooks")
        writes = [h.get("writes") for h in commits]
        if writes != [["apple", 2], ["pear", 3], ["apple", 6]]:
            return Miss(f"before_commit saw in the transaction (inbox row's sku, its stock): {show(writes)}, "
                        "not [['apple', 2], ['pear', 3], ['apple', 6]]",
                        "Call before_commit after the inbox insert AND the stock update, just before the commit: "
                        "what the transaction holds then is what a crash there loses.", clause="6.hooks")
        if [h["arg"] for h in acks] != a.ids or not all(h.get("pending") for h in acks):
            return Miss(f"before_ack saw {[(h['arg'], h.get('pending')) for h in acks]}",
                        "Call before_ack(entry id) after the commit and before its XACK.", clause="6.hooks")
        if returned(record) != {"applied": 3, "duplicate": 0, "dead": 0}:
            return Miss(f"returned {show(returned(record))}", "Return {'applied', 'duplicate', 'dead'}.",
                        clause="6.apply")
        return None

    add(Plan("three new events", "consume(conn, r, stream, 'g', 'c1', 10, 0, before_commit=…, before_ack=…)",
             "3 applied: inbox rows, stock, PEL empty; hooks inside the transaction and before each XACK",
             applied, clauses=("6.apply", "6.hooks", "6.no-noack")),
        a.spec("three new events", hooks={"before_commit": {"look": "tx"},
                                          "before_ack": {"look": "pending", "stream": a.key, "group": GROUP}}))

    # The same event in two entries.
    dup = ev("d-1", "kiwi", 5)
    b = Setup(ctx, srv, [entry(dup), entry(dup)])

    def duplicate(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        if b.stock() != {"kiwi": 5} or returned(record) != {"applied": 1, "duplicate": 1, "dead": 0} or b.pending():
            return Miss(f"returned {show(returned(record))}; stock {b.stock()}; {len(b.pending())} pending",
                        "The inbox row makes the second entry a duplicate: acknowledged, without effect.")
        return None

    add(Plan("the same event in two entries", "consume(…) over two entries of one event",
             "applied 1, duplicate 1, stock counted once, both acknowledged", duplicate, clauses=("6.duplicate",)),
        b.spec("the same event in two entries"))

    # Poison: not JSON, no body, an id applied before with another body; one good event.
    # Two ids applied before with another body: one whose stored body sorts before the new one, one after.
    good, clash, clash_after = ev("p-ok", "fig", 1), ev("p-clash", "fig", 9), ev("p-clash2", "fig", 1)
    poisons = [{"id": "p-1", "body": "not json"}, {"id": "p-2"}, entry(clash), entry(clash_after)]
    c = Setup(ctx, srv, [*poisons, entry(good)])
    c.db.setup(("INSERT INTO inbox(id, body, stream_id) VALUES ('p-clash', %s, '0-1')",
                (schema.canonical(ev("p-clash", "fig", 1)),)),
               ("INSERT INTO inbox(id, body, stream_id) VALUES ('p-clash2', %s, '0-2')",
                (schema.canonical(ev("p-clash2", "fig", 9)),)))

    def poison(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        dead = c.dead()
        found = [f.get("entry_id") for _i, f in dead]
        if found != c.ids[:len(poisons)]:
            return Miss(f"the dead-letter stream holds entries for {found}", "Each poison entry goes to "
                        "<stream>.dead, in order, with entry_id = its entry id.", clause="6.dead-letter")
        for (_i, fields), original in zip(dead, poisons, strict=True):
            try:
                raw = json.loads(fields.get("fields", ""))
            except ValueError:
                raw = None
            if raw != original or not fields.get("reason"):
                return Miss(f"a dead letter holds {show(fields)}", "Dead letters carry fields = the entry's raw "
                            "fields as JSON, and a reason.", clause="6.dead-letter")
        if c.pending() or c.stock() != {"fig": 1} or returned(record) != {"applied": 1, "duplicate": 0, "dead": 4}:
            return Miss(f"returned {show(returned(record))}; stock {c.stock()}; {len(c.pending())} pending",
                        "Dead letters are acknowledged too, and the good event is applied.", clause="6.dead-letter")
        acks = [h for h in record["observed"].get("hooks", []) if h["hook"] == "before_ack"]
        if [h["arg"] for h in acks] != c.ids:
            return Miss(f"before_ack was called for {[h['arg'] for h in acks]}", "before_ack runs before every "
                        "XACK, dead letters included.", clause="6.hooks")
        for h in acks[:len(poisons)]:
            if h["arg"] not in h.get("dead_for", []):
                return Miss(f"before_ack('{h['arg']}') ran before that entry reached the dead-letter stream",
                            DEAD_HINT, clause="6.dead-before-ack")
        return None

    add(Plan("poison entries", "consume(…) over a body that is not JSON, an entry without body, two ids applied "
             "with another body (one sorting before, one after), and a good event", "4 dead-lettered with their "
             "raw fields and a reason, then acknowledged; the good one applied", poison, clauses=("6.dead-letter", "6.dead-before-ack")),
        c.spec("poison entries", hooks={"before_ack": {"look": "pending", "stream": c.key, "group": GROUP}}))

    # The dead-letter stream refuses (its key holds a string): the poison must stay pending.
    d = Setup(ctx, srv, [{"id": "q-1", "body": "[]"}])
    with srv.judge_valkey() as judge:
        judge.set(d.key + ".dead", "not a stream")

    def refused(record: dict) -> Miss | None:
        if not d.pending():
            return Miss("the poison entry was acknowledged although it never reached the dead-letter stream",
                        DEAD_HINT)
        return raised_with("WRONGTYPE", "The dead-letter XADD's error propagates.")(record)

    add(Plan("the dead-letter stream refuses", "consume(…) over a poison entry when <stream>.dead is not a stream",
             "the error propagates; the entry is still pending", refused, clauses=("6.dead-before-ack",)),
        d.spec("the dead-letter stream refuses"))

    # before_commit fails: nothing applied, the entry still pending.
    e = Setup(ctx, srv, [entry(ev("f-1", "lime", 7))])

    def rolled_back(record: dict) -> Miss | None:
        miss = raised_with("the judge's before_commit fails", "Let before_commit's error propagate (the "
                           "transaction rolls back).")(record)
        if miss is not None:
            miss.clause = "6.one-transaction"
            return miss
        if not e.pending():
            return Miss("the entry was acknowledged although its transaction rolled back", ACK_HINT,
                        clause="6.commit-before-ack")
        if e.stock() or e.inbox():
            return Miss(f"after the rollback stock is {e.stock()} and the inbox holds {len(e.inbox())} row(s)", TX_HINT,
                        clause="6.one-transaction")
        return None

    add(Plan("before_commit fails", "consume(…, before_commit=<raises>)", "the error propagates; no inbox row, no "
             "stock; the entry still pending", rolled_back, clauses=("6.commit-before-ack", "6.one-transaction")),
        e.spec("before_commit fails", hooks={"before_commit": {"do": "raise"}}))

    # before_ack fails (the consumer dies there): applied, still pending.
    f = Setup(ctx, srv, [entry(ev("g-1", "lime", 7))])

    def still_pending(record: dict) -> Miss | None:
        miss = read_rules(f)
        if miss is not None:
            return miss
        miss = raised_with("the judge's before_ack fails", "Let before_ack's error propagate.")(record)
        if miss is not None:
            miss.clause = "6.hooks"
            return miss
        if f.stock() != {"lime": 7}:
            return Miss(f"stock is {f.stock()}", "Commit before before_ack.", clause="6.commit-before-ack")
        if not f.pending():
            return Miss("the entry is not pending although XACK never ran", NOACK_HINT, clause="6.no-noack")
        return None

    add(Plan("before_ack fails", "consume(…, before_ack=<raises>)", "the event applied; the entry still pending",
             still_pending, clauses=("6.no-noack", "6.commit-before-ack")),
        f.spec("before_ack fails", hooks={"before_ack": {"do": "raise"}}))

    # The consumer's own pending entries come first, then new ones, at most `count` in all: with its
    # own filling count, with fewer, and where count - k differs from count ^ k (a slip of the sum).
    for name, given, waiting, count in (("the consumer's own pending entries", 2, 2, 3),
                                        ("its own pending entries fill count", 2, 2, 2),
                                        ("one own pending entry, count 4", 1, 5, 4)):
        own = [ev(f"o-{i}", "plum", i) for i in range(1, given + waiting + 1)]
        g = Setup(ctx, srv, [entry(x) for x in own[:given]])
        with srv.judge_valkey() as judge:
            judge.xreadgroup(GROUP, "c1", {g.key: ">"}, count=given)  # delivered before a "restart"
            g.ids += [judge.xadd(g.key, entry(x)) for x in own[given:]]
        want = [x["id"] for x in own[:count]]

        def own_first(record: dict, g=g, given=given, count=count, want=want) -> Miss | None:
            miss = first_error(record)
            if miss is not None:
                return miss
            got = [row[0] for row in g.inbox()]
            if got[:given] != want[:given]:
                return Miss(f"applied {got}: the {given} entries this consumer was given before are not first",
                            PEL_HINT, clause="6.own-pending-first")
            if got != want:
                return Miss(f"applied {got} with count={count} ({given} of its own pending)", "At most `count` "
                            "entries in all: its own pending ones first, then up to count minus those new ones.",
                            clause="6.count-block")
            return None

        add(Plan(name, f"consume(…, 'c1', {count}, 0) when c1 was given {given} entries before and {waiting} new "
                 "ones wait", f"{', '.join(want[:given])} (its own) first, then new ones: {count} in all", own_first,
                 clauses=("6.own-pending-first", "6.count-block")),
            g.spec(name, count=count))

    # Nothing to read: block_ms 0 returns at once, 300 waits.
    h = Setup(ctx, srv, [])

    def waited(low: float, high: float):
        def check(record: dict) -> Miss | None:
            miss = first_error(record) or read_rules(h)
            if miss is not None:
                return Miss(miss.got, miss.hint or "block_ms 0 does not wait: never send BLOCK 0, which waits "
                            "forever.")
            seconds = record["outcome"].get("seconds", 0)
            if not low <= seconds <= high or returned(record) != {"applied": 0, "duplicate": 0, "dead": 0}:
                return Miss(f"returned {show(returned(record))} after {seconds:.2f} s",
                            "block_ms > 0 waits that long for new entries; 0 does not wait (never BLOCK 0).")
            return None
        return check

    add(Plan("nothing to read, block_ms 0", "consume(…, 5, 0) on an empty stream", "zeros, at once",
             waited(0, 1.0), clauses=("6.count-block",)), h.spec("nothing to read, block_ms 0", count=5, block_ms=0))
    add(Plan("nothing to read, block_ms 300", "consume(…, 5, 300) on an empty stream", "zeros after about 0.3 s",
             waited(0.25, 3.0), clauses=("6.count-block",)),
        h.spec("nothing to read, block_ms 300", count=5, block_ms=300, consumer="c2"))
    return run(ctx, plans, specs)
