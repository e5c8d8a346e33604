"""Lab `relay`: the judge's own view of an outbox file — the contract's schema, seeding, reading,
and the audit trigger that records every change of a row inside the writer's own transaction.

Used by the step checks (one module per step, listed in `checks/relay/lab.py`) and the final check
(`checks/relay/final.py`); never imported by a child.
"""

from __future__ import annotations

import math
import random
import shutil
import string
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from labkit.judge.expect import Miss

TOKEN_HINT = ("Compare the row's `fence` with the caller's token: only `state = 'leased'` with exactly "
              "this fence may change. The token decides, not the clock and not the owner's name.")

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
# What a new row holds besides id and body: steps 1 (the schema) and 2 (enqueue) check it.
DEFAULTS = {"state": "pending", "attempts": 0, "owner": None, "lease_until": None, "fence": 0, "due": 0,
            "last_error": None}
FIELDS = ("seq", "id", "body", "state", "attempts", "owner", "lease_until", "fence", "due", "last_error")
AUDITED = ("n", "t", "seq", "id", "state", "owner", "lease_until", "fence", "attempts", "due", "last_error")


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
        wrong = [k for k, v in expected.items() if have is None or not same_number(have[k], v)]
        if wrong:
            want = ", ".join(f"{k} {expected[k]!r}" for k in wrong)
            return Miss(f"the judge then read row {seq}: {shown(have)} (expected {want})", hint)
        return None

    return check


def same_number(have, want) -> bool:
    if isinstance(want, float) and isinstance(have, int | float) and not isinstance(have, bool):
        return math.isclose(have, want, rel_tol=1e-12, abs_tol=1e-9)
    return have == want


def unchanged(path: Path, before: list, hint: str) -> Callable[[dict], Miss | None]:
    def check(record: dict) -> Miss | None:
        if stores.fingerprint(path) != before:
            return Miss("the outbox changed", hint)
        return None

    return check
