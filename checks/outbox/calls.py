"""Steps 3-6 of lab `outbox`: accept, pending, receive and mark_sent on a connection, each call followed by
the judge's own look at the file (a write it commits, every row)."""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checks.outbox import db
from checks.outbox import schema as stores
from checks.outbox.common import (
    BOOL_HINT,
    NOT_SEEN,
    Check,
    event,
    flags_text,
    listing,
    name,
    outcome_text,
    seen_after,
    value_text,
    writable_after,
)
from checks.outbox.interleave import Interleaved, accept_cases, mark_sent_cases, receive_cases
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    is_module_exception,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.run import StepContext, together
from labkit.judge.verdict import Case, Outcome
from labkit.judge.witness import Witness
from labkit.values import encode, show

# --- steps 3-6: calls on a connection, and what the judge sees after each ------------------

SOURCE_TABLES = {"orders": ("id", "sku", "qty"), "outbox": ("seq", "id", "body", "sent")}
SINK_TABLES = {"inbox": ("id", "body"), "stock": ("sku", "qty")}


def snapshot(path: Path, tables: dict[str, tuple[str, ...]]) -> dict | db.Broken:
    """Every row of the contract's tables, as the judge reads them."""
    out = {}
    for table, cols in tables.items():
        rows = db.read(stores.rows, path, f"SELECT {', '.join(cols)} FROM {table} ORDER BY 1")
        if isinstance(rows, db.Broken):
            return rows
        out[table] = [dict(zip(cols, r, strict=True)) for r in rows]
    return out


def row_text(row: dict) -> str:
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) and k != "body" else f"{k}={v}" for k, v in row.items())


KEYS = {"orders": "id", "outbox": "id", "inbox": "id", "stock": "sku"}


def changes(before: dict | db.Broken | None, after: dict | db.Broken | None, most: int = 3) -> str:
    """What a call changed, in words ('' when nothing did): rows matched by their key."""
    if isinstance(after, db.Broken) or after is None:
        return f"the database could not be read afterwards ({after})"
    if isinstance(before, db.Broken) or before is None:
        return ""
    parts = []
    for table, rows in after.items():
        key = KEYS.get(table, next(iter(rows[0])) if rows else "id")
        old = {r.get(key): r for r in before.get(table, [])}
        new = {r.get(key): r for r in rows}
        parts += [f"{table} lost {k}" for k in old if k not in new]
        parts += [f"{table} gained {row_text(r)}" for k, r in new.items() if k not in old]
        for k in [k for k in new if k in old and new[k] != old[k]]:
            diffs = [f"{c} {old[k].get(c)!r} → {v!r}" for c, v in new[k].items() if old[k].get(c) != v]
            parts.append(f"{table} {k}: {', '.join(diffs)}")
    if len(parts) > most:
        parts = parts[:most] + [f"{len(parts) - most} more changes"]
    return "; ".join(parts)


