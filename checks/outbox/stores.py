"""Step 2 of lab `outbox`: open_source and open_sink, their schemas and their error paths."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from checks.outbox import db
from checks.outbox import schema as stores
from checks.outbox.common import (
    NOT_SEEN,
    Check,
    event,
    listing,
    name,
    outcome_text,
    seen_after,
    writable_after,
)
from labkit.judge import step_files
from labkit.judge.expect import (
    Miss,
    Plan,
    both,
    closed_when_interrupted,
    raises,
    under,
)
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.judge.witness import Witness, asker_holds
from labkit.values import decode, encode

SOURCE_COLUMNS = {
    "orders": [("id", "TEXT", 1), ("sku", "TEXT", 0), ("qty", "INTEGER", 0)],
    "outbox": [("seq", "INTEGER", 1), ("id", "TEXT", 0), ("body", "TEXT", 0), ("sent", "INTEGER", 0)],
}
SINK_COLUMNS = {
    "inbox": [("id", "TEXT", 1, 0), ("body", "TEXT", 0, 1)],
    "stock": [("sku", "TEXT", 1, 0), ("qty", "INTEGER", 0, 1)],
}
KEEP_HINT = ("Create tables only if missing (`CREATE TABLE IF NOT EXISTS`); never drop, clear or change rows "
             "when opening a file.")


def _columns(path: Path, table: str) -> list[tuple] | db.Broken:
    """(name, TYPE, pk, notnull) per column."""
    cols = db.read(stores.columns, path, table)
    if isinstance(cols, db.Broken):
        return cols
    return [(c[0], str(c[1]).upper(), 1 if c[4] else 0, 1 if c[2] else 0) for c in cols]


def _try_sql(path: Path, sql: str, params: tuple = ()) -> str:
    """Run one statement on a scratch copy's connection: '' when it worked, else the error."""
    try:
        with closing(stores.connect(path)) as con:
            con.execute(sql, params)
        return ""
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"


def _scratch(path: Path, suffix: str) -> Path:
    """A copy of the student's file, for the judge's constraint experiments."""
    copy = path.with_name(f"{path.stem}-{suffix}.db")
    step_files.copy(path, copy, what="the database file")  # a link or FIFO there is refused, never followed
    return copy


def _table_check(path: Path, table: str, want: list[tuple], with_not_null: bool) -> Check:
    def check(record: dict) -> Miss | None:
        tables = db.read(stores.tables, path)
        if isinstance(tables, db.Broken) or table not in tables:
            return Miss(f"the file has no table {table}" + (f" ({tables})" if isinstance(tables, db.Broken) else ""),
                        f"Create `{table}` exactly as the contract says, and commit it.")
        got = _columns(path, table)
        shape = got if isinstance(got, db.Broken) else [c if with_not_null else c[:3] for c in got]
        if shape != want:
            names = listing([f"{c[0]} {c[1]}{' PRIMARY KEY' if c[2] else ''}" for c in got]) \
                if not isinstance(got, db.Broken) else str(got)
            return Miss(f"{table} has the columns {names}", f"Use the contract's columns for `{table}`, with their types.")
        return None

    return check


