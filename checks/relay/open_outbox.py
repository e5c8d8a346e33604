"""Step 1 of lab `relay`: open_outbox — the contract's schema and defaults, WAL, the busy
timeout, and a fence counter that survives reopening and files with only some tables."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay.outbox import DEFAULTS, SCHEMA, counter, make_outbox, name, row, rows_of
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    closed_on_error,
    closed_when_interrupted,
    describe,
    under,
    waited_for_lock,
)
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.probe import WRITE_SEEN_HOLD
from labkit.values import decode, encode, show

OUTBOX_COLUMNS = [("seq", "INTEGER", 0, 1), ("id", "TEXT", 1, 0), ("body", "TEXT", 1, 0), ("state", "TEXT", 1, 0),
                 ("attempts", "INTEGER", 1, 0), ("owner", "TEXT", 0, 0), ("lease_until", "REAL", 0, 0),
                 ("fence", "INTEGER", 1, 0), ("due", "REAL", 1, 0), ("last_error", "TEXT", 0, 0)]
COUNTER_COLUMNS = [("id", "INTEGER", 0, 1), ("last", "INTEGER", 1, 0)]
KEEP_HINT = ("Create the tables only if missing (`CREATE TABLE IF NOT EXISTS`) and insert the counter row "
             "only if missing (`INSERT OR IGNORE`): a counter reset to 0 hands out old tokens again, and a "
             "stale publisher's token looks current.")


INTERRUPTED = "a Ctrl-C at every statement of open_outbox"
LOCK_HELD = 0.3  # s at most (`probe.hold_write_lock`): well within the 5 s busy timeout, so a correct open waits
WAIT_HINT = ("Initialise in one `BEGIN IMMEDIATE` transaction with the busy timeout: it waits for another "
             "writer's lock. A deferred `BEGIN` reads first and then cannot wait when it starts writing "
             "('database is locked' at once).")

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
    locked = ctx.path("locked.db")
    make_outbox(locked, kept, counter=last, audit=False)
    locked_before = stores.fingerprint(locked)
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
        Plan("open_outbox while another publisher holds the write lock",
             f"open_outbox(a saved outbox in WAL mode) while another connection holds the write lock (until the "
             f"call has waited {WRITE_SEEN_HOLD:g} s on it, {LOCK_HELD:g} s at most)",
             "a connection, once the other gives up the lock: initialisation waits for it (the busy timeout)",
             both(waited_for_lock(ok, "1.busy-timeout", WAIT_HINT), under("1.reopen-keeps", lambda r: None if stores.fingerprint(locked)
                                                      == locked_before else Miss("rows changed", KEEP_HINT))),
             WAIT_HINT, clauses=("1.busy-timeout", "1.reopen-keeps")),
        Plan(INTERRUPTED, "open_outbox(path of a new file), a KeyboardInterrupt just before its 1st statement, "
             "then its 2nd, ... (one new file each)", "the KeyboardInterrupt propagates; no connection left open",
             under("1.init-failure", closed_when_interrupted("open_outbox")), clauses=("1.init-failure",)),
    ]
    opens = [{"name": plans[0].name, "path": str(new)}, {"name": plans[1].name, "path": str(twice)},
             {"name": plans[1].name, "path": str(twice)}, {"name": plans[2].name, "path": str(saved)},
             {"name": plans[3].name, "path": str(outbox_only)}, {"name": plans[4].name, "path": str(counter_only)},
             {"name": plans[5].name, "path": str(garbage)},
             {"name": plans[6].name, "path": str(locked), "locked": LOCK_HELD}]
    interrupted = ctx.path("interrupted")
    interrupted.mkdir()
    return ctx.cases("opening", plans, {"opens": opens, "interrupted": {"name": INTERRUPTED, "folder": str(interrupted)}})