class CallSteps:
    """Steps 3–6: one child calls one function case by case on connections to files the judge
    made; after each call the judge itself tries to write, and reads every row."""

    def __init__(self, ctx: StepContext, step: int, fn: str, tables: dict[str, tuple[str, ...]],
                 tx_hint: str = TRANSACTION_HINT):
        self.ctx, self.fn, self.tables, self.tx_hint = ctx, fn, tables, tx_hint
        self.tx_clause = f"{step}.no-transaction-left"
        self.plans: list[Plan] = []
        self.specs: list[dict] = []
        self.paths: dict[str, Path] = {}
        self.initial: dict[Path, Any] = {}
        self.witness = Witness(self._look)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = self.paths.get(case)
        if path is None or point != "after":
            return {}, {}
        return {"write": db.try_write(path), "state": snapshot(path, self.tables)}, {}

    def add(self, label: str, path: Path, args: list, expected: str, rules: list[tuple[str, Check]],
            called: str = "", twice: bool = False) -> None:
        if path not in self.initial:
            self.initial[path] = snapshot(path, self.tables)
        self.paths[label] = path
        rules = [*rules, (self.tx_clause, writable_after(self.witness, label, self.tx_hint))]
        shown = called or f"{self.fn}(con, {', '.join(show(a, 90) for a in args)})"
        self.plans.append(Plan(label, shown, expected, both(*(under(c, k) for c, k in rules)),
                               clauses=tuple(dict.fromkeys(c for c, _ in rules))))
        self.specs.append({"name": label, "fn": self.fn, "db": str(path), "args": [encode(a) for a in args],
                           "twice": twice})

    def after(self, case: str) -> Any:
        saw = seen_after(self.witness, case)
        return None if saw is None else saw.get("state")

    def before(self, case: str) -> Any:
        path = self.paths[case]
        earlier = [p.name for p in self.plans[: [p.name for p in self.plans].index(case)] if self.paths[p.name] == path]
        return self.after(earlier[-1]) if earlier else self.initial[path]

    def unchanged(self, case: str, hint: str) -> Check:
        def check(record: dict) -> Miss | None:
            if self.after(case) is None:
                return NOT_SEEN
            what = changes(self.before(case), self.after(case))
            return Miss(f"{outcome_text(record['outcome'], 60)}, and {what}", hint) if what else None

        return check

    def state(self, case: str, test: Callable[[dict], str], hint: str) -> Check:
        """`test(state after the call)` returns '' or what is wrong."""

        def check(record: dict) -> Miss | None:
            after = self.after(case)
            if after is None:
                return NOT_SEEN
            if isinstance(after, db.Broken):
                return Miss(f"the judge could not read the database afterwards: {after}", hint)
            wrong = test(after)
            return Miss(wrong, hint) if wrong else None

        return check

    def run(self, beside: Interleaved | None = None) -> list[Case]:
        """The step's calls in one child; `beside`, the interleaving cases, in another at the same time."""
        with self.witness:
            if beside is None:
                return self.ctx.cases("on_connection", self.plans, {"calls": self.specs, "witness": self.witness.url})
            mine, other = together([
                lambda: self.ctx.cases("on_connection", self.plans, {"calls": self.specs, "witness": self.witness.url}),
                beside.run])
            return mine + after_plain(mine, other)


INTERLEAVED_NOTE = "not judged: the cases above fail; fix them first (these try the same calls with another writer or a fault)"


def after_plain(plain: list[Case], interleaved: list[Case]) -> list[Case]:
    """The interleaving cases add to a step whose plain cases pass: while a plain case fails, the
    same mistake would show again under a competing writer or a fault, as more rows of one cause."""
    if all(case.passed for case in plain):
        return interleaved
    return [case if case.passed else Case(case.name, Outcome.NOT_REACHED, case.called, case.expected,
                                          INTERLEAVED_NOTE, clauses=case.clauses) for case in interleaved]


def original_error(fragment: str, kind: str = "IntegrityError") -> Check:
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or kind not in outcome.get("mro", []) or fragment not in outcome.get("message", ""):
            return Miss(outcome_text(outcome), "Re-raise the original sqlite3 error (a bare `raise` after ROLLBACK), "
                                               "don't wrap or replace it.")
        return None

    return check


def rows_for(state: dict, table: str, key: str, value: str) -> list[dict]:
    return [r for r in state.get(table, []) if r.get(key) == value]