def _outbox_rules(path: Path) -> list[tuple[str, Check]]:
    """The outbox's constraints, tried by the judge on copies of the student's file."""

    def autoincrement(record):
        copy = _scratch(path, "autoinc")
        _try_sql(copy, "INSERT INTO outbox(id, body, sent) VALUES ('j1', '{}', 0)")
        first = db.read(stores.rows, copy, "SELECT seq FROM outbox WHERE id = 'j1'")
        _try_sql(copy, "DELETE FROM outbox WHERE id = 'j1'")
        _try_sql(copy, "INSERT INTO outbox(id, body, sent) VALUES ('j2', '{}', 0)")
        second = db.read(stores.rows, copy, "SELECT seq FROM outbox WHERE id = 'j2'")
        if isinstance(first, db.Broken) or isinstance(second, db.Broken) or not first or not second:
            return Miss("the judge could not insert into outbox", "Create outbox exactly as the contract says.")
        if second[0][0] <= first[0][0]:
            return Miss(f"after deleting the row with seq {first[0][0]}, the next row got seq {second[0][0]} again",
                        "`seq INTEGER PRIMARY KEY AUTOINCREMENT`: seq values are never reused.")
        return None

    def unique(record):
        copy = _scratch(path, "unique")
        _try_sql(copy, "INSERT INTO outbox(id, body, sent) VALUES ('dup', '{}', 0)")
        if not _try_sql(copy, "INSERT INTO outbox(id, body, sent) VALUES ('dup', '{}', 0)"):
            return Miss("outbox accepted the same id twice", "outbox.id is `NOT NULL UNIQUE`.")
        return None

    def default(record):
        copy = _scratch(path, "default")
        error = _try_sql(copy, "INSERT INTO outbox(id, body) VALUES ('fresh', '{}')")
        sent = db.read(stores.rows, copy, "SELECT sent FROM outbox WHERE id = 'fresh'")
        if error or sent != [(0,)]:
            return Miss(f"a row inserted without sent got {error or listing([r[0] for r in sent]) if not isinstance(sent, db.Broken) else sent}",
                        "`sent INTEGER NOT NULL DEFAULT 0`: a new row is pending.")
        return None

    def check_constraint(record):
        copy = _scratch(path, "check")
        for bad in (2, -1):
            if not _try_sql(copy, "INSERT INTO outbox(id, body, sent) VALUES (?, '{}', ?)", (f"b{bad}", bad)):
                return Miss(f"outbox accepted sent = {bad}", "Add `CHECK (sent IN (0, 1))` to the sent column.")
        return None

    def not_null(record):
        copy = _scratch(path, "notnull")
        attempts = [("orders.sku", "INSERT INTO orders VALUES ('n1', NULL, 1)"),
                    ("orders.qty", "INSERT INTO orders VALUES ('n2', 'x', NULL)"),
                    ("outbox.id", "INSERT INTO outbox(id, body, sent) VALUES (NULL, '{}', 0)"),
                    ("outbox.body", "INSERT INTO outbox(id, body, sent) VALUES ('n3', NULL, 0)"),
                    ("outbox.sent", "INSERT INTO outbox(id, body, sent) VALUES ('n4', '{}', NULL)")]
        for column, sql in attempts:
            if not _try_sql(copy, sql):
                return Miss(f"{column} accepted NULL", f"Declare {column.split('.')[1]} `NOT NULL`, as the contract does.")
        return None

    return [("2.outbox-autoincrement", _on_a_copy(autoincrement)), ("2.outbox-id-unique", _on_a_copy(unique)),
            ("2.outbox-sent-default", _on_a_copy(default)), ("2.outbox-sent-check", _on_a_copy(check_constraint)),
            ("2.source-not-null", _on_a_copy(not_null))]


def _on_a_copy(check: Check) -> Check:
    """A constraint experiment needs a copy of the file: one that cannot be copied is a verdict too."""

    def guarded(record: dict) -> Miss | None:
        try:
            return check(record)
        except OSError as exc:
            return Miss(f"the judge could not copy the database file to try its constraints: {exc}",
                        "open_source must leave a database file at the path it was given.")

    return guarded


def _opened(path: Path, fn: str, witness: Witness, case: str, clause: str) -> list[tuple[str, Check]]:
    def connection(record):
        seen = record["observed"]
        if record["outcome"]["kind"] != "returned" or not seen.get("connection"):
            return Miss(outcome_text(record["outcome"]), f"{fn} returns the sqlite3.Connection it opened.")
        if not seen.get("usable"):
            return Miss("returned a connection that was already closed", f"{fn} returns the connection open.")
        if seen.get("file") != str(path.resolve()):
            return Miss(f"returned a connection to {seen.get('file') or 'a temporary database'}, not to the path given",
                        f"{fn}(path) opens the file at `path`.")
        return None

    def isolation(record):
        level = decode(record["observed"].get("isolation_level", encode(None)))
        if level is not None:
            return Miss(f"isolation_level is {level!r}", "Connect with `isolation_level=None`: the default opens "
                                                         "hidden transactions.")
        return None

    def busy(record):
        ms = record["observed"].get("busy_timeout")
        if ms != 1000:
            return Miss(f"the busy timeout is {ms} ms", "Pass `timeout=1.0` to sqlite3.connect (a 1 s busy timeout).")
        return None

    return [(clause, connection), ("2.isolation-none", isolation), ("2.busy-timeout", busy),
            ("2.no-transaction-left", writable_after(witness, case, "Commit the CREATE TABLE statements before "
                                                                    "returning (or use executescript)."))]


