"""Lab `outbox` — the publisher that dies right after the ACK (contract: labs/outbox.md).

One check per contract step, then the crash check. Each check prepares real SQLite files
with the judge's own connections, lets a child process run the student's `worker.py`
(see `outbox_probes.py`), and compares what the child reports with what the judge then
observes in the files, the warehouse's request log and the exit codes.
"""

from __future__ import annotations

import random
import string

from labkit.judge import stores
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    closed_on_error,
    describe,
    is_module_exception,
    no_open_transaction,
    raises,
    returns,
    value_of,
)
from labkit.judge.run import LabSpec, StepContext, StepSpec
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode, encode, same, show

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."


def event(event_id: str, sku: str, qty: int) -> dict:
    return {"id": event_id, "sku": sku, "qty": qty}


def name(rng: random.Random, prefix: str, length: int = 6) -> str:
    return prefix + "-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=length))


# --- step 1 -------------------------------------------------------------------------------


def check_validate(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    longest = event("A" + "".join(rng.choices(string.ascii_letters + string.digits + "._-", k=63)),
                    "z" + "".join(rng.choices(string.ascii_lowercase, k=31)), 1000)
    good = [
        ("a plain event", event("snack-7", "snack", 7)),
        ("the longest id and sku, qty 1000", longest),
        ("dots, dashes, underscores; qty 1", event("0.a_b-c", "9_x.y-z", 1)),
        ("a random event", event(name(rng, "order"), name(rng, "sku", 3), rng.randint(2, 999))),
    ]
    base = good[0][1]
    bad = [
        ("qty is True", {**base, "qty": True}, BOOL_HINT),
        ("qty is 0", {**base, "qty": 0}, "qty ranges from 1 to 1000."),
        ("qty is 1001", {**base, "qty": 1001}, "qty ranges from 1 to 1000."),
        ("qty is a float", {**base, "qty": 5.0}, "qty must be an int; 5.0 is a float."),
        ("qty is a str", {**base, "qty": "5"}, "Don't convert: a str is the wrong type, not a number to parse."),
        ("id is an int", {**base, "id": 7}, "id must be a str."),
        ("id is empty", {**base, "id": ""}, "id has 1-64 characters."),
        ("id has 65 characters", {**base, "id": "a" * 65}, "id has at most 64 characters."),
        ("sku has 33 characters", {**base, "sku": "s" * 33}, "sku has at most 32 characters."),
        ("id starts with a dash", {**base, "id": "-snack"}, "The first character must be a letter or a digit."),
        ("id starts with a dot", {**base, "id": ".snack"}, "The first character must be a letter or a digit."),
        ("id has a space", {**base, "id": "snack 7"}, "Only letters, digits, '.', '_' and '-' are allowed."),
        ("id is not ASCII", {**base, "id": "café-7"},
         "`str.isalnum()` accepts letters of every alphabet: also check `isascii()`, or use a regex with ASCII ranges."),
        ("sku is not ASCII", {**base, "sku": "١٢٣"},
         "`isdigit()`/`isalnum()` accept Arabic-Indic digits; the contract allows ASCII only."),
        ("id ends with a newline", {**base, "id": "snack\n"},
         "`re.match(r'...$')` also matches before a final newline: use `re.fullmatch` or end the pattern with `\\Z`."),
        ("an extra key", {**base, "note": "x"}, "Exactly the keys id, sku and qty: an extra key is an error, not something to drop."),
        ("a missing key", {"id": "snack-7", "sku": "snack"}, "All three keys are required."),
        ("not a dict", [("id", "snack-7"), ("sku", "snack"), ("qty", 7)], "An event must be a dict."),
        ("None", None, "An event must be a dict."),
    ]
    plans = []
    for label, value in good:
        plans.append(Plan(label, f"validate_event({show(value, 80)})", f"a new dict equal to {show(value, 60)}",
                          _validated(value)))
    for label, value, hint in bad:
        plans.append(Plan(label, f"validate_event({show(value, 80)})", "ValueError",
                          both(raises("ValueError", hint), _unchanged), hint))
    specs = [{"name": p.name, "fn": "validate_event", "args": [encode(v)]}
             for p, v in zip(plans, [v for _, v in good] + [v for _, v, _ in bad], strict=True)]
    return ctx.cases("calls", plans, {"calls": specs}, probes="labkit.probe")


def _unchanged(record: dict) -> Miss | None:
    if record["observed"].get("input_changed"):
        return Miss("the dict passed in was modified", "Never modify the input: build and return a new dict.")
    return None


def _validated(expected: dict):
    def check(record: dict) -> Miss | None:
        miss = returns(expected)(record)
        if miss is not None:
            return miss
        if record["observed"].get("returned_input"):
            return Miss("returned the very dict it was given", "Return a *new* dict: the caller may change it later.")
        return _unchanged(record)

    return check


# --- step 2 -------------------------------------------------------------------------------

SOURCE_COLUMNS = {
    "orders": [("id", "TEXT", 1), ("sku", "TEXT", 0), ("qty", "INTEGER", 0)],
    "outbox": [("seq", "INTEGER", 1), ("id", "TEXT", 0), ("body", "TEXT", 0), ("sent", "INTEGER", 0)],
}
SINK_COLUMNS = {
    "inbox": [("id", "TEXT", 1), ("body", "TEXT", 0)],
    "stock": [("sku", "TEXT", 1), ("qty", "INTEGER", 0)],
}


def check_stores(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    new_source, new_sink = ctx.path("new-source.db"), ctx.path("new-sink.db")
    old_source, old_sink = ctx.path("old-source.db"), ctx.path("old-sink.db")
    garbage = ctx.path("not-a-db.db")
    kept = [event(name(rng, "kept"), "snack", rng.randint(1, 1000)) for _ in range(2)]
    stores.make_source(old_source, kept, sent={kept[0]["id"]})
    stores.make_sink(old_sink)
    stores.execute(old_sink, f"INSERT INTO stock VALUES ('snack', {kept[1]['qty']});"
                             f"INSERT INTO inbox VALUES ('{kept[1]['id']}', '{stores.canonical(kept[1])}');")
    before = {old_source: stores.fingerprint(old_source), old_sink: stores.fingerprint(old_sink)}
    garbage.write_bytes(b"this is not a database, just text\n" * 64)

    def opened(path, columns, fn):
        def check(record: dict) -> Miss | None:
            outcome, seen = record["outcome"], record["observed"]
            if outcome["kind"] != "returned" or outcome["value"].get("type") != "Connection":
                return Miss(describe(outcome), f"{fn} returns the sqlite3.Connection it opened.")
            if seen.get("isolation_level") != encode(None):
                return Miss(f"isolation_level is {show(seen.get('isolation_level', {}).get('v'))}",
                            "Connect with `isolation_level=None`: the default opens hidden transactions.")
            if seen.get("busy_timeout") != 1000:
                return Miss(f"the busy timeout is {seen.get('busy_timeout')} ms",
                            "Pass `timeout=1.0` to sqlite3.connect (a 1 s busy timeout).")
            return _schema_miss(path, columns)

        return check

    def kept_rows(path):
        def check(record: dict) -> Miss | None:
            if record["outcome"]["kind"] != "returned":
                return Miss(describe(record["outcome"]), "Opening an existing file must work.")
            if stores.fingerprint(path) != before[path]:
                return Miss("rows that were in the file before changed or disappeared",
                            "Create tables only if missing (`CREATE TABLE IF NOT EXISTS`); never drop or clear them.")
            return None

        return check

    plans = [
        Plan("open_source on a new file", "open_source(new file)", "a connection; tables orders and outbox",
             opened(new_source, SOURCE_COLUMNS, "open_source")),
        Plan("open_sink on a new file", "open_sink(new file)", "a connection; tables inbox and stock",
             opened(new_sink, SINK_COLUMNS, "open_sink")),
        Plan("open_source keeps existing rows", "open_source(existing file) in a new process",
             "every row still there", kept_rows(old_source)),
        Plan("open_sink keeps existing rows", "open_sink(existing file) in a new process",
             "every row still there", kept_rows(old_sink)),
        Plan("open_source on a file that is not a database", "open_source(text file)",
             "sqlite3.DatabaseError, connection closed", closed_on_error("creating the tables")),
        Plan("open_sink on a file that is not a database", "open_sink(text file)",
             "sqlite3.DatabaseError, connection closed", closed_on_error("creating the tables")),
    ]
    paths = [(new_source, "open_source"), (new_sink, "open_sink"), (old_source, "open_source"),
             (old_sink, "open_sink"), (garbage, "open_source"), (garbage, "open_sink")]
    cases_spec = [{"name": p.name, "fn": fn, "path": str(path)} for p, (path, fn) in zip(plans, paths, strict=True)]
    return ctx.cases("stores", plans, {"cases_spec": cases_spec})


def _schema_miss(path, expected: dict) -> Miss | None:
    have = stores.tables(path)
    for table, cols in expected.items():
        if table not in have:
            return Miss(f"no table {table}", f"Create `{table}` exactly as the contract says.")
        got = [(c[0], c[1].upper(), 1 if c[4] else 0) for c in stores.columns(path, table)]
        if got != cols:
            return Miss(f"{table} has columns {got}", f"Use the contract's columns for `{table}`: {cols}.")
    if "outbox" in expected:
        sql = have["outbox"].upper()
        if "AUTOINCREMENT" not in sql:
            return Miss("outbox.seq is not AUTOINCREMENT",
                        "`seq INTEGER PRIMARY KEY AUTOINCREMENT`: seq values are never reused.")
        try:
            stores.execute(path, "INSERT INTO outbox(id, body, sent) VALUES ('x', '{}', 2)")
            return Miss("outbox accepted sent = 2", "Add `CHECK (sent IN (0, 1))` to the sent column.")
        except Exception:
            pass
        stores.execute(path, "INSERT INTO outbox(id, body) VALUES ('dup', '{}')")
        try:
            stores.execute(path, "INSERT INTO outbox(id, body) VALUES ('dup', '{}')")
            return Miss("outbox accepted the same id twice", "outbox.id is `NOT NULL UNIQUE`.")
        except Exception:
            pass
        if stores.rows(path, "SELECT sent FROM outbox WHERE id = 'dup'") != [(0,)]:
            return Miss("a new outbox row is not sent = 0 by default", "`sent INTEGER NOT NULL DEFAULT 0`.")
    return None


# --- step 3 -------------------------------------------------------------------------------


def check_accept(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    db = stores.make_source(ctx.path("source.db"))
    first = event(name(rng, "z"), name(rng, "sku", 3), rng.randint(1, 1000))
    second = event(name(rng, "a"), first["sku"], rng.randint(1, 1000))
    changed = {**first, "qty": first["qty"] % 1000 + 1}
    invalid = event(name(rng, "bad"), "snack", True)
    boom = event(name(rng, "boom"), "snack", 3)
    stores.execute(db, f"""CREATE TRIGGER outbox_full BEFORE INSERT ON outbox
        WHEN NEW.id = '{boom["id"]}' BEGIN SELECT RAISE(ABORT, 'outbox is full'); END;""")

    def final_rows():
        orders = {r[0]: r for r in stores.rows(db, "SELECT id, sku, qty FROM orders")}
        return orders, stores.outbox(db)

    def first_saved(record):
        orders, outbox = final_rows()
        if first["id"] not in orders:
            return Miss("no row in orders for it", "Insert the order into `orders`.")
        rows = [r for r in outbox if r[1] == first["id"]]
        if not rows:
            return Miss("the order was saved but no outbox row", "Insert the outbox row in the same transaction.")
        if rows[0][2] != stores.canonical(first):
            return Miss(f"outbox.body is {rows[0][2]!r}",
                        "Store the canonical body: json.dumps(event, sort_keys=True, separators=(',', ':')).")
        if rows[0][3] != 0:
            return Miss("the outbox row is already sent = 1", "A new outbox row is pending: sent = 0.")
        return None

    def untouched(event_id, what):
        def check(record):
            orders, outbox = final_rows()
            if event_id in orders or any(r[1] == event_id for r in outbox):
                return Miss(f"{what}, yet a row for {event_id} was written", TRANSACTION_HINT)
            return None

        return check

    def conflict_kept(record):
        orders, outbox = final_rows()
        row = orders.get(first["id"])
        if row is not None and row[2] != first["qty"]:
            return Miss("the existing order was overwritten", "A conflict changes nothing: raise before writing.")
        return None

    def seq_order(record):
        ids = [r[1] for r in stores.outbox(db)]
        if ids[:2] != [first["id"], second["id"]]:
            return Miss(f"outbox order is {ids}", "Let outbox.seq (AUTOINCREMENT) number rows as they are accepted.")
        return None

    def original_error(record):
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or "outbox is full" not in outcome.get("message", ""):
            return Miss(describe(outcome), "Re-raise the original sqlite3 error (a bare `raise`), don't wrap it.")
        if not record["observed"].get("can_write", True):
            return Miss("another connection could not write afterwards", TRANSACTION_HINT)
        return None

    plans = [
        Plan("a new order", f"accept(con, {show(first)})", "True; a row in orders and a pending outbox row",
             both(returns(True), no_open_transaction, first_saved)),
        Plan("the same order again", f"accept(con, {show(first)})", "False, nothing changes",
             both(returns(False, "An identical repeat is not an error: return False and write nothing."),
                  no_open_transaction)),
        Plan("same id, other content", f"accept(con, {show(changed)})", "Conflict, nothing changes",
             both(is_module_exception("Conflict", "Compare the stored body with the new one: different → raise Conflict."),
                  no_open_transaction, conflict_kept)),
        Plan("an invalid order", f"accept(con, {show(invalid)})", "ValueError before any write",
             both(raises("ValueError", "Call validate_event first."), untouched(invalid["id"], "it was invalid"))),
        Plan("a second order", f"accept(con, {show(second)})", "True; after the first in the outbox",
             both(returns(True), seq_order)),
        Plan("the outbox insert fails", f"accept(con, {show(boom)}) with a trigger that aborts the outbox insert",
             "the original IntegrityError; no order row; no open transaction",
             both(original_error, no_open_transaction, untouched(boom["id"], "the outbox insert failed"))),
    ]
    args = [first, first, changed, invalid, second, boom]
    specs = [{"name": p.name, "fn": "accept", "args": [encode(a)]} for p, a in zip(plans, args, strict=True)]
    return ctx.cases("on_connection", plans, {"db": str(db), "calls": specs})


# --- step 4 -------------------------------------------------------------------------------


def check_pending(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    prefixes = ["z", "a", "m", "b", "y"]
    events = [event(name(rng, p), name(rng, "sku", 3), rng.randint(1, 1000)) for p in prefixes]
    sent_one = events[2]
    db = stores.make_source(ctx.path("source.db"), events, sent={sent_one["id"]})
    before = stores.fingerprint(db)
    unsent = [e for e in events if e is not sent_one]

    def in_order(expected):
        def check(record):
            outcome = record["outcome"]
            if outcome["kind"] == "returned":
                got = value_of(record)
                if isinstance(got, list) and same(got, sorted(expected, key=lambda e: e["id"])) and not same(got, expected):
                    return Miss(f"returned {show(got)}", "Rows come back in outbox order: `ORDER BY seq`, never by id.")
                if isinstance(got, list) and any(isinstance(e, dict) and e.get("id") == sent_one["id"] for e in got):
                    return Miss(f"returned {show(got)}", "Only rows with sent = 0 are pending.")
            return returns(expected, "Return dicts rebuilt from outbox.body, unsent rows only, in seq order.")(record)

        return check

    def read_only(record):
        if stores.fingerprint(db) != before:
            return Miss("the database changed", "pending only reads: it must not mark or delete rows.")
        return no_open_transaction(record)

    plans = [
        Plan("every pending row, in outbox order", "pending(con, 16)", show(unsent), both(in_order(unsent), read_only)),
        Plan("limit 2", "pending(con, 2)", show(unsent[:2]), both(in_order(unsent[:2]), read_only)),
        Plan("limit 1", "pending(con, 1)", show(unsent[:1]), both(in_order(unsent[:1]), read_only)),
    ]
    args = [16, 2, 1]
    for bad, hint in [(0, "limit ranges from 1 to 16."), (17, "limit ranges from 1 to 16."), (True, BOOL_HINT),
                      (2.0, "limit must be an int."), ("3", "limit must be an int."), (None, "limit is required.")]:
        plans.append(Plan(f"limit {bad!r}", f"pending(con, {bad!r})", "ValueError", both(raises("ValueError", hint), read_only)))
        args.append(bad)
    specs = [{"name": p.name, "fn": "pending", "args": [encode(a)]} for p, a in zip(plans, args, strict=True)]
    return ctx.cases("on_connection", plans, {"db": str(db), "calls": specs})


# --- step 5 -------------------------------------------------------------------------------


def check_receive(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    db = stores.make_sink(ctx.path("sink.db"))
    sku = name(rng, "sku", 3)
    first = event(name(rng, "in"), sku, rng.randint(1, 500))
    second = event(name(rng, "in"), sku, rng.randint(1, 500))
    changed = {**first, "qty": first["qty"] + 1}
    invalid = event(name(rng, "bad"), sku, 0)
    jammed = event(name(rng, "jam"), "jammed", 5)
    stores.execute(db, """CREATE TRIGGER shelf_jammed BEFORE INSERT ON stock
        WHEN NEW.sku = 'jammed' BEGIN SELECT RAISE(ABORT, 'stock shelf jammed'); END;""")

    def stock_is(qty, hint):
        def check(record):
            have = stores.stock(db).get(sku)
            if have != qty:
                return Miss(f"stock[{sku!r}] is {have} after this call", hint)
            return None

        return check

    expected_final = first["qty"] + second["qty"]

    def final_stock(record):
        have = stores.stock(db).get(sku)
        if have == expected_final + first["qty"]:
            return Miss(f"stock is {have}: the duplicate was applied twice",
                        "Look the id up in the inbox, in the same transaction, before changing stock.")
        if have != expected_final:
            return Miss(f"stock[{sku!r}] is {have}, expected {expected_final}",
                        "Add each new event's qty to stock[sku] exactly once.")
        return None

    def inbox_has(event_id, present):
        def check(record):
            if (event_id in stores.inbox_ids(db)) != present:
                verb = "has no" if present else "has a"
                return Miss(f"the inbox {verb} row for {event_id}",
                            "Record the id in the inbox in the same transaction as the stock change." if present
                            else TRANSACTION_HINT)
            return None

        return check

    def original_error(record):
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or "stock shelf jammed" not in outcome.get("message", ""):
            return Miss(describe(outcome), "Re-raise the original sqlite3 error (a bare `raise`), don't wrap it.")
        return None

    plans = [
        Plan("a new event is applied", f"receive(con, {show(first)})", "True; inbox row; stock added",
             both(returns(True), no_open_transaction, inbox_has(first["id"], True))),
        Plan("the same event again (a valid duplicate)", f"receive(con, {show(first)})", "False; stock unchanged",
             both(returns(False, "A repeat with the same body is a valid duplicate: return False, change nothing."),
                  no_open_transaction)),
        Plan("same id, other content", f"receive(con, {show(changed)})", "Conflict; stock unchanged",
             both(is_module_exception("Conflict", "Same id with a different body is a Conflict."), no_open_transaction)),
        Plan("another event, same sku", f"receive(con, {show(second)})", f"True; stock {expected_final}",
             both(returns(True), final_stock)),
        Plan("an invalid event", f"receive(con, {show(invalid)})", "ValueError before any write",
             both(raises("ValueError", "Call validate_event first."), inbox_has(invalid["id"], False))),
        Plan("the stock update fails", f"receive(con, {show(jammed)}) with a trigger that aborts the stock write",
             "the original IntegrityError; no inbox row; no open transaction",
             both(original_error, no_open_transaction, inbox_has(jammed["id"], False),
                  stock_is(expected_final, TRANSACTION_HINT))),
    ]
    args = [first, first, changed, second, invalid, jammed]
    specs = [{"name": p.name, "fn": "receive", "args": [encode(a)]} for p, a in zip(plans, args, strict=True)]
    return ctx.cases("on_connection", plans, {"db": str(db), "calls": specs})


# --- step 6 -------------------------------------------------------------------------------


def check_mark_sent(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = [event(name(rng, p), "snack", rng.randint(1, 1000)) for p in ("p", "s", "q")]
    target, already, other = (e["id"] for e in events)
    db = stores.make_source(ctx.path("source.db"), events, sent={already})
    unknown = name(rng, "ghost")

    def flags_are(expected, hint):
        def check(record):
            have = stores.sent_flags(db)
            if have != expected:
                return Miss(f"sent flags are {have}", hint)
            return None

        return check

    final = {target: 1, already: 1, other: 0}
    only_target = flags_are(final, "Update only the row with that id: `UPDATE outbox SET sent = 1 WHERE id = ?`.")
    plans = [
        Plan("a pending row", f"mark_sent(con, {target!r})", "True; that row now sent",
             both(returns(True), no_open_transaction, only_target)),
        Plan("the same row again", f"mark_sent(con, {target!r})", "False",
             both(returns(False, "Already sent → False: the caller learns that nothing changed."), no_open_transaction)),
        Plan("a row that was sent before", f"mark_sent(con, {already!r})", "False",
             both(returns(False, "Already sent → False."), no_open_transaction)),
        Plan("an unknown id", f"mark_sent(con, {unknown!r})", "KeyError; nothing changes",
             both(raises("KeyError", "An id that is not in the outbox is a KeyError, not False."),
                  no_open_transaction, only_target)),
    ]
    args = [target, target, already, unknown]
    specs = [{"name": p.name, "fn": "mark_sent", "args": [encode(a)]} for p, a in zip(plans, args, strict=True)]
    return ctx.cases("on_connection", plans, {"db": str(db), "calls": specs})


# --- step 7 -------------------------------------------------------------------------------

MARK_BEFORE_SEND = ("The row was marked sent before the warehouse answered: a crash during delivery "
                    "would lose it. Call send first, mark only after a True ACK.")


def check_dispatch(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    scenarios: list[dict] = []
    plans: list[Plan] = []

    def scenario(label, called, expected, events, limit, check, replies=(), hook=False, mutate=None):
        db = stores.make_source(ctx.path(f"s{len(scenarios)}.db"), events)
        scenarios.append({"name": label, "db": str(db), "limit": encode(limit), "replies": list(replies),
                          "hook": hook, "mutate": mutate})
        plans.append(Plan(label, called, expected, both(check(db, events), _no_lock_during_send)))

    def batch(prefixes):
        return [event(name(rng, p), name(rng, "sku", 3), rng.randint(1, 1000)) for p in prefixes]

    ok = {"return": encode(True)}
    three = batch("zam")
    scenario("sends every pending event in order, then marks it", "dispatch(con, send, 16, after_delivery=hook)",
             "3; send called for each in outbox order; the hook after each ACK; all marked",
             three, 16, _all_delivered, [ok] * 3, hook=True)
    five = batch("qwert")
    scenario("limit caps the batch", "dispatch(con, send, 2)", "2; only the first two sent and marked",
             five, 2, _first_n_delivered(2))
    truthy = rng.choice([1, "yes", "True", [True]])
    scenario("only `True` is an ACK", f"dispatch(con, send, 16) where send returns True, then {truthy!r}",
             "DeliveryError; the first marked, the rest pending, the third never sent",
             batch("cde"), 16, _stops_after(1, "DeliveryError"), [ok, {"return": encode(truthy)}, ok])
    scenario("stops at the first failure, re-raising the same error",
             "dispatch(con, send, 16) where the second send raises OSError",
             "that same OSError object; the first marked, the rest pending, the third never sent",
             batch("fgh"), 16, _stops_after(1, "OSError"), [ok, {"raise": "warehouse unreachable"}, ok])
    pair = batch("uv")
    scenario("the callee changes its copy", "dispatch(con, send, 1) where send sets event['id'] to the next row's id",
             f"1; {pair[0]['id']} marked, {pair[1]['id']} still pending", pair, 1, _marked_as_selected,
             mutate=pair[1]["id"])
    scenario("nothing pending", "dispatch(con, send, 16) on an empty outbox", "0; send never called",
             [], 16, _first_n_delivered(0))
    for bad in (0, 17, True):
        scenario(f"limit {bad!r} is refused before sending", f"dispatch(con, send, {bad!r})",
                 "ValueError; send never called", batch("l"), bad, _refused)
    return ctx.cases("dispatching", plans, {"scenarios": scenarios})


def _sent_events(record) -> list:
    """What `send` received, call by call, as the probe copied it before any mutation."""
    return [decode(s["event"]) for s in record["observed"].get("sends", [])]


def _sent_ids(record) -> list:
    return [e.get("id") if isinstance(e, dict) else None for e in _sent_events(record)]


def _no_lock_during_send(record) -> Miss | None:
    for call in record["observed"].get("sends", []):
        if not call.get("can_write", True):
            return Miss("while send ran, another connection could not BEGIN IMMEDIATE",
                        "Finish reading the batch (and commit) before the first send: a write "
                        "transaction held during a slow send blocks every new order.")
    return None


def _marked_early(record) -> Miss | None:
    for call in record["observed"].get("sends", []):
        if call.get("sent_flag") == 1:
            return Miss("the row was already sent = 1 while send was still running", MARK_BEFORE_SEND)
    for hook in record["observed"].get("hooks", []):
        if hook.get("sent_flag") == 1:
            return Miss("the row was already marked when after_delivery ran",
                        "Call after_delivery(event_id) after the ACK and before mark_sent.")
    return None


def _all_delivered(db, events):
    ids = [e["id"] for e in events]

    def check(record):
        miss = _marked_early(record)
        if miss is not None:
            return miss
        miss = returns(len(events), "Return how many rows this call marked sent.")(record)
        if miss is not None:
            return miss
        sent = _sent_ids(record)
        if sent != ids:
            return Miss(f"send was called for {sent}", "Send each selected event once, in outbox (seq) order.")
        got = _sent_events(record)
        if got != events:
            return Miss(f"send received {show(got)}", "Pass the event as pending() returned it (a copy).")
        hooked = [h["id"]["v"] for h in record["observed"].get("hooks", [])]
        if hooked != ids:
            return Miss(f"after_delivery was called with {hooked}",
                        "After each True ACK call after_delivery(event_id), then mark_sent.")
        if set(stores.sent_flags(db).values()) != {1}:
            return Miss(f"sent flags are {stores.sent_flags(db)}", "Mark every acknowledged row sent.")
        return None

    return check


def _first_n_delivered(n):
    def make(db, events):
        ids = [e["id"] for e in events]

        def check(record):
            miss = _marked_early(record) or returns(n, "Return how many rows this call marked sent.")(record)
            if miss is not None:
                return miss
            if _sent_ids(record) != ids[:n]:
                return Miss(f"send was called for {_sent_ids(record)}",
                            "Select at most `limit` events with pending(con, limit), send only those.")
            flags = stores.sent_flags(db)
            if [flags[i] for i in ids] != [1] * n + [0] * (len(ids) - n):
                return Miss(f"sent flags are {flags}", "Mark exactly the rows that were acknowledged.")
            return None

        return check

    return make


def _stops_after(n_marked, error):
    def make(db, events):
        ids = [e["id"] for e in events]

        def check(record):
            outcome = record["outcome"]
            miss = _marked_early(record)
            if miss is not None:
                return miss
            sent = _sent_ids(record)
            flags = stores.sent_flags(db)
            only_true = "Only a return value that `is True` is an ACK; anything else → raise DeliveryError."
            if error == "DeliveryError" and flags[ids[n_marked]] == 1:  # the non-True reply was taken as an ACK
                return Miss(f"{describe(outcome)}; the row whose send returned a non-True value was marked sent",
                            only_true)
            if len(sent) > n_marked + 1:
                return Miss(f"send was called for {sent} after the failure",
                            "Stop at the first failure: the rest wait for the next dispatch, in order.")
            if [flags[i] for i in ids] != [1] * n_marked + [0] * (len(ids) - n_marked):
                return Miss(f"sent flags are {flags}",
                            "Keep rows marked before the failure; leave the failed one and the rest pending.")
            if error == "DeliveryError":
                return is_module_exception("DeliveryError", only_true)(record)
            if outcome["kind"] != "raised" or outcome["type"] != "OSError":
                return Miss(describe(outcome),
                            "Let send's exception propagate unchanged: no `except` that wraps or swallows it.")
            if not record["observed"].get("same_error"):
                return Miss("raised an OSError, but not the object send raised",
                            "Re-raise the same exception (`raise`), not a copy of it.")
            return None

        return check

    return make


def _marked_as_selected(db, events):
    selected, other = events[0]["id"], events[1]["id"]

    def check(record):
        miss = returns(1)(record)
        if miss is not None:
            return miss
        flags = stores.sent_flags(db)
        if flags[selected] != 1 or flags[other] != 0:
            return Miss(f"sent flags are {flags}",
                        "send changed its argument and you marked the changed id: send a copy "
                        "(`dict(event)`) and mark the id as selected.")
        return None

    return check


def _refused(db, events):
    def check(record):
        miss = raises("ValueError", "Validate limit (an int 1–16, not bool) before sending anything.")(record)
        if miss is not None:
            return miss
        if _sent_ids(record):
            return Miss("send was called before limit was rejected", "Validate limit first.")
        return None

    return check



# --- step 8 -------------------------------------------------------------------------------

DELIVERY_FAULTS = {
    "redirect_302": ("a 302 redirect", "urllib turns a redirected POST into a GET without the body: "
                     "refuse redirects (an HTTPRedirectHandler whose redirect_request returns None)."),
    "redirect_307": ("a 307 redirect", "Any 3xx is not an ACK: raise DeliveryError."),
    "wrong_id": ("an ACK naming another id", "Check that the reply is exactly {\"ack\": <this event's id>}."),
    "oversized": ("a 4 KB reply", "Read at most 1,024 + 1 bytes; a longer reply is not evidence: raise DeliveryError."),
    "not_json": ("a reply that is not JSON", "A reply that does not parse is not an ACK: raise DeliveryError."),
    "status_500": ("status 500", "Only status 200 can carry an ACK; urllib raises HTTPError for others: turn it into DeliveryError."),
    "conflict_409": ("status 409", "Only status 200 can carry an ACK: turn HTTPError into DeliveryError."),
}
NETWORK_HINT = ("Network failures are not DeliveryError: let the OSError propagate "
                "(the row stays pending and is re-sent later).")


def _padded_ack_server():
    """A 200 whose body is exactly {"ack": <id>} plus JSON whitespace past 1,024 bytes.

    The warehouse's `oversized` reply carries an extra key, which an exact comparison rejects
    whatever its size; only a reply that is wrong by its size alone shows that the limit holds.
    """
    import json
    import socketserver
    import threading
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        timeout = 5.0

        def do_POST(self):
            try:
                event_id = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["id"]
            except (ValueError, TypeError, KeyError):
                event_id = None
            body = json.dumps({"ack": event_id}).encode() + b" " * 4096
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(socketserver.TCPServer):
        def handle_error(self, request, client_address):
            pass  # a client that stops reading early is what this server is for

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def check_send_http(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import close_all, start_warehouse

    rng = ctx.rng
    plans, specs, servers = [], [], []

    def server(faults=(), **kw):
        wh = start_warehouse(ctx.path(f"wh{len(servers)}.jsonl"), faults, **kw)
        servers.append(wh)
        return wh

    def add(plan, *args):
        plans.append(plan)
        specs.append({"name": plan.name, "fn": "send_http", "args": [encode(a) for a in args]})

    def fresh(prefix):
        return event(name(rng, prefix), name(rng, "sku", 3), rng.randint(1, 1000))

    padded = None
    try:
        proxy = server()
        good = server()
        ok = fresh("ok")
        add(Plan("a 200 ACK with the event's id", f"send_http({good.url!r}, {show(ok)})",
                 "True; one POST with the canonical JSON body",
                 both(_no_proxy(proxy), returns(True, "Return True (the object True) only for a verified ACK."),
                      _posted_once(good, ok))), good.url, ok)
        local = fresh("local")
        local_url = good.url.replace("127.0.0.1", "localhost")
        add(Plan("localhost is allowed", f"send_http({local_url!r}, {show(local)})", "True",
                 returns(True, "HOST may be `localhost` or any address in 127.0.0.0/8.")), local_url, local)
        port = good.port
        for label, url, hint in [
            ("https is refused", f"https://127.0.0.1:{port}/events", "Only http:// is allowed."),
            ("another path is refused", f"http://127.0.0.1:{port}/orders", "The path must be exactly /events."),
            ("a query is refused", f"http://127.0.0.1:{port}/events?x=1", "No query string."),
            ("a fragment is refused", f"http://127.0.0.1:{port}/events#top", "No fragment."),
            ("user info is refused", f"http://admin@127.0.0.1:{port}/events", "No user info (user@host)."),
            ("0.0.0.0 is refused", f"http://0.0.0.0:{port}/events",
             "0.0.0.0 is not in 127.0.0.0/8 (yet Linux connects it to this machine): check the address."),
            ("a remote name is refused", f"http://example.invalid:{port}/events", "Only localhost or 127.x.y.z."),
            ("a missing port is refused", "http://127.0.0.1/events", "The URL must name a port."),
        ]:
            e = fresh("url")
            add(Plan(label, f"send_http({url!r}, ...)", "ValueError before any connection",
                     both(raises("ValueError", hint), _never_reached(good, e))), url, e)
        for bad in (0, -1, True, float("nan"), float("inf"), "2"):
            e = fresh("timeout")
            add(Plan(f"timeout {bad!r} is refused", f"send_http(url, event, timeout={bad!r})",
                     "ValueError before any connection",
                     both(raises("ValueError", "timeout is a positive finite int or float, not bool."),
                          _never_reached(good, e))), good.url, e, bad)
        for fault, (label, hint) in DELIVERY_FAULTS.items():
            wh = server([fault])
            e = fresh(fault.replace("_", "-"))
            add(Plan(f"{label} is not an ACK", f"send_http(url, {show(e)}) answered with {label}", "DeliveryError",
                     both(is_module_exception("DeliveryError", hint), _not_followed(wh))), wh.url, e)
        padded = _padded_ack_server()
        e = fresh("padded")
        add(Plan("a valid ACK padded past 1,024 bytes is not an ACK",
                 f"send_http(url, {show(e)}) answered with {{\"ack\": id}} and 4 KB of spaces", "DeliveryError",
                 is_module_exception("DeliveryError", DELIVERY_FAULTS["oversized"][1])),
            f"http://127.0.0.1:{padded.server_address[1]}/events", e)
        dropped = server(["drop_after_commit"])
        e = fresh("dropped")
        add(Plan("the connection closes without a response", "send_http(url, event); the server commits, then hangs up",
                 "an OSError (not DeliveryError)", _network_error), dropped.url, e)
        slow = server(["slow"], slow_seconds=1.5)
        e = fresh("slow")
        add(Plan("a reply slower than timeout", "send_http(url, event, timeout=0.15); the server takes 1.5 s",
                 "an OSError (a timeout) after about 0.15 s",
                 _network_error), slow.url, e, 0.15)
        gone = server()
        gone_url = gone.url
        gone.close()  # its port now refuses: a real "nothing listening"
        e = fresh("refused")
        add(Plan("nothing listening", "send_http(url of a closed port, event)", "an OSError (connection refused)",
                 _network_error), gone_url, e)
        proxy_env = {"http_proxy": f"http://127.0.0.1:{proxy.port}", "HTTP_PROXY": f"http://127.0.0.1:{proxy.port}",
                     "no_proxy": "", "NO_PROXY": ""}
        return ctx.cases("calls", plans, {"calls": specs}, env=proxy_env, probes="labkit.probe")
    finally:
        close_all(servers)
        if padded is not None:
            padded.shutdown()
            padded.server_close()


def _posted_once(wh, sent):
    def check(record):
        mine = [r for r in wh.requests() if r.get("id") == sent["id"]]
        if len(mine) != 1:
            return Miss(f"the warehouse saw {len(mine)} requests for {sent['id']}", "POST the event exactly once.")
        body, ctype = mine[0].get("body"), mine[0].get("content_type", "")
        if body is not None and body != stores.canonical(sent):
            return Miss(f"the body was {body!r}",
                        "POST the canonical body: json.dumps(event, sort_keys=True, separators=(',', ':')).")
        if not ctype.startswith("application/json"):
            return Miss(f"Content-Type was {ctype!r}", "Send `Content-Type: application/json`.")
        return None

    return check


def _no_proxy(proxy):
    def check(record):
        if proxy.requests():
            return Miss("the request went to the proxy named in http_proxy",
                        "urllib sends even 127.0.0.1 through http_proxy: build the opener with ProxyHandler({}).")
        return None

    return check


def _never_reached(wh, sent):
    def check(record):
        if any(r.get("id") == sent["id"] for r in wh.requests()):
            return Miss("the request reached the server", "Validate the URL and timeout before connecting.")
        return None

    return check


def _not_followed(wh):
    def check(record):
        follow = [r for r in wh.requests() if r.get("method") != "POST" or r.get("path") != "/events"]
        if follow:
            return Miss(f"the redirect was followed ({follow[0].get('method')} {follow[0].get('path')})",
                        "Never follow redirects: a redirect is an answer, not a delivery.")
        return None

    return check


def _network_error(record):
    outcome = record["outcome"]
    if outcome["kind"] == "raised" and "OSError" in outcome["mro"] and "DeliveryError" not in outcome["mro"]:
        return None
    return Miss(describe(outcome), NETWORK_HINT)



# --- final check: the crash after the ACK ---------------------------------------------------

SNACK = {"id": "snack-7", "sku": "snack", "qty": 7}


def check_crash(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import WarehouseStartError, spawn_warehouse

    cases: list[Case] = []
    try:
        cases += _killed_after_ack(ctx, spawn_warehouse)
        cases += _lost_response(ctx, spawn_warehouse)
    except WarehouseStartError as exc:
        cases.append(Case("the warehouse runs your receive", Outcome.RAISED, "open_sink + receive in the warehouse process",
                          "the warehouse starts", str(exc), "Steps 2 and 5 must work before the crash check can run."))
    cases += _bad_replies(ctx)
    return cases


def _timeline_process(ctx, label, run, killed=False):
    ctx.evidence.timeline.append({"t": run.started_at, "actor": label, "kind": "start", "text": "process started"})
    for note in run.messages():
        if note.get("kind") == "hook":
            ctx.evidence.timeline.append({"t": note["t"], "actor": label, "kind": "ack",
                                          "text": f"ACK for {note['id']} verified; after_delivery runs os._exit"})
    kind = "killed" if killed and run.exit_code == 73 else "exit"
    ctx.evidence.timeline.append({"t": run.ended_at, "actor": label, "kind": kind, "text": f"exit code {run.exit_code}"})


def _timeline_requests(ctx, requests, seen):
    for r in requests[seen:]:
        ctx.evidence.timeline.append({"t": r.get("t_start", 0), "actor": "warehouse", "kind": r.get("outcome", "?"),
                                      "text": f"POST {r.get('id')} → {r.get('outcome')}, response: {r.get('response')}"})
    return len(requests)


def _snapshot(ctx, t, source, sink, event_id):
    flags = stores.sent_flags(source)
    ctx.evidence.timeline.append({"t": t, "actor": "source DB", "kind": "snapshot",
                                  "text": f"{event_id}: " + ("sent" if flags.get(event_id) else "pending")})
    if sink.exists():
        ctx.evidence.timeline.append({"t": t, "actor": "sink DB", "kind": "snapshot",
                                      "text": f"stock {stores.stock(sink)}, inbox {stores.inbox_ids(sink)}"})


def _process_problem(run, expected: str) -> Miss:
    """Why a publisher process did not do what the scenario needed."""
    from labkit.judge.expect import SKELETON_HINT, import_problem

    if not run.imported:
        got, hint, _ = import_problem(run, 10.0)
        return Miss(got, hint)
    record = run.cases().get("dispatch")  # a report is firmer evidence than `timed_out` (set at EOF)
    if record is not None and record["outcome"]["kind"] in ("not_implemented", "missing"):  # open_source or dispatch
        skeleton = record["outcome"]["kind"] == "not_implemented"
        return Miss(describe(record["outcome"]), SKELETON_HINT if skeleton else expected,
                    Outcome.NOT_IMPLEMENTED if skeleton else Outcome.MISSING)
    if record is not None:
        return Miss(f"dispatch {describe(record['outcome'])} (exit code {run.exit_code})", expected)
    if run.timed_out:
        return Miss("the publisher did not finish in time and was killed", "Look for a wait without a timeout.")
    return Miss(f"the process ended with exit code {run.exit_code} before dispatch returned", expected)


def _killed_after_ack(ctx, spawn_warehouse) -> list[Case]:
    source = stores.make_source(ctx.path("source.db"), [SNACK])
    sink, log = ctx.path("sink.db"), ctx.path("warehouse.jsonl")
    ctx.evidence.ladder.append({"rung": "in orders", "observed": "yes: snack-7 accepted before the run", "when": "start"})
    wh = spawn_warehouse(ctx.solution, sink, log, ctx.workdir, marker=ctx.marker())
    try:
        url = wh.url
        first = ctx.child("crash_dispatch", {"source": str(source), "url": url, "kill": True, "exit_code": 73})
        _timeline_process(ctx, "publisher #1", first, killed=True)
        seen = _timeline_requests(ctx, wh.requests(), 0)
        _snapshot(ctx, first.ended_at, source, sink, "snack-7")
        after_crash = (stores.sent_flags(source).get("snack-7"),
                       stores.stock(sink) if sink.exists() else {},
                       stores.inbox_ids(sink) if sink.exists() else [])
        second = ctx.child("crash_dispatch", {"source": str(source), "url": url, "kill": False})
        _timeline_process(ctx, "publisher #2", second)
        _timeline_requests(ctx, wh.requests(), seen)
        _snapshot(ctx, second.ended_at, source, sink, "snack-7")
        requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    cases = []
    hooked = any(n.get("kind") == "hook" for n in first.messages())
    died = Case("publisher #1 dies right after the ACK", Outcome.PASSED,
                "dispatch(con, send_http to the warehouse, 16, after_delivery=os._exit(73))", "exit code 73")
    if first.exit_code != 73 or not hooked:
        miss = _process_problem(first, "after_delivery must be called after a True ACK, before mark_sent.")
        died.outcome, died.got, died.hint = miss.outcome, miss.got, miss.hint
    else:
        ctx.evidence.faults.append("publisher killed in after_delivery (os._exit) — exit code 73 observed")
    cases.append(died)
    flag, stock_after, inbox_after = after_crash
    state = Case("after the crash: pending in the source, applied in the warehouse", Outcome.PASSED,
                 "the judge reads both DB files", "snack-7 sent = 0; stock {'snack': 7}; inbox has snack-7")
    ctx.evidence.ladder.append({"rung": "pending in outbox", "observed": "yes" if flag == 0 else f"no (sent = {flag})",
                                "when": "after publisher #1 died"})
    ctx.evidence.ladder.append({"rung": "in the warehouse inbox", "observed": "yes" if "snack-7" in inbox_after else "no",
                                "when": "after publisher #1 died"})
    ctx.evidence.ladder.append({"rung": "ACK returned to the publisher",
                                "observed": "yes: after_delivery ran, and it runs only after a True ACK" if hooked else "no",
                                "when": "just before the kill"})
    if died.passed:
        if flag != 0:
            state.outcome, state.got, state.hint = Outcome.WRONG, f"snack-7 has sent = {flag}", MARK_BEFORE_SEND
        elif stock_after != {"snack": 7} or "snack-7" not in inbox_after:
            state.outcome, state.got = Outcome.WRONG, f"stock {stock_after}, inbox {inbox_after}"
            state.hint = "receive must record the id and add the qty in one committed transaction."
    else:
        state.outcome, state.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    cases.append(state)
    resent = Case("a new process re-sends it; the warehouse applies it once", Outcome.PASSED,
                  "dispatch(...) again in a new process on the same files",
                  "returns 1; the server saw two POSTs for snack-7 (applied, duplicate); stock 7; row sent")
    final_flag = stores.sent_flags(source).get("snack-7")
    final_stock = stores.stock(sink) if sink.exists() else {}
    ctx.evidence.ladder.append({"rung": "sent saved", "observed": f"after #1: {'no' if flag == 0 else 'yes'}; "
                                f"after #2: {'yes' if final_flag == 1 else 'no'}", "when": "after each process"})
    record = second.cases().get("dispatch")
    if not died.passed:
        resent.outcome, resent.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    elif record is None or record["outcome"]["kind"] != "returned" or value_of(record) != 1:
        miss = _process_problem(second, "The second dispatch should find snack-7 pending and deliver it again.")
        resent.outcome, resent.got, resent.hint = Outcome.WRONG, miss.got, miss.hint
    elif [r.get("id") for r in requests] != ["snack-7", "snack-7"]:
        resent.outcome, resent.got = Outcome.WRONG, f"the server saw POSTs for {[r.get('id') for r in requests]}"
        resent.hint = "Each dispatch sends each pending event once."
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": 7}:
        resent.outcome = Outcome.WRONG
        resent.got = f"outcomes {[r.get('outcome') for r in requests]}, stock {final_stock}"
        resent.hint = "receive must recognise the repeated id in the inbox: delivered twice, applied once."
    elif final_flag != 1:
        resent.outcome, resent.got = Outcome.WRONG, "snack-7 is still pending"
        resent.hint = "After the duplicate ACK, mark the row sent."
    else:
        ctx.evidence.faults.append("the same event delivered twice — the warehouse's inbox recognised the duplicate")
    cases.append(resent)
    return cases


def _lost_response(ctx, spawn_warehouse) -> list[Case]:
    rng = ctx.rng
    lost = event(name(rng, "lost"), "snack", rng.randint(1, 1000))
    source = stores.make_source(ctx.path("lost-source.db"), [lost])
    sink = ctx.path("lost-sink.db")
    wh = spawn_warehouse(ctx.solution, sink, ctx.path("lost.jsonl"), ctx.workdir, faults=["drop_after_commit"],
                         marker=ctx.marker())
    try:
        first = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        flag_after = stores.sent_flags(source).get(lost["id"])
        second = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    drop = Case("a lost response leaves the row pending", Outcome.PASSED,
                "dispatch(...); the warehouse commits, then closes without answering",
                "an OSError from dispatch; the row still pending")
    record = first.cases().get("dispatch")
    outcome = record["outcome"] if record else None
    if outcome is None or outcome["kind"] != "raised" or "OSError" not in outcome.get("mro", []):
        miss = _process_problem(first, NETWORK_HINT)
        drop.outcome, drop.got, drop.hint = miss.outcome, miss.got, miss.hint
    elif flag_after != 0:
        drop.outcome, drop.got, drop.hint = Outcome.WRONG, f"sent = {flag_after}", MARK_BEFORE_SEND
    else:
        ctx.evidence.faults.append(f"response dropped after commit — publisher raised {outcome['type']}; row stayed pending")
    redo = Case("the re-send gets a duplicate ACK", Outcome.PASSED, "dispatch(...) again",
                "1; the warehouse answers duplicate; stock unchanged; row sent")
    record = second.cases().get("dispatch")
    final_stock = stores.stock(sink) if sink.exists() else {}
    if not drop.passed:
        redo.outcome, redo.got = Outcome.NOT_REACHED, "not checked: the lost response was not handled"
    elif record is None or record["outcome"]["kind"] != "returned" or value_of(record) != 1:
        miss = _process_problem(second, "The row is still pending, so the next dispatch must re-send it.")
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, miss.got, miss.hint
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": lost["qty"]}:
        redo.outcome = Outcome.WRONG
        redo.got = f"outcomes {[r.get('outcome') for r in requests]}, stock {final_stock}"
        redo.hint = "The warehouse must recognise the re-sent id and not add its qty again."
    elif stores.sent_flags(source).get(lost["id"]) != 1:
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, "the row is still pending", "Mark it after the duplicate ACK."
    return [drop, redo]


def _bad_replies(ctx) -> list[Case]:
    from labkit.servers.warehouse import close_all, start_warehouse

    rng = ctx.rng
    runs, servers, plans = [], [], []
    try:
        for fault in ("wrong_id", "oversized", "redirect_302"):
            e = event(name(rng, fault.replace("_", "-")), "snack", rng.randint(1, 1000))
            src = stores.make_source(ctx.path(f"{fault}.db"), [e])
            wh = start_warehouse(ctx.path(f"{fault}.jsonl"), [fault])
            servers.append(wh)
            label = DELIVERY_FAULTS[fault][0]
            runs.append({"name": f"{label} is never taken as delivery", "source": str(src), "url": wh.url})
            plans.append(Plan(runs[-1]["name"], f"dispatch(...) against a warehouse answering with {label}",
                              "DeliveryError; the row stays pending", _bad_reply_check(src, e["id"], fault, ctx)))
        return ctx.cases("bad_replies", plans, {"runs": runs})
    finally:
        close_all(servers)


def _bad_reply_check(source, event_id, fault, ctx):
    def check(record):
        miss = is_module_exception("DeliveryError", DELIVERY_FAULTS[fault][1])(record)
        if miss is None and stores.sent_flags(source).get(event_id) != 0:
            miss = Miss("the row was marked sent", "Only a verified ACK allows mark_sent.")
        if miss is None:
            ctx.evidence.faults.append(f"{DELIVERY_FAULTS[fault][0]} offered — DeliveryError raised, row stayed pending")
        return miss

    return check


LAB = LabSpec(
    name="outbox",
    module_name="worker",
    probes="checks.outbox_probes",
    steps=[
        StepSpec(1, "validate_event", 1, check_validate),
        StepSpec(2, "open_source / open_sink", 1, check_stores),
        StepSpec(3, "accept", 1, check_accept, requires=(1,)),
        StepSpec(4, "pending", 1, check_pending),
        StepSpec(5, "receive", 1, check_receive, requires=(1,)),
        StepSpec(6, "mark_sent", 1, check_mark_sent),
        StepSpec(7, "dispatch", 2, check_dispatch, requires=(4, 6)),
        StepSpec(8, "send_http", 2, check_send_http, requires=(1,)),
        StepSpec("final", "the crash after the ACK", 3, check_crash, requires=(2, 5, 7, 8)),
    ],
)
