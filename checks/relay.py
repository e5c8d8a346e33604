"""Lab `relay` — two publishers, one outbox: leases, fencing tokens, quarantine (contract: labs/relay.md).

One check per contract step, then the final check. Each check prepares real SQLite files with
the judge's own connections — with an audit trigger that records every change of an outbox row,
inside the student's own transaction — lets child processes run the student's `relay.py` (see
`relay_probes.py`), and judges what it then observes itself: the files, the audit, the
warehouse's request log, exit codes and /proc. A child's report counts for return values only.
The judge's clock (`now`) is used everywhere except the final check's real 0.3 s leases.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sqlite3
import string
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from checks.oracles import relay as oracle
from checks.relay_contract import CLAUSES
from labkit.judge import reaper, stores
from labkit.judge.child import ChildRun, run_child
from labkit.judge.expect import (
    SKELETON_HINT,
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    closed_on_error,
    describe,
    import_problem,
    is_module_exception,
    no_open_transaction,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.run import LabSpec, StepContext, StepSpec
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode, encode, same, show

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."
TOKEN_HINT = ("Compare the row's `fence` with the caller's token: only `state = 'leased'` with exactly "
              "this fence may change. The token decides, not the clock and not the owner's name.")
ONE_TX_HINT = ("Select and update in one `BEGIN IMMEDIATE` transaction (`with write_transaction(con):` "
               "around both): the write lock must be taken before the SELECT, so a second publisher waits "
               "and then sees your claims.")

SCHEMA = """
CREATE TABLE outbox(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','leased','sent','quarantined')),
    attempts INTEGER NOT NULL DEFAULT 0, owner TEXT, lease_until REAL, fence INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL DEFAULT 0, last_error TEXT);
