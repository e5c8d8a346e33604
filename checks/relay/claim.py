"""Step 3 of lab `relay`: claim — what is due, in seq order, with tokens from the one counter;
the argument ranges; another publisher between any two statements. The race of two real
processes is in `claim_race.py`."""

from __future__ import annotations

import string
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay.claim_race import race
from checks.relay.common import BOOL_HINT, ONE_TX_HINT, between_statements, calls_on, refused, value
from checks.relay.outbox import (
    copies,
    counter,
    make_outbox,
    name,
    row,
    row_is,
    rows_of,
    same_number,
    shown,
    unchanged,
)
from checks.relay.witness import no_open_transaction
from labkit.judge.expect import Miss, Plan, both, describe, returns, under, value_of
from labkit.judge.run import StepContext, together
from labkit.judge.verdict import Case
from labkit.values import encode, same, show


def check_claim(ctx: StepContext) -> list[Case]:
    racing = ctx.apart("race")
    cases, raced = together([lambda: _claim_cases(ctx), lambda: race(racing)])
    return cases + raced


def _claim_cases(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000)) + rng.choice((0.0, 0.25, 0.5))
    lease = float(rng.choice((15, 30, 45)))
    start = rng.randint(30, 90)  # the counter is ahead of every fence left in the file
    owner = rng.choice(("B", "publisher-b", "relay@host-2"))
    layout = [
        ("due", row(name(rng, "due"), due=now - rng.randint(1, 50))),
        ("not-yet-due", row(name(rng, "later"), due=now + rng.randint(1, 50), attempts=1, last_error="Transient: x")),
        ("live", row(name(rng, "live"), state="leased", owner="A", lease_until=now + 5, fence=start - 5, attempts=1)),
        ("expired", row(name(rng, "expired"), state="leased", owner="A", lease_until=now - 1, fence=start - 4,
                       attempts=1)),
        ("sent", row(name(rng, "sent"), state="sent", fence=start - 6, attempts=1)),
        ("quarantined", row(name(rng, "quar"), state="quarantined", fence=start - 7, attempts=3,
                           last_error="PermanentError: gone")),
        ("due-now", row(name(rng, "edge"), due=now)),
        ("expires-now", row(name(rng, "edge"), state="leased", owner="A", lease_until=now, fence=start - 3,
                           attempts=2)),
    ]
    main = make_outbox(ctx.path("claim.db"), [r for _, r in layout], counter=start)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    taken = ["due", "expired", "due-now", "expires-now"]
    expected = [{"seq": seq[k], "id": layout[seq[k] - 1][1]["id"], "body": layout[seq[k] - 1][1]["body"],
                 "fence": start + i + 1} for i, k in enumerate(taken)]
    before = rows_of(main)

    plans: list[Plan] = []
    specs: list[dict] = []

    def add(plan: Plan, db: Path, *args) -> None:
        plans.append(plan)
        specs.append({"name": plan.name, "fn": "claim", "db": str(db), "args": [value(a) for a in args]})

    def claimed_rows(record: dict) -> Miss | None:
        after = rows_of(main)
        for label, why, clause in (
                ("not-yet-due", "a pending row is not claimed before its due time (`due <= now`)", "3.due-pending"),
                ("live", "a live lease (lease_until > now) is never taken: its owner is still working on it",
                 "3.expired-lease"),
                ("sent", "sent rows are never claimed", "3.skip-done"),
                ("quarantined", "quarantined rows wait for a redrive, they are never claimed", "3.skip-done")):
            if after[seq[label]] != before[seq[label]]:
                return Miss(f"row {seq[label]} ({label}) became {shown(after[seq[label]])}", why + ".", clause=clause)
        for label in taken:
            r, want = after[seq[label]], next(e for e in expected if e["seq"] == seq[label])
            why = {"due": ("3.due-pending", "a pending row due before now is claimed"),
                  "due-now": ("3.due-pending", "`due <= now`: a row due exactly now is claimed"),
                  "expired": ("3.expired-lease", "a lease that ran out is claimed again (its owner is presumed "
                                                 "dead): `state = 'leased' AND lease_until <= now`"),
                  "expires-now": ("3.expired-lease", "`lease_until <= now`: a lease ending exactly now has run out"),
                  }[label]
            if r["state"] != "leased" or r["owner"] != owner:
                return Miss(f"row {seq[label]} ({label}) is {shown(r)}", why[1] + ".", clause=why[0])
            if r["fence"] != want["fence"]:
                return Miss(f"row {seq[label]} got token {r['fence']}; fence_counter.last was {start} before",
                           "Take each token from fence_counter: last + 1, stored back, one per claimed row, in "
                           "seq order. Never a per-row `fence + 1`, never a number kept in Python.",
                           clause="3.global-counter")
            if not same_number(r["lease_until"], now + lease) or r["attempts"] != before[seq[label]]["attempts"] + 1:
                return Miss(f"row {seq[label]} is {shown(r)}",
                           f"Set lease_until = now + lease ({now + lease:g}) and attempts = attempts + 1.",
                           clause="3.row-update")
        if counter(main) != [(1, start + len(taken))]:
            return Miss(f"fence_counter is {counter(main)} after {len(taken)} claims from {start}",
                       "Store each token back into fence_counter.last.", clause="3.global-counter")
        return None

    def returned(expect: list[dict]):
        def check(record: dict) -> Miss | None:
            if record["outcome"]["kind"] == "returned":
                got = value_of(record)
                if isinstance(got, list) and [g.get("seq") for g in got if isinstance(g, dict)] == \
                       sorted(e["seq"] for e in expect) and not same(got, expect):
                   return Miss(f"returned {show(got, 300)}", "Each dict has exactly seq, id, body and fence: the "
                                                             "token it claimed the row with.")
            return returns(expect, "Return the claimed rows as dicts {seq, id, body, fence}, in seq order.")(record)

        return check

    add(Plan("claims what is due, in seq order, with new tokens", f"claim(con, {owner!r}, {now:g}, {lease:g}, 16)",
             f"rows {[seq[k] for k in taken]} with tokens {start + 1}–{start + len(taken)}; not the live lease, "
             "the row not yet due, the sent or the quarantined row",
             both(claimed_rows, under("3.returns-dicts", returned(expected)),
                 under("3.one-transaction", no_open_transaction)),
             clauses=("3.due-pending", "3.expired-lease", "3.skip-done", "3.global-counter", "3.row-update",
                     "3.returns-dicts")), main, owner, now, lease, 16)

    # limit and order: 20 due rows
    many = [row(name(rng, "m")) for _ in range(20)]  # ids in random order: ORDER BY id is not seq order
    limited = make_outbox(ctx.path("limit.db"), many, counter=start)

    def leased_by(owner_: str, seqs: list[int], fences: list[int], untouched: list[int]):
        def check(record: dict) -> Miss | None:
            after = rows_of(limited)
            mine = [s for s, r in after.items() if r["state"] == "leased" and r["owner"] == owner_]
            if mine != seqs:
                return Miss(f"rows {mine} are leased by {owner_!r} now", "Claim at most `limit` rows, the first due "
                                                                        "ones in seq order: `ORDER BY seq LIMIT ?`.")
            if [after[s]["fence"] for s in seqs] != fences:
                return Miss(f"their tokens are {[after[s]['fence'] for s in seqs]}",
                           "One new token per claimed row, increasing in seq order.", clause="3.tokens-increase")
            if any(after[s]["state"] != "pending" for s in untouched):
                return Miss(f"rows {[s for s in untouched if after[s]['state'] != 'pending']} were claimed too",
                           "Claim at most `limit` rows.")
            return None

        return check

    add(Plan("limit 16 of 20", f"claim(con, {owner!r}, {now:g}, {lease:g}, 16) on 20 due rows",
             f"rows 1–16, tokens {start + 1}–{start + 16}",
             under("3.seq-order-limit", leased_by(owner, list(range(1, 17)), list(range(start + 1, start + 17)), [18])),
             clauses=("3.seq-order-limit",)), limited, owner, now, lease, 16)
    add(Plan("limit 1, then the next claim continues the tokens", f"claim(con, 'C', {now:g}, {lease:g}, 1) next",
             f"row 17 with token {start + 17}; rows 18–20 still pending",
             both(under("3.seq-order-limit", leased_by("C", [17], [start + 17], [18, 19, 20])),
                 under("3.tokens-increase", returns([{"seq": 17, "id": many[16]["id"], "body": many[16]["body"],
                                                      "fence": start + 17}]))),
             clauses=("3.seq-order-limit", "3.tokens-increase")), limited, "C", now, lease, 1)

    # nothing due: [] and no token
    idle = make_outbox(ctx.path("idle.db"), [row(name(rng, "later"), due=now + 1),
                                            row(name(rng, "busy"), state="leased", owner="A", lease_until=now + 1,
                                                fence=start)], counter=start)
    idle_before = stores.fingerprint(idle)
    add(Plan("nothing is due", f"claim(con, {owner!r}, {now:g}, {lease:g}, 16) when nothing is claimable",
             "[]; fence_counter unchanged",
             both(under("3.empty-no-token", returns([], "Nothing is due: the pending row is due later (`due <= "
                                                       "now`) and the leased row's lease is live (`lease_until <= "
                                                       "now`). Return [].")),
                 under("3.empty-no-token", unchanged(idle, idle_before, "A claim that finds nothing takes no token: "
                                                                        "take tokens only for rows you claim.")),
                 under("3.one-transaction", no_open_transaction)),
             clauses=("3.empty-no-token",)), idle, owner, now, lease, 16)

    # arguments: boundaries that pass, and values that must be refused with nothing changed
    template = make_outbox(ctx.path("one.db"), [row(name(rng, "one"))], counter=start)
    good = [
        ("owner of 1 character", "B", now, lease, 1, "3.owner-range"),
        ("owner of 64 characters", "".join(rng.choices(string.ascii_letters + string.digits + " .:@/-", k=63)) + "~",
         now, lease, 1, "3.owner-range"),
        ("owner U+0020 (a space)", " ", now, lease, 1, "3.owner-range"),
        ("owner U+007E (~)", "~", now, lease, 1, "3.owner-range"),
        ("now 0", owner, 0, lease, 1, "3.now-range"),
        ("now an int", owner, int(now), lease, 1, "3.now-range"),
        ("lease 3600", owner, now, 3600, 1, "3.lease-range"),
        ("lease 3600.0", owner, now, 3600.0, 1, "3.lease-range"),
        ("a tiny lease", owner, now, 1e-9, 1, "3.lease-range"),
        ("limit 1", owner, now, lease, 1, "3.limit-range"),
        ("limit 16", owner, now, lease, 16, "3.limit-range"),
    ]
    paths = copies(template, ctx.workdir, [f"good-{i}" for i in range(len(good))])
    for (label, o, n, le, li, clause), path in zip(good, paths, strict=True):
        add(Plan(f"{label} is accepted", f"claim(con, {show(o, 40)}, {n!r}, {le!r}, {li!r})",
                 f"the row, with token {start + 1}",
                 both(under(clause, returns([{"seq": 1, "id": rows_of(path)[1]["id"], "body": rows_of(path)[1]["body"],
                                             "fence": start + 1}], "This value is inside the contract's range.")),
                     under(clause, row_is(path, 1, "The claim must happen.", state="leased",
                                          lease_until=float(n + le)))),
                 clauses=(clause,)), path, o, n, le, li)
    bad = [
        ("owner ''", "", now, lease, 1, "owner has 1-64 characters.", "3.owner-range"),
        ("owner of 65 characters", "b" * 65, now, lease, 1, "owner has at most 64 characters.", "3.owner-range"),
        ("owner with U+001F", "publisher\x1f", now, lease, 1,
         "owner characters run from U+0020 (space) to U+007E (~): control characters are refused.", "3.owner-range"),
        ("owner with U+007F", "publisher\x7f", now, lease, 1,
         "U+007F (DEL) is a control character, outside U+0020–U+007E.", "3.owner-range"),
        ("owner with a newline", "pub\nlisher", now, lease, 1, "A newline is not printable ASCII.", "3.owner-range"),
        ("owner not ASCII", "publisher-é", now, lease, 1, "`str.isprintable()` accepts é: compare with ' ' and '~'.",
         "3.owner-range"),
        ("owner not a str", 7, now, lease, 1, "owner must be a str.", "3.owner-range"),
        ("owner True", True, now, lease, 1, "owner must be a str: True is a bool.", "3.owner-range"),
        ("now -1", owner, -1, lease, 1, "now is at least 0.", "3.now-range"),
        ("now -0.001", owner, -0.001, lease, 1, "now is at least 0.", "3.now-range"),
        ("now nan", owner, float("nan"), lease, 1, "nan compares false with everything: test `math.isfinite`.",
         "3.now-range"),
        ("now inf", owner, float("inf"), lease, 1, "now must be finite: `math.isfinite`.", "3.now-range"),
        ("now a str", owner, "100", lease, 1, "now must be an int or a float.", "3.now-range"),
        ("now True", owner, True, lease, 1, BOOL_HINT, "3.bool-not-number"),
        ("lease 0", owner, now, 0, 1, "lease must be more than 0.", "3.lease-range"),
        ("lease -1", owner, now, -1, 1, "lease must be more than 0.", "3.lease-range"),
        ("lease 3600.0001", owner, now, 3600.0001, 1, "lease is at most 3600.", "3.lease-range"),
        ("lease nan", owner, now, float("nan"), 1, "nan compares false with everything: test `math.isfinite`.",
         "3.lease-range"),
        ("lease inf", owner, now, float("inf"), 1, "lease must be finite.", "3.lease-range"),
        ("lease True", owner, now, True, 1, BOOL_HINT, "3.bool-not-number"),
        ("limit 0", owner, now, lease, 0, "limit ranges from 1 to 16.", "3.limit-range"),
        ("limit 17", owner, now, lease, 17, "limit ranges from 1 to 16.", "3.limit-range"),
        ("limit 2.0", owner, now, lease, 2.0, "limit must be an int.", "3.limit-range"),
        ("limit True", owner, now, lease, True, BOOL_HINT, "3.bool-not-number"),
    ]
    paths = copies(template, ctx.workdir, [f"bad-{i}" for i in range(len(bad))])
    for (label, o, n, le, li, hint, clause), path in zip(bad, paths, strict=True):
        add(Plan(f"{label} is refused", f"claim(con, {show(o, 40)}, {n!r}, {le!r}, {li!r})",
                 "ValueError; nothing changed", refused(hint, clause, path, stores.fingerprint(path)), hint,
                 clauses=(clause,)), path, o, n, le, li)
    more = _claim_between_statements(ctx, now, lease, start)
    return calls_on(ctx, plans + more[0], specs + more[1])