def check_accept(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    path = db.make_source(ctx.path("source.db"))
    first = event(name(rng, "z"), name(rng, "sku", 3), rng.randint(1, 1000))
    second = event(name(rng, "a"), first["sku"], rng.randint(1, 1000))
    boom, bang = event(name(rng, "boom"), "snack", 3), event(name(rng, "bang"), "snack", 4)
    shipped = event(name(rng, "shipped"), "snack", rng.randint(1, 1000))  # accepted and sent before
    db.script(path, f"""
        INSERT INTO orders VALUES ('{shipped["id"]}', 'snack', {shipped["qty"]});
        INSERT INTO outbox(id, body, sent) VALUES ('{shipped["id"]}', '{stores.canonical(shipped)}', 1);
        CREATE TRIGGER outbox_full BEFORE INSERT ON outbox WHEN NEW.id = '{boom["id"]}'
            BEGIN SELECT RAISE(ABORT, 'outbox is full'); END;
        CREATE TRIGGER orders_full BEFORE INSERT ON orders WHEN NEW.id = '{bang["id"]}'
            BEGIN SELECT RAISE(ABORT, 'orders is full'); END;""")
    steps = CallSteps(ctx, 3, "accept", SOURCE_TABLES)

    def saved(case, e):
        def order(state):
            got = rows_for(state, "orders", "id", e["id"])
            return "" if got == [e] else f"orders holds {listing([row_text(r) for r in got]) if got else 'no row'} for {e['id']}"

        def outbox(state):
            got = rows_for(state, "outbox", "id", e["id"])
            if len(got) != 1:
                return f"the outbox has {len(got)} rows for {e['id']}"
            return "" if got[0]["sent"] == 0 else f"the new outbox row has sent = {got[0]['sent']}"

        def body(state):
            got = rows_for(state, "outbox", "id", e["id"])
            want = stores.canonical(e)
            return "" if not got or got[0]["body"] == want else f"outbox.body is {got[0]['body']!r}, not {want!r}"

        return [("3.order-row", steps.state(case, order, "Insert the order into `orders` (id, sku, qty).")),
                ("3.outbox-row", steps.state(case, outbox, "Insert one outbox row for it; a new row is pending "
                                                           "(sent = 0).")),
                ("3.canonical-body", steps.state(case, body, "Store the canonical body: "
                                                             "json.dumps(event, sort_keys=True, separators=(',', ':')))."))]

    no_change = "A repeat or a conflict changes nothing: decide before writing, and roll back."
    steps.add("a new order", path, [first], "True; a row in orders and a pending outbox row",
              [("3.new-true", returns(True, "A new order returns True.")), *saved("a new order", first)])
    steps.add("the same order again", path, [first], "False, nothing changes",
              [("3.repeat-false", returns(False, "An identical repeat is not an error: return False and write nothing.")),
               ("3.repeat-false", steps.unchanged("the same order again", no_change))])
    reordered = {"qty": first["qty"], "sku": first["sku"], "id": first["id"]}
    steps.add("the same order, its keys in another order", path, [reordered], "False, nothing changes",
              [("3.same-content", returns(False, "Compare canonical bodies (sorted keys), not the dicts' text "
                                                 "as given: the same values are the same content.")),
               ("3.same-content", steps.unchanged("the same order, its keys in another order", no_change))])
    conflict = ("Compare the stored body with the new one: different → raise Conflict "
                "(declared `class Conflict(Exception)`).")
    # the stored body sorts after one conflicting body and before the other, whatever the seed
    for label, changed in (("same id, another qty", {**first, "qty": first["qty"] % 1000 + 1}),
                           ("same id, a sku that sorts before it", {**first, "sku": "A" + first["sku"][1:]}),
                           ("same id, a sku that sorts after it", {**first, "sku": first["sku"] + "x"})):
        steps.add(label, path, [changed], "Conflict; nothing changes",
                  [("3.conflict", is_module_exception("Conflict", conflict)),
                   ("3.conflict-no-change", steps.unchanged(label, "A conflict changes nothing: raise before writing "
                                                                   "(and roll back)."))])
    # a repeat is a repeat whatever state its row is in: sent rows are looked up too
    every_state = ("Look the id up among all outbox rows, pending or sent: an order stays accepted after it is sent.")
    steps.add("the same order again, after it was sent", path, [shipped], "False, nothing changes (the row stays sent)",
              [("3.repeat-false", returns(False, every_state)),
               ("3.repeat-false", steps.unchanged("the same order again, after it was sent",
                                                  every_state + " Never overwrite or reset a row that exists."))])
    steps.add("same id as a sent order, another qty", path, [{**shipped, "qty": shipped["qty"] % 1000 + 1}],
              "Conflict; nothing changes",
              [("3.conflict", is_module_exception("Conflict", every_state + " Different content → Conflict.")),
               ("3.conflict-no-change", steps.unchanged("same id as a sent order, another qty",
                                                        every_state + " Never overwrite or reset a row that exists."))])
    for label, bad in (("an invalid order (qty True)", event(name(rng, "bad"), "snack", True)),
                       ("an invalid order (id ending with a newline)", event(name(rng, "bad") + "\n", "snack", 2)),
                       ("an invalid order (an extra key)", {**event(name(rng, "bad"), "snack", 2), "note": "x"}),
                       ("an invalid order reusing an accepted id (qty 0)", {**first, "qty": 0}),
                       # values json cannot encode: validate before computing the canonical body
                       ("an invalid order (qty as bytes)", event(name(rng, "bad"), "snack", b"5")),
                       ("an invalid order (an extra key that is the number 1)", {**event(name(rng, "bad"), "snack", 2),
                                                                                 1: "x"})):
        steps.add(label, path, [bad], "ValueError before any write",
                  [("3.validates-first", raises("ValueError", "Call validate_event first, before looking at the "
                                                              "database or computing the body: an invalid event is "
                                                              "ValueError (json.dumps of it may raise TypeError).")),
                   ("3.validates-first", steps.unchanged(label, "Validate before any write."))])

    def seq_order(state):
        ids = [r["id"] for r in state.get("outbox", []) if r["id"] != shipped["id"]]
        return "" if ids[:2] == [first["id"], second["id"]] else f"the outbox's seq order is {listing(ids)}"

    steps.add("a second order", path, [second], "True; after the first in the outbox",
              [("3.new-true", returns(True)), *saved("a second order", second),
               ("3.outbox-row", steps.state("a second order", seq_order,
                                           "Let outbox.seq (AUTOINCREMENT) number rows as they are accepted."))])
    for label, e, fragment in (("the outbox insert fails", boom, "outbox is full"),
                               ("the orders insert fails", bang, "orders is full")):
        steps.add(label, path, [e], "the original IntegrityError; neither row; no open transaction",
                  [("3.original-error", original_error(fragment)),
                   ("3.one-transaction", steps.unchanged(label, "Both inserts in one transaction: "
                                                               "on any error ROLLBACK, so neither row remains."))],
                  called=f"accept(con, {show(e)}) with a trigger that aborts the {label.split()[1]} insert")
    later = event(name(rng, "c"), "snack", rng.randint(1, 1000))
    steps.add("a new order after the failures", path, [later], "True (the connection still works)",
              [("3.no-transaction-left", returns(True, "After a failure, roll back: a transaction left open makes "
                                                       "the next BEGIN fail."))])
    return steps.run(beside=accept_cases(ctx, first, event(name(rng, "race"), "snack", rng.randint(1, 1000))))


# --- step 4 -------------------------------------------------------------------------------

LIMIT_TYPE_HINT = "limit must be an int (not bool, not a float, not text): check `type(limit) is int`."
LIMIT_RANGE_HINT = "limit ranges from 1 to 16, both ends included."
READ_HINT = ("pending only reads: no BEGIN (or end it before returning), and `fetchall()` the rows, so no read "
             "transaction or unfinished cursor keeps a lock on the file.")


def _batch(expected: list[dict], size_clause: str, sent_ids: set[str]) -> list[tuple[str, Check]]:
    """pending's result, rule by rule: a list of dicts, unsent only, the right count, seq order, equal."""
    ids = [e["id"] for e in expected]

    def answered(record):
        if record["outcome"]["kind"] != "returned":
            return Miss(outcome_text(record["outcome"]), f"limit {len(expected) or 16} is valid here: return up to "
                                                         "limit events as a list of dicts.")
        return None

    def kind(record):
        got = value_of(record)
        if not isinstance(got, list) or not all(isinstance(e, dict) for e in got):
            return Miss(f"returned {value_text(got)}", "Return a list (not a cursor, tuple, generator or None) of "
                                                       "dicts rebuilt from outbox.body: `json.loads(body)`; an empty "
                                                       "list when nothing is pending.",
                        clause="" if expected else size_clause)
        return None

    def got_ids(record):
        return [e.get("id") for e in value_of(record)]

    def unsent(record):
        wrong = [i for i in got_ids(record) if i in sent_ids]
        return Miss(f"returned rows already sent: {listing(wrong)}", "Only rows with sent = 0 are pending.") if wrong else None

    def count(record):
        n = len(value_of(record))
        return None if n == len(expected) else Miss(
            f"returned {n} events where {len(expected)} were expected", "Return min(limit, pending) events: "
            "`LIMIT ?` with limit itself, no off-by-one.")

    def order(record):
        got = got_ids(record)
        if got == ids:
            return None
        if len(got) > 1 and got == sorted(got, key=str) or sorted(got, key=str) == sorted(ids):
            return Miss(f"returned {listing(got)}, in that order", "Rows come back in outbox order: `ORDER BY seq`, "
                                                                   "never by id.")
        return Miss(f"returned {listing(got)}", "The oldest pending rows first, in seq order.")

    def equal(record):
        return returns(expected, "Return dicts equal to the accepted events: `json.loads(body)` (qty an int).")(record)

    return [(size_clause, answered), ("4.events-rebuilt", kind), ("4.unsent-only", unsent), (size_clause, count),
            ("4.seq-order", order),
            ("4.events-rebuilt", equal)]


def check_pending(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    letters = "zambycxdwevfugthsirj"  # seq order is not id order
    events = [event(name(rng, p), name(rng, "sku", 3), rng.randint(1, 1000)) for p in letters]
    sent = {events[2]["id"], events[7]["id"]}
    path = db.make_source(ctx.path("source.db"), events, sent=sent)
    done = [event(name(rng, p), "snack", rng.randint(1, 1000)) for p in "kln"]
    all_sent = db.make_source(ctx.path("all-sent.db"), done, sent={e["id"] for e in done})
    unsent = [e for e in events if e["id"] not in sent]
    steps = CallSteps(ctx, 4, "pending", SOURCE_TABLES, tx_hint=READ_HINT)
    read_only = "pending only reads: it must not mark, delete or add rows."
    for label, db_path, limit, expected, clause in (
            ("limit 16 with 18 pending", path, 16, unsent[:16], "4.limit-max"),
            ("limit 2", path, 2, unsent[:2], "4.limit-caps"),
            ("limit 1", path, 1, unsent[:1], "4.limit-min"),
            ("nothing pending", all_sent, 16, [], "4.none-pending")):
        steps.add(label, db_path, [limit], f"{len(expected)} event{'s' if len(expected) != 1 else ''}, in seq order",
                  [*_batch(expected, clause, sent | {e["id"] for e in done}),
                   ("4.read-only", steps.unchanged(label, read_only))])
    # calls compared by identity as well as value: every call builds new dicts
    fresh_hint = ("Build new dicts on every call (`json.loads(body)` each time): a cache that hands out the same "
                  "dicts again lets one caller's change alter the next result.")

    def not_shared(record):
        if record["outcome"]["kind"] != "returned":  # no result, nothing compared: never a pass
            return Miss(outcome_text(record["outcome"]), "pending(con, 2) is valid here: return up to 2 events.")
        if record["observed"].get("shared"):
            return Miss("the second call returned some of the very dicts the first call returned", fresh_hint)
        return None

    label = "a second call after the caller changed the first result"
    # only identity is judged here: what the values must be, the cases above judge
    steps.add(label, path, [2], "new dicts, none of them an object the first call returned",
              [("4.new-dicts", not_shared)],
              called="rows = pending(con, 2); every row's qty set to -1 by the caller; pending(con, 2) again",
              twice=True)
    for bad, clause, hint in ((0, "4.limit-min", LIMIT_RANGE_HINT), (-1, "4.limit-min", LIMIT_RANGE_HINT),
                              (17, "4.limit-max", LIMIT_RANGE_HINT), (1000, "4.limit-max", LIMIT_RANGE_HINT),
                              (True, "4.limit-bool", BOOL_HINT), (False, "4.limit-bool", BOOL_HINT),
                              (2.0, "4.limit-type", LIMIT_TYPE_HINT), (16.0, "4.limit-type", LIMIT_TYPE_HINT),
                              ("3", "4.limit-type", LIMIT_TYPE_HINT), (None, "4.limit-type", LIMIT_TYPE_HINT),
                              (float("nan"), "4.limit-type", LIMIT_TYPE_HINT)):
        label = f"limit {bad!r}"
        steps.add(label, path, [bad], "ValueError, nothing read or changed",
                  [(clause, raises("ValueError", hint)), ("4.read-only", steps.unchanged(label, read_only))])
    return steps.run()


# --- step 5 -------------------------------------------------------------------------------


def check_receive(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    path = db.make_sink(ctx.path("sink.db"))
    sku = name(rng, "sku", 3)
    first = event(name(rng, "in"), sku, rng.randint(1, 499))
    second = event(name(rng, "in"), sku, rng.randint(1, 500))
    jammed, clogged = event(name(rng, "jam"), "jammed", 5), event(name(rng, "clog"), sku, 6)
    db.script(path, f"""
        INSERT INTO stock VALUES ('other', 50);
        CREATE TRIGGER shelf_jammed BEFORE INSERT ON stock WHEN NEW.sku = 'jammed'
            BEGIN SELECT RAISE(ABORT, 'stock shelf jammed'); END;
        CREATE TRIGGER shelf_stuck BEFORE UPDATE ON stock WHEN NEW.sku = 'jammed'
            BEGIN SELECT RAISE(ABORT, 'stock shelf jammed'); END;
        CREATE TRIGGER inbox_full BEFORE INSERT ON inbox WHEN NEW.id = '{clogged["id"]}'
            BEGIN SELECT RAISE(ABORT, 'inbox is full'); END;""")
    steps = CallSteps(ctx, 5, "receive", SINK_TABLES)

    def stock_is(case, want, clause, hint):
        def test(state):
            have = {r["sku"]: r["qty"] for r in state.get("stock", [])}
            wrong = {k: have.get(k) for k, v in want.items() if have.get(k) != v}
            return "" if not wrong else listing([f"stock[{k!r}] is {v}, expected {want[k]}" for k, v in wrong.items()])

        return (clause, steps.state(case, test, hint))

    def inbox_row(case, e):
        def test(state):
            got = rows_for(state, "inbox", "id", e["id"])
            want = [{"id": e["id"], "body": stores.canonical(e)}]
            return "" if got == want else f"the inbox holds {listing([row_text(r) for r in got]) if got else 'no row'} for {e['id']}"

        return ("5.inbox-row", steps.state(case, test, "Record the id and its canonical body in the inbox, in the "
                                                       "same transaction as the stock change."))

    no_change = "A duplicate or a conflict changes nothing: look the id up in the inbox before any write."
    steps.add("a new event of a new sku", path, [first], f"True; inbox row; stock[{sku!r}] = {first['qty']}",
              [("5.new-true", returns(True, "An unknown id returns True.")), inbox_row("a new event of a new sku", first),
               stock_is("a new event of a new sku", {sku: first["qty"]}, "5.stock-new-sku",
                        "The first event of a sku creates its stock row: INSERT … ON CONFLICT(sku) DO UPDATE."),
               stock_is("a new event of a new sku", {"other": 50}, "5.stock-other-skus",
                        "Change only the event's sku: `WHERE sku = ?`.")])
    steps.add("the same event again (a valid duplicate)", path, [first], "False; nothing changes",
              [("5.duplicate-false", returns(False, "A repeat with the same body is a valid duplicate: return False, "
                                                    "change nothing.")),
               ("5.duplicate-false", steps.unchanged("the same event again (a valid duplicate)",
                                                     "Look the id up in the inbox, in the same transaction, before "
                                                     "changing stock: the duplicate was applied twice."))])
    reordered = {"qty": first["qty"], "sku": first["sku"], "id": first["id"]}
    steps.add("the same event, its keys in another order", path, [reordered], "False; nothing changes",
              [("5.same-content", returns(False, "Compare canonical bodies (sorted keys): the same values are the "
                                                 "same content.")),
               ("5.same-content", steps.unchanged("the same event, its keys in another order", no_change))])
    for label, changed in (("same id, another qty", {**first, "qty": first["qty"] + 1}),
                           ("same id, a sku that sorts before it", {**first, "sku": "other"}),
                           ("same id, a sku that sorts after it", {**first, "sku": sku + "x"})):
        steps.add(label, path, [changed], "Conflict; nothing changes",
                  [("5.conflict", is_module_exception("Conflict", "Same id with a different body is a Conflict.")),
                   ("5.conflict-no-change", steps.unchanged(label, no_change))])
    total = first["qty"] + second["qty"]
    steps.add("another event of the same sku", path, [second], f"True; stock[{sku!r}] = {total}",
              [("5.new-true", returns(True)), inbox_row("another event of the same sku", second),
               stock_is("another event of the same sku", {sku: total}, "5.stock-added",
                        "Add each new event's qty to stock[sku] exactly once."),
               stock_is("another event of the same sku", {"other": 50}, "5.stock-other-skus",
                        "Change only the event's sku: `WHERE sku = ?`.")])
    for label, bad in (("an invalid event (qty 0)", event(name(rng, "bad"), sku, 0)),
                       ("an invalid event (a '/' in the sku)", event(name(rng, "bad"), "a/b", 3)),
                       ("an invalid event reusing a received id (qty True)", {**first, "qty": True}),
                       # values json cannot encode: validate before computing the canonical body
                       ("an invalid event (qty as bytes)", event(name(rng, "bad"), sku, b"5")),
                       ("an invalid event (an extra key that is the number 1)", {**event(name(rng, "bad"), sku, 2),
                                                                                 1: "x"})):
        steps.add(label, path, [bad], "ValueError before any write",
                  [("5.validates-first", raises("ValueError", "Call validate_event first, before the database or "
                                                              "the canonical body: an invalid event is ValueError "
                                                              "(json.dumps of it may raise TypeError).")),
                   ("5.validates-first", steps.unchanged(label, "Validate before any write."))])
    for label, e, fragment in (("the stock write fails", jammed, "stock shelf jammed"),
                               ("the inbox write fails", clogged, "inbox is full")):
        steps.add(label, path, [e], "the original IntegrityError; no inbox row, stock unchanged",
                  [("5.original-error", original_error(fragment)),
                   ("5.one-transaction", steps.unchanged(label, "The inbox row and the stock change in one "
                                                               "transaction: on any error ROLLBACK both."))],
                  called=f"receive(con, {show(e)}) with a trigger that aborts the {label.split()[1]} write")
    later = event(name(rng, "in"), "snack", rng.randint(1, 1000))
    steps.add("a new event after the failures", path, [later], "True (the connection still works)",
              [("5.no-transaction-left", returns(True, "After a failure, roll back: a transaction left open makes "
                                                       "the next BEGIN fail."))])
    return steps.run(beside=receive_cases(ctx, event(name(rng, "race"), sku, rng.randint(1, 1000)),
                                          rng.randint(1, 50)))


# --- step 6 -------------------------------------------------------------------------------


def check_mark_sent(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    target, already, other = (event("Pend-" + "".join(rng.choices(string.ascii_letters, k=5)) + p, "snack",
                                    rng.randint(1, 1000)) for p in "psq")
    path = db.make_source(ctx.path("source.db"), [target, already, other], sent={already["id"]})
    steps = CallSteps(ctx, 6, "mark_sent", SOURCE_TABLES)

    def flags(case, want):
        def test(state):
            have = {r["id"]: r["sent"] for r in state.get("outbox", [])}
            return "" if have == want else f"afterwards: {flags_text(have)}"

        return test

    after_first = {target["id"]: 1, already["id"]: 1, other["id"]: 0}
    steps.add("a pending row", path, [target["id"]], "True; that row, and only it, now sent",
              [("6.pending-true", returns(True, "Pending → sent: return True.")),
               ("6.only-that-row", steps.state("a pending row", flags("a pending row", after_first),
                                               "Update only that row: `UPDATE outbox SET sent = 1 WHERE id = ?`."))])
    for label, arg in (("the same row again", target["id"]), ("a row that was sent before", already["id"])):
        steps.add(label, path, [arg], "False; nothing changes",
                  [("6.already-false", returns(False, "Already sent → False: the caller learns that nothing "
                                                      "changed.")),
                   ("6.already-false", steps.unchanged(label, "An already sent row stays as it is."))])
    for label, arg in (("an unknown id", name(rng, "ghost")),
                       ("an id that differs from a pending one only in case", other["id"].swapcase()),
                       ("the LIKE pattern '%'", "%")):
        steps.add(label, path, [arg], "KeyError; nothing changes",
                  [("6.unknown-keyerror", raises("KeyError", "An id that is not in the outbox is a KeyError, not "
                                                             "False; match it exactly (`=`, not LIKE).")),
                   ("6.unknown-keyerror", steps.unchanged(label, "An unknown id changes nothing."))])
    steps.add("the other pending row", path, [other["id"]], "True; now every row is sent",
              [("6.pending-true", returns(True)),
               ("6.only-that-row", steps.state("the other pending row", flags("x", {**after_first, other["id"]: 1}),
                                               "Update only that row."))])
    return steps.run(beside=mark_sent_cases(ctx, target, other))