CREATE TABLE fence_counter(id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
"""
# The judge's instrument: every change of a row, recorded by SQLite inside the writer's own
# transaction (a rolled-back change leaves no trace), with the wall-clock time of the write.
AUDIT = """
CREATE TABLE judge_audit(n INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, seq INTEGER, id TEXT, state TEXT,
    owner TEXT, lease_until REAL, fence INTEGER, attempts INTEGER, due REAL, last_error TEXT);
CREATE TRIGGER judge_audit_update AFTER UPDATE ON outbox BEGIN
    INSERT INTO judge_audit(t, seq, id, state, owner, lease_until, fence, attempts, due, last_error)
    VALUES ((julianday('now') - 2440587.5) * 86400.0, NEW.seq, NEW.id, NEW.state, NEW.owner,
            NEW.lease_until, NEW.fence, NEW.attempts, NEW.due, NEW.last_error);
END;
"""
FIELDS = ("seq", "id", "body", "state", "attempts", "owner", "lease_until", "fence", "due", "last_error")
AUDITED = ("n", "t", "seq", "id", "state", "owner", "lease_until", "fence", "attempts", "due", "last_error")


# --- the judge's own view of an outbox ------------------------------------------------------


def event(event_id: str, sku: str = "snack", qty: int = 1) -> dict:
    return {"id": event_id, "sku": sku, "qty": qty}


def name(rng: random.Random, prefix: str, length: int = 5) -> str:
    return prefix + "-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=length))


def row(event_id: str, qty: int = 1, **fields) -> dict:
    """An outbox row to seed: pending and due at 0 unless `fields` say otherwise."""
    return {"id": event_id, "body": stores.canonical(event(event_id, "snack", qty)), "state": "pending",
            "attempts": 0, "owner": None, "lease_until": None, "fence": 0, "due": 0.0, "last_error": None,
            **fields}


def make_outbox(path: Path, rows: list[dict] = (), counter: int = 0, audit: bool = True,
                wal: bool = True) -> Path:
    """An outbox file as the contract's schema says, seeded with `rows` (seq = 1, 2, ...)."""
    with closing(stores.connect(path)) as con:
        con.execute("PRAGMA synchronous = OFF")  # a temp seed file: no fsync, other processes still see it
        if wal:
            con.execute("PRAGMA journal_mode = WAL")
        con.executescript(SCHEMA)
        con.execute("BEGIN")
        con.execute("INSERT INTO fence_counter VALUES (1, ?)", (counter,))
        names = FIELDS[1:]
        con.executemany(f"INSERT INTO outbox({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                        [tuple(r[k] for k in names) for r in rows])
        con.execute("COMMIT")
        if audit:
            con.executescript(AUDIT)
    return path


def copies(template: Path, folder: Path, names: list[str]) -> list[Path]:
    """One copy of a closed outbox file per case, so no case sees another's changes."""
    out = []
    for label in names:
        target = folder / f"{label}.db"
        shutil.copyfile(template, target)
        out.append(target)
    return out


def rows_of(path: Path) -> dict[int, dict]:
    """Every outbox row by seq, read through the judge's own connection."""
    return {r[0]: dict(zip(FIELDS, r, strict=True))
            for r in stores.rows(path, f"SELECT {', '.join(FIELDS)} FROM outbox ORDER BY seq")}


def counter(path: Path) -> list[tuple]:
    return stores.rows(path, "SELECT id, last FROM fence_counter ORDER BY id")


def audit(path: Path) -> list[dict]:
    """Every row change the audit trigger recorded, in commit order."""
    return [dict(zip(AUDITED, r, strict=True))
            for r in stores.rows(path, f"SELECT {', '.join(AUDITED)} FROM judge_audit ORDER BY n")]


def claims_in(entries: list[dict]) -> list[dict]:
    """The audit entries that are claims: a row became leased with a new token."""
    out, last_fence = [], {}
    for e in entries:
        if e["state"] == "leased" and last_fence.get(e["seq"]) != e["fence"]:
            out.append(e)
        last_fence[e["seq"]] = e["fence"]
    return out


def shown(r: dict | None) -> str:
    if r is None:
        return "no such row"
    parts = [r["state"]]
    if r["owner"] is not None:
        parts.append(f"by {r['owner']!r}")
    parts.append(f"token {r['fence']}")
    if r["lease_until"] is not None:
        parts.append(f"lease until {r['lease_until']:g}")
    parts.append(f"attempts {r['attempts']}")
    if r["state"] == "pending" and r["due"]:
        parts.append(f"due {r['due']:g}")
    if r["last_error"] is not None:
        parts.append(f"last_error {r['last_error'][:60]!r}")
    return ", ".join(parts)


def row_is(path: Path, seq: int, hint: str, **expected) -> Callable[[dict], Miss | None]:
    """After the child ended, the judge reads row `seq`: each named field has the expected value."""

    def check(record: dict) -> Miss | None:
        have = rows_of(path).get(seq)
        wrong = [k for k, v in expected.items() if have is None or not _equal(have[k], v)]
        if wrong:
            want = ", ".join(f"{k} {expected[k]!r}" for k in wrong)
            return Miss(f"the judge then read row {seq}: {shown(have)} (expected {want})", hint)
        return None

    return check


def _equal(have, want) -> bool:
    if isinstance(want, float) and isinstance(have, int | float) and not isinstance(have, bool):
        return math.isclose(have, want, rel_tol=1e-12, abs_tol=1e-9)
    return have == want


def unchanged(path: Path, before: list, hint: str) -> Callable[[dict], Miss | None]:
    def check(record: dict) -> Miss | None:
        if stores.fingerprint(path) != before:
            return Miss("the outbox changed", hint)
        return None

    return check


def value(item) -> dict:
    return {"value": encode(item)}


def calls_on(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    return ctx.cases("on_outbox", plans, {"calls": specs})


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
    kept = [row(name(rng, "kept"), state="sent", fence=last - 3, attempts=1),
            row(name(rng, "kept"), state="leased", owner="A", lease_until=123.5, fence=last, attempts=2),
            row(name(rng, "kept"), state="quarantined", fence=last - 1, attempts=5, last_error="PermanentError: x")]
    make_outbox(saved, kept, counter=last, audit=False, wal=False)  # a file from before WAL: open must switch it
    before = stores.fingerprint(saved)
    garbage.write_bytes(b"this is not a database, just text\n" * 64)

    def connection(record: dict) -> Miss | None:
        outcome, seen = record["outcome"], record["observed"]
        if outcome["kind"] != "returned" or outcome["value"].get("type") != "Connection":
            return Miss(describe(outcome), "open_outbox returns the sqlite3.Connection it opened.")
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
        Plan("open_outbox on a file that is not a database", "open_outbox(text file)",
             "sqlite3.DatabaseError; the connection closed",
             under("1.init-failure", closed_on_error("initialisation")), clauses=("1.init-failure",)),
    ]
    opens = [{"name": plans[0].name, "path": str(new)}, {"name": plans[1].name, "path": str(twice)},
             {"name": plans[1].name, "path": str(twice)}, {"name": plans[2].name, "path": str(saved)},
             {"name": plans[3].name, "path": str(garbage)}]
    return ctx.cases("opening", plans, {"opens": opens})


# --- step 2 ---------------------------------------------------------------------------------


def check_enqueue(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    db = make_outbox(ctx.path("outbox.db"), audit=False)
    first = event(name(rng, "z"), name(rng, "sku", 3), rng.randint(1, 1000))
    second = event(name(rng, "a"), first["sku"], rng.randint(1, 1000))
    changed = {**first, "qty": first["qty"] % 1000 + 1}
    boom = event(name(rng, "boom"), "snack", 3)
    stores.execute(db, f"""CREATE TRIGGER outbox_full BEFORE INSERT ON outbox
        WHEN NEW.id = '{boom["id"]}' BEGIN SELECT RAISE(ABORT, 'outbox is full'); END;""")
    invalid = [
        ("qty is True", {**event(name(rng, "bool")), "qty": True}, BOOL_HINT),
        ("qty is 0", event(name(rng, "zero"), qty=0), "Call validate_event first: qty ranges from 1 to 1000."),
        ("qty is 1001", event(name(rng, "big"), qty=1001), "Call validate_event first: qty ranges from 1 to 1000."),
        ("id has 65 characters", event("a" * 65), "Call validate_event first: id has at most 64 characters."),
        ("an extra key", {**event(name(rng, "extra")), "note": "x"}, "Call validate_event first: exactly id, sku and qty."),
        ("not a dict", [("id", "x")], "Call validate_event first: an event is a dict."),
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
        if ids()[:2] != [first["id"], second["id"]]:
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
    args = [first, first, changed]
    for label, bad, hint in invalid:
        plans.append(Plan(label, f"enqueue(con, {show(bad, 70)})", "ValueError; nothing written",
                          both(under("2.validate", raises("ValueError", hint)),
                               under("2.validate", nothing_for(bad["id"] if isinstance(bad, dict) else "x", hint))),
                          clauses=("2.validate",)))
        args.append(bad)
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
    return calls_on(ctx, plans, specs)


# --- step 3 ---------------------------------------------------------------------------------


def check_claim(ctx: StepContext) -> list[Case]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        racing = pool.submit(_race, ctx)
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
            if not _equal(r["lease_until"], now + lease) or r["attempts"] != before[seq[label]]["attempts"] + 1:
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
        ("now -1", owner, -1, lease, 1, "now is at least 0.", "3.now-range"),
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
    return calls_on(ctx, plans, specs)


RACERS = ("A", "B")


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
                                                           "cases": ["claims"]}), RACERS))
    entries = audit(db)
    claims = claims_in(entries)
    case = Case(f"{len(RACERS)} processes race to claim {total} rows", Outcome.PASSED,
                f"claim(con, owner, {now:g}, 3600, {limit}) in a loop, in {len(RACERS)} processes at once, on one file",
                "every row claimed exactly once; tokens strictly increasing from "
                f"{start + 1}; fence_counter.last = {start + total}",
                clauses=("3.one-transaction", "3.tokens-increase", "3.global-counter"))
    miss = _race_miss(runs, claims, db, start, total, ctx.timeout)
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
        returned = [r for call in run.cases()["claims"]["observed"]["calls"] for r in (decode(call["value"]) or [])]
        mine = {(c["seq"], c["fence"]) for c in claims if c["owner"] == owner}
        got = {(r.get("seq"), r.get("fence")) for r in returned if isinstance(r, dict)}
        if got != mine:
            wrong = sorted(got - mine)[:4]
            return Miss(f"claim returned (seq, token) {wrong} to {owner}, but the file shows {owner} never held them",
                        "Return exactly the rows this call leased, with the tokens it stored.",
                        clause="3.one-transaction")
    return None


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
    return calls_on(ctx, plans, specs)


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

    def add(label: str, attempt, base, cap, check, clauses: tuple[str, ...], hint: str = "") -> None:
        seed = rng.randrange(2**31)
        plans.append(Plan(label, f"backoff({attempt!r}, {base!r}, {cap!r}, random.Random({seed}))",
                          _expected_wait(attempt, base, cap), check(seed, attempt, base, cap), hint, clauses=clauses))
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
        ("attempt 10**6", 10**6, 0.25, 30.0),
        ("attempt 10**6 with an int base", 10**6, 1, 3600),
    ]
    for _ in range(4):  # randomness adds cases, never replaces them
        base = rng.choice((0.1, 0.5, 1, 2.5, rng.uniform(0.01, 10)))
        fixed.append((f"random: attempt {{}} base {base:g}", rng.randint(1, 40), base,
                      rng.choice((base, base * rng.randint(2, 100), 3600.0))))
    for label, attempt, base, cap in fixed:
        clauses = ("5.full-jitter", "5.seeded-rng") + (("5.cap",) if oracle.ceiling(attempt, base, cap) == cap else ()) + \
                  (("5.large-attempt",) if attempt >= 10**6 else ())
        add(label.format(attempt), attempt, base, cap, _drawn, clauses)
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
            ("cap a str", 1, 1.0, "10", "cap must be an int or a float.")):
        add(f"{label} is refused", attempt, base, cap, lambda *a, hint=hint: both(raises("ValueError", hint), _no_draw(a[0])),
            ("5.arg-ranges",), hint)
    return ctx.cases("backoffs", plans, {"calls": calls})


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
    ceiling = oracle.ceiling(attempt, base, cap)
    expected = oracle.backoff(attempt, base, cap, random.Random(seed))
    draw = expected / ceiling if ceiling else 0.0  # the random() behind the expected wait

    def check(record: dict) -> Miss | None:
        outcome, seen = record["outcome"], record["observed"]
        if outcome["kind"] == "raised" and outcome["type"] == "OverflowError":
            return Miss(describe(outcome), "Don't compute 2 ** attempt as a float: stop doubling once the ceiling "
                                           "has reached the cap.", clause="5.large-attempt")
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
        if got > ceiling * (1 + 1e-12) and got > cap * (1 + 1e-12):
            return Miss(f"returned {got!r}, more than cap {cap!r}", "The ceiling is `min(cap, base * 2 ** (attempt - "
                                                                    "1))`: without the cap, waits grow without "
                                                                    "bound.", clause="5.cap")
        if math.isclose(got, ceiling, rel_tol=1e-12) and not math.isclose(draw, 1.0, rel_tol=1e-9):
            return Miss(f"returned {got!r}, the ceiling itself", "Full jitter draws the wait: `rng.uniform(0, "
                                                                 "ceiling)`. Without jitter every failed row comes "
                                                                 "back at the same moment.", clause="5.full-jitter")
        if math.isclose(got, ceiling / 2 + draw * ceiling / 2, rel_tol=1e-9) and draw < 1:
            return Miss(f"returned {got!r}: half the ceiling {ceiling:g} plus a random half",
                        "That is equal jitter. Full jitter draws from the whole range: `rng.uniform(0, ceiling)`.",
                        clause="5.full-jitter")
        if seen.get("rng_next") != oracle.next_draw(seed, 1):
            return Miss(f"returned {show(got)}, but drew from rng {'more than once' if seen.get('rng_next') != oracle.next_draw(seed, 0) else 'not at all'}",
                        "Draw exactly once, with rng.random() or rng.uniform(): the same seed must give the same "
                        "waits.", clause="5.seeded-rng")
        if not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            ratio = got / expected if expected else math.inf
            hint = ("The ceiling for attempt k is base * 2 ** (k - 1): attempt 1 waits up to base." if
                    math.isclose(ratio, 2, rel_tol=1e-9) or math.isclose(ratio, 0.5, rel_tol=1e-9) else
                    "The ceiling is min(cap, base * 2 ** (attempt - 1)), computed exactly; then one "
                    "rng.uniform(0, ceiling).")
            return Miss(f"returned {got!r}; Random({seed}) gives {expected!r} for a ceiling of {ceiling:g}", hint,
                        clause="5.full-jitter")
        return None

    return check


