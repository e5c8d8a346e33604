"""Lab `outbox` — the publisher that dies right after the ACK (contract: labs/outbox.md).

One check per contract step, then the crash check. Each check prepares real SQLite files
with the judge's own connections, lets a child process run the student's `worker.py`
(see `outbox_probes.py`), and decides from what the judge observes itself: the DB files
(read with its own connections, also *while* the student's code runs, through the witness
endpoint in `outbox_witness.py`), its own servers' records, and exit codes. The child's
reports are evidence about return values only.

Every case is tagged with the contract clauses it tries (`outbox_contract.py`); every kind
of every near-miss (`outbox_inputs.py`) is tried in every run, and the seed only adds.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import string
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks import outbox_db as db
from checks.outbox_contract import CLAUSES
from checks.outbox_inputs import (
    INT_LOOKALIKES,
    LETTERS_DIGITS,
    NAME_REST,
    NON_ASCII,
    NON_ASCII_SHOWN,
    PUNCTUATION,
    SPACES,
    char_name,
)
from checks.outbox_witness import Witness
from labkit.judge import stores
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
from labkit.judge.run import LabSpec, StepContext, StepSpec
from labkit.judge.verdict import Case, Outcome
from labkit.values import Opaque, decode, encode, same, show

Check = Callable[[dict], Miss | None]

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."
INPUT_HINT = "Never modify the input: build and return a new dict."
CLOSED_HINT = "The caller owns the connection: use it, but don't close it."


def event(event_id: str, sku: str, qty: int) -> dict:
    return {"id": event_id, "sku": sku, "qty": qty}


def name(rng: random.Random, prefix: str, length: int = 6) -> str:
    return prefix + "-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=length))


def listing(items: list) -> str:
    """Items in prose, not as a Python list: 'a, b and c' ('nothing' when empty)."""
    words = [str(i) for i in items]
    if not words:
        return "nothing"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def flags_text(flags: dict | db.Broken, ids: list[str] | None = None) -> str:
    if isinstance(flags, db.Broken):
        return f"the outbox could not be read ({flags})"
    ids = list(flags) if ids is None else ids
    return listing([f"{i} {'sent' if flags.get(i) == 1 else 'pending' if flags.get(i) == 0 else 'missing'}"
                    for i in ids])


def value_text(value: Any, limit: int = 120) -> str:
    if isinstance(value, Opaque):
        article = "an" if value.type_name[:1].lower() in "aeiou" else "a"
        return f"{article} {value.type_name} ({show(value, 60)})"
    return show(value, limit)


def outcome_text(outcome: dict, limit: int = 120) -> str:
    if outcome.get("kind") == "returned":
        return f"returned {value_text(decode(outcome['value']), limit)}"
    return describe(outcome)


def seen_after(witness: Witness, case: str, point: str = "after") -> dict | None:
    sightings = witness.sightings(case, point)
    return sightings[-1].saw if sightings else None


NOT_SEEN = Miss("the judge was never asked to look after this call (the probe's request did not arrive)",
                "Don't patch or replace the checker's code, and don't close sockets or files you did not open.")


def writable_after(witness: Witness, case: str, hint: str = TRANSACTION_HINT) -> Check:
    """The judge itself wrote and committed to the file right after the call."""

    def check(record: dict) -> Miss | None:
        if record["observed"].get("connection_open") is False:
            return Miss("the function closed the connection it was given", CLOSED_HINT)
        saw = seen_after(witness, case)
        if saw is None:
            return NOT_SEEN
        if saw.get("write"):
            return Miss(f"right afterwards the judge's own connection could not write and commit: {saw['write']}",
                        hint)
        return None

    return check


# --- step 1 -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Try:
    """One call inside a step-1 case: an input, whether the contract accepts it, what it is."""

    value: Any
    accept: bool
    note: str = ""


def _each_call(tries: list[Try], hint: str) -> Check:
    def check(record: dict) -> Miss | None:
        calls = record["observed"].get("calls", [])
        if len(calls) != len(tries):
            return Miss(f"only {len(calls)} of {len(tries)} calls came back", "Each call must return or raise.")
        for one, call in zip(tries, calls, strict=True):
            outcome = call["outcome"]
            label = f"validate_event({show(one.value, 100)})" + (f" [{one.note}]" if one.note else "")
            if call.get("input_changed"):
                return Miss(f"{label} modified the dict passed in", INPUT_HINT, clause="1.input-unchanged")
            if one.accept:
                if outcome["kind"] != "returned" or not same(decode(outcome["value"]), one.value):
                    return Miss(f"{label} {outcome_text(outcome)}", hint)
                if call.get("returned_input"):
                    return Miss(f"{label} returned the very dict it was given",
                                "Return a *new* dict: the caller may change it later.", clause="1.returns-new")
            elif outcome["kind"] != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(f"{label} {outcome_text(outcome)}", hint)
        return None

    return check


def _name_cases(field: str, longest: int, base: dict, rng: random.Random) -> list[tuple]:
    """Every rule of the id/sku grammar, both sides of every bound, every kind of near-miss."""

    def e(value):
        return {**base, field: value}

    def refuse(values, note=""):
        return [Try(e(v), False, note(v) if callable(note) else note) for v in values]

    def accept(values):
        return [Try(e(v), True) for v in values]

    full = "".join(rng.choices(NAME_REST, k=longest - 1))
    first_of = "".join(rng.choices(LETTERS_DIGITS, k=1))
    grammar = f"{field}: an ASCII letter or digit first, then letters, digits, '.', '_' or '-'"
    return [
        (f"1.{field}-type", f"{field} of another type (int, bytes, None, list, float: 5 calls)",
         refuse([7, field.encode(), None, [base[field]], 7.5]), f"{field} must be a str: refuse anything else."),
        (f"1.{field}-min", f"{field} of 0 and of 1 character (2 calls)", refuse([""]) + accept(["a"]),
         f"{field} has 1 to {longest} characters: '' is refused, one character is fine."),
        (f"1.{field}-max", f"{field} of {longest} characters (accepted) and of {longest + 1} or more (refused): 5 calls",
         accept(["a" * longest, first_of + full]) + refuse(["a" * (longest + 1), first_of + full + "x", "a" * 10_000]),
         f"{field} has at most {longest} characters; exactly {longest} is fine."),
        (f"1.{field}-ascii", f"{field} with a letter or digit of another script, first or later "
                             f"({NON_ASCII_SHOWN}: {2 * len(NON_ASCII)} calls)",
         [t for c in NON_ASCII for t in refuse([c + "snack", "sn" + c + "ck"], char_name(c))],
         "`isalnum()`, `isdigit()`, `\\w` and `\\d` accept letters of every alphabet, and `[a-z]` with "
         "re.IGNORECASE matches the Kelvin sign: use ASCII ranges without IGNORECASE, or check `isascii()`."),
        (f"1.{field}-first", f"{field} starting with '.', '_' or '-' (refused), with each ASCII letter or digit "
                             f"(accepted): {3 + len(LETTERS_DIGITS)} calls",
         refuse([".snack", "_snack", "-snack"]) + accept([c + "x" for c in LETTERS_DIGITS]),
         f"The first character of {field} must be an ASCII letter or digit. {grammar}."),
        (f"1.{field}-rest", f"{field} with each allowed character after the first (accepted) and each other "
                            f"ASCII punctuation character (refused): {len(NAME_REST) + len(PUNCTUATION)} calls",
         accept(["x" + c for c in NAME_REST]) + refuse(["a" + c + "b" for c in PUNCTUATION], lambda v: repr(v[1])),
         f"Only letters, digits, '.', '_' and '-' after the first character: {grammar}. A class like "
         "`[.-_]` or `[A-z]` is a range that lets in more than it shows."),
        (f"1.{field}-space", f"{field} with whitespace or a control character at the start, in the middle or at "
                             f"the end ({len(SPACES)} kinds: {3 * len(SPACES)} calls)",
         [t for c in SPACES for t in refuse([c + "snack", "sn" + c + "ack", "snack" + c], char_name(c))],
         "No whitespace of any kind: `strip()`/`split()` remove more than spaces (\\x0b, \\x1c, \\x85, \\xa0, "
         "\\u2028…), and the contract refuses the value, it does not clean it."),
        (f"1.{field}-newline", f"{field} ending with a newline (1 call)", refuse(["snack\n"]),
         "`re.match(r'...$')` also matches before a final newline: use `re.fullmatch` or end the pattern with `\\Z`."),
    ]


def check_validate(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    base = event("snack-7", "snack", 7)
    rand = event("A" + "".join(rng.choices(NAME_REST, k=rng.randint(0, 63))),
                 rng.choice(LETTERS_DIGITS) + "".join(rng.choices(NAME_REST, k=rng.randint(0, 31))),
                 rng.randint(1, 1000))
    pairs = [(k, v) for k, v in base.items()]
    groups: list[tuple] = [
        ("1.returns-equal", "a plain event and a random valid one (2 calls)", [Try(base, True), Try(rand, True)],
         "A valid event comes back as a new dict with the same three keys and values."),
        ("1.event-dict", "not a dict (None, a list of pairs, a JSON string, a tuple, an int: 5 calls)",
         [Try(v, False) for v in (None, pairs, stores.canonical(base), tuple(pairs), 7)], "An event must be a dict."),
        ("1.keys-missing", "a key missing (no id, no sku, no qty, no keys: 4 calls)",
         [Try({k: v for k, v in base.items() if k != gone}, False, f"no {gone}") for gone in ("id", "sku", "qty")]
         + [Try({}, False)], "All three keys are required; a missing one is ValueError (not KeyError)."),
        ("1.keys-extra", "an extra key ('note', 'ID', the int 1: 3 calls)",
         [Try({**base, extra: "x"}, False) for extra in ("note", "ID", 1)],
         "Exactly the keys id, sku and qty: an extra key is an error, not something to drop "
         "(and keys need not be strings, so don't sort them)."),
    ]
    groups += _name_cases("id", 64, base, rng)
    groups += _name_cases("sku", 32, base, rng)
    groups += [
        ("1.qty-bool", "qty True and False (2 calls)", [Try({**base, "qty": b}, False) for b in (True, False)],
         BOOL_HINT),
        ("1.qty-type", f"qty as a float (5.0, 1000.0, 1.5, nan, inf, -0.0), as text ({listing(map(repr, INT_LOOKALIKES))}), "
                       f"None or a list: {6 + len(INT_LOOKALIKES) + 2} calls",
         [Try({**base, "qty": q}, False) for q in (5.0, 1000.0, 1.5, float("nan"), float("inf"), -0.0,
                                                   *INT_LOOKALIKES, None, [5])],
         "qty must be an int: don't convert (`int('٧')` is 7, `int(' 7')` too) and don't accept floats."),
        ("1.qty-min", "qty 1 (accepted), 0, -1 and -1000 (refused): 4 calls",
         [Try({**base, "qty": 1}, True)] + [Try({**base, "qty": q}, False) for q in (0, -1, -1000)],
         "qty ranges from 1 to 1000, both ends included."),
        ("1.qty-max", "qty 1000 (accepted), 1001, 10**6, 2**63 and 10**100 (refused): 5 calls",
         [Try({**base, "qty": 1000}, True)] + [Try({**base, "qty": q}, False) for q in (1001, 10**6, 2**63, 10**100)],
         "qty ranges from 1 to 1000, both ends included."),
    ]
    plans, specs = [], []
    for clause, label, tries, hint in groups:
        verb = "each accepted" if all(t.accept for t in tries) else "ValueError for each" if not any(
            t.accept for t in tries) else "accepted or ValueError as labelled"
        called = "validate_event(" + ", ".join(show(t.value, 60) for t in tries[:2]) + (", …" if len(tries) > 2 else "") + ")"
        plans.append(Plan(label, called, verb, under(clause, _each_call(tries, hint)), hint, clauses=(clause,)))
        specs.append({"name": label, "inputs": [encode(t.value) for t in tries]})
    for plan in plans:  # every call also checks these two: the case says so
        if plan.clauses[0] == "1.returns-equal":
            plan.clauses += ("1.returns-new", "1.input-unchanged")
    return ctx.cases("validating", plans, {"cases_spec": specs})


# --- step 2 -------------------------------------------------------------------------------

SOURCE_COLUMNS = {
    "orders": [("id", "TEXT", 1), ("sku", "TEXT", 0), ("qty", "INTEGER", 0)],
    "outbox": [("seq", "INTEGER", 1), ("id", "TEXT", 0), ("body", "TEXT", 0), ("sent", "INTEGER", 0)],
}
SOURCE_NOT_NULL = {"orders": {"sku", "qty"}, "outbox": {"id", "body", "sent"}}
SINK_COLUMNS = {
    "inbox": [("id", "TEXT", 1, 0), ("body", "TEXT", 0, 1)],
    "stock": [("sku", "TEXT", 1, 0), ("qty", "INTEGER", 0, 1)],
}
KEEP_HINT = "Create tables only if missing (`CREATE TABLE IF NOT EXISTS`); never drop or clear them."


def _columns(path: Path, table: str) -> list[tuple] | db.Broken:
    """(name, TYPE, pk, notnull) per column."""
    cols = db.read(stores.columns, path, table)
    if isinstance(cols, db.Broken):
        return cols
    return [(c[0], str(c[1]).upper(), 1 if c[4] else 0, 1 if c[2] else 0) for c in cols]


def _try_sql(path: Path, sql: str, params: tuple = ()) -> str:
    """Run one statement on a scratch copy's connection: '' when it worked, else the error."""
    try:
        with closing(sqlite3.connect(path, isolation_level=None, timeout=2.0)) as con:
            con.execute(sql, params)
        return ""
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"


