"""Lab `vending`, step 2: open_store on new, saved, half-made and broken files, and state() on a store."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from checks.vending.hints import KEEP_HINT, PART_HINT, READ_ONLY_HINT
from checks.vending.inputs import distinct_history
from checks.vending.store import (
    STORE_COLUMNS,
    judged,
    make_store,
    no_open_transaction,
    observe_store,
    show_rows,
    shown,
    snapshot,
)
from labkit.judge.expect import (
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    closed_when_interrupted,
    describe,
    raises,
    returns,
    under,
    waited_for_lock,
)
from labkit.judge.run import StepContext, together
from labkit.judge.served import served
from labkit.judge.verdict import Case
from labkit.probe import WRITE_SEEN_HOLD
from labkit.values import decode, encode, show


def _schema_miss(path: Path) -> Miss | None:
    have = stores.tables(path)
    for table, cols in STORE_COLUMNS.items():
        if table not in have:
            return Miss(f"no table '{table}'", f"Create `{table}` exactly as the contract says.")
        got = [(c[0], c[1].upper(), 1 if c[2] else 0, 1 if c[4] else 0) for c in stores.columns(path, table)]
        if got != cols:
            return Miss(f"{table} has columns (name, type, not null, primary key) {got}",
                       f"Use the contract's columns for `{table}`: {cols}.")
    with closing(stores.connect(path)) as con:
        con.execute("BEGIN")
        try:
            con.execute("INSERT INTO checkpoint VALUES (2, 0, 0)")
            return Miss("checkpoint accepted a row with id 2",
                       "`id INTEGER PRIMARY KEY CHECK(id=1)`: there is exactly one checkpoint row.")
        except sqlite3.IntegrityError:
            return None
        finally:
            con.execute("ROLLBACK")


def check_store(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    new, empty, garbage, misshapen = (ctx.path(n) for n in ("new.db", "empty.db", "not-a-db.db", "misshapen.db"))
    history = distinct_history(rng, rng.randint(3, 6))
    saved = make_store(ctx.path("saved.db"), history)
    before = stores.fingerprint(saved)
    rowless = make_store(ctx.path("rowless.db"), history[:2])
    stores.execute(rowless, "DELETE FROM checkpoint")
    rowless_before = stores.rows(rowless, "SELECT seq, delta FROM ledger ORDER BY seq")
    fresh = make_store(ctx.path("fresh.db"))
    state_saved = make_store(ctx.path("state-saved.db"), history)  # apart: an open case may have wiped `saved`
    state_busy = make_store(ctx.path("state-busy.db"), history)
    locked = make_store(ctx.path("locked.db"), history)
    # Set-up met half done (a crash during it, an older program): every part of the schema alone.
    only_checkpoint = make_store(ctx.path("only-checkpoint.db"), history)
    stores.execute(only_checkpoint, "DROP TABLE ledger")
    only_ledger = make_store(ctx.path("only-ledger.db"), history[:2])
    stores.execute(only_ledger, "DROP TABLE checkpoint")
    empty.write_bytes(b"")
    garbage.write_bytes(b"this is not a database, just text\n" * 64)
    stores.execute(misshapen, "CREATE TABLE checkpoint(id INTEGER PRIMARY KEY, last INTEGER NOT NULL);")

    opened = both(
        under("2.connection", returned_connection),
        under("2.autocommit", lambda r: None if r["observed"].get("isolation_level") == encode(None) else Miss(
            f"isolation_level is {show(decode(r['observed'].get('isolation_level', encode(''))))}",
            "Connect with `isolation_level=None`: the default opens hidden transactions.")),
        under("2.busy-timeout", lambda r: None if r["observed"].get("busy_timeout") == 1000 else Miss(
            f"the busy timeout is {r['observed'].get('busy_timeout')} ms",
            "Pass `timeout=1.0` to sqlite3.connect (a 1 s busy timeout).")),
        under("2.no-open-transaction", lambda r: None if judged(r).get("can_write") is not False else Miss(
            "right after open_store returned, the judge could not BEGIN IMMEDIATE: a write lock was still held",
            TRANSACTION_HINT)),
        under("2.no-open-transaction", lambda r: None if not r["observed"].get("in_transaction") else Miss(
            "open_store returned with a transaction still open", TRANSACTION_HINT)),
    )

    def initial_row(path: Path, hint: str):
        def check(record: dict) -> Miss | None:
            miss = under("2.schema", lambda _: _schema_miss(path))(record)
            if miss is not None:
                return miss
            rows = stores.rows(path, "SELECT id, last, total FROM checkpoint")
            if rows != [(1, -1, 0)]:
                return Miss(f"checkpoint holds {show_rows(rows)}", hint, clause="2.initial-row")
            return None

        return check

    def unchanged(path: Path, fingerprint: list, what: str):
        def check(record: dict) -> Miss | None:
            if stores.fingerprint(path) != fingerprint:
                return Miss(f"the saved store changed: before {what}; after {shown(snapshot(path))}", KEEP_HINT)
            return None

        return under("2.keep-saved", check)

    def ledger_kept(record: dict) -> Miss | None:
        now = stores.rows(rowless, "SELECT seq, delta FROM ledger ORDER BY seq")
        if now != rowless_before:
            return Miss(f"the ledger changed from {show_rows(rowless_before)} to {show_rows(now)}", KEEP_HINT)
        return None

    expected_saved = (history[-1][0], sum(d for _, d in history))
    tuple_hint = "Return a tuple `(last, total)` read from the checkpoint row."
    row_hint = "Insert the row (1, -1, 0) when it is missing, and only then (`INSERT OR IGNORE`)."
    plans = [
        Plan("open_store on a new file", "open_store(new file)",
             "a connection (isolation_level None, 1 s busy timeout); tables checkpoint and ledger; row (1, -1, 0)",
             both(opened, initial_row(new, row_hint)),
             clauses=("2.connection", "2.autocommit", "2.busy-timeout", "2.schema", "2.initial-row")),
        Plan("open_store on the same file again", "open_store(that file) again",
             "a connection; still exactly one checkpoint row (1, -1, 0)",
             both(under("2.create-if-missing", returned_connection),
                 under("2.create-if-missing", initial_row(new, KEEP_HINT))),
             clauses=("2.create-if-missing",)),
        Plan("open_store on an existing empty file", "open_store(a file of 0 bytes)",
             "a connection; tables checkpoint and ledger created; row (1, -1, 0)",
             both(opened, retag("2.create-if-missing", initial_row(empty, ""), (
                 "Create the tables whenever they are missing, also in a file that already exists: "
                 "`CREATE TABLE IF NOT EXISTS`, not a check of `os.path.exists`."))),
             clauses=("2.create-if-missing",)),
        Plan("open_store on a store saved by another process", "open_store(saved store) in a new process",
             f"a connection; the cursor still {expected_saved[0]}, every row unchanged",
             both(opened, unchanged(saved, before, f"last {expected_saved[0]}, total {expected_saved[1]}")),
             clauses=("2.keep-saved",)),
        Plan("open_store on a store whose checkpoint row is missing",
             f"open_store(a store with ledger rows {show_rows(rowless_before)} and no checkpoint row)",
             "a connection; the row (1, -1, 0) inserted; the ledger unchanged",
             both(opened, under("2.initial-row", initial_row(rowless, row_hint)),
                 under("2.keep-saved", ledger_kept)),
             clauses=("2.initial-row", "2.keep-saved")),
        Plan("open_store on a file that is not a database", "open_store(text file)",
             "sqlite3.DatabaseError; the connection closed", closed_after_failure, clauses=("2.init-failure",)),
        Plan("open_store on a store whose checkpoint table has the wrong columns",
             "open_store(a store holding checkpoint(id, last), empty)",
             "sqlite3's own error (inserting the row fails); the connection closed",
             closed_after_failure, clauses=("2.init-failure",)),
        Plan("open_store on a file holding only the checkpoint table",
             f"open_store(a store saved at last {expected_saved[0]} whose ledger table is missing)",
             f"a connection; table ledger created; the checkpoint row still ({expected_saved[0]}, "
             f"{expected_saved[1]})",
             both(opened, retag("2.create-if-missing", lambda r: _schema_miss(only_checkpoint), PART_HINT),
                 under("2.keep-saved", lambda r: None if stores.rows(
                     only_checkpoint, "SELECT id, last, total FROM checkpoint") == [(1, *expected_saved)] else Miss(
                     f"the saved store changed: before last {expected_saved[0]}, total {expected_saved[1]}; after "
                     f"{shown(snapshot(only_checkpoint))}", KEEP_HINT))),
             clauses=("2.create-if-missing", "2.keep-saved")),
        Plan("open_store on a file holding only the ledger table",
             f"open_store(a store with ledger rows {show_rows(history[:2])} whose checkpoint table is missing)",
             "a connection; table checkpoint created with the row (1, -1, 0); the ledger unchanged",
             both(opened, retag("2.create-if-missing", initial_row(only_ledger, row_hint), PART_HINT),
                 under("2.keep-saved", lambda r: None if (now := stores.rows(
                     only_ledger, "SELECT seq, delta FROM ledger ORDER BY seq")) == history[:2] else Miss(
                     f"the ledger changed from {show_rows(history[:2])} to {show_rows(now)}", KEEP_HINT))),
             clauses=("2.create-if-missing", "2.keep-saved")),
        Plan("state of a new store", "state(con) on a store holding (1, -1, 0)", "(-1, 0)",
             both(under("2.state", returns((-1, 0), tuple_hint)),
                 under("2.no-open-transaction", no_open_transaction)),
             clauses=("2.state", "2.no-open-transaction")),
        Plan("state of a saved store", f"state(con) on a store saved at last {expected_saved[0]}",
             show(expected_saved), both(under("2.state", returns(expected_saved, tuple_hint)),
                                       under("2.no-open-transaction", no_open_transaction)),
             clauses=("2.state", "2.no-open-transaction")),
        Plan("state while another connection is writing",
             f"state(con) on a store saved at last {expected_saved[0]}, while another connection is in the middle "
             "of a write transaction", f"{show(expected_saved)} at once (what is committed)",
             under("2.state", returns(expected_saved, READ_ONLY_HINT)), READ_ONLY_HINT, clauses=("2.state",)),
    ]
    opens = [new, new, empty, saved, rowless, garbage, misshapen, only_checkpoint, only_ledger]
    states = [{"path": str(fresh)}, {"path": str(state_saved)}, {"path": str(state_busy), "held": True}]
    interrupted = ctx.path("interrupted")
    interrupted.mkdir()
    busy = Plan("open_store while another connection holds the write lock",
                f"open_store(a saved store) while another connection holds the write lock (until the call has "
                f"waited {WRITE_SEEN_HOLD:g} s on it, {LOCK_HELD:g} s at most)",
                "a connection, once the other gives up the lock: initialisation waits for it (the busy timeout)",
                waited_for_lock(opened, "2.busy-timeout", WAIT_HINT), WAIT_HINT, clauses=("2.busy-timeout",))
    # Four children side by side: each has files of its own, and its own CPU budget (`served`),
    # so none waits for another's cases (the held lock's 0.3 s above all).
    runs = together([
        lambda: served(ctx, "open", plans[:9], [{"path": str(path)} for path in opens], observe_store),
        lambda: served(ctx, "interrupted", [INTERRUPTED_PLAN], [{"folder": str(interrupted)}]),
        lambda: served(ctx, "open_busy", [busy], [{"path": str(locked), "seconds": LOCK_HELD}], observe_store),
        lambda: served(ctx, "state", plans[9:], states, observe_store),
    ])
    return [case for cases in runs for case in cases]


LOCK_HELD = 0.3  # s at most (`probe.hold_write_lock`): well within the 1 s busy timeout, so a correct open waits
WAIT_HINT = ("Initialise in one `BEGIN IMMEDIATE` transaction with the 1 s busy timeout: it waits for another "
             "writer's lock. A deferred `BEGIN` reads first and then cannot wait when it starts writing "
             "('database is locked' at once).")
INTERRUPTED_PLAN = Plan("a Ctrl-C at every statement of open_store",
                        "open_store(path of a new file), a KeyboardInterrupt just before its 1st statement, then "
                        "its 2nd, ... (one new file each)", "the KeyboardInterrupt propagates; no connection left open",
                        under("2.init-failure", closed_when_interrupted("open_store")), clauses=("2.init-failure",))


def closed_after_failure(record: dict) -> Miss | None:
    """Initialisation failed: sqlite3's own error, and no connection to the file left open."""
    miss = raises("DatabaseError", "Let sqlite3's own error propagate (a bare `raise` after closing).")(record)
    if miss is not None:
        return miss
    hint = "If initialisation fails, close the connection, then re-raise the original error."
    if judged(record).get("holds_file"):
        return Miss("raised, but the connection to the file was left open (the judge saw the process still "
                   "holding the file)", hint)
    if record["observed"].get("left_open"):
        return Miss("raised, but the connection to the file was left open", hint)
    return None


def retag(clause: str, check, hint: str = ""):
    """`check`, with every miss it finds attributed to `clause` (even one a sub-check named), and
    told with `hint` when given."""

    def tagged(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None:
            miss.clause = clause
            miss.hint = hint or miss.hint
        return miss

    return tagged


def returned_connection(record: dict) -> Miss | None:
    outcome, seen = record["outcome"], record["observed"]
    if outcome["kind"] != "returned" or outcome["value"].get("type") != "Connection":
        return Miss(describe(outcome), "open_store returns the sqlite3.Connection it opened.")
    if seen.get("closed"):
        return Miss("returned a connection that was already closed",
                   "Return the open connection: close it only when initialisation fails (then re-raise).")
    return None