# --- step 6 ---------------------------------------------------------------------------------


def _policy(base, cap, max_attempts, seed: int | None) -> dict:
    fields = {"base": encode(base), "cap": encode(cap), "max_attempts": encode(max_attempts)}
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
    ]
    db = make_outbox(ctx.path("fail.db"), [r for _, r in layout], counter=tok + 30)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    before = rows_of(db)
    plans, specs = [], []

    def add(label: str, s, fence, error: dict, expected: str, check, clauses: tuple[str, ...], seed: int,
            hint: str = "", policy_fields: tuple = (base, cap, max_attempts)) -> None:
        plans.append(Plan(label, f"fail(con, {s!r}, {fence!r}, {error['kind'].replace('_', ' ')} error "
                                 f"{error['message'][:30]!r}, {now:g}, {{base {policy_fields[0]}, cap "
                                 f"{policy_fields[1]}, max_attempts {policy_fields[2]}, rng Random({seed})}})",
                          expected, check, hint, clauses=clauses))
        specs.append({"name": label, "fn": "fail", "db": str(db),
                      "args": [value(s), value(fence), {"error": error}, value(now), _policy(*policy_fields, seed)]})

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
    for label, s, fence, hint in (("bool seq", True, tok, BOOL_HINT + " fail(con, True, …) must not fail row 1."),
                                  ("float fence", seq["float fence"], float(tok + 10), "fence must be an int.")):
        seed = rng.randrange(2**31)
        add(f"{label} is refused", s, fence, transient, "ValueError; nothing changes",
            both(under("6.token-check", raises("ValueError", hint)), untouched(label, hint, "6.token-check"),
                 draws(seed, 0, "6.rng-only-retry", "Validate before drawing.")), ("6.token-check",), seed, hint)
    return calls_on(ctx, plans, specs)


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
    template = make_outbox(ctx.path("redrive.db"), layout, counter=40)
    ids = {r["id"]: i + 1 for i, r in enumerate(layout)}
    sent_id, pending_id, leased_id = layout[3]["id"], layout[4]["id"], layout[5]["id"]
    cases = [
        ("one quarantined row", [q[0]], 1, "7.requeue"),
        ("a tuple of two", (q[0], q[1]), 2, "7.requeue"),
        ("a set", {q[2]}, 1, "7.ids-shape"),
        ("an empty list", [], 0, "7.ids-shape"),
        ("an empty tuple", (), 0, "7.ids-shape"),
        ("a quarantined and a sent row", [q[0], sent_id], ValueError, "7.all-or-nothing"),
        ("a sent row", [sent_id], ValueError, "7.never-sent"),
        ("a pending row", [pending_id], ValueError, "7.all-or-nothing"),
        ("a leased row", [leased_id], ValueError, "7.all-or-nothing"),
        ("an unknown id", [q[1], name(rng, "ghost")], ValueError, "7.all-or-nothing"),
        ("a bare string", letters, ValueError, "7.ids-shape"),
        ("an id listed twice", [q[0], q[0]], ValueError, "7.ids-shape"),
        ("an id that is not a str", [q[0], 1], ValueError, "7.ids-shape"),
        ("now nan", [q[0]], ValueError, "7.ids-shape"),
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
    }
    paths = copies(template, ctx.workdir, [f"case-{i}" for i in range(len(cases))])
    plans, specs = [], []
    for (label, arg, result, clause), path in zip(cases, paths, strict=True):
        when = float("nan") if label == "now nan" else now
        called = f"redrive(con, {arg!r}, {when!r})"
        if result is ValueError:
            hint = hints[label]
            plans.append(Plan(label, called, "ValueError; nothing changes",
                              refused(hint, clause, path, stores.fingerprint(path), hint), hint, clauses=(clause,)))
        else:
            plans.append(Plan(label, called, f"{result}; each back to pending, attempts 0, due {now:g}, last_error kept",
                              both(under(clause, returns(result, "Return how many rows were redriven.")),
                                   under("7.requeue", _requeued(path, [ids[i] for i in arg], now)),
                                   under("7.requeue", no_open_transaction)), clauses=(clause, "7.requeue")))
        ids_arg = {"set": sorted(arg)} if isinstance(arg, set) else value(arg)  # sets do not cross the pipe
        specs.append({"name": label, "fn": "redrive", "db": str(path), "args": [ids_arg, value(when)]})
    return calls_on(ctx, plans, specs)