def _scratch(path: Path, suffix: str) -> Path:
    """A copy of the student's file, for the judge's constraint experiments."""
    copy = path.with_name(f"{path.stem}-{suffix}.db")
    shutil.copyfile(path, copy)
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

    return [("2.outbox-autoincrement", autoincrement), ("2.outbox-id-unique", unique),
            ("2.outbox-sent-default", default), ("2.outbox-sent-check", check_constraint),
            ("2.source-not-null", not_null)]


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


def _init_failed(fn: str) -> Check:
    def check(record: dict) -> Miss | None:
        miss = under("2.init-error-propagates", raises("DatabaseError", "Let sqlite3's own error propagate: "
                                                                         "a bare `raise` after closing."))(record)
        if miss is not None:
            return miss
        if record["observed"].get("left_open"):
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

    def look(case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = paths.get(case, (None,))[0]
        return ({"write": db.try_write(path)} if path is not None and path.is_file() else {}), {}

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
                              _init_failed(fn), clauses=("2.init-error-propagates", "2.init-error-closes")))
        for label, (_path, fn) in list(paths.items())[6:]:
            plans.append(Plan(label, f"{fn}(path of a folder)", "sqlite3.OperationalError (unable to open)",
                              under("2.connect-error-propagates",
                                    raises("OperationalError", "If sqlite3.connect itself fails there is no "
                                                               "connection to close: let its error propagate "
                                                               "(a `con` that was never assigned cannot be closed).")),
                              clauses=("2.connect-error-propagates",)))
        specs = [{"name": label, "fn": fn, "path": str(path)} for label, (path, fn) in paths.items()]
        return ctx.cases("stores", plans, {"cases_spec": specs, "witness": witness.url})
    finally:
        witness.close()


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

    def __init__(self, ctx: StepContext, step: int, fn: str, tables: dict[str, tuple[str, ...]]):
        self.ctx, self.fn, self.tables = ctx, fn, tables
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
            called: str = "") -> None:
        if path not in self.initial:
            self.initial[path] = snapshot(path, self.tables)
        self.paths[label] = path
        rules = [*rules, (self.tx_clause, writable_after(self.witness, label))]
        shown = called or f"{self.fn}(con, {', '.join(show(a, 90) for a in args)})"
        self.plans.append(Plan(label, shown, expected, both(*(under(c, k) for c, k in rules)),
                               clauses=tuple(dict.fromkeys(c for c, _ in rules))))
        self.specs.append({"name": label, "fn": self.fn, "db": str(path), "args": [encode(a) for a in args]})

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

    def run(self) -> list[Case]:
        with self.witness:
            return self.ctx.cases("on_connection", self.plans, {"calls": self.specs, "witness": self.witness.url})


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
    first = event(name(rng, "z"), name(rng, "sku", 3), rng.randint(1, 999))
    second = event(name(rng, "a"), first["sku"], rng.randint(1, 1000))
    boom, bang = event(name(rng, "boom"), "snack", 3), event(name(rng, "bang"), "snack", 4)
    db.script(path, f"""
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
    for label, changed in (("same id, another qty", {**first, "qty": first["qty"] + 1}),
                           ("same id, another sku", {**first, "sku": first["sku"] + "x"})):
        steps.add(label, path, [changed], "Conflict; nothing changes",
                  [("3.conflict", is_module_exception("Conflict", conflict)),
                   ("3.conflict-no-change", steps.unchanged(label, "A conflict changes nothing: raise before writing "
                                                                   "(and roll back)."))])
    for label, bad in (("an invalid order (qty True)", event(name(rng, "bad"), "snack", True)),
                       ("an invalid order (id ending with a newline)", event(name(rng, "bad") + "\n", "snack", 2)),
                       ("an invalid order (an extra key)", {**event(name(rng, "bad"), "snack", 2), "note": "x"}),
                       ("an invalid order reusing an accepted id (qty 0)", {**first, "qty": 0})):
        steps.add(label, path, [bad], "ValueError before any write",
                  [("3.validates-first", raises("ValueError", "Call validate_event first, before looking at the "
                                                              "database: an invalid event is ValueError.")),
                   ("3.validates-first", steps.unchanged(label, "Validate before any write."))])

    def seq_order(state):
        ids = [r["id"] for r in state.get("outbox", [])]
        return "" if ids[:2] == [first["id"], second["id"]] else f"the outbox's seq order is {listing(ids)}"

    steps.add("a second order", path, [second], "True; after the first in the outbox",
              [("3.new-true", returns(True)), *saved("a second order", second),
               ("3.seq-order", steps.state("a second order", seq_order,
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
    return steps.run()


# --- step 4 -------------------------------------------------------------------------------

LIMIT_TYPE_HINT = "limit must be an int (not bool, not a float, not text): check `type(limit) is int`."
LIMIT_RANGE_HINT = "limit ranges from 1 to 16, both ends included."


def _batch(expected: list[dict], size_clause: str, sent_ids: set[str]) -> list[tuple[str, Check]]:
    """pending's result, rule by rule: a list of dicts, unsent only, the right count, seq order, equal."""
    ids = [e["id"] for e in expected]

    def kind(record):
        if record["outcome"]["kind"] != "returned":
            return Miss(outcome_text(record["outcome"]), "Return a list of dicts rebuilt from outbox.body.")
        got = value_of(record)
        if not isinstance(got, list) or not all(isinstance(e, dict) for e in got):
            return Miss(f"returned {value_text(got)}", "Return a list (not a cursor, tuple or generator) of dicts "
                                                       "rebuilt from outbox.body: `json.loads(body)`.")
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

    return [("4.events-rebuilt", kind), ("4.unsent-only", unsent), (size_clause, count), ("4.seq-order", order),
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
    steps = CallSteps(ctx, 4, "pending", SOURCE_TABLES)
    read_only = "pending only reads: it must not mark, delete or add rows."
    for label, db_path, limit, expected, clause in (
            ("limit 16 with 18 pending", path, 16, unsent[:16], "4.limit-max"),
            ("limit 2", path, 2, unsent[:2], "4.limit-caps"),
            ("limit 1", path, 1, unsent[:1], "4.limit-min"),
            ("nothing pending", all_sent, 16, [], "4.none-pending")):
        steps.add(label, db_path, [limit], f"{len(expected)} event{'s' if len(expected) != 1 else ''}, in seq order",
                  [*_batch(expected, clause, sent | {e["id"] for e in done}),
                   ("4.read-only", steps.unchanged(label, read_only))])
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
                           ("same id, another sku", {**first, "sku": "other"})):
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
                       ("an invalid event reusing a received id (qty True)", {**first, "qty": True})):
        steps.add(label, path, [bad], "ValueError before any write",
                  [("5.validates-first", raises("ValueError", "Call validate_event first, before the database.")),
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
    return steps.run()


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
    return steps.run()



# --- step 7 -------------------------------------------------------------------------------

MARK_BEFORE_SEND = ("The row was marked sent before the warehouse answered: a crash during delivery "
                    "would lose it. Call send first, mark only after a True ACK.")
LOCK_HINT = ("Finish reading the batch (fetchall, and commit any transaction) before the first send: a "
             "write transaction or an unfinished cursor held during a slow send blocks every new order.")
ONLY_TRUE = "Only a return value that `is True` is an ACK; anything else → raise DeliveryError."
ACK_KINDS = [("1", 1), ("1.0", 1.0), ("'True'", "True"), ("'yes'", "yes"), ("[True]", [True]),
             ("(True,)", (True,)), ("{'ack': id}", "ACK_DICT"), ("None", None), ("False", False), ("0", 0),
             ("an object whose == says True", "EQUALS_TRUE")]
ERROR_KINDS = ["OSError", "ConnectionResetError", "TimeoutError", "DeliveryError", "RuntimeError", "KeyError"]


class Dispatches:
    """Step 7: scenarios, each on its own source file. Inside every send the judge reads the
    sent flags and accepts a new order with its own connection; inside every after_delivery
    it reads the flags again. Those sightings, the file afterwards and the return value decide."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self.plans: list[Plan] = []
        self.scenarios: list[dict] = []
        self.paths: dict[str, Path] = {}
        self.replies: dict[str, list[dict]] = {}
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.witness = Witness(self._look)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = self.paths.get(case)
        if path is None:
            return {}, {}
        if point == "hook":
            return {"flags": db.sent_flags(path)}, {}
        if point != "send":
            return {}, {}
        with self.lock:  # a dispatch may call send from several threads
            n = self.counts[case] = self.counts.get(case, 0) + 1
        flags = db.sent_flags(path)
        fresh = event(f"new-{len(self.paths)}-{n}", "fresh", n)
        locked = any(s.saw.get("accept") for s in self.sends(case))  # seen once is enough: don't wait again
        accepted = "skipped: the lock was seen earlier in this scenario" if locked else db.accept_order(path, fresh)
        replies = self.replies[case]
        return {"flags": flags, "accept": accepted, "new_order": fresh["id"]}, replies[n - 1] if n <= len(replies) else {}

    def batch(self, prefixes: str) -> list[dict]:
        rng = self.ctx.rng
        return [event(name(rng, p), name(rng, "sku", 3), rng.randint(1, 1000)) for p in prefixes]

    def sends(self, case: str) -> list:
        return self.witness.sightings(case, "send")

    def hooks(self, case: str) -> list:
        return self.witness.sightings(case, "hook")

    def add(self, label: str, called: str, expected: str, events: list[dict], limit: Any,
            rules: Callable[[Path, list[dict]], list[tuple[str, Check]]], replies: list = (), hook: bool = False,
            mutate: str | None = None, sent: list[dict] = ()) -> None:
        rows = [*events[:1], *sent, *events[1:]]  # a sent row between pending ones
        path = db.make_source(self.ctx.path(f"s{len(self.scenarios)}.db"), rows, sent={e["id"] for e in sent})
        self.paths[label], self.replies[label] = path, list(replies)
        self.scenarios.append({"name": label, "db": str(path), "limit": encode(limit), "hook": hook, "mutate": mutate})
        common = [("7.read-before-send", self._no_lock(label)), ("7.mark-after-ack", self._not_marked_early(label)),
                  ("7.fresh-copy", self._copies(label, events)), ("7.batch-fixed", self._batch_fixed(label))]
        checks = common + rules(path, events)
        self.plans.append(Plan(label, called, expected, both(*(under(c, k) for c, k in checks)),
                               clauses=tuple(dict.fromkeys(c for c, _ in checks))))

    # what every scenario checks

    def _no_lock(self, case: str) -> Check:
        def check(record):
            for s in self.sends(case):
                if s.saw.get("accept"):
                    return Miss(f"while send ran for {_id_of(s)}, the judge's own connection could not accept a new "
                                f"order: {s.saw['accept']}", LOCK_HINT)
            return None

        return check

    def _not_marked_early(self, case: str) -> Check:
        def check(record):
            for s in self.sends(case):
                flags = s.saw.get("flags")
                if isinstance(flags, dict) and flags.get(_id_of(s)) == 1:
                    return Miss(f"{_id_of(s)} was already sent = 1 while send was still running", MARK_BEFORE_SEND)
            return None

        return check

    def _copies(self, case: str, events: list[dict]) -> Check:
        by_id = {e["id"]: e for e in events}

        def check(record):
            for s in self.sends(case):
                got = decode(s.said.get("event", encode(None)))
                if s.said.get("not_a_copy"):
                    return Miss(f"send received the very dict that pending returned (for {_id_of(s)})",
                                "Pass a fresh copy (`dict(event)`): the callee may change its argument.")
                want = by_id.get(_id_of(s))
                if want is not None and not same(got, want):
                    return Miss(f"send received {value_text(got)}", "Pass a copy equal to the event as pending "
                                                                    "returned it: the same three keys and values.")
            return None

        return check

    def _batch_fixed(self, case: str) -> Check:
        def check(record):
            fresh = {s.saw.get("new_order") for s in self.sends(case)}
            late = [i for i in _ids(self.sends(case)) if i in fresh]
            if late:
                return Miss(f"send was also called for {listing(late)}, an order the judge accepted while the batch "
                            "was being sent", "Select the batch once, with pending(con, limit), before the first send; "
                                              "orders accepted meanwhile wait for the next dispatch.")
            return None

        return check

    def sent_ids(self, case: str, want: list[str], hint: str) -> Check:
        def check(record):
            misuse = record["observed"].get("send_misuse")
            if misuse:
                return Miss(f"send was called as {misuse[0]}", "Call send with one argument, the event's copy: "
                                                                "`send(dict(event))`.")
            got = _ids(self.sends(case))
            return None if got == want else Miss(f"send was called for {listing(got)}" if got
                                                 else "send was never called", hint)

        return check

    def hooked(self, case: str, want: list[str]) -> Check:
        def check(record):
            hooks = self.hooks(case)
            got = [decode(h.said.get("event_id", encode(None))) for h in hooks]
            if got != want:
                return Miss(f"after_delivery was called with {listing(map(repr, got))}",
                            "After each True ACK call after_delivery(event_id) with the id as selected, then mark_sent;"
                            " never for a failed send.")
            for h in hooks:
                flags = h.saw.get("flags")
                if isinstance(flags, dict) and flags.get(decode(h.said["event_id"])) == 1:
                    return Miss("the row was already marked when after_delivery ran",
                                "Call after_delivery(event_id) after the ACK and before mark_sent.")
            return None

        return check

    def run(self) -> list[Case]:
        with self.witness:
            return self.ctx.cases("dispatching", self.plans, {"scenarios": self.scenarios, "witness": self.witness.url})


def _id_of(sighting) -> Any:
    got = decode(sighting.said.get("event", encode(None)))
    return got.get("id") if isinstance(got, dict) else None


def _ids(sightings) -> list:
    return [_id_of(s) for s in sightings]


def flags_are(path: Path, want: dict[str, int], hint: str) -> Check:
    def check(record):
        have = db.sent_flags(path)
        if isinstance(have, db.Broken) or any(have.get(k) != v for k, v in want.items()):
            return Miss(f"afterwards: {flags_text(have, list(want))}", hint)
        return None

    return check


def same_error(kind: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or outcome["type"] != kind:
            return Miss(outcome_text(outcome), "Let send's exception propagate unchanged: no `except` that wraps, "
                                               "replaces or swallows it.")
        if not record["observed"].get("same_error"):
            return Miss(f"raised a {kind}, but not the object send raised",
                        "Re-raise the same exception (a bare `raise`), not a copy of it.")
        return None

    return check


def check_dispatch(ctx: StepContext) -> list[Case]:
    d = Dispatches(ctx)
    ok = {"return": encode(True)}
    order_hint = "Send each selected event once, in outbox (seq) order."
    mark_hint = "Mark every acknowledged row sent (mark_sent after after_delivery)."

    def delivered(label, n_marked, size_clause="7.batch-order", hook_ids=True):
        def rules(path, events):
            ids = [e["id"] for e in events]
            return [("7.returns-count", returns(n_marked, "Return how many rows this call marked sent.")),
                    (size_clause, d.sent_ids(label, ids[:n_marked], order_hint if size_clause == "7.batch-order" else
                                             "Select at most `limit` events with pending(con, limit); send only those.")),
                    *([("7.hook-after-ack", d.hooked(label, ids[:n_marked]))] if hook_ids else []),
                    ("7.marks-acked", flags_are(path, {i: int(k < n_marked) for k, i in enumerate(ids)}, mark_hint))]

        return rules

    three, skipped = d.batch("zam"), d.batch("b")
    d.add("sends every pending event in seq order, then marks it", "dispatch(con, send, 16, after_delivery=hook) "
          "with a sent row between the pending ones", "3; send called for each pending event in seq order; the hook "
          "after each ACK; all marked", three, 16,
          lambda path, events: [("7.batch-unsent", d.sent_ids("sends every pending event in seq order, then marks it",
                                                              [e["id"] for e in three],
                                                              "Only pending rows (sent = 0) are sent."))]
          + delivered("sends every pending event in seq order, then marks it", 3)(path, events),
          [ok] * 3, hook=True, sent=skipped)
    for limit, pending_n in ((1, 3), (2, 5), (16, 17)):
        label = f"limit {limit} with {pending_n} pending"
        d.add(label, f"dispatch(con, send, {limit})", f"{limit}; only the first {limit} sent and marked",
              d.batch("qwertyuiopasdfghj"[:pending_n]), limit, delivered(label, limit, "7.batch-size", False))
    d.add("nothing pending", "dispatch(con, send, 16) on an outbox with no pending row", "0; send never called",
          [], 16, lambda path, events: [("7.returns-count", returns(0, "Nothing pending: return 0.")),
                                        ("7.batch-unsent", d.sent_ids("nothing pending", [], "Send nothing."))],
          sent=d.batch("n"))

    def stops(label, error, first_fails=False):
        def rules(path, events):
            ids = [e["id"] for e in events]
            n = 0 if first_fails else 1
            failed = ids[n]
            outcome = (is_module_exception("DeliveryError", ONLY_TRUE) if error == "DeliveryError!" else same_error(error))

            def not_taken(record):
                flags = db.sent_flags(path)
                if isinstance(flags, dict) and flags.get(failed) == 1:
                    return Miss(f"{outcome_text(record['outcome'])}; the row whose send did not return True was "
                                "marked sent", ONLY_TRUE)
                return None

            first = [("7.ack-is-true", not_taken), ("7.ack-is-true", outcome)] if error == "DeliveryError!" else []
            return first + [
                ("7.stop-on-failure", d.sent_ids(label, ids[:n + 1], "Stop at the first failure: the rest wait for "
                                                                     "the next dispatch, in order.")),
                *([] if error == "DeliveryError!" else [("7.send-error-same", outcome)]),
                ("7.hook-after-ack", d.hooked(label, ids[:n])),
                ("7.keep-marked", flags_are(path, {i: int(k < n) for k, i in enumerate(ids)},
                                            "Keep rows marked before the failure; leave the failed one and the rest "
                                            "pending.")),
            ]

        return rules

    for shown, value in ACK_KINDS:
        label = f"send returns {shown} for the second event"
        reply = ({"special": "equals_true"} if value == "EQUALS_TRUE" else
                 {"return": encode({"ack": "the-id"} if value == "ACK_DICT" else value)})
        d.add(label, f"dispatch(con, send, 16, after_delivery=hook) where send returns True, then {shown}",
              "DeliveryError; the first marked, the rest pending, the third never sent", d.batch("cde"), 16,
              stops(label, "DeliveryError!"), [ok, reply, ok], hook=True)
    for kind in ERROR_KINDS:
        label = f"send raises {kind} for the second event"
        d.add(label, f"dispatch(con, send, 16, after_delivery=hook) where the second send raises {kind}",
              f"that same {kind} object; the first marked, the rest pending, the third never sent", d.batch("fgh"), 16,
              stops(label, kind), [ok, {"raise": {"type": kind, "message": "warehouse unreachable"}}, ok], hook=True)
    d.add("the first send fails", "dispatch(con, send, 16, after_delivery=hook) where the first send raises OSError",
          "that same OSError; nothing marked, nothing else sent", d.batch("ijk"), 16,
          stops("the first send fails", "OSError", first_fails=True),
          [{"raise": {"type": "OSError", "message": "connection refused"}}], hook=True)
    pair = d.batch("uv")

    def as_selected(path, events):
        return [("7.returns-count", returns(1)),
                ("7.hook-after-ack", d.hooked("the callee changes its copy", [events[0]["id"]])),
                ("7.mark-as-selected", flags_are(path, {events[0]["id"]: 1, events[1]["id"]: 0},
                                                 "send changed its argument and you marked the changed id: send a copy "
                                                 "(`dict(event)`) and mark the id as selected."))]

    d.add("the callee changes its copy", "dispatch(con, send, 1, after_delivery=hook) where send sets event['id'] "
          "to the next row's id", f"1; {pair[0]['id']} marked, {pair[1]['id']} still pending", pair, 1, as_selected,
          hook=True, mutate=pair[1]["id"])
    for bad, clause in ((0, "7.limit-range"), (-1, "7.limit-range"), (17, "7.limit-range"), (True, "7.limit-type"),
                        (2.0, "7.limit-type"), ("3", "7.limit-type"), (None, "7.limit-type")):
        label = f"limit {bad!r} is refused before sending"

        def refused(path, events, label=label, clause=clause):
            return [(clause, raises("ValueError", "Validate limit (an int 1–16, not bool) before sending anything.")),
                    (clause, d.sent_ids(label, [], "Validate limit first: nothing may be sent with a bad limit."))]

        d.add(label, f"dispatch(con, send, {bad!r})", "ValueError; send never called", d.batch("l"), bad, refused)
    return d.run()



# --- step 8 -------------------------------------------------------------------------------

NETWORK_HINT = ("Network failures are not DeliveryError: let the OSError propagate "
                "(the row stays pending and is re-sent later).")
CLOSE_HINT = ("Close the response on every path before returning or raising: `with opener.open(...) as "
              "response:`, and `exc.close()` on an HTTPError (it holds the connection open).")
URL_HINTS = {
    "8.url-type": "url must be a str.",
    "8.url-scheme": "Only `http://`, in lower case: compare the URL's text, not only urlsplit's (lower-cased) scheme.",
    "8.url-host-localhost": "HOST `localhost` exactly: urlsplit's `.hostname` lower-cases it, so compare the URL's "
                            "own text.",
    "8.url-host-loopback": "HOST may be `localhost` or any address in 127.0.0.0/8.",
    "8.url-host-other": "Only localhost or 127.x.y.z: 0.0.0.0 is not in 127.0.0.0/8 (yet Linux connects it to this "
                        "machine), IPv6 and names are not allowed.",
    "8.url-host-spelling": "Only the dotted-decimal form: `ipaddress.ip_address(host)` refuses 127.1, hex, a bare "
                           "integer and leading zeros; `socket.inet_aton` accepts them all.",
    "8.url-port": "The URL must name a port from 1 to 65535, written in ASCII digits only.",
    "8.url-path": "The path must be exactly /events.",
    "8.url-userinfo": "No user info (user@host).",
    "8.url-query": "No query string, not even an empty `?`.",
    "8.url-fragment": "No fragment, not even an empty `#`.",
    "8.url-whitespace": "urlsplit silently removes tabs and newlines and strips leading control characters: check "
                        "that the URL is exactly `http://HOST:PORT/events`, character by character.",
}
TIMEOUT_HINT = "timeout is a positive finite int or float, not bool: anything else is ValueError."


def _ack_text(event_id: str | None) -> bytes:
    return ('{"ack":' + (f'"{event_id}"' if event_id is not None else "null") + "}").encode()


def _padded(size: int) -> Callable[[str | None], bytes]:
    """A valid ACK padded with JSON whitespace to exactly `size` bytes."""

    def body(event_id):
        text = _ack_text(event_id)
        return text + b" " * (size - len(text))

    return body


class SendHttp:
    """Step 8: every call of send_http gets its own listener (scripted replies), so what the
    listener saw — a connection, the request, how much of the answer was read, the close — is
    the judge's evidence for that call alone."""

    def __init__(self, ctx: StepContext):
        from checks.outbox_replies import Replier

        self.ctx = ctx
        self.replier = Replier()
        self.plans: list[Plan] = []
        self.specs: list[dict] = []
        self.listeners: dict[str, Any] = {}
        self.leak_seen = False
        self.witness = Witness(self._look)
        self.proxy = self.replier.listen([self._reply(200, lambda i: json_ack(i))])

    @staticmethod
    def _reply(status, body=b"", **kw):
        from checks.outbox_replies import Reply

        return Reply(status, body, **kw)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        listener = self.listeners.get(case)
        if listener is None or point != "after" or not listener.visits:
            return {}, {}
        gone = listener.clients_gone(0.1 if self.leak_seen else 0.5)
        self.leak_seen = self.leak_seen or not gone
        return {"closed": gone}, {}

    def fresh(self, prefix: str, event_id: str | None = None) -> dict:
        rng = self.ctx.rng
        return event(event_id or name(rng, prefix), name(rng, "sku", 3), rng.randint(1, 1000))

    def add(self, label: str, called: str, expected: str, args: list, listener, rules: list[tuple[str, Check]],
            close_check: bool = True) -> None:
        if listener is not None:
            self.listeners[label] = listener
        if close_check and listener is not None:
            rules = [*rules, ("8.closes-connection", self._closed(label))]
        self.plans.append(Plan(label, called, expected, both(*(under(c, k) for c, k in rules)),
                               clauses=tuple(dict.fromkeys(c for c, _ in rules))))
        self.specs.append({"name": label, "fn": "send_http", "args": [encode(a) for a in args]})

    def _closed(self, case: str) -> Check:
        def check(record):
            listener = self.listeners[case]
            if not listener.visits:
                return None
            saw = seen_after(self.witness, case)
            if saw is None:
                return NOT_SEEN
            if saw.get("closed") is False:
                return Miss(f"{outcome_text(record['outcome'])}, but the connection was still open afterwards",
                            CLOSE_HINT)
            return None

        return check

    def run(self) -> list[Case]:
        url = f"http://127.0.0.1:{self.proxy.port}"
        env = {k: url for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}
        env.update(no_proxy="", NO_PROXY="")
        try:
            with self.witness:
                return self.ctx.cases("sending", self.plans, {"calls": self.specs, "witness": self.witness.url},
                                      env=env)
        finally:
            self.replier.close()


def json_ack(event_id: str | None) -> bytes:
    import json

    return json.dumps({"ack": event_id}).encode()


def _no_connection(listener) -> Check:
    def check(record):
        if listener.visits:
            return Miss(f"{outcome_text(record['outcome'])}, after connecting to the server",
                        "Validate the URL and timeout before opening any connection.")
        return None

    return check


def _delivery_error(hint: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and outcome["type"] == "DeliveryError" and "OSError" not in outcome["mro"]:
            return is_module_exception("DeliveryError", hint)(record)
        return Miss(outcome_text(outcome), hint)

    return check


def _network_error(record):
    outcome = record["outcome"]
    if outcome["kind"] == "raised" and "OSError" in outcome["mro"] and "DeliveryError" not in outcome["mro"]:
        return None
    return Miss(outcome_text(outcome), NETWORK_HINT)


def _not_value_error(hint: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and "ValueError" in outcome.get("mro", []):
            return Miss(outcome_text(outcome), hint)
        return None

    return check


def _posted(listener, sent: dict) -> list[tuple[str, Check]]:
    def once(record):
        posts = [v for v in listener.visits if v.method]
        if len(posts) != 1:
            return Miss(f"the server saw {len(posts)} requests", "POST the event exactly once.")
        visit = posts[0]
        if visit.method != "POST" or visit.path != "/events":
            return Miss(f"the server saw {visit.method} {visit.path}", "POST to /events.")
        if visit.body != stores.canonical(sent).encode():
            return Miss(f"the body was {(visit.body or b'').decode('utf-8', 'replace')!r}",
                        "POST the canonical body: json.dumps(event, sort_keys=True, separators=(',', ':')).")
        return None

    def content_type(record):
        posts = [v for v in listener.visits if v.method]
        ctype = posts[0].headers.get("content-type") if posts else None
        if ctype is None:
            return Miss("the request had no Content-Type header", "Send `Content-Type: application/json`.")
        if ctype.split(";")[0].strip().lower() != "application/json":
            return Miss(f"Content-Type was {ctype!r}", "Send `Content-Type: application/json`.")
        return None

    return [("8.post-canonical", once), ("8.content-type", content_type)]


def check_send_http(ctx: StepContext) -> list[Case]:
    from checks.outbox_inputs import NOT_JSON, NOT_OBJECTS, OTHER_STATUSES, REDIRECTS, URL_REFUSED
    from checks.outbox_replies import ENDLESS

    h = SendHttp(ctx)
    rng = ctx.rng
    reply = h._reply
    listen = h.replier.listen
    true = "Return True (the object True) only for a verified ACK."

    def no_proxy(record):
        if h.proxy.visits:
            return Miss("the request went to the proxy named in http_proxy",
                        "urllib sends even 127.0.0.1 through http_proxy: build the opener with ProxyHandler({}).")
        return None

    ok = h.fresh("ok")
    good = listen([reply(200, json_ack)])
    h.add("a 200 ACK with the event's id", f"send_http(url, {show(ok)})", "True; one POST with the canonical JSON body",
          [good.url, ok], good,
          [("8.no-proxy", no_proxy), ("8.returns-true", returns(True, true)), *_posted(good, ok)])
    local = h.fresh("local")
    listener = listen([reply(200, json_ack)])
    h.add("localhost is allowed", "send_http('http://localhost:PORT/events', ...)", "True",
          [listener.url.replace("127.0.0.1", "localhost"), local], listener,
          [("8.url-host-localhost", returns(True, URL_HINTS["8.url-host-loopback"]))])
    for host in ("127.0.0.2", f"127.{rng.randint(1, 254)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"):
        e = h.fresh("loop")
        listener = listen([reply(200, json_ack)], host=host)
        h.add(f"{host} is in 127.0.0.0/8", f"send_http('http://{host}:PORT/events', ...)", "True", [listener.url, e],
              listener, [("8.url-host-loopback", returns(True, URL_HINTS["8.url-host-loopback"]))])
    for label, url, clause, hint in (
            ("127.255.255.255 is in 127.0.0.0/8", "http://127.255.255.255:9/events", "8.url-host-loopback",
             "127.255.255.255 is in 127.0.0.0/8: accept it (here the network then refuses: an OSError)."),
            ("port 65535 is a port", "http://127.0.0.1:65535/events", "8.url-port",
             "Ports run from 1 to 65535: 65535 is allowed.")):
        h.add(label, f"send_http({url!r}, ...)", "not ValueError: the URL is valid (an OSError, since nothing "
                                                  "answers there)", [url, h.fresh("edge")], None,
              [(clause, _not_value_error(hint))])
    for label, url, clause in URL_REFUSED:
        listener = listen([reply(200, json_ack)])
        target = url.format(p=listener.port)
        h.add(f"url: {label} is refused", f"send_http({target!r}, ...)", "ValueError before any connection",
              [target, h.fresh("url")], listener,
              [(clause, raises("ValueError", URL_HINTS[clause])), ("8.before-connect", _no_connection(listener))],
              close_check=False)
    for label, value in (("bytes", b"http://127.0.0.1:PORT/events"), ("None", None)):
        listener = listen([reply(200, json_ack)])
        target = value.replace(b"PORT", str(listener.port).encode()) if value else value
        h.add(f"url as {label} is refused", f"send_http({show(target)}, ...)", "ValueError", [target, h.fresh("url")],
              listener, [("8.url-type", raises("ValueError", URL_HINTS["8.url-type"])),
                         ("8.before-connect", _no_connection(listener))], close_check=False)
    for bad, clause in ((0, "8.timeout-positive"), (0.0, "8.timeout-positive"), (-0.0, "8.timeout-positive"),
                        (-1, "8.timeout-positive"), (True, "8.timeout-type"), (False, "8.timeout-type"),
                        ("2", "8.timeout-type"), (None, "8.timeout-type"), (float("nan"), "8.timeout-finite"),
                        (float("inf"), "8.timeout-finite"), (float("-inf"), "8.timeout-finite")):
        listener = listen([reply(200, json_ack)])
        h.add(f"timeout {bad!r} is refused", f"send_http(url, event, timeout={bad!r})", "ValueError before any "
              "connection", [listener.url, h.fresh("timeout"), bad], listener,
              [(clause, raises("ValueError", TIMEOUT_HINT)), ("8.before-connect", _no_connection(listener))],
              close_check=False)
    for good_timeout in (2, 0.5):
        listener = listen([reply(200, json_ack)])
        h.add(f"timeout {good_timeout!r} is accepted", f"send_http(url, event, timeout={good_timeout!r})", "True",
              [listener.url, h.fresh("timeout"), good_timeout], listener,
              [("8.timeout-positive", returns(True, "A positive int or float is a valid timeout."))])
    for status in REDIRECTS:
        listener = listen([reply(status, b'{"moved": true}', headers=(("Location", "/events/elsewhere"),)),
                           reply(200, json_ack)])

        def not_followed(record, listener=listener):
            if len(listener.visits) > 1:
                follow = listener.visits[1]
                return Miss(f"the redirect was followed ({follow.method} {follow.path})",
                            "Never follow redirects: a redirect is an answer, not a delivery (an HTTPRedirectHandler "
                            "whose redirect_request returns None).")
            return None

        h.add(f"a {status} redirect is not an ACK", f"send_http(url, event) answered {status} with a Location",
              "DeliveryError; the redirect not followed", [listener.url, h.fresh("moved")], listener,
              [("8.no-redirect", not_followed),
               ("8.no-redirect", _delivery_error("A 3xx is not an ACK: raise DeliveryError (urllib turns a "
                                                 "redirected POST into a GET without the body)."))])
    for status in OTHER_STATUSES:
        body = b"" if status in (204, 304) else json_ack
        listener = listen([reply(status, body)])
        h.add(f"status {status} is not an ACK", f"send_http(url, event) answered {status} "
              + ("(no body)" if not body else "with a perfect ACK body"), "DeliveryError", [listener.url, h.fresh("st")],
              listener, [("8.status-200", _delivery_error(
                  "Only status 200 is success: check `response.status == 200` (urllib raises HTTPError only for "
                  "non-2xx; turn that into DeliveryError too)."))])
    accepted = [
        ("a compact ACK", _ack_text, "8.ack-exact"),
        ("an ACK with JSON whitespace around and inside", lambda i: b'\n { "ack" :\t"' + i.encode() + b'" } \n',
         "8.ack-exact"),
        ("an ACK whose id is written with a \\u escape", lambda i: b'{"ack": "\\u00' + f"{ord(i[0]):02x}".encode()
         + i[1:].encode() + b'"}', "8.ack-id"),
        ("an ACK of exactly 1,024 bytes (with Content-Length)", _padded(1024), "8.ack-size"),
    ]
    for label, body, clause in accepted:
        listener = listen([reply(200, body)])
        h.add(f"{label} is an ACK", f"send_http(url, event) answered 200 with {label}", "True",
              [listener.url, h.fresh("ack")], listener, [(clause, returns(True, _ACK_RULE))])
    for framing, shown in (("close", "without Content-Length"), ("chunked", "chunked")):
        listener = listen([reply(200, _padded(1024), framing=framing)])
        h.add(f"an ACK of exactly 1,024 bytes ({shown}) is an ACK", f"send_http(url, event) answered 200 with a "
              f"1,024-byte ACK, {shown}", "True", [listener.url, h.fresh("ack")], listener,
              [("8.ack-size", returns(True, _ACK_RULE))])
    numeric = h.fresh("", event_id=str(rng.randint(100, 99999)))
    refused = [
        ("an extra key", lambda i: b'{"ack": "' + i.encode() + b'", "ok": true}', "8.ack-exact", None),
        ("no ack key", lambda i: b'{"id": "' + i.encode() + b'"}', "8.ack-exact", None),
        ("the key ACK in capitals", lambda i: b'{"ACK": "' + i.encode() + b'"}', "8.ack-exact", None),
        ("an empty object", b"{}", "8.ack-exact", None),
        ("another id", lambda i: _ack_text(i + "-other"), "8.ack-id", None),
        ("the id in other case", lambda i: _ack_text(i.upper()), "8.ack-id", None),
        ("a prefix of the id", lambda i: _ack_text(i[:-1]), "8.ack-id", None),
        ("the id with a space before it", lambda i: _ack_text(" " + i), "8.ack-id", None),
        ("the id as a number", lambda i: b'{"ack": ' + i.encode() + b"}", "8.ack-id", numeric),
        ("the id in a list", lambda i: b'{"ack": ["' + i.encode() + b'"]}', "8.ack-id", None),
        ("ack null", b'{"ack": null}', "8.ack-id", None),
        ("ack true", b'{"ack": true}', "8.ack-id", None),
        *[(f"JSON {text.decode()}", text, "8.ack-json-object", None) for text in NOT_OBJECTS],
        ("the id as a JSON string", lambda i: b'"' + i.encode() + b'"', "8.ack-json-object", None),
        ("a list holding the ACK", lambda i: b"[" + _ack_text(i) + b"]", "8.ack-json-object", None),
        *[(f"not JSON: {text!r}", text, "8.ack-not-json", None) for text in NOT_JSON],
        ("an ACK followed by more text", lambda i: _ack_text(i) + b" x", "8.ack-not-json", None),
    ]
    for label, body, clause, e in refused:
        listener = listen([reply(200, body)])
        h.add(f"{label} is not an ACK", f"send_http(url, event) answered 200 with {label}", "DeliveryError",
              [listener.url, e or h.fresh("bad")], listener, [(clause, _delivery_error(_ACK_RULE))])
    for framing, shown in (("length", "with Content-Length"), ("close", "without Content-Length"),
                           ("chunked", "chunked")):
        listener = listen([reply(200, _padded(1025), framing=framing)])
        h.add(f"a valid ACK padded to 1,025 bytes ({shown}) is not an ACK", f"send_http(url, event) answered 200 with "
              f"{{\"ack\": id}} and spaces, 1,025 bytes, {shown}", "DeliveryError", [listener.url, h.fresh("big")],
              listener, [("8.ack-size", _delivery_error(_SIZE_RULE))])
    endless = listen([reply(200, _ack_text, framing="close", stream=ENDLESS)])

    def bounded(record):
        if endless.visits and endless.visits[0].sent >= ENDLESS // 2:
            return Miss(f"{outcome_text(record['outcome'])}, after reading {endless.visits[0].sent // 2**20} MB of the "
                        "reply", _SIZE_RULE)
        return None

    h.add("a reply that never ends is not an ACK", "send_http(url, event) answered 200 with an ACK followed by "
          "64 MB of spaces and no Content-Length", "DeliveryError, after reading at most 1,025 bytes",
          [endless.url, h.fresh("endless")], endless,
          [("8.ack-read-bounded", bounded), ("8.ack-size", _delivery_error(_SIZE_RULE))])
    refusing = h.replier.refusing_port()
    h.add("nothing listening", "send_http(url of a port where nothing listens, event)",
          "an OSError (connection refused)", [f"http://127.0.0.1:{refusing}/events", h.fresh("refused")], None,
          [("8.network-error", _network_error)])
    for label, hang_up in (("the server closes without a response", "close"),
                           ("the server resets the connection", "reset")):
        listener = listen([reply(200, json_ack, hang_up=hang_up)])
        h.add(label, f"send_http(url, event); {label.split(' ', 2)[2]}", "an OSError (not DeliveryError)",
              [listener.url, h.fresh("gone")], listener, [("8.network-error", _network_error)], close_check=False)
    for label, kw in (("no reply within the timeout", {"delay": 1.5}),
                      ("the body does not come within the timeout", {"body_delay": 1.5})):
        listener = listen([reply(200, json_ack, **kw)])

        def in_time(record, listener=listener):
            if record["outcome"]["kind"] == "returned":
                return Miss(f"{outcome_text(record['outcome'])} after the server's 1.5 s",
                            "Pass timeout to the connection (urlopen(..., timeout=timeout)): every wait is bounded.")
            return None

        h.add(label, "send_http(url, event, timeout=0.15); the server waits 1.5 s", "an OSError (a timeout) after "
              "about 0.15 s", [listener.url, h.fresh("slow"), 0.15], listener,
              [("8.timeout-honoured", in_time), ("8.network-error", _network_error)])
    return h.run()


_ACK_RULE = ("Success is only status 200 and a body that parses (json.loads) to exactly the object "
             "{\"ack\": <this event's id>}: compare the parsed value, `reply == {\"ack\": event[\"id\"]}`, not "
             "the text, and don't convert or strip the id.")
_SIZE_RULE = ("Read at most 1,025 bytes (`response.read(1025)`) and refuse more than 1,024: a longer reply is not "
              "evidence (whatever its Content-Length says), and reading it all lets a server fill your memory.")



# --- final check: the crash after the ACK ---------------------------------------------------

SNACK = {"id": "snack-7", "sku": "snack", "qty": 7}
FINAL_FAULTS = {
    "wrong_id": ("an ACK naming another id", "final.wrong-id-not-delivery",
                 "Check that the reply is exactly {\"ack\": <this event's id>}."),
    "oversized": ("a 4 KB reply", "final.oversized-not-delivery",
                  "Read at most 1,025 bytes; a longer reply is not evidence: raise DeliveryError."),
    "redirect_302": ("a 302 redirect", "final.redirect-not-delivery",
                     "urllib turns a redirected POST into a GET without the body: refuse redirects (an "
                     "HTTPRedirectHandler whose redirect_request returns None)."),
}


def check_crash(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import WarehouseStartError, spawn_warehouse

    cases: list[Case] = []
    try:
        cases += _killed_after_ack(ctx, spawn_warehouse)
        cases += _lost_response(ctx, spawn_warehouse)
    except WarehouseStartError as exc:
        cases.append(Case("the warehouse runs your receive", Outcome.RAISED, "open_sink + receive in the warehouse "
                          "process", "the warehouse starts with your module",
                          f"the warehouse process could not use your module: {exc}",
                          "The warehouse imports your worker.py and calls your open_sink and receive: steps 2 and 5 "
                          "must work before the crash check can run.", clauses=("final.warehouse-starts",)))
    cases += _bad_replies(ctx)
    return cases


def _timeline_process(ctx, label, run, killed=False):
    ctx.evidence.timeline.append({"t": run.started_at, "actor": label, "kind": "start", "text": "process started"})
    for note in run.messages():
        if note.get("kind") == "hook":
            ctx.evidence.timeline.append({"t": note["t"], "actor": label, "kind": "ack",
                                          "text": f"ACK for {decode(note['id'])} verified; after_delivery runs os._exit"})
    kind = "killed" if killed and run.exit_code == 73 else "exit"
    ctx.evidence.timeline.append({"t": run.ended_at, "actor": label, "kind": kind, "text": f"exit code {run.exit_code}"})


def _timeline_requests(ctx, requests, seen):
    for r in requests[seen:]:
        ctx.evidence.timeline.append({"t": r.get("t_start", 0), "actor": "warehouse", "kind": r.get("outcome", "?"),
                                      "text": f"POST {r.get('id')} → {r.get('outcome')}, response: {r.get('response')}"})
    return len(requests)


def _sink_text(sink: Path) -> str:
    if not sink.exists():
        return "no sink file"
    stock, inbox = db.stock(sink), db.inbox_ids(sink)
    if isinstance(stock, db.Broken) or isinstance(inbox, db.Broken):
        return f"the sink could not be read ({stock if isinstance(stock, db.Broken) else inbox})"
    return f"stock {listing([f'{k} {v}' for k, v in stock.items()])}, inbox {listing(inbox)}"


def _snapshot(ctx, t, source, sink, event_id):
    flags = db.sent_flags(source)
    state = flags_text(flags, [event_id]) if isinstance(flags, dict) else str(flags)
    ctx.evidence.timeline.append({"t": t, "actor": "source DB", "kind": "snapshot", "text": state})
    if sink.exists():
        ctx.evidence.timeline.append({"t": t, "actor": "sink DB", "kind": "snapshot", "text": _sink_text(sink)})


def _receive_failures(requests: list[dict]) -> str:
    """What the student's receive did wrong inside the warehouse, as the warehouse logged it."""
    bad = [r for r in requests if r.get("outcome") in ("error", "bad_request", "conflict")]
    if not bad:
        return ""
    r = bad[0]
    return f"; the warehouse ran your receive for {r.get('id')}, which ended with {r.get('outcome')}: {r.get('error')}"


def _process_problem(run, expected: str, requests: list[dict] = ()) -> Miss:
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
    receive = _receive_failures(list(requests))
    if receive:
        expected = "Your receive (step 5) failed inside the warehouse, so it could not ACK: make step 5 pass first."
    if record is not None:
        return Miss(f"dispatch {outcome_text(record['outcome'])} (exit code {run.exit_code}){receive}", expected)
    if run.timed_out:
        return Miss("the publisher did not finish in time and was killed", "Look for a wait without a timeout.")
    return Miss(f"the process ended with exit code {run.exit_code} before dispatch returned{receive}", expected)


def _killed_after_ack(ctx, spawn_warehouse) -> list[Case]:
    source = db.make_source(ctx.path("source.db"), [SNACK])
    sink, log = ctx.path("sink.db"), ctx.path("warehouse.jsonl")
    ctx.evidence.ladder.append({"rung": "in orders", "observed": "yes: snack-7 accepted before the run", "when": "start"})
    wh = spawn_warehouse(ctx.solution, sink, log, ctx.workdir, marker=ctx.marker())
    try:
        url = wh.url
        first = ctx.child("crash_dispatch", {"source": str(source), "url": url, "kill": True, "exit_code": 73})
        _timeline_process(ctx, "publisher #1", first, killed=True)
        seen = _timeline_requests(ctx, wh.requests(), 0)
        _snapshot(ctx, first.ended_at, source, sink, "snack-7")
        flags = db.sent_flags(source)
        after_crash = (flags.get("snack-7") if isinstance(flags, dict) else flags,
                       db.stock(sink) if sink.exists() else {}, db.inbox_ids(sink) if sink.exists() else [])
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
                "dispatch(con, send_http to the warehouse, 16, after_delivery=os._exit(73))", "exit code 73",
                clauses=("final.dies-at-hook",))
    if first.exit_code != 73 or not hooked:
        miss = _process_problem(first, "after_delivery must be called after a True ACK, before mark_sent.", requests)
        died.outcome, died.got, died.hint = miss.outcome, miss.got, miss.hint
    else:
        ctx.evidence.faults.append("publisher killed in after_delivery (os._exit) — exit code 73 observed")
    cases.append(died)
    flag, stock_after, inbox_after = after_crash
    state = Case("after the crash: pending in the source, applied in the warehouse", Outcome.PASSED,
                 "the judge reads both DB files", "snack-7 pending; stock snack 7; inbox has snack-7",
                 clauses=("final.pending-after-crash", "final.applied-before-crash"))
    ctx.evidence.ladder.append({"rung": "pending in outbox", "observed": "yes" if flag == 0 else f"no (sent = {flag})",
                                "when": "after publisher #1 died"})
    applied = isinstance(inbox_after, list) and "snack-7" in inbox_after
    ctx.evidence.ladder.append({"rung": "in the warehouse inbox", "observed": "yes" if applied else "no",
                                "when": "after publisher #1 died"})
    ctx.evidence.ladder.append({"rung": "ACK returned to the publisher",
                                "observed": "yes: after_delivery ran, and it runs only after a True ACK" if hooked else "no",
                                "when": "just before the kill"})
    if died.passed:
        if flag != 0:
            state.outcome, state.got, state.hint = Outcome.WRONG, f"snack-7 is {flags_text({'snack-7': flag})}" \
                if not isinstance(flag, db.Broken) else f"the source could not be read: {flag}", MARK_BEFORE_SEND
            state.clauses = ("final.pending-after-crash",)
        elif stock_after != {"snack": 7} or not applied:
            state.outcome, state.got = Outcome.WRONG, f"after the crash the sink holds {_sink_text(sink)}"
            state.hint = "receive must record the id and add the qty in one committed transaction."
            state.clauses = ("final.applied-before-crash",)
    else:
        state.outcome, state.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    cases.append(state)
    resent = Case("a new process re-sends it; the warehouse applies it once", Outcome.PASSED,
                  "dispatch(...) again in a new process on the same files",
                  "returns 1; the server saw two POSTs for snack-7 (applied, duplicate); stock 7; row sent",
                  clauses=("final.resent-once", "final.stock-once", "final.sent-after-resend"))
    final_flags = db.sent_flags(source)
    final_flag = final_flags.get("snack-7") if isinstance(final_flags, dict) else final_flags
    final_stock = db.stock(sink) if sink.exists() else {}
    ctx.evidence.ladder.append({"rung": "sent saved", "observed": f"after #1: {'no' if flag == 0 else 'yes'}; "
                                f"after #2: {'yes' if final_flag == 1 else 'no'}", "when": "after each process"})
    record = second.cases().get("dispatch")
    if not died.passed:
        resent.outcome, resent.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    elif record is None or record["outcome"]["kind"] != "returned" or not same(value_of(record), 1):
        miss = _process_problem(second, "The second dispatch should find snack-7 pending and deliver it again.",
                                requests)
        resent.outcome, resent.got, resent.hint = Outcome.WRONG, miss.got, miss.hint
        resent.clauses = ("final.resent-once",)
    elif [r.get("id") for r in requests] != ["snack-7", "snack-7"]:
        resent.outcome = Outcome.WRONG
        resent.got = f"the server saw POSTs for {listing([r.get('id') for r in requests])}"
        resent.hint, resent.clauses = "Each dispatch sends each pending event once.", ("final.resent-once",)
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": 7}:
        resent.outcome = Outcome.WRONG
        resent.got = (f"the warehouse answered {listing([r.get('outcome') for r in requests])}; "
                      f"{_sink_text(sink)}")
        resent.hint = "receive must recognise the repeated id in the inbox: delivered twice, applied once."
        resent.clauses = ("final.stock-once",)
    elif final_flag != 1:
        resent.outcome, resent.got = Outcome.WRONG, "snack-7 is still pending"
        resent.hint, resent.clauses = "After the duplicate ACK, mark the row sent.", ("final.sent-after-resend",)
    else:
        ctx.evidence.faults.append("the same event delivered twice — the warehouse's inbox recognised the duplicate")
    cases.append(resent)
    return cases


def _lost_response(ctx, spawn_warehouse) -> list[Case]:
    rng = ctx.rng
    lost = event(name(rng, "lost"), "snack", rng.randint(1, 1000))
    source = db.make_source(ctx.path("lost-source.db"), [lost])
    sink = ctx.path("lost-sink.db")
    wh = spawn_warehouse(ctx.solution, sink, ctx.path("lost.jsonl"), ctx.workdir, faults=["drop_after_commit"],
                         marker=ctx.marker())
    try:
        first = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        flags = db.sent_flags(source)
        flag_after = flags.get(lost["id"]) if isinstance(flags, dict) else flags
        second = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    drop = Case("a lost response leaves the row pending", Outcome.PASSED,
                "dispatch(...); the warehouse commits, then closes without answering",
                "an OSError from dispatch; the row still pending", clauses=("final.lost-response-pending",))
    record = first.cases().get("dispatch")
    outcome = record["outcome"] if record else None
    if outcome is None or outcome["kind"] != "raised" or "OSError" not in outcome.get("mro", []):
        miss = _process_problem(first, NETWORK_HINT, requests[:1])
        drop.outcome, drop.got, drop.hint = miss.outcome, miss.got, miss.hint
    elif flag_after != 0:
        drop.outcome, drop.got, drop.hint = Outcome.WRONG, f"{lost['id']} has sent = {flag_after}", MARK_BEFORE_SEND
    else:
        ctx.evidence.faults.append(f"response dropped after commit — publisher raised {outcome['type']}; row stayed pending")
    redo = Case("the re-send gets a duplicate ACK", Outcome.PASSED, "dispatch(...) again",
                "1; the warehouse answers duplicate; stock unchanged; row sent",
                clauses=("final.lost-response-redelivered",))
    record = second.cases().get("dispatch")
    final_stock = db.stock(sink) if sink.exists() else {}
    final_flags = db.sent_flags(source)
    if not drop.passed:
        redo.outcome, redo.got = Outcome.NOT_REACHED, "not checked: the lost response was not handled"
    elif record is None or record["outcome"]["kind"] != "returned" or not same(value_of(record), 1):
        miss = _process_problem(second, "The row is still pending, so the next dispatch must re-send it.", requests)
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, miss.got, miss.hint
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": lost["qty"]}:
        redo.outcome = Outcome.WRONG
        redo.got = f"the warehouse answered {listing([r.get('outcome') for r in requests])}; {_sink_text(sink)}"
        redo.hint = "The warehouse must recognise the re-sent id and not add its qty again."
    elif not isinstance(final_flags, dict) or final_flags.get(lost["id"]) != 1:
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, "the row is still pending", "Mark it after the duplicate ACK."
    return [drop, redo]


def _bad_replies(ctx) -> list[Case]:
    from labkit.servers.warehouse import close_all, start_warehouse

    rng = ctx.rng
    runs, servers, plans = [], [], []
    try:
        for fault, (label, clause, hint) in FINAL_FAULTS.items():
            e = event(name(rng, fault.replace("_", "-")), "snack", rng.randint(1, 1000))
            src = db.make_source(ctx.path(f"{fault}.db"), [e])
            wh = start_warehouse(ctx.path(f"{fault}.jsonl"), [fault])
            servers.append(wh)
            runs.append({"name": f"{label} is never taken as delivery", "source": str(src), "url": wh.url})
            plans.append(Plan(runs[-1]["name"], f"dispatch(...) against a warehouse answering with {label}",
                              "DeliveryError; the row stays pending", under(clause, _bad_reply_check(src, e["id"], hint,
                                                                                                     label, ctx)),
                              clauses=(clause,)))
        return ctx.cases("bad_replies", plans, {"runs": runs})
    finally:
        close_all(servers)


def _bad_reply_check(source, event_id, hint, label, ctx):
    def check(record):
        miss = is_module_exception("DeliveryError", hint)(record)
        flags = db.sent_flags(source)
        if miss is None and (not isinstance(flags, dict) or flags.get(event_id) != 0):
            miss = Miss(f"the row is {flags_text(flags, [event_id])}", "Only a verified ACK allows mark_sent.")
        if miss is None:
            ctx.evidence.faults.append(f"{label} offered — DeliveryError raised, row stayed pending")
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
    contract=CLAUSES,
)
