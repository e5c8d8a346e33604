"""Step 2 of lab `relay`: enqueue — one pending row per new event, False for a repeat and
Conflict for other content (whatever the row's state), refusals, and the insert with another
publisher, a failure or a Ctrl-C between any two statements."""

from __future__ import annotations

import json
import string
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay.common import BOOL_HINT, between_statements, calls_on, value
from checks.relay.outbox import DEFAULTS, event, make_outbox, name, row, rows_of, shown
from checks.relay.witness import no_open_transaction
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    describe,
    is_module_exception,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def check_enqueue(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    db = make_outbox(ctx.path("outbox.db"), audit=False)
    first = event(name(rng, "z"), name(rng, "sku", 3), rng.randint(1, 1000))
    second = event(name(rng, "a"), first["sku"], rng.randint(1, 1000))
    changed = {**first, "qty": first["qty"] % 1000 + 1}
    # Other content that sorts before and after the stored body: a comparison other than == shows.
    before_it, after_it = {**first, "sku": "a" + first["sku"]}, {**first, "sku": "z" + first["sku"]}
    boom = event(name(rng, "boom"), "snack", 3)
    stores.execute(db, f"""CREATE TRIGGER outbox_full BEFORE INSERT ON outbox
        WHEN NEW.id = '{boom["id"]}' BEGIN SELECT RAISE(ABORT, 'outbox is full'); END;""")
    invalid = [
        ("qty is True", {**event(name(rng, "bool")), "qty": True}, BOOL_HINT),
        ("qty is 0", event(name(rng, "zero"), qty=0), "Call validate_event first: qty ranges from 1 to 1000."),
        ("qty is 1001", event(name(rng, "big"), qty=1001), "Call validate_event first: qty ranges from 1 to 1000."),
        ("id has 65 characters", event("a" * 65), "Call validate_event first: id has at most 64 characters."),
        ("id is empty", event(""), "Call validate_event first: id has 1-64 characters."),
        ("id starts with a dash", event("-" + name(rng, "dash")), "Call validate_event first: the first character "
                                                                 "is a letter or a digit."),
        ("id has a space", event("snack " + name(rng, "x")), "Call validate_event first: letters, digits, '.', '_' "
                                                            "and '-' only."),
        ("sku has 33 characters", event(name(rng, "long-sku"), "s" * 33), "Call validate_event first: sku has at most "
                                                                        "32 characters."),
        ("an extra key", {**event(name(rng, "extra")), "note": "x"}, "Call validate_event first: exactly id, sku and qty."),
        ("not a dict", [("id", "not-a-dict")], "Call validate_event first: an event is a dict."),
        ("a missing key", {"id": name(rng, "nosku"), "qty": 3}, "Call validate_event first: all three keys are "
                                                               "required (a ValueError, not a KeyError)."),
    ]

    def ids() -> list[str]:
        return [r["id"] for r in rows_of(db).values()]

    def saved(e: dict):
        def check(record: dict) -> Miss | None:
            mine = [r for r in rows_of(db).values() if r["id"] == e["id"]]
            if len(mine) != 1:
                return Miss(f"the outbox has {len(mine)} rows for {e['id']}", "Insert one row per new event.")
            r = mine[0]
            if r["body"] != stores.canonical(e):
                return Miss(f"body is {r['body']!r}", "Store the canonical body: `canonical(event)`.")
            got = {k: r[k] for k in DEFAULTS}
            if got != DEFAULTS:
                return Miss(f"the new row is {shown(r)}", f"A new row is pending, due at once, never claimed: "
                                                         f"leave the defaults {DEFAULTS}.")
            return None

        return check

    def nothing_for(event_id: str, hint: str):
        def check(record: dict) -> Miss | None:
            if event_id in ids():
                return Miss(f"a row for {event_id} was written", hint)
            return None

        return check

    def kept_body(record: dict) -> Miss | None:
        mine = [r for r in rows_of(db).values() if r["id"] == first["id"]]
        if len(mine) != 1 or mine[0]["body"] != stores.canonical(first):
            return Miss("the first event's row was changed or duplicated", "A conflict changes nothing.")
        return None

    def seq_order(record: dict) -> Miss | None:
        if [i for i in ids() if i in (first["id"], second["id"])] != [first["id"], second["id"]]:
            return Miss(f"the outbox order is {ids()}", "Let seq (AUTOINCREMENT) number rows as they are enqueued.")
        return None

    def original_error(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or "outbox is full" not in outcome.get("message", ""):
            return Miss(describe(outcome), "Re-raise the original sqlite3 error, don't wrap it.")
        return None

    plans = [
        Plan("a new event", f"enqueue(con, {show(first)})", "True; one pending row with the canonical body",
             both(under("2.new-pending", returns(True)), under("2.one-transaction", no_open_transaction),
                 under("2.new-pending", saved(first))), clauses=("2.new-pending", "2.one-transaction")),
        Plan("the same event again", f"enqueue(con, {show(first)})", "False; nothing changes",
             both(under("2.same-false", returns(False, "An identical repeat is not an error: return False.")),
                 under("2.one-transaction", no_open_transaction), under("2.same-false", kept_body)),
             clauses=("2.same-false",)),
        Plan("same id, other content", f"enqueue(con, {show(changed)})", "Conflict; nothing changes",
             both(under("2.conflict", is_module_exception("Conflict", "Same id with another body → raise Conflict.")),
                 under("2.one-transaction", no_open_transaction), under("2.conflict", kept_body)),
             clauses=("2.conflict",)),
    ]
    for label, other in (("same id, content that sorts first", before_it),
                        ("same id, content that sorts last", after_it)):
        plans.append(Plan(label, f"enqueue(con, {show(other)})", "Conflict; nothing changes",
                         both(under("2.conflict", is_module_exception("Conflict", "Compare the stored body with the "
                                                                                  "new one for equality: any other "
                                                                                  "body → Conflict.")),
                              under("2.conflict", kept_body)), clauses=("2.conflict",)))
    args = [first, first, changed, before_it, after_it]
    for label, bad, hint in invalid:
        plans.append(Plan(label, f"enqueue(con, {show(bad, 70)})", "ValueError; nothing written",
                         both(under("2.validate", raises("ValueError", hint)),
                              under("2.validate", nothing_for(bad["id"] if isinstance(bad, dict) else "not-a-dict", hint))),
                         clauses=("2.validate",)))
        args.append(bad)
    shortest = event(rng.choice(string.ascii_letters + string.digits), "s" * 32, 1)
    longest = event("L" + "".join(rng.choices(string.ascii_letters + string.digits + "._-", k=63)), "k", 1000)
    for label, good in (("id of one character, sku of 32, qty 1", shortest),
                       ("id has 64 characters, qty 1000", longest)):
        plans.append(Plan(label, f"enqueue(con, {show(good, 90)})", "True; a pending row",
                         both(under("2.validate", returns(True, "Lab 01's rules allow this event.")),
                              under("2.new-pending", saved(good))), clauses=("2.validate", "2.new-pending")))
        args.append(good)
    plans += [
        Plan("a second event", f"enqueue(con, {show(second)})", "True; after the first in seq order",
             both(under("2.new-pending", returns(True)), under("2.new-pending", seq_order)),
             clauses=("2.new-pending",)),
        Plan("the insert fails", f"enqueue(con, {show(boom)}) with a trigger that aborts the insert",
             "the original IntegrityError; no row; no open transaction",
             both(under("2.one-transaction", original_error), under("2.one-transaction", no_open_transaction),
                 under("2.one-transaction", nothing_for(boom["id"], TRANSACTION_HINT))),
             clauses=("2.one-transaction",)),
    ]
    args += [second, boom]
    specs = [{"name": p.name, "fn": "enqueue", "db": str(db), "args": [value(a)]} for p, a in zip(plans, args, strict=True)]
    more_plans, more_specs = _enqueue_in_every_state(ctx)
    return calls_on(ctx, plans + more_plans, specs + more_specs)


def _enqueue_in_every_state(ctx: StepContext) -> tuple[list[Plan], list[dict]]:
    """A repeat and a conflict against a row in each state; a value json cannot write; and the
    insert with another publisher, a failure or a Ctrl-C between any two statements."""
    rng = ctx.rng
    states = {"pending": {}, "leased": {"owner": "A", "lease_until": 5000.0, "fence": 7, "attempts": 1},
              "sent": {"fence": 6, "attempts": 1},
              "quarantined": {"fence": 5, "attempts": 3, "last_error": "PermanentError: gone"}}
    rows = [row(name(rng, state[:4]), qty=rng.randint(1, 1000), state=state, **extra) for state, extra in states.items()]
    db = make_outbox(ctx.path("states.db"), rows, counter=9)
    before = rows_of(db)
    plans, specs = [], []
    hint = ("Look for the id among all rows, whatever their state: once the row has moved on (leased, sent, "
            "quarantined) a repeat is still the same event, and the UNIQUE id makes a second INSERT fail. Never "
            "rewrite the row (no INSERT OR REPLACE): its state is the publishers' business.")

    def kept(seq: int):
        def check(record: dict) -> Miss | None:
            if rows_of(db).get(seq) != before[seq]:
                return Miss(f"row {seq} ({before[seq]['state']}) became {shown(rows_of(db).get(seq))}", hint)
            if len(rows_of(db)) != len(before):
                return Miss(f"the outbox has {len(rows_of(db))} rows, not {len(before)}", hint)
            return None

        return check

    for seq, r in zip(before, rows, strict=True):
        e = json.loads(r["body"])
        other = {**e, "qty": e["qty"] % 1000 + 1}
        plans.append(Plan(f"the same event again, its row {r['state']}", f"enqueue(con, {show(e)}) on a {r['state']} row",
                         "False; the row unchanged",
                         both(under("2.same-false", returns(False, hint)), under("2.same-false", kept(seq))),
                         hint, clauses=("2.same-false",)))
        specs.append({"name": plans[-1].name, "fn": "enqueue", "db": str(db), "args": [value(e)]})
        plans.append(Plan(f"other content for a {r['state']} row", f"enqueue(con, {show(other)}) on a {r['state']} row",
                         "Conflict; the row unchanged",
                         both(under("2.conflict", is_module_exception("Conflict", hint)), under("2.conflict", kept(seq))),
                         hint, clauses=("2.conflict",)))
        specs.append({"name": plans[-1].name, "fn": "enqueue", "db": str(db), "args": [value(other)]})
    for label, bad in (("qty is bytes", {**event(name(rng, "bytes")), "qty": b"3"}),):
        why = ("Validate first (validate_event), then compute the canonical body: json cannot write this value, "
               "and a bad event is a ValueError, not a TypeError.")
        plans.append(Plan(f"{label}: refused before serialising", f"enqueue(con, {show(bad)})", "ValueError",
                         under("2.validate", raises("ValueError", why)), why, clauses=("2.validate",)))
        specs.append({"name": plans[-1].name, "fn": "enqueue", "db": str(db), "args": [value(bad)]})

    new = event(name(rng, "new"), "snack", rng.randint(1, 1000))
    template = make_outbox(ctx.path("enqueue-boundaries.db"), [row(name(rng, "old"))], counter=3)
    mine = ("Look for the id inside the same BEGIN IMMEDIATE transaction as the INSERT: a row that was not there "
            "before the transaction can be there by the time you write (another publisher enqueued it between "
            "your SELECT and your INSERT).")

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        found = [r for r in rows_of(path).values() if r["id"] == new["id"]]
        want = not landed  # True if nobody else enqueued it first, else the identical repeat: False
        if outcome.get("kind") != "returned" or value_of({"outcome": outcome}) is not want:
            return Miss(f"enqueue {describe(outcome)} (expected {want})", mine)
        if len(found) != 1 or found[0]["state"] != "pending":
            return Miss(f"the outbox has {[shown(r) for r in found]} for {new['id']}", mine)
        return None

    # The other publisher runs your own enqueue on a second connection: whatever body your code
    # writes, the repeat is identical.
    other = {"call": "enqueue", "args": [value(new)], "landed": encode(True)}
    more = between_statements(ctx, "enqueue", f"enqueue(con, {show(new)})", template, [value(new)],
                             "2.one-transaction", other, judge,
                             "True, or False if the other publisher's identical event landed first; one pending row")
    return plans + more[0], specs + more[1]