def _requeued(path: Path, seqs: list[int], now: float):
    def check(record: dict) -> Miss | None:
        after = rows_of(path)
        for s in seqs:
            r = after[s]
            if r["state"] != "pending" or r["attempts"] != 0 or not _equal(r["due"], now):
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
            ("a policy with base > cap", ("A", now, lease, 16), (5.0, 1.0, 5),
             "Check the policy like backoff would (0 < base <= cap) before claiming: otherwise the first failure "
             "raises with the row still leased.", {}),
            ("a policy with max_attempts True", ("A", now, lease, 16), (base, cap, True), BOOL_HINT, {})):
        rows = [row(name(rng, "safe"))]
        scenario(f"{label} is refused before claiming", rows, _refused_first(hint), ("8.args-first",),
                 expected="ValueError; nothing leased; send never called", args=call_args, policy=policy, **flags)
    return ctx.cases("relaying", plans, {"scenarios": scenarios})


def _log(record: dict, kind: str) -> list[dict]:
    return [e for e in record["observed"].get("log", []) if e["kind"] == kind]


def _counts(expected: dict, hint: str = "Return the counts of this call: {'sent', 'retry', 'quarantined', 'stale'}."):
    return under("8.counts", returns(expected, hint))


def _delivered_in_order(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
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
            if (e["row"] or {}).get("state") != "leased" or (e["row"] or {}).get("owner") != "A":
                return Miss(f"while send ran, another connection saw row {e['seq']} as {e['row']}",
                            "Claim (and commit the claim) before sending.", clause="8.claim-committed")
            if not e.get("can_write", True):
                return Miss("while send ran, another connection could not BEGIN IMMEDIATE",
                            "Commit the claim before the first send: a write lock held during a slow send blocks "
                            "every other publisher.", clause="8.claim-committed")
        for e in _log(record, "after_send"):
            if (e["row"] or {}).get("state") != "leased":
                return Miss(f"when after_send({decode(e['seq'])}) ran the row was already {e['row']['state']}",
                            "Call after_send(seq) after the ACK and before complete.", clause="8.order-hooks")
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
                if not _equal(after[s]["due"], now + wait):
                    return Miss(f"row {s} is due at {after[s]['due']!r}, expected now + backoff(1, …) = "
                                f"{now + wait!r}", "fail each failed row with backoff drawn from the policy's rng, "
                                                   "in seq order.", clause="8.exception-fails")
            if not (after[3]["last_error"] or "").startswith("DeliveryError: "):
                return Miss(f"row 3's last_error is {after[3]['last_error']!r}",
                            "A non-True return is a DeliveryError: fail the row with DeliveryError(...).",
                            clause="8.true-only")
            return _counts({"sent": 2, "retry": 2, "quarantined": 1, "stale": 0},
                           "Count each row once: sent, retry (back to pending), quarantined or stale. Quarantined "
                           "is not sent.")(record)

        return check

    return make


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
        return _counts({"sent": 1, "retry": 0, "quarantined": 2, "stale": 0})(record)

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


# --- final check: two publishers, a kill and a pause ----------------------------------------

LEASE = 0.3  # the final check's real leases, in seconds of wall-clock time
DIE_EXIT_CODE = 74


@dataclass
class Scene:
    """What the final check observed, for its cases, its timeline and its ladder."""

    db: Path
    ids: dict[str, str] = field(default_factory=dict)  # role → event id
    runs: dict[str, ChildRun] = field(default_factory=dict)  # "A #1", "A #2", "B", "C", "D"
    stopped_at: float | None = None
    continued_at: float | None = None
    after_death: dict | None = None  # snack-1's row right after A #1 died
    after_b: dict | None = None  # snack-2's row before A #2 was woken
    requests: list[dict] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    rows: dict[int, dict] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)  # event id → seq
    policy: dict = field(default_factory=dict)
    notes: list[dict] = field(default_factory=list)


