"""Lab `pipeline`, step 7: reclaim — idle entries of a dead consumer, entries not idle enough,
entries delivered too often, more idle entries than one page, a dead-letter stream that refuses.

The judge sets how long an entry has been idle and how often it was delivered itself
(`XCLAIM … IDLE ms RETRYCOUNT n`), so no case waits."""

from __future__ import annotations

import json

from checks.pipeline.common import call, first_error, raised_with, returned, run, servers
from checks.pipeline.consume import GROUP, entry, ev
from labkit.judge.expect import Miss, Plan
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import show

COUNT_HINT = ("Read each idle entry's delivery count from XPENDING (`times_delivered`): more than max_deliveries "
              "→ add it to `<stream>.dead` and acknowledge it. Claimed again instead, a poison entry kills every "
              "consumer that takes it, forever.")
PAGE_HINT = ("Follow XAUTOCLAIM's cursor until it comes back as 0-0 (and XPENDING's range to its end): one call "
             "returns at most COUNT entries, and the rest stay with the dead consumer.")
DEAD_HINT = ("Add the entry to `<stream>.dead` first, acknowledge it only after that XADD succeeded: acknowledged "
             "first, a failing dead-letter XADD loses it.")
OLD = 60_000  # ms an "old" entry has been idle; min_idle_ms is 30 000


class Stream:
    def __init__(self, ctx: StepContext, srv) -> None:
        self.srv, self.user = srv, srv.user(ctx.step)
        self.key = self.user.prefix + "orders"
        with srv.judge_valkey() as judge:
            judge.xgroup_create(self.key, GROUP, id="0", mkstream=True)

    def deliver(self, count: int, consumer: str, idle: int | None = None, times: int | None = None,
                prefix: str = "r") -> list[str]:
        """`count` new entries delivered to `consumer`, then made `idle` ms idle and delivered `times` times."""
        with self.srv.judge_valkey() as judge:
            with judge.pipeline(transaction=False) as pipe:  # the same commands, one round trip
                for i in range(count):
                    pipe.xadd(self.key, entry(ev(f"{prefix}-{i}")))
                ids = pipe.execute()
            judge.xreadgroup(GROUP, consumer, {self.key: ">"}, count=count)
            if idle is not None or times is not None:
                extra = [*(["IDLE", idle] if idle is not None else []), *(["RETRYCOUNT", times] if times else [])]
                with judge.pipeline(transaction=False) as pipe:
                    for start in range(0, len(ids), 100):
                        pipe.execute_command("XCLAIM", self.key, GROUP, consumer, 0, *ids[start:start + 100], *extra,
                                             "JUSTID")
                    pipe.execute()
        return ids

    def owners(self) -> dict[str, str]:
        with self.srv.judge_valkey() as judge:
            found, start = {}, "-"
            while True:
                page = judge.xpending_range(self.key, GROUP, min=start, max="+", count=500)
                found.update({p["message_id"]: p["consumer"] for p in page})
                if len(page) < 500:
                    return found
                start = "(" + page[-1]["message_id"]

    def dead(self) -> list:
        with self.srv.judge_valkey() as judge:
            return judge.xrange(self.key + ".dead") if judge.type(self.key + ".dead") == "stream" else []

    def spec(self, name: str, consumer: str = "c2", min_idle: int = 30_000, most: int = 5) -> dict:
        return {"name": name, "valkey": self.user.kwargs,
                "ops": [call("reclaim", "$r", self.key, GROUP, consumer, min_idle, most)]}


