"""Lab 01's databases as the judge sees them (lab 03 builds on them): the contract's schemas, seeding and snapshots.

The judge builds and reads DB files with its own connections, so a step can be checked
without trusting the student's `open_*` functions, and state is observed, not reported.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

from labkit.judge.step_files import check_db

SOURCE_SCHEMA = """
CREATE TABLE orders(id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL);
CREATE TABLE outbox(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL, sent INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)));
"""
SINK_SCHEMA = """
CREATE TABLE inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE stock(sku TEXT PRIMARY KEY, qty INTEGER NOT NULL);
"""


def canonical(event: dict) -> str:
    return json.dumps(event, sort_keys=True, separators=(",", ":"))


def connect(path: Path, timeout: float = 2.0) -> sqlite3.Connection:
    """The judge's read-write connection to a DB file (it writes, takes locks, rolls back a hot
    journal). The file and its journal are checked first (`step_files.check_db`): a link, FIFO or
    folder a child put in their place is refused (`DatabaseRefused`, an sqlite3.Error), never followed."""
    check_db(path)
    return sqlite3.connect(path, isolation_level=None, timeout=timeout)


def reader(path: Path, timeout: float = 2.0) -> sqlite3.Connection:
    """The judge's connection for a pure read: checked as `connect` checks, and read-only
    (`mode=ro`) unless the file needs a writer to be read at all (a rollback journal or WAL
    beside it, or WAL mode) or is missing (SQLite then makes an empty one, as it always did)."""
    if check_db(path).needs_writer:
        return sqlite3.connect(path, isolation_level=None, timeout=timeout)
    uri = f"file:{quote(str(Path(path).absolute()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout)


def make_source(path: Path, events: list[dict] = (), sent: set[str] = frozenset()) -> Path:
    with closing(connect(path)) as con:
        con.executescript(SOURCE_SCHEMA)
        for event in events:
            con.execute("INSERT INTO orders VALUES (?, ?, ?)", (event["id"], event["sku"], event["qty"]))
            con.execute("INSERT INTO outbox(id, body, sent) VALUES (?, ?, ?)",
                        (event["id"], canonical(event), int(event["id"] in sent)))
    return path


def make_sink(path: Path) -> Path:
    with closing(connect(path)) as con:
        con.executescript(SINK_SCHEMA)
    return path


def execute(path: Path, sql: str) -> None:
    with closing(connect(path)) as con:
        con.executescript(sql)


def rows(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(reader(path)) as con:
        return con.execute(sql, params).fetchall()


def outbox(path: Path) -> list[tuple[int, str, str, int]]:
    return rows(path, "SELECT seq, id, body, sent FROM outbox ORDER BY seq")


def sent_flags(path: Path) -> dict[str, int]:
    return {event_id: sent for _seq, event_id, _body, sent in outbox(path)}


def stock(path: Path) -> dict[str, int]:
    return dict(rows(path, "SELECT sku, qty FROM stock"))


def inbox_ids(path: Path) -> list[str]:
    return [r[0] for r in rows(path, "SELECT id FROM inbox ORDER BY id")]


def tables(path: Path) -> dict[str, str]:
    return dict(rows(path, "SELECT name, sql FROM sqlite_master WHERE type = 'table'"))


def columns(path: Path, table: str) -> list[tuple]:
    """(name, type, notnull, default, pk) per column, as PRAGMA table_info says."""
    return [tuple(r[1:6]) for r in rows(path, f"PRAGMA table_info({table})")]


def fingerprint(path: Path) -> list:
    """Everything in every table: equal fingerprints mean nothing changed."""
    with closing(reader(path)) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return [(n, con.execute(f"SELECT * FROM {n} ORDER BY 1").fetchall()) for n in names]
