"""Lab `relay` — two publishers, one outbox: leases, fencing tokens, quarantine (contract: labs/relay.md).

One check per contract step; the final check is in `relay_final.py`. Each check prepares real
SQLite files with the judge's own connections (`relay_outbox.py`: the contract's schema plus an
audit trigger that records every change of a row, inside the student's own transaction), lets
child processes run the student's `relay.py` (see `relay_probes.py`), and judges what it then
observes itself: the files, the audit, exit codes. A child's report counts for return values
only. Time is the judge's clock (`now`): nothing here sleeps.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import string
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay import boundaries, oracle
from checks.relay.contract import CLAUSES
from checks.relay.final import check_final
from checks.relay.outbox import (
    SCHEMA,
    TOKEN_HINT,
    audit,
    claims_in,
    copies,
    counter,
    event,
    make_outbox,
    name,
    row,
    row_is,
    rows_of,
    same_number,
    shown,
    unchanged,
)
from checks.relay.witness import judged, look_failed, no_open_transaction, not_seen, watched_cases
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    closed_on_error,
    describe,
    is_module_exception,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.run import StepContext, lab_spec
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode, encode, same, show

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."
ONE_TX_HINT = ("Select and update in one `BEGIN IMMEDIATE` transaction (`with write_transaction(con):` "
               "around both): the write lock must be taken before the SELECT, so a second publisher waits "
               "and then sees your claims.")


def value(item) -> dict:
    return {"value": encode(item)}


def calls_on(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """One child calls each spec's function on its file; right after each call, while the probe
    still holds the connection, the judge tries BEGIN IMMEDIATE itself (`relay_witness`). A spec
    run once per statement (`relay_boundaries`) is looked at after every run."""
    paths = {s["name"]: Path(s["db"]) for s in specs}
    for s in specs:
        if "boundaries" in s:
            paths.update(boundaries.watched(s["name"], s["boundaries"]))
    return watched_cases(ctx, "on_outbox", plans, {"calls": specs}, paths)


def between_statements(ctx: StepContext, fn: str, called: str, template: Path, args: list, clause: str,
                      writer: list | dict, judge, expected: str,
                      clauses: tuple[str, ...] = ()) -> tuple[list[Plan], list[dict]]:
    """One case that runs `fn` once per statement, three ways (`relay_boundaries`): another
    publisher committing just before that statement, that statement failing, and a
    KeyboardInterrupt right after it."""
    dbs = boundaries.files(template, ctx.workdir)
    name = f"{fn} between any two statements: another publisher's commit, a failure, a Ctrl-C"
    plan = Plan(name, f"{called}, once per statement: another publisher committing just before it; then it failing "
                     "with sqlite3.OperationalError('interrupted'); then a KeyboardInterrupt right after it",
                f"{expected}; a failure or KeyboardInterrupt propagates, leaves no transaction open and the file as "
                "before or as after the whole call", boundaries.between(fn, dbs, clause, judge),
                clauses=(clause, *clauses))
    return [plan], [boundaries.spec(name, fn, args, dbs, writer)]


def refused(hint: str, clause: str, path: Path, before: list, untouched_hint: str | None = None):
    """ValueError, and nothing in the file changed."""
    return both(under(clause, raises("ValueError", hint)),
                under(clause, unchanged(path, before, untouched_hint or "Validate the arguments before "
                                                                      "touching the outbox.")))


# --- step 1 ---------------------------------------------------------------------------------

OUTBOX_COLUMNS = [("seq", "INTEGER", 0, 1), ("id", "TEXT", 1, 0), ("body", "TEXT", 1, 0), ("state", "TEXT", 1, 0),
                 ("attempts", "INTEGER", 1, 0), ("owner", "TEXT", 0, 0), ("lease_until", "REAL", 0, 0),
                 ("fence", "INTEGER", 1, 0), ("due", "REAL", 1, 0), ("last_error", "TEXT", 0, 0)]
COUNTER_COLUMNS = [("id", "INTEGER", 0, 1), ("last", "INTEGER", 1, 0)]
DEFAULTS = {"state": "pending", "attempts": 0, "owner": None, "lease_until": None, "fence": 0, "due": 0,
            "last_error": None}
KEEP_HINT = ("Create the tables only if missing (`CREATE TABLE IF NOT EXISTS`) and insert the counter row "
             "only if missing (`INSERT OR IGNORE`): a counter reset to 0 hands out old tokens again, and a "
             "stale publisher's token looks current.")


def _columns_miss(path: Path, table: str, expected: list) -> Miss | None:
    got = [(c[0], c[1].upper(), 1 if c[2] else 0, 1 if c[4] else 0) for c in stores.columns(path, table)]
    if got != expected:
        return Miss(f"{table} has columns (name, type, not null, primary key) {got}",
                   f"Use the contract's columns for `{table}`: {expected}.")
    return None


def _rejects(con: sqlite3.Connection, sql: str, params: tuple = ()) -> bool:
    try:
        con.execute(sql, params)
    except sqlite3.IntegrityError:
        return True
    return False


def outbox_schema_miss(path: Path) -> Miss | None:
    tables = stores.tables(path)
    if "outbox" not in tables:
        return Miss("no table outbox", "Create `outbox` exactly as the contract says.")
    miss = _columns_miss(path, "outbox", OUTBOX_COLUMNS)
    if miss is not None:
        return miss
    if "AUTOINCREMENT" not in tables["outbox"].upper():
        return Miss("outbox.seq is not AUTOINCREMENT", "`seq INTEGER PRIMARY KEY AUTOINCREMENT`: seq values "
                                                      "are never reused.")
    with closing(stores.connect(path)) as con:
        con.execute("BEGIN")
        try:  # probe the constraints, then roll every probe back
            con.execute("INSERT INTO outbox(id, body) VALUES ('judge-probe', '{}')")
            got = dict(zip(DEFAULTS, con.execute(f"SELECT {', '.join(DEFAULTS)} FROM outbox "
                                                "WHERE id = 'judge-probe'").fetchone(), strict=True))
            if got != DEFAULTS:
                return Miss(f"a new row gets the defaults {got}", f"Give the columns the contract's defaults: {DEFAULTS}.")
            if not _rejects(con, "INSERT INTO outbox(id, body) VALUES ('judge-probe', '{}')"):
                return Miss("outbox accepted the same id twice", "outbox.id is `NOT NULL UNIQUE`.")
            if not _rejects(con, "INSERT INTO outbox(id, body, state) VALUES ('judge-done', '{}', 'done')"):
                return Miss("outbox accepted state = 'done'",
                           "Add `CHECK (state IN ('pending', 'leased', 'sent', 'quarantined'))`.")
        finally:
            con.execute("ROLLBACK")
    return None


def counter_schema_miss(path: Path) -> Miss | None:
    if "fence_counter" not in stores.tables(path):
        return Miss("no table fence_counter", "Create `fence_counter` exactly as the contract says.")
    miss = _columns_miss(path, "fence_counter", COUNTER_COLUMNS)
    if miss is not None:
        return miss
    if counter(path) != [(1, 0)]:
        return Miss(f"fence_counter holds {counter(path)}", "Insert the row (1, 0) when it is missing, and only then.")
    with closing(stores.connect(path)) as con:
        con.execute("BEGIN")
        try:
            if not _rejects(con, "INSERT INTO fence_counter VALUES (2, 0)"):
                return Miss("fence_counter accepted a row with id 2",
                           "`id INTEGER PRIMARY KEY CHECK (id = 1)`: there is exactly one counter.")
        finally:
            con.execute("ROLLBACK")
    return None


def journal_mode(path: Path) -> str:
    return stores.rows(path, "PRAGMA journal_mode")[0][0]


def check_open(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    new, twice, saved, garbage = (ctx.path(n) for n in ("new.db", "twice.db", "saved.db", "not-a-db.db"))
    last = rng.randint(20, 900)
    # The counter is ahead of every token left in the rows (the rows that took the last tokens were
    # deleted by the operator): a counter recomputed from the rows would hand those tokens out again.
    kept = [row(name(rng, "kept"), state="sent", fence=last - 9, attempts=1),
            row(name(rng, "kept"), state="leased", owner="A", lease_until=123.5, fence=last - 6, attempts=2),
            row(name(rng, "kept"), state="quarantined", fence=last - 7, attempts=5, last_error="PermanentError: x")]
    make_outbox(saved, kept, counter=last, audit=False, wal=False)  # a file from before WAL: open must switch it
    before = stores.fingerprint(saved)
    garbage.write_bytes(b"this is not a database, just text\n" * 64)
    # Files that have some of the tables: set-up must create whatever is missing, not stop at the
    # first table it finds.
    outbox_only, counter_only = ctx.path("outbox-only.db"), ctx.path("counter-only.db")
    outbox_sql, counter_sql = (s.strip() + ";" for s in SCHEMA.split(";") if s.strip())
    only_row = row(name(rng, "only"), state="sent", fence=4, attempts=1)
    with closing(stores.connect(outbox_only)) as con:
        con.execute(outbox_sql)
        con.execute("INSERT INTO outbox(id, body, state, fence, attempts) VALUES (?, ?, 'sent', 4, 1)",
                   (only_row["id"], only_row["body"]))
        con.commit()
    with closing(stores.connect(counter_only)) as con:
        con.execute(counter_sql)
        con.execute("INSERT INTO fence_counter VALUES (1, ?)", (last,))
        con.commit()

    def connection(record: dict) -> Miss | None:
        outcome, seen = record["outcome"], record["observed"]
        if outcome["kind"] != "returned" or outcome["value"].get("type") != "Connection":
            return Miss(describe(outcome), "open_outbox returns the sqlite3.Connection it opened.")
        if seen.get("closed"):
            return Miss("returned a connection that was already closed",
                       "Return the open connection: close it only when initialisation fails (then re-raise).")
        if seen.get("isolation_level") != encode(None):
            return Miss(f"isolation_level is {show(decode(seen.get('isolation_level', encode(''))))}",
                       "Connect with `isolation_level=None`: the default opens hidden transactions.")
        if seen.get("in_transaction"):
            return Miss("open_outbox returned with a transaction still open", TRANSACTION_HINT)
        return None

    def busy(record: dict) -> Miss | None:
        if record["observed"].get("busy_timeout") != 5000:
            return Miss(f"the busy timeout is {record['observed'].get('busy_timeout')} ms",
                       "Pass `timeout=5.0` to sqlite3.connect: two publishers really wait for each other.")
        return None

    def wal(path: Path):
        def check(record: dict) -> Miss | None:
            mode = journal_mode(path)
            if mode != "wal":
                return Miss(f"the file's journal mode is {mode!r}",
                           "Run `PRAGMA journal_mode=WAL` after connecting: readers then never block the other "
                           "publisher's commits.")
            return None

        return check

    def keeps(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "returned":
            return Miss(describe(record["outcome"]), "Opening an existing outbox must work.")
        if counter(saved) != [(1, last)]:
            return Miss(f"fence_counter went from {[(1, last)]} to {counter(saved)}: the token restarts after "
                       "reopening", KEEP_HINT)
        if stores.fingerprint(saved) != before:
            return Miss("rows that were in the file before changed or disappeared", KEEP_HINT)
        return None

    def counted_once(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "returned":
            return Miss(describe(record["outcome"]), "Opening the same file twice must work: " + KEEP_HINT)
        if counter(twice) != [(1, 0)]:
            return Miss(f"after two opens fence_counter holds {counter(twice)}", KEEP_HINT)
        return None

    def completed(path: Path, want: list, rows: int):
        def check(record: dict) -> Miss | None:
            if record["outcome"]["kind"] != "returned":
                return Miss(describe(record["outcome"]), "Opening a file that has some of the tables must work.")
            missing = [t for t in ("outbox", "fence_counter") if t not in stores.tables(path)]
            if missing:
                return Miss(f"no table {' and no table '.join(missing)} after open_outbox",
                           "Create each table that is missing (`CREATE TABLE IF NOT EXISTS` for each), and insert "
                           "the counter row if it is missing: a file can have some of the tables and not others.",
                           clause="1.counter-schema" if "fence_counter" in missing else "1.outbox-schema")
            if counter(path) != want or len(rows_of(path)) != rows:
                return Miss(f"fence_counter holds {counter(path)} and the outbox {len(rows_of(path))} rows",
                           KEEP_HINT, clause="1.reopen-keeps")
            return None

        return check

    ok = under("1.connection", connection)
    plans = [
        Plan("open_outbox on a new file", "open_outbox(new file)",
             "a connection (isolation_level None, busy timeout 5 s); WAL; outbox and fence_counter as the contract "
             "says; the counter row (1, 0)",
             both(ok, under("1.busy-timeout", busy), under("1.wal", wal(new)),
                 under("1.outbox-schema", lambda r: outbox_schema_miss(new)),
                 under("1.counter-schema", lambda r: counter_schema_miss(new))),
             clauses=("1.connection", "1.busy-timeout", "1.wal", "1.outbox-schema", "1.counter-schema")),
        Plan("open_outbox twice on the same file", "open_outbox(file) twice", "still exactly one counter row, (1, 0)",
             both(under("1.reopen-keeps", counted_once), ok), clauses=("1.reopen-keeps",)),
        Plan("open_outbox on an outbox saved by another process",
             f"open_outbox(saved file with 3 rows, fence_counter.last = {last}) in a new process",
             f"every row unchanged; fence_counter.last still {last}; the file switched to WAL",
             both(ok, under("1.reopen-keeps", keeps), under("1.wal", wal(saved))),
             clauses=("1.reopen-keeps", "1.wal")),
        Plan("open_outbox on a file with only the outbox table", "open_outbox(file with outbox and one row, "
             "no fence_counter)", "fence_counter created with (1, 0); the row kept",
             both(ok, under("1.counter-schema", completed(outbox_only, [(1, 0)], 1)),
                 under("1.counter-schema", lambda r: counter_schema_miss(outbox_only))),
             clauses=("1.counter-schema", "1.reopen-keeps")),
        Plan("open_outbox on a file with only fence_counter", f"open_outbox(file with fence_counter (1, {last}), "
             "no outbox)", f"outbox created; fence_counter still (1, {last})",
             both(ok, under("1.outbox-schema", completed(counter_only, [(1, last)], 0)),
                 under("1.outbox-schema", lambda r: outbox_schema_miss(counter_only))),
             clauses=("1.outbox-schema", "1.reopen-keeps")),
        Plan("open_outbox on a file that is not a database", "open_outbox(text file)",
             "sqlite3.DatabaseError; the connection closed",
             under("1.init-failure", closed_on_error("initialisation")), clauses=("1.init-failure",)),
    ]
    opens = [{"name": plans[0].name, "path": str(new)}, {"name": plans[1].name, "path": str(twice)},
             {"name": plans[1].name, "path": str(twice)}, {"name": plans[2].name, "path": str(saved)},
             {"name": plans[3].name, "path": str(outbox_only)}, {"name": plans[4].name, "path": str(counter_only)},
             {"name": plans[5].name, "path": str(garbage)}]
    return ctx.cases("opening", plans, {"opens": opens})


# --- step 2 ---------------------------------------------------------------------------------


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


# --- step 3 ---------------------------------------------------------------------------------


def check_claim(ctx: StepContext) -> list[Case]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        racing = pool.submit(_race, ctx.apart("race"))
        cases = _claim_cases(ctx)
        return cases + racing.result()


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


RACERS = ("A", "B")
# The racers wait for each other by design (the probe's barriers and turns), so on a loaded
# machine a correct pair takes longer than one step's child limit; a hanging claim costs this once.
RACE_TIME_FACTOR = 2.0


def _race(ctx: StepContext) -> list[Case]:
    """Two real processes claim from one file until nothing is left; the audit shows who held what."""
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000))
    start = rng.randint(10, 60)
    total = rng.randint(20, 28)
    limit = rng.randint(3, 5)
    rows = [row(name(rng, f"r{i:02d}")) for i in range(total)]
    db = make_outbox(ctx.path("race.db"), rows, counter=start)
    sync = ctx.path("race-sync")
    sync.mkdir()
    args = {"db": str(db), "sync": str(sync), "now": now, "lease": 3600.0, "limit": limit,
            "max_rounds": total + 2}
    with ThreadPoolExecutor(max_workers=len(RACERS)) as pool:
        runs = list(pool.map(lambda me: ctx.child("race", {**args, "owner": me,
                                                          "peers": [p for p in RACERS if p != me],
                                                          "cases": ["claims"]},
                                                 timeout=RACE_TIME_FACTOR * ctx.timeout), RACERS))
    entries = audit(db)
    claims = claims_in(entries)
    case = Case(f"{len(RACERS)} processes race to claim every row", Outcome.PASSED,
                f"claim(con, owner, {now:g}, 3600, {limit}) in a loop, in {len(RACERS)} processes at once, on one "
                f"file of {total} due rows",
                "every row claimed exactly once; tokens strictly increasing from "
                f"{start + 1}; fence_counter.last = {start + total}",
                clauses=("3.one-transaction", "3.tokens-increase", "3.global-counter"))
    miss = _race_miss(runs, claims, db, start, total, RACE_TIME_FACTOR * ctx.timeout)
    if miss is not None:
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
        case.clauses = (miss.clause,)
    return [case]


def _race_miss(runs, claims: list[dict], db: Path, start: int, total: int, timeout: float) -> Miss | None:
    from labkit.judge.expect import judge

    plan = Plan("claims", "claim(...) in a loop", "no error", lambda r: None)
    for owner, run in zip(RACERS, runs, strict=True):
        got = judge(run, [plan], timeout)[0]
        if not got.passed:
            return Miss(f"publisher {owner}: {got.got}", got.hint, got.outcome, "3.one-transaction")
        record = run.cases()["claims"]
        for call in record["observed"]["calls"]:
            if call["kind"] == "returned" and not isinstance(decode(call["value"]), list):
                return Miss(f"publisher {owner}: claim {describe(call)}", "claim returns a list of new dicts "
                                                                         "{seq, id, body, fence}.",
                           clause="3.returns-dicts")
            if call["kind"] != "returned":
                hint = (ONE_TX_HINT if call.get("type") == "OperationalError" else "claim must not fail when "
                       "another publisher claims at the same moment.")
                return Miss(f"publisher {owner}: claim {describe(call)} while the other publisher was claiming too",
                           hint, clause="3.one-transaction")
    holders: dict[int, dict] = {}
    for c in claims:
        if c["seq"] in holders:
            first = holders[c["seq"]]
            return Miss(f"row {c['seq']} was claimed by {first['owner']!r} (token {first['fence']}) and then by "
                       f"{c['owner']!r} (token {c['fence']}) while the first lease (until {first['lease_until']:g}) "
                       "was still live: both publishers would send it", ONE_TX_HINT, clause="3.one-transaction")
        holders[c["seq"]] = c
    fences = [c["fence"] for c in claims]
    for before, after in zip(fences, fences[1:], strict=False):
        if after <= before:
            return Miss(f"in commit order the claims took tokens {fences[:12]}{'…' if len(fences) > 12 else ''}: "
                       f"{after} after {before}", "Every claim takes fence_counter.last + 1 and stores it back, in "
                                                  "the same transaction: one counter for the whole file.",
                       clause="3.tokens-increase")
    if fences and fences[0] != start + 1:
        return Miss(f"the first token was {fences[0]}, but fence_counter.last was {start}",
                   "Take each token from fence_counter (last + 1), never from the row or a Python variable.",
                   clause="3.global-counter")
    if len(holders) != total:
        missing = sorted(set(range(1, total + 1)) - set(holders))
        return Miss(f"rows {missing[:8]} were never claimed", "Claim until nothing is due: each call takes the "
                                                             "next due rows in seq order.", clause="3.seq-order-limit")
    if counter(db) != [(1, start + total)]:
        return Miss(f"fence_counter is {counter(db)} after {total} claims from {start}",
                   "Store each token back into fence_counter.last.", clause="3.global-counter")
    for owner, run in zip(RACERS, runs, strict=True):
        returned = [r for call in run.cases()["claims"]["observed"]["calls"] if call["kind"] == "returned"
                   for r in _as_list(decode(call["value"]))]
        mine = {(c["seq"], c["fence"]) for c in claims if c["owner"] == owner}
        got = {(r.get("seq"), r.get("fence")) for r in returned if isinstance(r, dict)}
        if got != mine:
            wrong = sorted(got - mine)[:4]
            return Miss(f"claim returned (seq, token) {wrong} to {owner}, but the file shows {owner} never held them",
                       "Return exactly the rows this call leased, with the tokens it stored.",
                       clause="3.one-transaction")
    return None


def _as_list(value) -> list:
    return value if isinstance(value, list) else []


# --- step 4 ---------------------------------------------------------------------------------


def check_complete(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    base = rng.randint(20, 400)
    now = float(rng.randint(1_000, 9_000))
    layout = [  # seq 1 and 2 are what True would mean
        ("bool seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base, attempts=1)),
        ("bool fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=1, attempts=1)),
        ("main", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 2, attempts=2,
                    due=now - 7.5, last_error="Transient: the warehouse is unreachable")),
        ("expired", row(name(rng, "r"), state="leased", owner="A", lease_until=1.0, fence=base + 3, attempts=1)),
        ("taken over", row(name(rng, "r"), state="leased", owner="B", lease_until=now + 30, fence=base + 9,
                          attempts=2)),
        ("newer token", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 5,
                           attempts=1)),
        ("pending", row(name(rng, "r"), state="pending", fence=base + 6, attempts=1, due=now + 3,
                       last_error="Transient: x")),
        ("sent", row(name(rng, "r"), state="sent", fence=base + 7, attempts=1)),
        ("quarantined", row(name(rng, "r"), state="quarantined", fence=base + 8, attempts=4,
                           last_error="PermanentError: y")),
        ("float seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 10,
                         attempts=1)),
        ("str seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 11,
                       attempts=1)),
        ("float fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 12,
                           attempts=1)),
        ("None fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 13,
                          attempts=1)),
    ]
    db = make_outbox(ctx.path("complete.db"), [r for _, r in layout], counter=base + 20)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    before = rows_of(db)
    plans, specs = [], []

    def add(label: str, call_args: tuple, expected: str, check, clauses: tuple[str, ...], hint: str = "") -> None:
        plans.append(Plan(label, f"complete(con, {', '.join(repr(a) for a in call_args)})", expected, check, hint,
                         clauses=clauses))
        specs.append({"name": label, "fn": "complete", "db": str(db), "args": [value(a) for a in call_args]})

    def untouched(label: str, hint: str, clause: str):
        def check(record: dict) -> Miss | None:
            have = rows_of(db)[seq[label]]
            if have != before[seq[label]]:
                return Miss(f"row {seq[label]} became {shown(have)}", hint, clause=clause)
            return None

        return check

    def stale(label: str, fence: int, hint: str, clause: str = "4.stale"):
        return both(under(clause, is_module_exception("StaleLease", hint)), untouched(label, hint, clause),
                   under(clause, no_open_transaction))

    m = before[seq["main"]]
    add("the current token", (seq["main"], base + 2), "None; the row is sent, owner and lease cleared; fence, "
        "attempts, due and last_error unchanged",
        both(under("4.token-decides", returns(None, "complete returns None.")),
             under("4.token-decides", row_is(db, seq["main"], "Set state = 'sent' and clear owner and lease_until.",
                                            state="sent", owner=None, lease_until=None)),
             under("4.keeps-fields", row_is(db, seq["main"], "complete changes only state, owner and lease_until: the "
                                           "fence shows which token delivered the row.",
                                           fence=base + 2, attempts=m["attempts"], due=m["due"],
                                           last_error=m["last_error"])),
             under("4.token-decides", no_open_transaction)),
        ("4.token-decides", "4.keeps-fields"))
    add("an expired lease nobody re-claimed", (seq["expired"], base + 3),
        "None; sent (expiry alone does not make a token stale)",
        both(under("4.expiry-not-stale", returns(None, "Don't look at the clock: a lease that ran out but was not "
                                                      "claimed again still belongs to its token. The token decides, "
                                                      "not the clock.")),
             under("4.expiry-not-stale", row_is(db, seq["expired"], "The token decides, not the clock.",
                                               state="sent"))),
        ("4.expiry-not-stale",))
    add("another publisher took the row over", (seq["taken over"], base + 4),
        f"StaleLease (the row is leased by 'B' with token {base + 9}); nothing changes",
        stale("taken over", base + 4, TOKEN_HINT), ("4.stale",))
    add("a token newer than the row's", (seq["newer token"], base + 6), "StaleLease; nothing changes",
        stale("newer token", base + 6, "Only exactly the row's token completes it, not a larger one."), ("4.stale",))
    for label in ("pending", "sent", "quarantined"):
        fence = before[seq[label]]["fence"]
        add(f"a {label} row with its own token", (seq[label], fence), "StaleLease; nothing changes",
            stale(label, fence, f"Only a leased row can be completed: a {label} row's token is not a lease."),
            ("4.stale",))
    unknown = len(layout) + rng.randint(5, 50)
    add("an unknown seq", (unknown, base), "KeyError",
        both(under("4.unknown-keyerror", raises("KeyError", "A seq without a row is a KeyError, not StaleLease.")),
             under("4.unknown-keyerror", no_open_transaction)), ("4.unknown-keyerror",))
    for label, call_args, hint in (
            ("bool seq", (True, base), BOOL_HINT + " complete(con, True, …) must not complete row 1."),
            ("bool fence", (seq["bool fence"], True), BOOL_HINT + " True is not token 1."),
            ("float seq", (float(seq["float seq"]), base + 10), "seq must be an int: 10.0 == 10 for SQLite too."),
            ("str seq", (str(seq["str seq"]), base + 11), "seq must be an int: SQLite turns '11' into 11 for you."),
            ("float fence", (seq["float fence"], float(base + 12)), "fence must be an int."),
            ("None fence", (seq["None fence"], None), "fence must be an int.")):
        add(f"{label} is refused before the DB is touched", call_args, "ValueError; no SQL run; nothing changes",
            both(under("4.int-args", raises("ValueError", hint)), untouched(label, hint, "4.int-args"),
                 under("4.int-args", _no_sql(hint))), ("4.int-args",), hint)
    more = _token_between_statements(ctx, "complete", now, base + 30, None, "4.one-transaction",
                                    "None (the row sent), or StaleLease if the other publisher took the row over "
                                    "first (the row stays B's)")
    return calls_on(ctx, plans + more[0], specs + more[1])


TAKE_OVER_HINT = ("Check the token and change the row in one BEGIN IMMEDIATE transaction: a check made before the "
                 "transaction is stale by the time you write (another publisher took the row over between your check "
                 "and your UPDATE). A deferred BEGIN is not enough: its UPDATE then fails with 'database is locked' "
                 "where BEGIN IMMEDIATE would have waited.")


def _token_between_statements(ctx: StepContext, fn: str, now: float, start: int, policy: tuple | None, clause: str,
                             expected: str) -> tuple[list[Plan], list[dict]]:
    """complete or fail on A's row (its lease ran out, nobody re-claimed it yet) while another
    publisher B re-claims the row between any two of its statements."""
    fence = start - 2
    template = make_outbox(ctx.path(f"{fn}-boundaries.db"),
                          [row(name(ctx.rng, "slow"), state="leased", owner="A", lease_until=now - 1, fence=fence,
                               attempts=1)], counter=start)
    take_over = [["UPDATE fence_counter SET last = last + 1 WHERE id = 1", []],
                 ["UPDATE outbox SET state = 'leased', owner = 'B', lease_until = ?, attempts = attempts + 1, "
                 "fence = (SELECT last FROM fence_counter WHERE id = 1) WHERE seq = 1", [encode(now + 60)]]]
    args = [value(1), value(fence)]
    called = f"{fn}(con, 1, {fence}"
    if policy is not None:
        seed = ctx.rng.randrange(2**31)
        args += [{"error": {"kind": "transient", "message": "the warehouse is unreachable"}}, value(now),
                 _policy(*policy, seed)]
        called += f", OSError(...), {now!r}, policy"
    called += ")"

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        r = rows_of(path)[1]
        if landed:
            if outcome.get("kind") != "raised" or "StaleLease" not in outcome.get("mro", [outcome.get("type")]):
                return Miss(f"{fn} {describe(outcome)} and the row B had just claimed is now {shown(r)}",
                           TAKE_OVER_HINT)
            if r["state"] != "leased" or r["owner"] != "B" or r["fence"] != start + 1:
                return Miss(f"{fn} raised StaleLease, but the row B had just claimed is now {shown(r)}", TAKE_OVER_HINT)
            return None
        want = ("returned", None) if fn == "complete" else ("returned", "pending")
        got = (outcome.get("kind"), value_of({"outcome": outcome}) if outcome.get("kind") == "returned" else None)
        if got != want or r["owner"] is not None or r["fence"] != fence:
            return Miss(f"{fn} {describe(outcome)}; the row is {shown(r)}", TAKE_OVER_HINT)
        return None

    return between_statements(ctx, fn, called, template, args, clause, take_over, judge, expected)


def _no_sql(hint: str):
    def check(record: dict) -> Miss | None:
        words = record["observed"].get("statements", [])
        if words:
            return Miss(f"ValueError, but only after running {words[:4]}", "Check the types before touching the "
                                                                            "database. " + hint)
        return None

    return check


# --- step 5 ---------------------------------------------------------------------------------


def check_backoff(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    plans, calls = [], []

    def add(label: str, attempt, base, cap, check, clauses: tuple[str, ...], hint: str = "", hang: str = "") -> None:
        seed = rng.randrange(2**31)
        plans.append(Plan(label, f"backoff({attempt!r}, {base!r}, {cap!r}, random.Random({seed}))",
                         _expected_wait(attempt, base, cap), check(seed, attempt, base, cap), hint, clauses=clauses,
                         hang_clause=hang))
        calls.append({"name": label, "seed": seed, "args": [encode(attempt), encode(base), encode(cap)]})

    fixed = [
        ("attempt 1", 1, 2.0, 60.0),
        ("attempt 2 doubles the ceiling", 2, 2.0, 60.0),
        ("attempt 4", 4, 0.5, 60.0),
        ("the cap", 9, 2.0, 60.0),
        ("exactly at the cap", 6, 1.875, 60.0),
        ("base == cap", 3, 5.0, 5.0),
        ("int base and cap", 3, 1, 30),
        ("a tiny base, a large cap", 70, 1e-20, 3600.0),
        # 2 ** 1099 is past the largest float, yet base * 2 ** 1099 is about 1.4e30, below the cap:
        # neither a float power nor "past 1024 the cap bites" gives this ceiling.
        ("a tiny base past 2 ** 1024", 1100, 1e-300, 1e300),
    ]
    # Last, after the refusals: a solution that builds 2 ** attempt spends seconds on 10**9 and,
    # on a busy machine, hangs there; a hang ends the child, and no case after it runs.
    large = [
        ("attempt 10**6", 10**6, 0.25, 30.0),
        ("attempt 10**6 with an int base", 10**6, 1, 3600),
        ("attempt 10**9", 10**9, 0.5, 60.0),
    ]
    # Randomness adds cases, never replaces them, and never changes what a case can catch: each
    # random case stays in its category (below the cap with room to spare, or capped) under every seed.
    for n in (1, 2):
        attempt, base = rng.randint(1, 12), round(rng.uniform(0.01, 10), 3)
        fixed.append((f"random, below the cap ({n})", attempt, base,
                     round(base * 2 ** (attempt - 1) * rng.uniform(2.5, 50), 3)))
        attempt, base = rng.randint(8, 60), round(rng.uniform(0.01, 5), 3)
        # base <= cap < the ceiling: the contract's precondition holds and the cap really bites.
        fixed.append((f"random, capped ({n})", attempt, base, round(base * rng.uniform(1, 2 ** (attempt - 1) / 1.5), 3)))
    def drawn(label: str, attempt: int, base, cap) -> None:
        clauses = ("5.full-jitter", "5.seeded-rng") + (("5.cap",) if oracle.ceiling(attempt, base, cap) == cap else ()) + \
                 (("5.large-attempt",) if attempt > 1024 else ())
        add(label, attempt, base, cap, _drawn, clauses, hang="5.large-attempt" if attempt >= 10**6 else "")

    for label, attempt, base, cap in fixed:
        drawn(label, attempt, base, cap)
    for label, attempt, base, cap, hint in (
            ("attempt 0", 0, 1.0, 10.0, "attempt starts at 1."),
            ("attempt -1", -1, 1.0, 10.0, "attempt starts at 1."),
            ("attempt True", True, 1.0, 10.0, BOOL_HINT),
            ("attempt 2.0", 2.0, 1.0, 10.0, "attempt must be an int."),
            ("base 0", 1, 0, 10.0, "base must be more than 0."),
            ("base -1", 1, -1.0, 10.0, "base must be more than 0."),
            ("base nan", 1, float("nan"), 10.0, "nan compares false with everything: test `math.isfinite`."),
            ("base True", 1, True, 10.0, BOOL_HINT),
            ("cap below base", 1, 5.0, 4.0, "0 < base <= cap."),
            ("cap inf", 1, 1.0, float("inf"), "cap must be finite."),
            ("cap nan", 1, 1.0, float("nan"), "nan compares false with everything: test `math.isfinite`."),
            ("cap a str", 1, 1.0, "10", "cap must be an int or a float."),
            ("cap True", 1, 1.0, True, BOOL_HINT)):
        add(f"{label} is refused", attempt, base, cap, lambda *a, hint=hint: both(raises("ValueError", hint), _no_draw(a[0])),
            ("5.arg-ranges",), hint)
    for label, attempt, base, cap in large:
        drawn(label, attempt, base, cap)
    from labkit.judge.differential import after_fixed

    cases = ctx.cases("backoffs", plans, {"calls": calls})
    return after_fixed(cases, BACKOFF_PROPERTY, "backoff on generated inputs", lambda: _backoff_property(ctx))


BACKOFF_PROPERTY = "backoff agrees with the contract on generated inputs"  # differential's default name


def _backoff_property(ctx: StepContext) -> list[Case]:
    """backoff against the oracle on inputs Hypothesis draws (and shrinks), in one child that
    stays up; the adapter builds each Random(seed) in the child."""
    from hypothesis import strategies as st

    from labkit.judge.differential import differential

    sizes = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False) | st.integers(1, 100)
    # Small attempts and roomy caps are where a wrong exponent or jitter shows; weight them.
    attempts = st.integers(1, 8) | st.integers(1, 8) | st.integers(9, 80) | st.sampled_from((1_000, 4_321, 10**6))
    factors = st.sampled_from((1, 1.5, 2, 3, 7.5, 64, 1000)) | st.floats(min_value=1.0, max_value=1e4)
    valid = st.tuples(attempts, sizes, factors).map(lambda t: (t[0], t[1], t[1] * t[2]))
    # Valid inputs only: whether a random search meets one bad argument depends on the seed, and
    # a verdict must not; every bad argument has its own case above, in every run.
    strategy = st.tuples(valid, st.integers(0, 2**32 - 1)).map(lambda t: (*t[0], t[1]))
    return differential(ctx, "backoff", strategy, oracle.backoff_triple, _backoff_clause,
                       clauses=("5.full-jitter", "5.cap", "5.seeded-rng", "5.large-attempt"),
                       adapter="checks.relay.probes:backoff_adapter", examples=100,
                       show_call=lambda a, b, c, seed: f"backoff({a!r}, {b!r}, {c!r}, random.Random({seed}))")


def _backoff_clause(attempt, base, cap, seed) -> tuple[str, str]:
    try:
        oracle.backoff_triple(attempt, base, cap, seed)
    except ValueError:
        return "5.arg-ranges", ("attempt is an int >= 1; base and cap finite ints or floats with 0 < base <= cap; "
                               "bool is never a number. Anything else is ValueError.")
    if attempt >= 1_000:
        return "5.large-attempt", "Stop doubling once the ceiling has reached the cap: never build 2 ** attempt."
    if oracle.ceiling(attempt, base, cap) == cap and oracle.ceiling(attempt, base, math.inf) > cap:
        return "5.cap", "The ceiling is min(cap, base * 2 ** (attempt - 1)): never more than cap."
    return "5.full-jitter", ("The result is (wait, next draw, global random used): one rng.uniform(0, ceiling) from "
                            "the rng passed in, with ceiling = base * 2 ** (attempt - 1) for this attempt.")


def _expected_wait(attempt, base, cap) -> str:
    try:
        return f"a uniform draw from [0, {oracle.ceiling(attempt, base, cap):g}], from that Random"
    except (TypeError, ValueError):
        return "ValueError"


def _no_draw(seed: int):
    def check(record: dict) -> Miss | None:
        if record["observed"].get("rng_next") != oracle.next_draw(seed, 0):
            return Miss("ValueError, but only after drawing from rng", "Validate before drawing.")
        return None

    return check


def _drawn(seed: int, attempt: int, base: float, cap: float):
    """The wait Random(seed) gives, or a miss that names the mistake by the shape of what came
    back (the same draw times another ceiling, the ceiling itself, half plus half...): a rule of
    what was returned, not of which draw the seed happened to give."""
    ceiling = oracle.ceiling(attempt, base, cap)
    uncapped = oracle.ceiling(attempt, base, math.inf)
    doubled = oracle.ceiling(attempt + 1, base, cap)
    expected = oracle.backoff(attempt, base, cap, random.Random(seed))
    draw = random.Random(seed).random()  # the one random() behind the expected wait

    def like(got: float, want: float) -> bool:
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)

    def check(record: dict) -> Miss | None:
        outcome, seen = record["outcome"], record["observed"]
        if outcome["kind"] == "raised" and outcome["type"] == "OverflowError":
            return Miss(describe(outcome), "Don't compute 2 ** attempt as a float, nor base times an exact "
                                          "2 ** attempt (an int that large cannot become a float): double base step "
                                          "by step and stop once the ceiling has reached the cap, or use "
                                          "math.ldexp(base, attempt - 1).", clause="5.large-attempt")
        if outcome["kind"] != "returned":
            return Miss(describe(outcome), "backoff returns a float: the wait in seconds.")
        got = value_of(record)
        if seen.get("seconds", 0) > 0.5:
            return Miss(f"it took {seen['seconds']:.2f} s", "Don't loop up to `attempt`: stop doubling once the "
                                                          "ceiling has reached the cap.", clause="5.large-attempt")
        if seen.get("global_used"):
            return Miss(f"returned {show(got)} and used the global `random` module",
                       "Draw only from the rng passed in (`rng.uniform(0, ceiling)`): the global random module "
                       "cannot be replayed from a seed.", clause="5.seeded-rng")
        if type(got) not in (int, float) or isinstance(got, bool):
            return Miss(f"returned {show(got)}", "Return the wait as a float.")
        if like(got, expected):
            if seen.get("rng_next") != oracle.next_draw(seed, 1):
                used = "more than once" if seen.get("rng_next") != oracle.next_draw(seed, 0) else "not at all"
                return Miss(f"returned {show(got)}, but drew from rng {used}", "Draw exactly once, with rng.random() "
                           "or rng.uniform(): the same seed must give the same waits.", clause="5.seeded-rng")
            return None
        if uncapped > cap and (got > cap * (1 + 1e-12) or like(got, draw * uncapped)):
            return Miss(f"returned {got!r}, a draw below base * 2 ** (attempt - 1) = {uncapped:g}, past cap {cap!r}",
                       "The ceiling is `min(cap, base * 2 ** (attempt - 1))`: without the cap, waits grow without "
                       "bound.", clause="5.cap")
        if like(got, ceiling):
            return Miss(f"returned {got!r}, the ceiling itself", "Full jitter draws the wait: `rng.uniform(0, "
                                                                "ceiling)`. Without jitter every failed row comes "
                                                                "back at the same moment.", clause="5.full-jitter")
        if attempt > 1024 and ceiling < cap and like(got, draw * cap):
            return Miss(f"returned {got!r}: a draw below the cap {cap!r}, but base * 2 ** (attempt - 1) = {ceiling:g} "
                       "is below the cap here", "The cap does not always bite past attempt 1024: with a tiny base "
                       "the ceiling is still below it. Double base step by step and stop at the cap, or use "
                       "math.ldexp(base, attempt - 1).", clause="5.large-attempt")
        if like(got, ceiling / 2 + draw * ceiling / 2):
            return Miss(f"returned {got!r}: half the ceiling {ceiling:g} plus a random half",
                       "That is equal jitter. Full jitter draws from the whole range: `rng.uniform(0, ceiling)`.",
                       clause="5.full-jitter")
        if like(got, draw * doubled):
            return Miss(f"returned {got!r}: a draw below {doubled:g}, the ceiling of attempt {attempt + 1}",
                       "The ceiling for attempt k is base * 2 ** (k - 1): attempt 1 waits up to base.",
                       clause="5.full-jitter")
        return Miss(f"returned {got!r}; Random({seed}) gives {expected!r} for a ceiling of {ceiling:g}",
                   "The ceiling is min(cap, base * 2 ** (attempt - 1)), computed exactly; then one "
                   "rng.uniform(0, ceiling) from the rng passed in.", clause="5.full-jitter")

    return check


# --- step 6 ---------------------------------------------------------------------------------


def _policy(base, cap, max_attempts, seed: int | None, **extra) -> dict:
    fields = {"base": encode(base), "cap": encode(cap), "max_attempts": encode(max_attempts),
              **{k: encode(v) for k, v in extra.items()}}
    return {"policy": {"fields": fields, **({"seed": seed} if seed is not None else {})}}


def check_fail(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    tok = rng.randint(20, 400)
    now = float(rng.randint(1_000, 9_000)) + 0.5
    base, cap, max_attempts = rng.choice((0.5, 1.0, 2.0)), 60.0, 4
    long = "é" * 150 + "x" * 100  # 250 characters, 400 bytes in UTF-8

    def leased(fence: int, attempts: int = 1, **extra) -> dict:
        return row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=fence, attempts=attempts,
                  **extra)

    layout = [
        ("bool seq", leased(tok)),
        ("transient", leased(tok + 2, attempts=1)),
        ("second attempt", leased(tok + 3, attempts=2)),
        ("last attempt", leased(tok + 4, attempts=max_attempts)),
        ("permanent", leased(tok + 5, attempts=1)),
        ("permanent subclass", leased(tok + 6, attempts=1)),
        ("stale", row(name(rng, "r"), state="leased", owner="B", lease_until=now + 30, fence=tok + 20, attempts=2)),
        ("pending", row(name(rng, "r"), state="pending", fence=tok + 8, attempts=1, due=now + 4,
                       last_error="Transient: x")),
        ("long message", leased(tok + 9, attempts=1)),
        ("float fence", leased(tok + 10)),
        ("bool fence", leased(1)),  # what True would mean
        ("bool now", leased(tok + 11)),
        ("past max", leased(tok + 12, attempts=max_attempts + 2)),
        ("policy checks", leased(tok + 13, attempts=1)),
        ("max_attempts 1", leased(tok + 15, attempts=1)),
        ("base equals cap", leased(tok + 16, attempts=2)),
        ("now 0", leased(tok + 17, attempts=1)),
        ("extra key", leased(tok + 18, attempts=1)),
        ("negative now", leased(tok + 14)),
        ("sent", row(name(rng, "r"), state="sent", fence=tok + 21, attempts=1)),
        ("quarantined", row(name(rng, "r"), state="quarantined", fence=tok + 22, attempts=2,
                           last_error="PermanentError: gone")),
    ]
    db = make_outbox(ctx.path("fail.db"), [r for _, r in layout], counter=tok + 30)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    before = rows_of(db)
    plans, specs = [], []

    def add(label: str, s, fence, error: dict, expected: str, check, clauses: tuple[str, ...], seed: int,
            hint: str = "", policy_fields: tuple = (base, cap, max_attempts), when=now,
            extra_policy: dict | None = None) -> None:
        rng_text = f"rng Random({seed})" if seed is not None else "no rng"
        plans.append(Plan(label, f"fail(con, {s!r}, {fence!r}, {error['kind'].replace('_', ' ')} error "
                                f"{error['message'][:30]!r}, {when!r}, {{base {policy_fields[0]!r}, cap "
                                f"{policy_fields[1]!r}, max_attempts {policy_fields[2]!r}, {rng_text}}})",
                         expected, check, hint, clauses=clauses))
        specs.append({"name": label, "fn": "fail", "db": str(db),
                     "args": [value(s), value(fence), {"error": error}, value(when),
                              _policy(*policy_fields, seed, **(extra_policy or {}))]})

    def draws(seed: int, n: int, clause: str, hint: str):
        def check(record: dict) -> Miss | None:
            if record["observed"].get("rng_next") != oracle.next_draw(seed, n):
                used = "drew from rng" if n == 0 else f"did not draw exactly {n} time"
                return Miss(f"fail {used}", hint, clause=clause)
            return None

        return check

    def untouched(label: str, hint: str, clause: str):
        def check(record: dict) -> Miss | None:
            if rows_of(db)[seq[label]] != before[seq[label]]:
                return Miss(f"row {seq[label]} became {shown(rows_of(db)[seq[label]])}", hint, clause=clause)
            return None

        return check

    transient = {"kind": "transient", "message": "the warehouse is unreachable"}
    for label, attempts in (("transient", 1), ("second attempt", 2)):
        seed = rng.randrange(2**31)
        due = now + oracle.backoff(attempts, base, cap, random.Random(seed))
        add(f"a transient failure on attempt {attempts}", seq[label], before[seq[label]]["fence"], transient,
            f"'pending'; due = now + backoff({attempts}, {base}, {cap}, rng) = {due:.6g}; owner and lease cleared; "
            "last_error 'Transient: the warehouse is unreachable'",
            both(under("6.returns-state", returns("pending", "Return the new state: 'pending' for a retry.")),
                 under("6.retry", row_is(db, seq[label], f"A transient failure with attempts ({attempts}) < "
                                                        "max_attempts goes back to pending, due at now + backoff("
                                                        "attempts, base, cap, rng): attempts counts claims.",
                                        state="pending", due=due)),
                 under("6.clears-lease", row_is(db, seq[label], "Clear owner and lease_until; keep fence and "
                                                              "attempts.", owner=None, lease_until=None,
                                               attempts=attempts, fence=before[seq[label]]["fence"])),
                 under("6.last-error", row_is(db, seq[label], "last_error is f\"{type(error).__name__}: {error}\".",
                                             last_error="Transient: the warehouse is unreachable")),
                 draws(seed, 1, "6.retry", "Draw the wait once, with backoff(attempts, base, cap, rng)."),
                 under("6.retry", no_open_transaction)),
            ("6.retry", "6.clears-lease", "6.last-error", "6.returns-state"), seed)
    seed = rng.randrange(2**31)
    add(f"a transient failure on attempt {max_attempts} of {max_attempts}", seq["last attempt"],
        before[seq["last attempt"]]["fence"], transient, "'quarantined'; no random number drawn",
        both(under("6.quarantine-max", returns("quarantined", f"attempts ({max_attempts}) >= max_attempts "
                                                           f"({max_attempts}): quarantine it.")),
             under("6.quarantine-max", row_is(db, seq["last attempt"], "attempts >= max_attempts → quarantined.",
                                             state="quarantined", owner=None, lease_until=None)),
             draws(seed, 0, "6.rng-only-retry", "A quarantine draws no random number: call backoff only for a "
                                               "retry.")),
        ("6.quarantine-max", "6.rng-only-retry"), seed)
    seed = rng.randrange(2**31)
    add(f"attempt {max_attempts + 2} of {max_attempts} (max_attempts was lowered)", seq["past max"],
        before[seq["past max"]]["fence"], transient, "'quarantined'",
        both(under("6.quarantine-max", returns("quarantined", "attempts >= max_attempts: also when attempts is past "
                                                             "it, not only equal to it.")),
             under("6.quarantine-max", row_is(db, seq["past max"], "attempts >= max_attempts → quarantined.",
                                             state="quarantined"))),
        ("6.quarantine-max",), seed)
    checked = seq["policy checks"]
    for label, fields, hint in (
            ("a policy without rng", (base, cap, max_attempts), "policy needs base, cap, max_attempts and rng."),
            ("a policy with base True", (True, cap, max_attempts), BOOL_HINT),
            ("a policy with base 0", (0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base 0.0", (0.0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base -1", (-1.0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base > cap", (cap + 1, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with max_attempts 0", (base, cap, 0), "max_attempts is an int of at least 1."),
            ("a policy with max_attempts True", (base, cap, True), BOOL_HINT)):
        seed = None if "without rng" in label else rng.randrange(2**31)
        # A PermanentError: the quarantine path never calls backoff, so only fail's own check can refuse.
        add(f"{label} is refused", checked, before[checked]["fence"],
            {"kind": "permanent", "message": "sku snack is discontinued"}, "ValueError; nothing changes",
            both(under("6.token-check", raises("ValueError", "Check the policy before touching the row: " + hint)),
                 untouched("policy checks", "A refused call changes nothing.", "6.token-check")),
            ("6.token-check",), seed, hint, policy_fields=fields)
    for label, fields, when, state, extra in (
            ("max_attempts 1", (base, cap, 1), now, "quarantined", {}),
            ("base equals cap", (cap, cap, max_attempts), now, "pending", {}),
            ("now 0", (base, cap, max_attempts), 0, "pending", {}),
            ("extra key", (base, cap, max_attempts), now, "pending", {"note": "other keys are ignored"})):
        seed = rng.randrange(2**31)
        attempts = before[seq[label]]["attempts"]
        due = {} if state == "quarantined" else {"due": when + oracle.backoff(attempts, fields[0], fields[1],
                                                                              random.Random(seed))}
        add(f"{label} is accepted", seq[label], before[seq[label]]["fence"], transient, f"{state!r}",
            both(under("6.returns-state", returns(state, "This policy and this now are inside the contract: "
                                                        "max_attempts >= 1, 0 < base <= cap, now >= 0; other keys "
                                                        "of the policy are ignored.")),
                 under("6.retry", row_is(db, seq[label], "Apply the policy as given.", state=state, **due))),
            ("6.returns-state", "6.retry"), seed, policy_fields=fields, when=when, extra_policy=extra)
    for label, kind in (("permanent", "permanent"), ("permanent subclass", "permanent_subclass")):
        seed = rng.randrange(2**31)
        message = "sku snack is discontinued"
        type_name = "PermanentError" if kind == "permanent" else "Discontinued"
        add(f"a {label.replace('permanent', 'PermanentError')} on attempt 1", seq[label], before[seq[label]]["fence"],
            {"kind": kind, "message": message},
            f"'quarantined' at once; last_error '{type_name}: {message}'; no random number drawn",
            both(under("6.quarantine-permanent", returns("quarantined", "A PermanentError is never retried: "
                                                                       "`isinstance(error, PermanentError)` → "
                                                                       "quarantine, whatever attempts says.")),
                 under("6.quarantine-permanent", row_is(db, seq[label], "Quarantine a PermanentError at once.",
                                                       state="quarantined", owner=None, lease_until=None)),
                 under("6.last-error", row_is(db, seq[label], "last_error is f\"{type(error).__name__}: {error}\": "
                                                            "the error's own class name.",
                                             last_error=f"{type_name}: {message}")),
                 draws(seed, 0, "6.rng-only-retry", "A quarantine draws no random number.")),
            ("6.quarantine-permanent", "6.last-error"), seed)
    seed = rng.randrange(2**31)
    add("a stale token", seq["stale"], tok + 7, transient, "StaleLease; nothing changes; no random number drawn",
        both(under("6.token-check", is_module_exception("StaleLease", "Check the token as complete does, before "
                                                                     "anything else: " + TOKEN_HINT)),
             untouched("stale", "fail must not touch a row another publisher owns now.", "6.token-check"),
             draws(seed, 0, "6.rng-only-retry", "Check the token first, then draw: a stale call consumes no random "
                                               "number."),
             under("6.token-check", no_open_transaction)),
        ("6.token-check", "6.rng-only-retry"), seed)
    seed = rng.randrange(2**31)
    add("a pending row", seq["pending"], before[seq["pending"]]["fence"], transient, "StaleLease; nothing changes",
        both(under("6.token-check", is_module_exception("StaleLease", "Only a leased row with this token can fail.")),
             untouched("pending", "fail must not touch a row that is not leased.", "6.token-check")),
        ("6.token-check",), seed)
    seed = rng.randrange(2**31)
    add("an unknown seq", len(layout) + 7, tok, transient, "KeyError",
        under("6.token-check", raises("KeyError", "A seq without a row is a KeyError.")), ("6.token-check",), seed)
    seed = rng.randrange(2**31)
    add("a 250-character message", seq["long message"], before[seq["long message"]]["fence"],
        {"kind": "transient", "message": long}, "last_error cut to 200 characters (not bytes)",
        under("6.last-error", row_is(db, seq["long message"], "Cut the text to 200 characters: `text[:200]` on the "
                                                             "str, not on its bytes.",
                                    last_error=f"Transient: {long}"[:200])), ("6.last-error",), seed)
    for label, s, fence, hint, when in (
            ("bool seq", True, tok, BOOL_HINT + " fail(con, True, …) must not fail row 1.", now),
            ("float fence", seq["float fence"], float(tok + 10), "fence must be an int.", now),
            ("bool fence", seq["bool fence"], True, BOOL_HINT + " True is not token 1.", now),
            ("bool now", seq["bool now"], tok + 11, BOOL_HINT + " now is a number, never a bool.", True),
            ("negative now", seq["negative now"], tok + 14, "now is a finite number >= 0, as in claim.", -0.001)):
        seed = rng.randrange(2**31)
        add(f"{label} is refused", s, fence, transient, "ValueError; nothing changes; no SQL run",
            both(under("6.token-check", raises("ValueError", hint)), untouched(label, hint, "6.token-check"),
                 draws(seed, 0, "6.rng-only-retry", "Validate before drawing."),
                 under("6.token-check", _no_sql(hint))), ("6.token-check",), seed, hint,
            when=when)
    for label in ("sent", "quarantined"):
        seed = rng.randrange(2**31)
        add(f"a {label} row with its own token", seq[label], before[seq[label]]["fence"], transient,
            "StaleLease; nothing changes",
            both(under("6.token-check", is_module_exception("StaleLease", f"Only a leased row with this token can "
                                                                         f"fail: look the row up by seq whatever its "
                                                                         f"state (a {label} row is not unknown).")),
                 untouched(label, f"fail must not touch a {label} row.", "6.token-check")),
            ("6.token-check",), seed)
    more = _token_between_statements(ctx, "fail", now, tok + 40, (base, cap, max_attempts), "6.one-transaction",
                                    "'pending', or StaleLease if the other publisher took the row over first (the "
                                    "row stays B's)")
    return calls_on(ctx, plans + more[0], specs + more[1])


# --- step 7 ---------------------------------------------------------------------------------


def check_redrive(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000)) + 0.25
    q = [name(rng, "q") for _ in range(3)]
    letters = "".join(rng.sample(string.ascii_lowercase, 2))  # two one-character ids: the bare string's letters
    layout = [
        row(q[0], state="quarantined", attempts=5, fence=31, due=now - 100, last_error="PermanentError: gone"),
        row(q[1], state="quarantined", attempts=2, fence=32, due=now - 50, last_error="Transient: down"),
        row(q[2], state="quarantined", attempts=1, fence=33, last_error="PermanentError: bad sku"),
        row(name(rng, "sent"), state="sent", attempts=1, fence=34),
        row(name(rng, "pend"), state="pending", attempts=1, fence=35, due=now + 9, last_error="Transient: x"),
        row(name(rng, "lease"), state="leased", owner="A", lease_until=now + 9, attempts=1, fence=36),
        row(letters[0], state="quarantined", attempts=3, fence=37, last_error="Transient: down"),
        row(letters[1], state="quarantined", attempts=3, fence=38, last_error="Transient: down"),
    ]
    crowd = [f"crowd-{i:03d}" for i in range(300)]  # more than CPython's cached small ints
    layout += [row(i, state="quarantined", attempts=5, fence=40 + n, last_error="Transient: down")
               for n, i in enumerate(crowd)]
    template = make_outbox(ctx.path("redrive.db"), layout, counter=400)
    ids = {r["id"]: i + 1 for i, r in enumerate(layout)}
    sent_id, pending_id, leased_id = layout[3]["id"], layout[4]["id"], layout[5]["id"]
    cases = [
        ("one quarantined row", [q[0]], 1, "7.requeue"),
        ("a tuple of two", (q[0], q[1]), 2, "7.requeue"),
        ("a set", {q[2]}, 1, "7.ids-shape"),
        ("an empty list", [], 0, "7.ids-shape"),
        ("an empty tuple", (), 0, "7.ids-shape"),
        ("now 0", [q[2]], 1, "7.requeue"),
        ("300 quarantined rows", crowd, 300, "7.requeue"),
        ("now -0.001", [q[0]], ValueError, "7.ids-shape"),
        ("a quarantined and a sent row", [q[0], sent_id], ValueError, "7.all-or-nothing"),
        ("a sent row", [sent_id], ValueError, "7.never-sent"),
        ("a pending row", [pending_id], ValueError, "7.all-or-nothing"),
        ("a leased row", [leased_id], ValueError, "7.all-or-nothing"),
        ("an unknown id", [q[1], name(rng, "ghost")], ValueError, "7.all-or-nothing"),
        ("a bare string", letters, ValueError, "7.ids-shape"),
        ("an id listed twice", [q[0], q[0]], ValueError, "7.ids-shape"),
        ("an id that is not a str", [q[0], 1], ValueError, "7.ids-shape"),
        ("now nan", [q[0]], ValueError, "7.ids-shape"),
        ("now True", [q[0]], ValueError, "7.ids-shape"),
    ]
    hints = {
        "a quarantined and a sent row": "All or nothing: check every id first, change rows only when all are "
                                       "quarantined. A redrive that applies partially leaves the operator guessing.",
        "a sent row": "A sent row is never redriven: it was delivered, and sending it again is a duplicate nobody "
                     "asked for.",
        "a pending row": "Only quarantined rows can be redriven.",
        "a leased row": "Only quarantined rows can be redriven: a leased row belongs to a publisher.",
        "an unknown id": "Every id must name a quarantined row: an unknown one is a ValueError, and nothing changes.",
        "a bare string": f"A bare str is iterable: {letters!r} would redrive the rows {letters[0]!r} and "
                        f"{letters[1]!r}. Refuse it.",
        "an id listed twice": "An id listed twice is a ValueError (the count would lie).",
        "an id that is not a str": "Each id is a str.",
        "now nan": "now is a finite number >= 0, as in claim.",
        "now True": BOOL_HINT,
        "now -0.001": "now is a finite number >= 0, as in claim.",
    }
    paths = copies(template, ctx.workdir, [f"case-{i}" for i in range(len(cases))])
    plans, specs = [], []
    for (label, arg, result, clause), path in zip(cases, paths, strict=True):
        when = {"now nan": float("nan"), "now True": True, "now 0": 0, "now -0.001": -0.001}.get(label, now)
        called = f"redrive(con, {arg!r}, {when!r})"
        if result is ValueError:
            hint = hints[label]
            plans.append(Plan(label, called, "ValueError; nothing changes",
                             refused(hint, clause, path, stores.fingerprint(path), hint), hint, clauses=(clause,)))
        else:
            plans.append(Plan(label, called, f"{result}; each back to pending, attempts 0, due {when:g}, last_error kept",
                             both(under(clause, returns(result, "Return how many rows were redriven (now 0 is a "
                                                                "valid time).")),
                                  under("7.requeue", _requeued(path, [ids[i] for i in arg], when)),
                                  under("7.requeue", no_open_transaction)), clauses=(clause, "7.requeue")))
        ids_arg = {"set": sorted(arg)} if isinstance(arg, set) else value(arg)  # sets do not cross the pipe
        specs.append({"name": label, "fn": "redrive", "db": str(path), "args": [ids_arg, value(when)]})
    more = _redrive_between_statements(ctx, now)
    return calls_on(ctx, plans + more[0], specs + more[1])


def _redrive_between_statements(ctx: StepContext, now: float) -> tuple[list[Plan], list[dict]]:
    """redrive of two quarantined rows while another operator's redrive and a publisher's claim
    take the second one between any two of its statements; each statement failing; a Ctrl-C."""
    ids = [name(ctx.rng, "q") for _ in range(2)]
    template = make_outbox(ctx.path("redrive-boundaries.db"),
                          [row(i, state="quarantined", attempts=3, fence=20 + n, last_error="Transient: down")
                           for n, i in enumerate(ids)], counter=30)
    taken = [["UPDATE fence_counter SET last = last + 1 WHERE id = 1", []],
             ["UPDATE outbox SET state = 'leased', owner = 'B', lease_until = ?, attempts = 1, "
              "fence = (SELECT last FROM fence_counter WHERE id = 1) WHERE seq = 2", [encode(now + 60)]]]
    hint = ("Check every row and change them in one BEGIN IMMEDIATE transaction: a state read before the "
            "transaction can be stale by the time you write (another publisher claimed the row between your check "
            "and your UPDATE), and a leased row must never be put back to pending.")

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        after = rows_of(path)
        if landed:
            if outcome.get("kind") != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(f"redrive {describe(outcome)}; the rows are now {[shown(r) for r in after.values()]}", hint)
            if after[2]["owner"] != "B" or after[2]["state"] != "leased" or after[1]["state"] != "quarantined":
                return Miss(f"redrive raised ValueError, but the rows are now {[shown(r) for r in after.values()]}",
                           hint)
            return None
        if outcome.get("kind") != "returned" or value_of({"outcome": outcome}) != 2 or \
                [r["state"] for r in after.values()] != ["pending", "pending"]:
            return Miss(f"redrive {describe(outcome)}; the rows are {[shown(r) for r in after.values()]}", hint)
        return None

    return between_statements(ctx, "redrive", f"redrive(con, {ids!r}, {now!r})", template, [value(ids), value(now)],
                             "7.all-or-nothing", taken, judge,
                             "2, or ValueError if the other publisher claimed the second row first (it stays B's)")


def _requeued(path: Path, seqs: list[int], now: float):
    def check(record: dict) -> Miss | None:
        after = rows_of(path)
        for s in seqs:
            r = after[s]
            if r["state"] != "pending" or r["attempts"] != 0 or not same_number(r["due"], now):
                return Miss(f"row {s} is {shown(r)}", "Each goes back to pending with attempts = 0 and due = now.")
            if not r["last_error"]:
                return Miss(f"row {s} lost its last_error", "Keep last_error: the history of what went wrong is "
                                                           "worth more than a clean row.")
        others = [s for s, r in after.items() if s not in seqs and r["state"] == "pending" and r["attempts"] == 0]
        if others:
            return Miss(f"rows {others} were redriven too", "Change only the rows named in ids.")
        return None

    return check


# --- step 8 ---------------------------------------------------------------------------------


def check_relay_once(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000)) + 0.5
    lease, base, cap = 30.0, rng.choice((0.5, 1.0, 2.0)), 60.0
    plans: list[Plan] = []
    scenarios: list[dict] = []

    def scenario(label: str, rows: list[dict], check, clauses: tuple[str, ...], *, expected: str, called: str = "",
                 replies: dict | None = None, args: tuple | None = None, policy: tuple | None = None,
                 counter_start: int = 10, **flags) -> Path:
        db = make_outbox(ctx.path(f"s{len(scenarios)}.db"), rows, counter=counter_start)
        seed = rng.randrange(2**31)
        call_args = args or ("A", now, lease, 16)
        fields = dict(zip(("base", "cap", "max_attempts"), policy or (base, cap, 5), strict=True))
        scenarios.append({"name": label, "db": str(db), "args": [encode(a) for a in call_args], "now": now,
                         "policy": {k: encode(v) for k, v in fields.items()}, "seed": seed,
                         "replies": replies or {}, **flags})
        shown_args = ", ".join(repr(a) for a in call_args[:1]) + ", send, " + ", ".join(repr(a) for a in call_args[1:])
        plans.append(Plan(label, called or f"relay_once(con, {shown_args}, policy, after_claim, after_send)", expected,
                         check(db, rows, seed, fields), clauses=clauses))
        return db

    ok = [row(name(rng, "ok"), qty=rng.randint(1, 1000)) for _ in range(3)]
    scenario("delivers every claimed row in order", ok, _delivered_in_order,
             ("8.order-hooks", "8.counts", "8.claim-committed"),
             expected="{'sent': 3, 'retry': 0, 'quarantined': 0, 'stale': 0}; for each row: after_claim(seq), "
                     "send(its event), after_send(seq), then complete")
    mixed = [row(name(rng, p), qty=rng.randint(1, 1000)) for p in ("ok", "down", "odd", "gone", "ok")]
    truthy = rng.choice((1, "yes", "True", {"ack": mixed[2]["id"]}, [True]))  # truthy, yet not True
    scenario("a failure does not stop the batch", mixed, _mixed(truthy, now),
             ("8.no-head-of-line", "8.true-only", "8.exception-fails", "8.counts"),
             expected="{'sent': 2, 'retry': 2, 'quarantined': 1, 'stale': 0}; all five sent; the OSError and the "
                     f"non-True reply ({truthy!r}) retried with backoff, the PermanentError quarantined",
             called=f"relay_once(...) where send raises OSError for row 2, returns {truthy!r} for row 3 and raises "
                   "PermanentError for row 4",
             replies={mixed[1]["id"]: {"raise": "transient"}, mixed[2]["id"]: {"return": encode(truthy)},
                     mixed[3]["id"]: {"raise": "permanent"}})
    poison = [row(name(rng, "bad"), body="not json"), row(name(rng, "list"), body="[1, 2]"), row(name(rng, "ok"))]
    equal = [row(name(rng, "one")), row(name(rng, "float"))]
    scenario("a reply equal to True is not True", equal, _equal_to_true, ("8.true-only",),
             expected="{'sent': 0, 'retry': 2, 'quarantined': 0, 'stale': 0}: 1 == True and 1.0 == True, but "
                     "neither is True",
             called="relay_once(...) where send returns 1, then 1.0",
             replies={equal[0]["id"]: {"return": encode(1)}, equal[1]["id"]: {"return": encode(1.0)}})
    scenario("a stored body that is not a JSON object", poison, _poison_bodies,
             ("8.poison-body", "8.no-head-of-line"),
             expected="{'sent': 1, 'retry': 0, 'quarantined': 2, 'stale': 0}; send called only for the third row")
    for how in ("complete", "fail"):
        pair = [row(name(rng, "taken")), row(name(rng, "ok"))]
        scenario(f"a row taken over during send ({how} is stale)", pair, _stale(how), ("8.stale-skip", "8.counts"),
                 expected="{'sent': 1, 'retry': 0, 'quarantined': 0, 'stale': 1}; the taken row sent once, never "
                         "retried; it stays leased by B",
                 called="relay_once(...) where another publisher B claims row 1 while send runs"
                       + (" and send then raises OSError" if how == "fail" else ""),
                 replies={pair[0]["id"]: {"raise": "transient"}} if how == "fail" else {}, take_over=pair[0]["id"])
    for kind, label in (("keyboard", "KeyboardInterrupt"), ("system_exit", "SystemExit")):
        one = [row(name(rng, "ctrl-c")), row(name(rng, "next"))]
        scenario(f"{label} from send propagates", one, _propagates(label), ("8.base-exception",),
                 expected=f"{label}; the row stays leased (its lease will run out); the next row is not sent",
                 called=f"relay_once(...) where send raises {label}", replies={one[0]["id"]: {"raise": kind}})
    again = [row(name(rng, "gone")), row(name(rng, "ok"))]
    scenario("a second call in the same process, after a redrive", again, _again,
             ("8.order-hooks", "8.counts"),
             expected="first {'sent': 1, 'retry': 0, 'quarantined': 1, 'stale': 0}; after the operator's redrive the "
                     "second call sends the redriven row: {'sent': 1, 'retry': 0, 'quarantined': 0, 'stale': 0}, "
                     "a new dict",
             called="relay_once(...) where send raises PermanentError for row 1; the operator lifts the refusal and "
                   "redrives row 1; relay_once(...) again in the same process",
             replies={again[0]["id"]: {"raise": "permanent"}}, again=True)
    hook = [row(name(rng, "hook"))]
    scenario("an exception from after_claim propagates", hook, _hook_error, ("8.hook-errors",),
             expected="LookupError from the hook; send never called", claim_hook_raises=True,
             called="relay_once(...) where after_claim raises LookupError")
    tired = [row(name(rng, "tired"), attempts=2, fence=9, due=now - 1, last_error="Transient: down")]
    scenario("the last attempt is quarantined", tired, _last_attempt, ("8.counts", "6.quarantine-max"),
             expected="{'sent': 0, 'retry': 0, 'quarantined': 1, 'stale': 0}: the claim made attempts 3 = max_attempts",
             called="relay_once(...) with max_attempts 3 on a row claimed twice before; send raises OSError",
             policy=(base, cap, 3), replies={tired[0]["id"]: {"raise": "transient"}})
    for label, call_args, policy, hint, flags in (
            ("lease 0", ("A", now, 0, 16), None, "lease must be more than 0.", {}),
            ("limit 17", ("A", now, lease, 17), None, "limit ranges from 1 to 16.", {}),
            ("owner ''", ("", now, lease, 16), None, "owner has 1-64 characters.", {}),
            ("now nan", ("A", float("nan"), lease, 16), None, "now must be finite.", {}),
            ("a policy without rng", ("A", now, lease, 16), None, "policy needs the four keys base, cap, max_attempts "
                                                                 "and rng.", {"drop_rng": True}),
            ("a policy with base True", ("A", now, lease, 16), (True, cap, 5), BOOL_HINT, {}),
            ("a policy with base 0", ("A", now, lease, 16), (0, cap, 5), "0 < base <= cap, as backoff requires.", {}),
            ("a policy with base > cap", ("A", now, lease, 16), (5.0, 1.0, 5),
             "Check the policy like backoff would (0 < base <= cap) before claiming: otherwise the first failure "
             "raises with the row still leased.", {}),
            ("a policy with max_attempts True", ("A", now, lease, 16), (base, cap, True), BOOL_HINT, {}),
            ("limit True", ("A", now, lease, True), None, BOOL_HINT, {}),
            ("lease True", ("A", now, True, 16), None, BOOL_HINT, {})):
        rows = [row(name(rng, "safe"))]
        scenario(f"{label} is refused before claiming", rows, _refused_first(hint), ("8.args-first",),
                 expected="ValueError; nothing leased; send never called", args=call_args, policy=policy, **flags)
    return watched_cases(ctx, "relaying", plans, {"scenarios": scenarios},
                        {s["name"]: Path(s["db"]) for s in scenarios})


def _log(record: dict, kind: str) -> list[dict]:
    return [e for e in record["observed"].get("log", []) if e["kind"] == kind]


def _counts(expected: dict, hint: str = "Return the counts of this call: {'sent', 'retry', 'quarantined', 'stale'}."):
    return under("8.counts", returns(expected, hint))


def _delivered_in_order(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        sends = judged(record).get("send", [])
        for e in sends:  # the claim first: committed before anything is sent (the judge's own looks)
            failed = look_failed(e, "while send ran", "8.claim-committed")
            if failed is not None:
                return failed
            row_ = e.get("row") or {}
            if row_.get("state") != "leased" or row_.get("owner") != "A":
                seen = {k: row_[k] for k in ("state", "owner", "fence")} if row_ else None
                return Miss(f"while send ran, the judge's own connection saw row {row_.get('seq', e.get('event_id'))} "
                           f"as {seen}", "Claim (and commit the claim) before sending.", clause="8.claim-committed")
            if e.get("can_write") is False:
                return Miss("while send ran, the judge's own connection could not BEGIN IMMEDIATE",
                           "Commit the claim before the first send: a write lock held during a slow send blocks "
                           "every other publisher.", clause="8.claim-committed")
        if len(sends) < len(_log(record, "send")):
            return not_seen("while send ran", "8.claim-committed")
        log = record["observed"].get("log", [])
        kinds = [(e["kind"], decode(e["seq"]) if e["kind"] != "send" else e["seq"]) for e in log]
        want = [(k, s) for s in range(1, len(rows) + 1) for k in ("after_claim", "send", "after_send")]
        if kinds != want:
            return Miss(f"the calls were {kinds[:9]}", "For each claimed row in order: after_claim(seq), then "
                                                      "send(event), then after_send(seq) after a True ACK, then "
                                                      "complete.", clause="8.order-hooks")
        for e in _log(record, "send"):
            sent = decode(e["event"])
            if sent != json.loads(rows[e["seq"] - 1]["body"]):
                return Miss(f"send received {show(sent)}", "Send the event decoded from the row's body (a dict).",
                           clause="8.order-hooks")
        after_sends = judged(record).get("after_send", [])
        for e in after_sends:  # the judge's own looks while after_send ran
            failed = look_failed(e, "while after_send ran", "8.order-hooks")
            if failed is not None:
                return failed
            if (e.get("row") or {}).get("state") != "leased":
                state = (e.get("row") or {}).get("state", "missing")
                return Miss(f"when after_send({e.get('seq')}) ran the row was already {state}",
                           "Call after_send(seq) after the ACK and before complete.", clause="8.order-hooks")
        if len(after_sends) < len(_log(record, "after_send")):
            return not_seen("while after_send ran", "8.order-hooks")
        after = rows_of(db)
        if [r["state"] for r in after.values()] != ["sent"] * len(rows):
            return Miss(f"the rows are {[shown(r) for r in after.values()]}", "complete each row after its ACK.",
                       clause="8.order-hooks")
        return _counts({"sent": len(rows), "retry": 0, "quarantined": 0, "stale": 0})(record) or \
            no_open_transaction(record)

    return check


def _mixed(truthy, now: float):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        rng = random.Random(seed)

        def check(record: dict) -> Miss | None:
            sent = [e["seq"] for e in _log(record, "send")]
            if sent[:2] == [1, 2] and len(sent) < 5:
                return Miss(f"send was called for rows {sent} only",
                           "A failure does not stop the batch: fail that row and go on with the next one. Stopping "
                           "at the first failure is lab 01's contract, not this one's: a poison row would block "
                           "every row behind it.", clause="8.no-head-of-line")
            after = rows_of(db)
            want_states = ["sent", "pending", "pending", "quarantined", "sent"]
            states = [after[s]["state"] for s in range(1, 6)]
            if states[2] == "sent":
                return Miss(f"send returned {truthy!r} for row 3 and the row was completed",
                           "Only a return value that `is True` is an ACK; anything else is a DeliveryError: fail "
                           "the row.", clause="8.true-only")
            for s, kind in ((2, "Transient"), (4, "PermanentError")):
                if (after[s]["last_error"] or "").startswith("DeliveryError"):
                   return Miss(f"row {s}'s last_error is {after[s]['last_error']!r}, although send raised {kind}",
                               "fail the row with the exception send raised (the same object), not a new one: a "
                               "wrapped PermanentError is retried forever.", clause="8.exception-fails")
            if states[3] == "pending":
                return Miss("the PermanentError row went back to pending", "fail quarantines a PermanentError at "
                                                                          "once.", clause="8.exception-fails")
            if states != want_states:
                return Miss(f"the rows ended {states}", "Complete after True; fail with the error otherwise.",
                           clause="8.exception-fails")
            waits = [oracle.backoff(1, policy["base"], policy["cap"], rng) for _ in range(2)]
            for s, wait in zip((2, 3), waits, strict=True):
                if not same_number(after[s]["due"], now + wait):
                   return Miss(f"row {s} is due at {after[s]['due']!r}, expected now + backoff(1, …) = "
                               f"{now + wait!r}", "fail each failed row with backoff drawn from the policy's rng, "
                                                  "in seq order.", clause="8.exception-fails")
            if not (after[3]["last_error"] or "").startswith("DeliveryError: "):
                return Miss(f"row 3's last_error is {after[3]['last_error']!r}",
                           "A non-True return is a DeliveryError: fail the row with DeliveryError(...).",
                           clause="8.true-only")
            return _after_send_only(record, [1, 5]) or \
                _counts({"sent": 2, "retry": 2, "quarantined": 1, "stale": 0},
                       "Count each row once: sent, retry (back to pending), quarantined or stale. Quarantined "
                       "is not sent.")(record)

        return check

    return make


def _after_send_only(record: dict, seqs: list[int]) -> Miss | None:
    """after_send ran for exactly the rows whose send returned True (a hook on every path is wrong)."""
    called = [decode(e["seq"]) for e in _log(record, "after_send")]
    if called != seqs:
        return Miss(f"after_send was called for rows {called}, but send returned True for rows {seqs}: after_send "
                   "ran after a failed send, or not after a True one",
                   "Call after_send(seq) only after send returned True, and before complete: it means 'the "
                   "warehouse has it'. A failed or non-True send goes to fail without it.", clause="8.order-hooks")
    return None


def _again(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        again = record["observed"].get("again") or {}
        first = again.get("first") or record["outcome"]
        want = {"sent": 1, "retry": 0, "quarantined": 1, "stale": 0}
        if first.get("kind") != "returned" or decode(first["value"]) != want:
            return Miss(describe(first), f"The first call quarantines row 1 and sends row 2: {want}.",
                       clause="8.counts")
        log = record["observed"].get("log", [])
        marks = [i for i, e in enumerate(log) if e["kind"] == "again"]
        later = [e["seq"] for e in log[marks[0] + 1:] if e["kind"] == "send"] if marks else []
        if 1 not in later:
            return Miss("in the second call, in the same process, send was never called for row 1, which the "
                       "operator had redriven: relay_once remembered it from the first call",
                       "relay_once keeps nothing between calls: what to send is in the outbox alone. A redriven row "
                       "is pending again and is claimed and sent like any other.", clause="8.order-hooks")
        states = [r["state"] for r in rows_of(db).values()]
        if states != ["sent", "sent"]:
            return Miss(f"after the second call the rows are {[shown(r) for r in rows_of(db).values()]}",
                       "complete the redriven row after its ACK.", clause="8.order-hooks")
        if again.get("same_object"):
            return Miss("the second call returned the very dict object the first call returned",
                       "Build new counts in each call: a caller who kept the first result would see it change.",
                       clause="8.counts")
        return _counts({"sent": 1, "retry": 0, "quarantined": 0, "stale": 0},
                      "Count only what this call did: new counts for each call.")(record) or \
            _after_send_only(record, [2, 1])

    return check


def _equal_to_true(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        after = rows_of(db)
        done = [s for s, r in after.items() if r["state"] == "sent"]
        if done:
            return Miss(f"rows {done} were completed although send returned 1 or 1.0",
                       "Only a return value that `is True` is an ACK: `acked is True`, not `acked == True` "
                       "(1 == True in Python).")
        return _after_send_only(record, []) or _counts({"sent": 0, "retry": 2, "quarantined": 0, "stale": 0})(record)

    return check


def _poison_bodies(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        sent = [e["seq"] for e in _log(record, "send")]
        if sent != [3]:
            return Miss(f"send was called for rows {sent}", "A body that is not a JSON object can never be sent: "
                                                           "fail it with a PermanentError and go on.")
        after = rows_of(db)
        for s in (1, 2):
            if after[s]["state"] != "quarantined" or not (after[s]["last_error"] or "").startswith("PermanentError"):
                return Miss(f"row {s} ({rows[s - 1]['body']!r}) is {shown(after[s])}",
                           "Quarantine it as a PermanentError: `fail(con, seq, fence, PermanentError(...), …)`.")
        return _after_send_only(record, [3]) or _counts({"sent": 1, "retry": 0, "quarantined": 2, "stale": 0})(record)

    return check


def _stale(how: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        def check(record: dict) -> Miss | None:
            sent = [e["seq"] for e in _log(record, "send")]
            if sent.count(1) > 1:
                return Miss(f"send was called {sent.count(1)} times for the taken row",
                           "StaleLease means another publisher owns the row now: count it as stale and never retry "
                           "it.")
            after = rows_of(db)
            if after[1]["owner"] != "B" or after[1]["state"] != "leased":
                return Miss(f"the taken row is {shown(after[1])}", f"{how} must raise StaleLease and change nothing "
                                                                  "on a row B owns now.")
            if after[2]["state"] != "sent":
                return Miss(f"the next row is {shown(after[2])}", "StaleLease is not a reason to stop: go on with "
                                                                 "the next row.")
            if how == "fail" and record["observed"].get("rng_next") != oracle.next_draw(seed, 0):
                return Miss("a random number was drawn for the stale row", "fail checks the token before drawing.",
                           clause="6.rng-only-retry")
            return _counts({"sent": 1, "retry": 0, "quarantined": 0, "stale": 1},
                          "Catch StaleLease from complete and fail, count it as 'stale', and go on.")(record)

        return check

    return make


def _propagates(name_: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        def check(record: dict) -> Miss | None:
            outcome = record["outcome"]
            if outcome["kind"] != "raised" or outcome["type"] != name_:
                return Miss(describe(outcome), f"Catch `Exception` around send, never `BaseException`: {name_} must "
                                              "propagate (the operator stopped the process).")
            after = rows_of(db)
            if after[1]["state"] != "leased" or after[1]["last_error"] is not None:
                return Miss(f"the row is {shown(after[1])}", f"Don't fail or complete the row on {name_}: it stays "
                                                            "leased and its lease will run out.")
            if after[2]["state"] == "sent":
                return Miss("the next row was sent", f"{name_} ends the call at once.")
            return None

        return check

    return make


def _hook_error(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or outcome["type"] != "LookupError":
            return Miss(describe(outcome), "Don't catch exceptions from the hooks: they propagate.")
        if _log(record, "send"):
            return Miss("send was called after after_claim raised", "An exception from after_claim ends the call.")
        return None

    return check


def _last_attempt(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        after = rows_of(db)[1]
        if after["state"] != "quarantined" or after["attempts"] != 3:
            return Miss(f"the row is {shown(after)}", "The claim counts the attempt (3); fail then sees attempts >= "
                                                     "max_attempts and quarantines it.", clause="6.quarantine-max")
        return _counts({"sent": 0, "retry": 0, "quarantined": 1, "stale": 0},
                      "A quarantined row is counted as 'quarantined', never as 'sent' or 'retry'.")(record)

    return check


def _refused_first(hint: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        before = stores.fingerprint(db)

        def check(record: dict) -> Miss | None:
            outcome = record["outcome"]
            if outcome["kind"] != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(describe(outcome), "Check every argument, the policy too, before claiming: bad input "
                                              "must never leave rows leased. " + hint)
            if stores.fingerprint(db) != before:
                return Miss(f"ValueError, but the row is now {shown(rows_of(db)[1])}",
                           "Check every argument before claiming: bad input must never leave rows leased. " + hint)
            if _log(record, "send"):
                return Miss("send was called", "Check the arguments before anything else.")
            return None

        return check

    return make


# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_open, 2: check_enqueue, 3: check_claim, 4: check_complete, 5: check_backoff, 6: check_fail,
                 7: check_redrive, 8: check_relay_once, "final": check_final}, contract=CLAUSES)