def check_final(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import refused, start_warehouse, unavailable

    rng = ctx.rng
    scene = Scene(ctx.path("outbox.db"))
    poison = [event(name(rng, "pill"), "snack", rng.randint(1, 1000)) for _ in range(5)]
    refused_at = rng.randrange(0, 3)
    flaky_at = rng.choice([i for i in range(0, 4) if i != refused_at])
    scene.ids = {"dead": "snack-1", "paused": "snack-2", "refused": poison[refused_at]["id"],
                 "flaky": poison[flaky_at]["id"]}
    scene.ids.update({f"plain{k}": e["id"] for k, e in enumerate(e for i, e in enumerate(poison)
                                                                if i not in (refused_at, flaky_at))})
    reason = f"sku {name(rng, 'old', 3)} is discontinued"
    scene.policy = {"base": rng.choice((0.5, 1.0, 2.0)), "cap": 30.0, "max_attempts": 5, "seed": rng.randrange(2**31)}
    make_outbox(scene.db, [row("snack-1", qty=1), row("snack-2", qty=2)])
    wh = start_warehouse(ctx.path("warehouse.jsonl"),
                         event_faults={scene.ids["refused"]: refused(reason), scene.ids["flaky"]: unavailable(2)})
    try:
        common = {"db": str(scene.db), "url": wh.url, "lease": LEASE, **scene.policy}
        _two_publishers(ctx, scene, common)
        if _reached(scene, "B"):
            with closing(stores.connect(scene.db)) as con:  # five more events, enqueued by the judge
                con.executemany("INSERT INTO outbox(id, body) VALUES (?, ?)",
                                [(e["id"], stores.canonical(e)) for e in poison])
            start = float(int(_now()))
            scene.runs["C"] = ctx.child("poison", {**common, "owner": "C", "start": start, "limit": 16, "rounds": 6,
                                                   "cases": ["relay"]})
            wh.lift(scene.ids["refused"])  # the cause is fixed
            scene.notes.append({"t": _now(), "actor": "warehouse", "kind": "note",
                                "text": f"the refusal of {scene.ids['refused']} is lifted (cause fixed)"})
            later = start + 1000.0
            scene.runs["D"] = ctx.child("redriving", {**common, "owner": "D", "ids": [scene.ids["refused"]],
                                                      "now": later, "limit": 16, "cases": ["redrive"]})
        scene.requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    scene.entries = audit(scene.db)
    scene.rows = rows_of(scene.db)
    scene.seq = {r["id"]: s for s, r in scene.rows.items()}
    cases = _final_cases(ctx, scene, reason)
    _final_timeline(ctx, scene)
    _final_ladder(ctx, scene)
    return cases


def _now() -> float:
    import time

    return time.time()


def _reached(scene: Scene, label: str) -> bool:
    return label in scene.runs


def _two_publishers(ctx: StepContext, scene: Scene, common: dict) -> None:
    """A #1 dies right after its claim; A #2 is frozen right after its; B takes both rows over."""
    import time

    a1 = ctx.child("publisher", {**common, "owner": "A", "mode": "die", "exit_code": DIE_EXIT_CODE, "limit": 1,
                                 "cases": ["relay"]})
    scene.runs["A #1"] = a1
    claimed = [e for e in claims_in(audit(scene.db)) if e["id"] == "snack-1" and e["owner"] == "A"]
    scene.after_death = rows_of(scene.db).get(1)
    if a1.exit_code != DIE_EXIT_CODE or not claimed:
        return
    a_now = claimed[0]["lease_until"] - LEASE  # A's clock when it claimed
    marker = ctx.marker()
    args = {**common, "owner": "A", "mode": "pause", "limit": 1, "nows": [a_now + 0.01], "cases": ["relay"]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        paused = pool.submit(run_child, ctx.solution, f"{ctx.lab.probes}:publisher", args, workdir=ctx.workdir,
                             timeout=ctx.timeout, marker=marker, module_name=ctx.lab.module_name)
        try:
            deadline = time.monotonic() + ctx.timeout / 2
            while not paused.done() and time.monotonic() < deadline:
                if _stopped(marker):
                    scene.stopped_at = _now()
                    break
                time.sleep(0.005)
            if scene.stopped_at is not None:
                scene.runs["B"] = ctx.child("publisher", {**common, "owner": "B", "mode": "drain", "limit": 16,
                                                          "nows": [a_now + 0.02], "until": ["snack-1", "snack-2"],
                                                          "seconds": 3.0, "cases": ["relay"]})
                scene.after_b = rows_of(scene.db).get(2)
        finally:
            if _continue(marker):
                scene.continued_at = _now()
            scene.runs["A #2"] = paused.result()


def _stopped_pids(marker: str) -> list[int]:
    """The processes carrying `marker` that are stopped (state T in /proc/<pid>/stat): the judge
    observes the stop itself, whatever wraps the child (a sandbox may add a parent)."""
    found = []
    for pid in reaper.marked_pids(marker):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 1:].split()[0] == "T":
            found.append(pid)
    return found


def _stopped(marker: str) -> bool:
    return bool(_stopped_pids(marker))


def _continue(marker: str) -> bool:
    import os
    import signal

    pids = _stopped_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return bool(pids)


def _report(run: ChildRun | None, case: str) -> dict | None:
    return None if run is None else run.cases().get(case)


def _counts_of(run: ChildRun | None) -> list:
    record = _report(run, "relay")
    if record is None:
        return []
    return [decode(r["outcome"]["value"]) if r["outcome"]["kind"] == "returned" else describe(r["outcome"])
            for r in record["observed"].get("rounds", [])]


def _publisher_problem(run: ChildRun | None, label: str, timeout: float, case: str = "relay") -> Miss:
    """Why a publisher process did not do what the scenario needed."""
    if run is None:
        return Miss(f"publisher {label} was never started: an earlier part of the scenario failed",
                    outcome=Outcome.NOT_REACHED)
    if not run.imported:
        got, hint, _ = import_problem(run, timeout)
        return Miss(got, hint, Outcome.IMPORT_FAILED)
    record = run.cases().get(case)
    if record is not None:
        for r in [record["outcome"]] + [x["outcome"] for x in record["observed"].get("rounds", [])]:
            if r.get("kind") == "not_implemented":
                return Miss(f"publisher {label}: {describe(r)}", SKELETON_HINT, Outcome.NOT_IMPLEMENTED)
            if r.get("kind") == "missing":
                return Miss(f"publisher {label}: {describe(r)}", "Run every step's cell.", Outcome.MISSING)
        if record["outcome"].get("kind") == "raised":
            return Miss(f"publisher {label}: {describe(record['outcome'])} (exit code {run.exit_code})",
                        "relay_once must not raise here: see the steps' own checks.", Outcome.RAISED)
    if run.timed_out:
        return Miss(f"publisher {label} did not finish in time and was killed", "Look for a wait without a timeout.",
                    Outcome.TIMED_OUT)
    return Miss(f"publisher {label} ended with exit code {run.exit_code}", "")


def _requests_for(scene: Scene, event_id: str) -> list[dict]:
    return [r for r in scene.requests if r.get("id") == event_id]


def _claims_of(scene: Scene, event_id: str) -> list[dict]:
    return [e for e in claims_in(scene.entries) if e["id"] == event_id]


def _token(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _final_cases(ctx: StepContext, scene: Scene, reason: str) -> list[Case]:
    cases: list[Case] = []

    def case(label: str, called: str, expected: str, clause: str, miss: Miss | None) -> None:
        c = Case(label, Outcome.PASSED, called, expected, clauses=(clause,))
        if miss is not None:
            c.outcome, c.got, c.hint = miss.outcome, miss.got, miss.hint
        cases.append(c)

    def blocked(previous: list[Case]) -> Miss | None:
        failed = next((c for c in previous if not c.passed), None)
        if failed is not None:
            return Miss(f"not checked: {failed.name!r} did not pass", outcome=Outcome.NOT_REACHED)
        return None

    a1, a2, b = scene.runs.get("A #1"), scene.runs.get("A #2"), scene.runs.get("B")
    s1 = _claims_of(scene, "snack-1")
    s2 = _claims_of(scene, "snack-2")
    # 1. the dead owner
    hooked = a1 is not None and any(n.get("kind") == "claimed" for n in a1.messages())
    miss = None
    if a1 is None or a1.exit_code != DIE_EXIT_CODE or not hooked:
        miss = _publisher_problem(a1, "A", ctx.timeout)
        if miss.outcome is Outcome.WRONG or not miss.got:
            miss = Miss(f"publisher A ended with exit code {None if a1 is None else a1.exit_code}"
                        + ("" if hooked else " and after_claim was never called"),
                        "Call after_claim(seq) for each claimed row, right after the claim committed and before send.")
    elif _requests_for(scene, "snack-1") and _requests_for(scene, "snack-1")[0].get("t_start", 0) < \
            (b.started_at if b else math.inf):
        miss = Miss("the warehouse got snack-1 from A before A died", "Call after_claim(seq) before send(event).")
    elif not s1 or s1[0]["owner"] != "A" or (scene.after_death or {}).get("state") != "leased":
        miss = Miss(f"after A died the judge read snack-1 as {shown(scene.after_death)}",
                    "claim commits the lease before relay_once calls after_claim.")
    else:
        ctx.evidence.faults.append(f"publisher A killed in after_claim (os._exit) — exit code {DIE_EXIT_CODE} "
                                   f"observed; snack-1 left leased by A with token {s1[0]['fence']}")
    case("A dies right after claiming snack-1", "relay_once(con, 'A', send, now, 0.3, 1, policy, after_claim=hook) "
         f"where hook runs os._exit({DIE_EXIT_CODE})",
         f"exit code {DIE_EXIT_CODE}; snack-1 leased by A; nothing sent", "final.dead-owner", miss)
    # 2. B waits for the lease, then takes over
    miss = blocked(cases)
    if miss is None:
        first_round = _counts_of(b)[:1]
        if b is None or _report(b, "relay") is None or (_report(b, "relay")["outcome"]["kind"] != "returned"):
            miss = _publisher_problem(b, "B", ctx.timeout)
        elif len(s1) < 2:
            miss = Miss(f"snack-1 was never claimed again after A died; B's rounds returned {first_round}…",
                        "A leased row whose lease_until <= now is claimed again: its owner is presumed dead. "
                        "Otherwise a dead owner's row is stuck forever.")
        elif s1[1]["lease_until"] - LEASE < s1[0]["lease_until"] - 1e-9:
            miss = Miss(f"B claimed snack-1 at now={s1[1]['lease_until'] - LEASE:.3f}, while A's lease ran until "
                        f"{s1[0]['lease_until']:.3f}", "A live lease (lease_until > now) is never taken.")
    case("B does not take snack-1 while A's lease is live", "relay_once(con, 'B', …) in a new process, at once and "
         "then every 20 ms", "no claim of snack-1 before A's lease_until", "final.lease-respected", miss)
    miss = blocked(cases)
    if miss is None:
        got = _requests_for(scene, "snack-1")
        if s1[1]["owner"] != "B" or s1[1]["fence"] <= s1[0]["fence"]:
            miss = Miss(f"snack-1's second claim: {s1[1]['owner']!r} with token {s1[1]['fence']} (A had "
                        f"{s1[0]['fence']})", "Every claim takes a new, larger token from fence_counter.")
        elif [(_token(r.get("token")), r.get("outcome")) for r in got] != [(s1[1]["fence"], "applied")]:
            miss = Miss(f"the warehouse saw snack-1 as {[(r.get('token'), r.get('outcome')) for r in got]}",
                        "B sends snack-1 once, with its own token, and completes it.")
        elif scene.rows[1]["state"] != "sent" or scene.rows[1]["fence"] != s1[1]["fence"]:
            miss = Miss(f"snack-1 ended {shown(scene.rows[1])}", "complete after the ACK, with the token of the claim.")
    case("B takes snack-1 over with a larger token and delivers it once", "the same B process",
         "snack-1 claimed by B with a larger token; one POST, applied; sent under B's token", "final.takeover", miss)
    # 3. the paused owner
    miss = blocked(cases)
    if miss is None:
        if scene.stopped_at is None:
            miss = _publisher_problem(a2, "A (restarted)", ctx.timeout)
            miss = Miss(f"the judge never saw the restarted A stopped: {miss.got}", miss.hint or
                        "Call after_claim(seq) right after the claim.", miss.outcome)
        elif not s2 or s2[0]["owner"] != "A":
            miss = Miss(f"the restarted A did not claim snack-2 (claims: {[(c['owner'], c['fence']) for c in s2]})",
                        "claim takes the first due row in seq order: snack-1 was still leased by the dead A.")
        elif len(s2) < 2 or s2[1]["owner"] != "B" or s2[1]["fence"] <= s2[0]["fence"] or \
                (scene.after_b or {}).get("state") != "sent":
            miss = Miss(f"while A was stopped, snack-2 became {shown(scene.after_b)}",
                        "Once A's lease has run out, B claims snack-2 with a larger token and completes it.")
        elif s2[1]["t"] < s2[0]["lease_until"] - 0.005:
            miss = Miss(f"B claimed snack-2 at {s2[1]['t']:.3f}, before A's lease ended at {s2[0]['lease_until']:.3f}",
                        "A live lease is never taken.")
        else:
            ctx.evidence.faults.append("the restarted A stopped with SIGSTOP in after_claim — state T observed in "
                                       "/proc; SIGCONT only after B completed snack-2")
    case("A (restarted) is frozen right after claiming snack-2; B takes it over",
         "relay_once(con, 'A', …) where after_claim stops the process (SIGSTOP); then B; then SIGCONT",
         "the judge sees the process stopped; B claims snack-2 with a larger token after A's lease and completes it",
         "final.paused-owner", miss)
    miss = blocked(cases)
    if miss is None:
        got = [(_token(r.get("token")), r.get("outcome")) for r in _requests_for(scene, "snack-2")]
        counts = _counts_of(a2)
        want = [(s2[1]["fence"], "applied"), (s2[0]["fence"], "duplicate")]
        if a2 is None or not counts or not isinstance(counts[-1], dict):
            miss = _publisher_problem(a2, "A (restarted)", ctx.timeout)
        elif got != want:
            miss = Miss(f"the warehouse saw snack-2 as (token, outcome) {got}",
                        f"After SIGCONT, A sends snack-2 with its old token {s2[0]['fence']}: the warehouse "
                        "recognises the duplicate.")
        elif scene.rows[2]["state"] != "sent" or scene.rows[2]["fence"] != s2[1]["fence"]:
            miss = Miss(f"snack-2 ended {shown(scene.rows[2])}",
                        "A's complete must get StaleLease: the row stays sent under B's token. " + TOKEN_HINT)
        elif counts[-1] != {"sent": 0, "retry": 0, "quarantined": 0, "stale": 1}:
            miss = Miss(f"A's relay_once returned {counts[-1]}", "complete raised StaleLease: count the row as "
                                                                  "'stale', not 'sent', and never retry it.")
        else:
            ctx.evidence.faults.append(f"snack-2 delivered twice (token {s2[1]['fence']}, then the stale token "
                                       f"{s2[0]['fence']}) — the warehouse recognised the duplicate; A got StaleLease")
    case("the woken A is refused by its stale token", "SIGCONT: A sends snack-2 and calls complete",
         "the warehouse sees a duplicate; StaleLease; the row stays sent under B's token; A counts stale 1",
         "final.stale-complete", miss)
    cases += _poison_cases(ctx, scene, reason, blocked(cases))
    return cases


def _poison_cases(ctx: StepContext, scene: Scene, reason: str, earlier: Miss | None) -> list[Case]:
    cases: list[Case] = []
    c_run, d_run = scene.runs.get("C"), scene.runs.get("D")
    ids = scene.ids
    plain = [v for k, v in ids.items() if k.startswith("plain")]
    policy = scene.policy
    rounds = (_report(c_run, "relay") or {"observed": {}})["observed"].get("rounds", [])
    nows = [r["now"] for r in rounds]

    def case(label: str, called: str, expected: str, clause: str, miss: Miss | None) -> None:
        c = Case(label, Outcome.PASSED, called, expected, clauses=(clause,))
        if miss is None and earlier is not None:
            miss = Miss(f"not checked: {earlier.got}", outcome=Outcome.NOT_REACHED)
        if miss is not None:
            c.outcome, c.got, c.hint = miss.outcome, miss.got, miss.hint
        cases.append(c)

    problem = None
    if c_run is None or _report(c_run, "relay") is None or _report(c_run, "relay")["outcome"]["kind"] != "returned":
        problem = _publisher_problem(c_run, "C", ctx.timeout)
    # the permanent refusal
    refused_id = ids["refused"]
    miss = problem
    if miss is None:
        entries = [e for e in scene.entries if e["id"] == refused_id]
        first_fail = next((e for e in entries if e["state"] != "leased"), None)
        want = oracle.last_error("PermanentError", f"422 for {refused_id}: {reason}")
        if first_fail is None or first_fail["state"] != "quarantined" or first_fail["attempts"] != 1:
            miss = Miss(f"after its first attempt {refused_id} was {shown(first_fail) if first_fail else 'never claimed'}",
                        "A PermanentError is quarantined at once: retrying a refusal that cannot change only delays "
                        "the operator's alarm.")
        elif first_fail["last_error"] != want:
            miss = Miss(f"its last_error is {first_fail['last_error']!r}", f"Store the error: {want!r}.")
    case(f"the refused event {refused_id} is quarantined on its first attempt",
         "relay_once(con, 'C', send, now, …) where the warehouse answers 422 for it",
         "quarantined after one attempt, last_error 'PermanentError: 422 …'", "final.poison-quarantined", miss)
    # the transient one
    flaky = ids["flaky"]
    miss = problem
    if miss is None:
        flaky_entries = [e for e in scene.entries if e["id"] == flaky]
        fails = [e for e in flaky_entries if e["state"] == "pending"]
        claims = [e for e in flaky_entries if e["state"] == "leased"]
        got = [(_token(r.get("token")), r.get("response")) for r in _requests_for(scene, flaky)]
        waits = oracle.draws(policy["seed"], [(1, policy["base"], policy["cap"]), (2, policy["base"], policy["cap"])])
        claim_nows = [c["lease_until"] - LEASE for c in claims]
        if [r for _, r in got] != ["503", "503", "ack"] or len(claims) != 3:
            miss = Miss(f"the warehouse saw {flaky} answered {[r for _, r in got]} over {len(claims)} claims",
                        "A transient failure goes back to pending with a due time; the next relay_once at that time "
                        "claims it again.")
        elif len(fails) < 2 or not all(_equal(f["due"], n + w) for f, n, w in zip(fails, claim_nows, waits,
                                                                               strict=False)):
            shown_dues = [f"{f['due'] - n:.4g}" for f, n in zip(fails, claim_nows, strict=False)]
            miss = Miss(f"its waits were {shown_dues} s; Random({policy['seed']}) gives "
                        f"{[f'{w:.4g}' for w in waits]} (ceilings {policy['base']:g}, {2 * policy['base']:g})",
                        "fail: due = now + backoff(attempts, base, cap, rng), with the policy's rng, drawing only for "
                        "a retry.")
        elif scene.rows[scene.seq[flaky]]["state"] != "sent" or scene.rows[scene.seq[flaky]]["attempts"] != 3:
            miss = Miss(f"it ended {shown(scene.rows[scene.seq[flaky]])}", "The third attempt succeeds: complete it.")
        else:
            ctx.evidence.faults.append(f"the warehouse answered 503 twice for {flaky}; waits "
                                       f"{', '.join(f'{w:.3g} s' for w in waits)} (ceilings {policy['base']:g}, "
                                       f"{2 * policy['base']:g} s, judge's clock); delivered on attempt 3")
    case(f"the flaky event {flaky} is retried with growing, jittered waits", "relay_once(...) again at each due time "
         "(the judge's clock)", "503, 503, then applied; due = now + backoff(1), then + backoff(2), from the seeded rng",
         "final.transient-retried", miss)
    # no head-of-line blocking
    miss = problem
    if miss is None:
        for event_id in plain:
            got = _requests_for(scene, event_id)
            claims = _claims_of(scene, event_id)
            if [r.get("outcome") for r in got] != ["applied"] or not claims or \
                    not _equal(claims[0]["lease_until"] - LEASE, nows[0] if nows else -1.0):
                miss = Miss(f"{event_id}: claimed at {[round(c['lease_until'] - LEASE, 3) for c in claims]}, "
                            f"warehouse outcomes {[r.get('outcome') for r in got]}",
                            "A failure does not stop the batch: the rows behind a poison row go on in the same call.")
                break
    case("the other three are delivered at once", "the first relay_once(con, 'C', ...)",
         f"{', '.join(plain)} delivered in the first call", "final.no-head-of-line", miss)
    # redrive
    miss = problem
    record = _report(d_run, "redrive")
    if miss is None:
        if record is None or record["outcome"]["kind"] != "returned" or value_of(record) != 1:
            miss = _publisher_problem(d_run, "D", ctx.timeout, "redrive") if record is None or \
                record["outcome"]["kind"] != "returned" else Miss(f"redrive returned {show(value_of(record))}",
                                                                  "redrive returns how many rows it moved.")
        else:
            entries = [e for e in scene.entries if e["id"] == refused_id]
            back = next((e for e in entries if e["state"] == "pending"), None)
            final_row = scene.rows[scene.seq[refused_id]]
            got = [r.get("response") for r in _requests_for(scene, refused_id)]
            if back is None or back["attempts"] != 0 or not back["last_error"]:
                miss = Miss(f"after redrive the row was {shown(back)}", "Back to pending, attempts 0, due now, "
                                                                        "last_error kept.")
            elif got != ["422", "ack"] or final_row["state"] != "sent":
                miss = Miss(f"the warehouse answered {got}; the row ended {shown(final_row)}",
                            "After the redrive, the next relay_once delivers it.")
    case(f"after the refusal is lifted, {refused_id} is redriven and delivered",
         f"redrive(con, [{refused_id!r}], now) and relay_once(con, 'D', …) in a new process",
         "1; pending with attempts 0; then delivered, applied", "final.redrive", miss)
    # everything once
    miss = problem if problem is not None else None
    if miss is None:
        everything = ["snack-1", "snack-2", *[e for e in scene.seq if e not in ("snack-1", "snack-2")]]
        applied = {i: sum(1 for r in scene.requests if r.get("id") == i and r.get("outcome") == "applied")
                   for i in everything}
        attempts = {i: scene.rows[scene.seq[i]]["attempts"] for i in everything}
        want = {i: 1 for i in everything}
        want_attempts = {**{i: 1 for i in everything}, "snack-1": 2, "snack-2": 2, flaky: 3}
        states = {i: scene.rows[scene.seq[i]]["state"] for i in everything}
        if applied != want:
            miss = Miss(f"applied per event: {applied}", "Every event must reach the warehouse and be applied once.")
        elif set(states.values()) != {"sent"}:
            miss = Miss(f"final states {states}", "Every event ends sent.")
        elif attempts != want_attempts:
            miss = Miss(f"attempts {attempts}", "attempts counts claims: 2 for the taken-over rows, 3 for the flaky "
                                                "one, 1 for the redriven one (redrive resets it to 0).")
    case("every event applied exactly once, none lost, attempts as expected", "the judge reads the outbox and the "
         "warehouse's log", "7 events applied once each; all sent; attempts 2, 2, 3 for the flaky one, 1 otherwise",
         "final.applied-once", miss)
    return cases


def out_of_order(requests: list[dict], seq: dict[str, int]) -> list[str]:
    """Events the warehouse applied after an event with a larger seq."""
    order = [r.get("id") for r in requests if r.get("outcome") == "applied" and r.get("id") in seq]
    late = []
    for i, event_id in enumerate(order):
        overtaken = [o for o in order[:i] if seq[o] > seq[event_id]]
        if overtaken:
            late.append(f"{event_id} (seq {seq[event_id]}) after {', '.join(f'{o} (seq {seq[o]})' for o in overtaken)}")
    return late


def _final_timeline(ctx: StepContext, scene: Scene) -> None:
    timeline = ctx.evidence.timeline
    for label, run in scene.runs.items():
        actor = f"publisher {label}"
        timeline.append({"t": run.started_at, "actor": actor, "kind": "start", "text": "process started"})
        for note in run.messages():
            if note.get("kind") == "claimed":
                timeline.append({"t": note["t"], "actor": actor, "kind": "hook",
                                 "text": f"after_claim({decode(note['seq'])}): holds token {note.get('fence')}"})
        if label == "A #2" and scene.stopped_at is not None:
            timeline.append({"t": scene.stopped_at, "actor": actor, "kind": "stopped",
                             "text": "SIGSTOP in after_claim (judge saw state T)"})
        if label == "A #2" and scene.continued_at is not None:
            timeline.append({"t": scene.continued_at, "actor": actor, "kind": "continued", "text": "SIGCONT from the judge"})
        killed = label == "A #1" and run.exit_code == DIE_EXIT_CODE
        counts = _counts_of(run)
        tail = f"; returned {counts[-1]}" if counts and isinstance(counts[-1], dict) and label != "A #1" else ""
        timeline.append({"t": run.ended_at, "actor": actor, "kind": "killed" if killed else "exit",
                         "text": f"exit code {run.exit_code}{tail}"})
    for e in scene.entries:
        text = _audit_text(e)
        if text:
            timeline.append({"t": e["t"], "actor": "outbox", "kind": "committed" if e["state"] == "sent" else e["state"],
                             "text": text})
    seen: set[str] = set()
    for r in scene.requests:
        event_id, token = r.get("id"), r.get("token")
        if r.get("outcome") == "duplicate":
            kind, what = "duplicate", "duplicate: recognised, applied once"
        elif r.get("outcome") == "applied":
            kind, what = "applied", "applied"
        else:
            kind, what = "refused", f"{r.get('response')} (not applied)"
        seen.add(event_id)
        timeline.append({"t": r.get("t_start", 0), "actor": "warehouse", "kind": kind,
                         "text": f"POST {event_id}, token {token} → {what}"})
    timeline.extend(scene.notes)
    late = out_of_order(scene.requests, scene.seq)
    if late:
        timeline.append({"t": max(e["t"] for e in timeline), "actor": "judge", "kind": "note",
                         "text": "out of seq order: " + "; ".join(late)})
    timeline.sort(key=lambda e: e["t"])


def _audit_text(e: dict) -> str:
    if e["state"] == "leased":
        return f"{e['id']}: claimed by {e['owner']!r}, token {e['fence']}, attempt {e['attempts']}"
    if e["state"] == "sent":
        return f"{e['id']}: sent, saved under token {e['fence']}"
    if e["state"] == "pending" and e["attempts"] == 0:
        return f"{e['id']}: redriven, due at once (last_error kept)"
    if e["state"] == "pending":
        return f"{e['id']}: failed ({(e['last_error'] or '')[:40]}), retry due at +{e['due'] - (e['lease_until'] or e['due']):.3g}"
    if e["state"] == "quarantined":
        return f"{e['id']}: quarantined with {(e['last_error'] or '')[:48]!r}"
    return ""


def _final_ladder(ctx: StepContext, scene: Scene) -> None:
    ladder = ctx.evidence.ladder
    for event_id in ("snack-1", "snack-2"):
        claims = _claims_of(scene, event_id)
        ladder.append({"rung": f"{event_id}: claimed by whom, with which token",
                       "observed": ", then ".join(f"{c['owner']} with token {c['fence']}" for c in claims) or "never",
                       "when": "the outbox (audit of every change)"})
        sent = [(r.get("token"), r.get("outcome")) for r in _requests_for(scene, event_id)]
        ladder.append({"rung": f"{event_id}: sent, with which token",
                       "observed": ", then ".join(f"token {t} → {o}" for t, o in sent) or "never",
                       "when": "the warehouse's request log"})
        final = scene.rows.get(scene.seq.get(event_id, -1))
        holder = claims[-1]["fence"] if claims else None
        ok = final is not None and final["state"] == "sent" and final["fence"] == holder
        ladder.append({"rung": f"{event_id}: sent saved by the current token holder",
                       "observed": (f"yes: sent under token {final['fence']}" if ok else f"no: {shown(final)}"),
                       "when": "the outbox, at the end"})
    fails = [e for e in scene.entries if e["state"] == "pending" and e["attempts"] > 0]
    ladder.append({"rung": "failed, retry due at T",
                   "observed": "; ".join(f"{e['id']} attempt {e['attempts']}: due {e['due']:.6g} "
                                         f"({(e['last_error'] or '')[:30]})" for e in fails) or "none observed",
                   "when": "the outbox, on the judge's clock"})
    quarantined = [e for e in scene.entries if e["state"] == "quarantined"]
    ladder.append({"rung": "quarantined with error E",
                   "observed": "; ".join(f"{e['id']}: {e['last_error']}" for e in quarantined) or "none observed",
                   "when": "the outbox"})
    redriven = [e for e in scene.entries if e["state"] == "pending" and e["attempts"] == 0]
    ladder.append({"rung": "redriven",
                   "observed": "; ".join(f"{e['id']} back to pending, due {e['due']:.6g}, last_error kept"
                                         for e in redriven) or "none observed",
                   "when": "the outbox, after the refusal was lifted"})
    late = out_of_order(scene.requests, scene.seq)
    ladder.append({"rung": "delivered out of seq order", "observed": "; ".join(late) or "none",
                   "when": "the warehouse's request log: the price of quarantine and retries"})


LAB = LabSpec(
    name="relay",
    module_name="relay",
    probes="checks.relay_probes",
    contract=CLAUSES,
    steps=[
        StepSpec(1, "open_outbox", 1, check_open),
        StepSpec(2, "enqueue", 1, check_enqueue),
        StepSpec(3, "claim", 2, check_claim),
        StepSpec(4, "complete", 1, check_complete),
        StepSpec(5, "backoff", 1, check_backoff),
        StepSpec(6, "fail", 1, check_fail, requires=(5,)),
        StepSpec(7, "redrive", 1, check_redrive),
        StepSpec(8, "relay_once", 2, check_relay_once, requires=(3, 4, 6)),
        StepSpec("final", "two publishers, a kill and a pause", 3, check_final, requires=(1, 3, 4, 6, 7, 8)),
    ],
)