def _claim_between_statements(ctx: StepContext, now: float, lease: float, start: int) -> tuple[list[Plan], list[dict]]:
    """A's claim of two due rows while publisher B claims the first one between any two of its
    statements; each statement failing; a Ctrl-C after each."""
    # ids in seq order: this case is about the transaction, under every seed, not about the order
    rows = [row(i) for i in sorted(name(ctx.rng, "due") for _ in range(2))]
    template = make_outbox(ctx.path("claim-boundaries.db"), rows, counter=start)
    b_claims = [["UPDATE fence_counter SET last = last + 1 WHERE id = 1", []],
                ["UPDATE outbox SET state = 'leased', owner = 'B', lease_until = ?, attempts = attempts + 1, "
                 "fence = (SELECT last FROM fence_counter WHERE id = 1) WHERE seq = 1", [encode(now + lease)]]]

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        after = rows_of(path)
        mine = [1, 2] if not landed else [2]
        want = [{"seq": s, "id": rows[s - 1]["id"], "body": rows[s - 1]["body"], "fence": start + i + 1 + landed}
                for i, s in enumerate(mine)]
        got = value_of({"outcome": outcome}) if outcome.get("kind") == "returned" else None
        owners = [(r["owner"], r["fence"]) for r in after.values()]
        expect = [("B", start + 1), ("A", start + 2)] if landed else [("A", start + 1), ("A", start + 2)]
        fences = [f for _, f in owners if f]
        if landed and len(set(fences)) < len(fences):
            return Miss(f"claim {describe(outcome)}; the rows are now {[shown(r) for r in after.values()]}: two "
                       "claims took the same token", "Read and store fence_counter inside the claim's BEGIN "
                       "IMMEDIATE transaction: a counter read before it is stale once another publisher claims, and "
                       "tokens must be strictly increasing across every claim.", clause="3.tokens-increase")
        if got != want or owners != expect:
            return Miss(f"claim {describe(outcome)}; the rows are now {[shown(r) for r in after.values()]}"
                       + (": both publishers hold row 1" if landed and got and any(
                           isinstance(g, dict) and g.get("seq") == 1 for g in got) else ""), ONE_TX_HINT)
        return None

    return between_statements(ctx, "claim", f"claim(con, 'A', {now:g}, {lease:g}, 16) on two due rows", template,
                             [value("A"), value(now), value(lease), value(16)], "3.one-transaction", b_claims,
                             judge, "both rows, or only row 2 with a larger token if B claimed row 1 first",
                             clauses=("3.tokens-increase",))