def _kept_rows(path: Path, before: list, fn: str) -> Check:
    def check(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "returned":
            return Miss(outcome_text(record["outcome"]), f"Opening an existing file with {fn} must work.")
        if db.fingerprint(path) != before:
            return Miss("rows that were in the file before changed or disappeared", KEEP_HINT)
        return None

    return check


def _opened_at_all(fn: str) -> Check:
    def check(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "returned":
            return Miss(outcome_text(record["outcome"]), f"Opening an existing file with {fn} must work.")
        return None

    return check


def _kept_table(path: Path, table: str) -> Check:
    """The one row the judge put in the table the file already had is still there."""

    def check(record: dict) -> Miss | None:
        rows = db.read(stores.rows, path, f"SELECT * FROM {table}")
        if isinstance(rows, db.Broken) or len(rows) != 1:
            return Miss(f"the row in {table} changed or disappeared ({rows})", KEEP_HINT)
        return None

    return check


def _created(path: Path, has: str, lacks: str, want: list[tuple], with_not_null: bool) -> Check:
    def check(record: dict) -> Miss | None:
        tables = db.read(stores.tables, path)
        if not isinstance(tables, db.Broken) and lacks not in tables:
            return Miss(f"the file had the table '{has}' but not '{lacks}', and after opening it still has no "
                        f"table '{lacks}'", PARTIAL_HINT)
        return _table_check(path, lacks, want, with_not_null)(record)

    return check


PARTIAL_HINT = ("Create each table if it is missing (`CREATE TABLE IF NOT EXISTS` for every one): a file can hold "
                "some tables and not others.")


def _init_failed(fn: str, witness: Witness, case: str) -> Check:
    """DatabaseError, and the file no longer open in the child: the judge counts the child's open
    descriptors on it (/proc) while the probe still holds every connection the call opened. Only
    where the kernel cannot be asked does the probe's own count decide."""

    def check(record: dict) -> Miss | None:
        miss = under("2.init-error-propagates", raises("DatabaseError", "Let sqlite3's own error propagate: "
                                                                         "a bare `raise` after closing."))(record)
        if miss is not None:
            return miss
        saw = seen_after(witness, case, "raised")
        if saw is None:
            return Miss(NOT_SEEN.got, NOT_SEEN.hint, clause="2.init-error-closes")
        held = saw.get("held")
        if held if held is not None else record["observed"].get("left_open"):
            return Miss("raised, but left the connection open",
                        f"If creating the tables fails, close the connection, then re-raise: `{fn}` must not leave "
                        "a half-opened connection behind.", clause="2.init-error-closes")
        return None

    return check


def check_stores(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    new_source, new_sink = ctx.path("new-source.db"), ctx.path("new-sink.db")
    old_source, old_sink = ctx.path("old-source.db"), ctx.path("old-sink.db")
    garbage, folder = ctx.path("not-a-db.db"), ctx.path("a-folder.db")
    folder.mkdir()
    kept = [event(name(rng, "kept"), "snack", rng.randint(1, 1000)) for _ in range(3)]
    db.make_source(old_source, kept, sent={kept[0]["id"]})
    db.make_sink(old_sink)
    db.script(old_sink, f"INSERT INTO stock VALUES ('snack', {kept[1]['qty']});"
                             f"INSERT INTO inbox VALUES ('{kept[1]['id']}', '{stores.canonical(kept[1])}');")
    before = {old_source: stores.fingerprint(old_source), old_sink: stores.fingerprint(old_sink)}
    garbage.write_bytes(b"this is not a database, just text\n" * 64)
    paths = {"open_source on a new file": (new_source, "open_source"),
             "open_sink on a new file": (new_sink, "open_sink"),
             "open_source keeps the rows of an existing file": (old_source, "open_source"),
             "open_sink keeps the rows of an existing file": (old_sink, "open_sink"),
             "open_source on a file that is not a database": (garbage, "open_source"),
             "open_sink on a file that is not a database": (garbage, "open_sink"),
             "open_source on a path that is a folder": (folder, "open_source"),
             "open_sink on a path that is a folder": (folder, "open_sink")}
    # a file with some of the tables (a set-up that stopped part-way, an older version): every
    # missing table is created, not only when the first one is missing
    partial = {}
    for fn, schema, tables in (("open_source", stores.SOURCE_SCHEMA, SOURCE_COLUMNS),
                               ("open_sink", stores.SINK_SCHEMA, SINK_COLUMNS)):
        statements = [part.strip() + ";" for part in schema.split(";") if part.strip()]
        for k, (has, lacks) in enumerate((list(tables), list(tables)[::-1])):
            path = ctx.path(f"partial-{fn}-{k}.db")
            db.script(path, statements[list(tables).index(has)])
            label = f"{fn} on a file that has {has} but no {lacks}"
            paths[label] = (path, fn)
            partial[label] = (has, lacks)
    seeded = {"orders": "INSERT INTO orders VALUES ('kept-1', 'snack', 3)",
              "outbox": "INSERT INTO outbox(id, body) VALUES ('kept-1', '{}')",
              "inbox": "INSERT INTO inbox VALUES ('kept-1', '{}')", "stock": "INSERT INTO stock VALUES ('snack', 3)"}
    for label, (has, _lacks) in partial.items():
        db.script(paths[label][0], seeded[has] + ";")

    def look(case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = paths.get(case, (None,))[0]
        if path is None or not path.is_file():
            return {}, {}
        if point == "raised":
            return {"held": asker_holds(path)}, {}
        return {"write": db.try_write(path)}, {}

    witness = Witness(look).start()
    try:
        plans = []
        for label, (path, fn) in list(paths.items())[:2]:
            table_checks = (
                [("2.orders-table", _table_check(path, "orders", SOURCE_COLUMNS["orders"], False)),
                 ("2.outbox-columns", _table_check(path, "outbox", SOURCE_COLUMNS["outbox"], False)),
                 *_outbox_rules(path)] if fn == "open_source" else
                [("2.inbox-table", _table_check(path, "inbox", SINK_COLUMNS["inbox"], True)),
                 ("2.stock-table", _table_check(path, "stock", SINK_COLUMNS["stock"], True))])
            clause = "2.source-connection" if fn == "open_source" else "2.sink-connection"
            rules = _opened(path, fn, witness, label, clause) + table_checks
            plans.append(Plan(label, f"{fn}(path of a new file)",
                              "an open connection to that file (isolation_level None, busy timeout 1 s, no open "
                              "transaction); the contract's tables", both(*(under(c, k) for c, k in rules)),
                              clauses=tuple(c for c, _ in rules)))
        for label, (path, fn) in list(paths.items())[2:4]:
            clause = "2.source-keeps-rows" if fn == "open_source" else "2.sink-keeps-rows"
            plans.append(Plan(label, f"{fn}(path of a file with rows) in a new process", "every row still there",
                              under(clause, _kept_rows(path, before[path], fn)), clauses=(clause,)))
        for label, (_path, fn) in list(paths.items())[4:6]:
            plans.append(Plan(label, f"{fn}(path of a text file)", "sqlite3.DatabaseError; the connection closed",
                              _init_failed(fn, witness, label),
                              clauses=("2.init-error-propagates", "2.init-error-closes")))
        for label, (_path, fn) in list(paths.items())[6:8]:
            plans.append(Plan(label, f"{fn}(path of a folder)", "sqlite3.OperationalError (unable to open)",
                              under("2.connect-error-propagates",
                                    raises("OperationalError", "If sqlite3.connect itself fails there is no "
                                                               "connection to close: let its error propagate "
                                                               "(a `con` that was never assigned cannot be closed).")),
                              clauses=("2.connect-error-propagates",)))
        for label, (has, lacks) in partial.items():
            path, fn = paths[label]
            want = (SOURCE_COLUMNS if fn == "open_source" else SINK_COLUMNS)[lacks]
            plans.append(Plan(label, f"{fn}(path of a file with the table {has} only)",
                              f"a connection; {lacks} created; {has}'s row kept",
                              both(under("2.creates-missing", _opened_at_all(fn)),
                                   under("2.creates-missing", _created(path, has, lacks, want, fn == "open_sink")),
                                   under("2.creates-missing", _kept_table(path, has))),
                              clauses=("2.creates-missing",)))
        specs = [{"name": label, "fn": fn, "path": str(path)} for label, (path, fn) in paths.items()]
        interrupted = []
        for fn in ("open_source", "open_sink"):
            label = f"a Ctrl-C at every statement of {fn}"
            plans.append(Plan(label, f"{fn}(path of a new file), a KeyboardInterrupt just before its 1st statement, "
                                     "then its 2nd, ... (one new file each)",
                              "the KeyboardInterrupt propagates; no connection left open",
                              under("2.init-error-closes", closed_when_interrupted(fn)), clauses=("2.init-error-closes",)))
            folder = ctx.path(f"interrupted-{fn}")
            folder.mkdir()
            interrupted.append({"name": label, "fn": fn, "folder": str(folder)})
        return ctx.cases("stores", plans, {"cases_spec": specs, "witness": witness.url, "interrupted": interrupted})
    finally:
        witness.close()