def check_reclaim(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    plans, specs = [], []

    a = Stream(ctx, srv)
    old = a.deliver(3, "dead-c", idle=OLD, prefix="old")
    fresh = a.deliver(1, "alive-c", prefix="fresh")

    def takes_idle(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got = returned(record)
        owners = a.owners()
        if owners.get(fresh[0]) != "alive-c":
            return Miss("an entry idle for less than min_idle_ms was taken from its live consumer",
                        "Pass min_idle_ms to XAUTOCLAIM: only entries idle at least that long are taken.")
        if not isinstance(got, dict) or sorted(got.get("claimed") or []) != sorted(old) or got.get("dead") != 0:
            return Miss(f"returned {show(got)}", "Return {'claimed': [the entry ids taken over], 'dead': n}: "
                        "here the three entries idle for 60 s.")
        if any(owners.get(i) != "c2" for i in old):
            return Miss(f"the idle entries now belong to {[owners.get(i) for i in old]}", "Take them over with "
                        "XAUTOCLAIM for this consumer.")
        return None

    plans.append(Plan("idle entries of a dead consumer", "reclaim(r, stream, 'g', 'c2', 30000, 5) with 3 entries "
                      "idle 60 s and 1 just delivered", "the 3 idle ones claimed by c2; the fresh one left",
                      takes_idle, clauses=("7.takes-idle",)))
    specs.append(a.spec(plans[-1].name))

    b = Stream(ctx, srv)
    # the entry to keep comes first: a walk that stops at it never reaches the poison after it
    edge = b.deliver(1, "dead-c", idle=OLD, times=5, prefix="edge")
    poison = b.deliver(1, "dead-c", idle=OLD, times=6, prefix="poison")

    def counted(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got, owners, dead = returned(record), b.owners(), b.dead()
        if edge[0] in [f.get("entry_id") for _i, f in dead]:
            return Miss("the entry delivered exactly 5 times was dead-lettered with max_deliveries=5",
                        "Only a count greater than max_deliveries is dead; 5 with max_deliveries=5 is claimed.")
        if poison[0] in owners or [f.get("entry_id") for _i, f in dead] != poison:
            return Miss(f"the entry delivered 6 times is {'still pending' if poison[0] in owners else 'gone'}, "
                        f"the dead-letter stream holds {[f.get('entry_id') for _i, f in dead]}", COUNT_HINT)
        fields = dead[0][1]
        try:
            raw = json.loads(fields.get("fields", ""))
        except ValueError:
            raw = None
        if raw != entry(ev("poison-0")) or not fields.get("reason"):
            return Miss(f"its dead letter holds {show(fields)}", "Dead letters carry entry_id, the raw fields as "
                        "JSON, and a reason.")
        if owners.get(edge[0]) != "c2" or got != {"claimed": edge, "dead": 1}:
            return Miss(f"returned {show(got)}; the entry delivered exactly 5 times belongs to {owners.get(edge[0])}",
                        "Only a count greater than max_deliveries is dead; 5 with max_deliveries=5 is claimed.")
        return None

    plans.append(Plan("an entry delivered too often", "reclaim(r, stream, 'g', 'c2', 30000, 5) with idle entries "
                      "delivered 5 and then 6 times", "the 6-times one dead-lettered and acknowledged; the 5-times one "
                      "claimed; {'claimed': [it], 'dead': 1}", counted, clauses=("7.delivery-count",)))
    specs.append(b.spec(plans[-1].name))

    c = Stream(ctx, srv)
    many = c.deliver(250, "dead-c", idle=OLD, prefix="many")

    def all_pages(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got, owners = returned(record), c.owners()
        mine = sum(1 for i in many if owners.get(i) == "c2")
        claimed = got.get("claimed") if isinstance(got, dict) else None
        if mine != 250 or not isinstance(claimed, list) or sorted(claimed) != sorted(many):
            return Miss(f"{mine} of 250 idle entries taken over; {len(claimed or [])} returned", PAGE_HINT)
        return None

    plans.append(Plan("250 idle entries", "reclaim(r, stream, 'g', 'c2', 30000, 5) with 250 entries idle 60 s",
                      "all 250 claimed by c2 and returned", all_pages, clauses=("7.all-pages",)))
    specs.append(c.spec(plans[-1].name))

    d = Stream(ctx, srv)
    d.deliver(250, "dead-c", idle=OLD, times=9, prefix="deadly")

    def all_dead(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        got, owners = returned(record), d.owners()
        if owners or len(d.dead()) != 250 or not isinstance(got, dict) or got.get("dead") != 250:
            return Miss(f"returned {show(got)}; {len(d.dead())} dead letters; {len(owners)} still pending",
                        "Follow XPENDING's range to its end (start after the last id of each page): " + COUNT_HINT)
        return None

    plans.append(Plan("250 entries delivered too often", "reclaim(r, stream, 'g', 'c2', 30000, 5) with 250 idle "
                      "entries delivered 9 times", "all 250 dead-lettered and acknowledged", all_dead,
                      clauses=("7.all-pages", "7.delivery-count")))
    specs.append(d.spec(plans[-1].name))

    e = Stream(ctx, srv)
    stuck = e.deliver(1, "dead-c", idle=OLD, times=9, prefix="stuck")
    with srv.judge_valkey() as judge:
        judge.set(e.key + ".dead", "not a stream")

    def kept(record: dict) -> Miss | None:
        if stuck[0] not in e.owners():
            return Miss("the entry was acknowledged although it never reached the dead-letter stream", DEAD_HINT,
                        clause="7.delivery-count")
        miss = raised_with("WRONGTYPE", "The dead-letter XADD's error propagates.")(record)
        if miss is not None:
            miss.clause = "7.delivery-count"
        return miss

    plans.append(Plan("the dead-letter stream refuses", "reclaim(…) over an entry delivered 9 times when "
                      "<stream>.dead is not a stream", "the error propagates; the entry still pending", kept,
                      clauses=("7.delivery-count",)))
    specs.append(e.spec(plans[-1].name))
    return run(ctx, plans, specs)
