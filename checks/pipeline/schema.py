"""Lab `pipeline`: the contract's schema, made by the judge as the step's own role (so a step
after the first does not depend on the student's open_db), and what the judge reads back."""

from __future__ import annotations

import json

import psycopg

SCHEMA = [
    "CREATE TABLE orders(id text PRIMARY KEY, sku text NOT NULL, qty integer NOT NULL)",
    """CREATE TABLE outbox(seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL UNIQUE,
        body text NOT NULL, accepted_at timestamptz NOT NULL DEFAULT now(), claimed_by text,
        claim_until timestamptz, fence bigint NOT NULL DEFAULT 0, published_at timestamptz, stream_id text)""",
    "CREATE SEQUENCE fence_seq",
    """CREATE TABLE inbox(id text PRIMARY KEY, body text NOT NULL, stream_id text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE TABLE stock(sku text PRIMARY KEY, qty integer NOT NULL)",
]

# (table, column) → (type, NOT NULL, default contains, identity)
COLUMNS = {
    ("orders", "id"): ("text", True), ("orders", "sku"): ("text", True), ("orders", "qty"): ("integer", True),
    ("outbox", "seq"): ("bigint", True), ("outbox", "id"): ("text", True), ("outbox", "body"): ("text", True),
    ("outbox", "accepted_at"): ("timestamp with time zone", True),
    ("outbox", "claimed_by"): ("text", False), ("outbox", "claim_until"): ("timestamp with time zone", False),
    ("outbox", "fence"): ("bigint", True), ("outbox", "published_at"): ("timestamp with time zone", False),
    ("outbox", "stream_id"): ("text", False),
    ("inbox", "id"): ("text", True), ("inbox", "body"): ("text", True), ("inbox", "stream_id"): ("text", True),
    ("inbox", "applied_at"): ("timestamp with time zone", True),
    ("stock", "sku"): ("text", True), ("stock", "qty"): ("integer", True),
}


def canonical(event: dict) -> str:
    return json.dumps(event, sort_keys=True, separators=(",", ":"))


def create(db) -> None:
    """The contract's tables in `db` (a `servers.Db`), owned by its role."""
    db.as_owner(list(SCHEMA))


def schema_problems(con: psycopg.Connection) -> list[str]:
    """What differs from the contract's schema, in words (empty: as the contract says)."""
    rows = con.execute("""SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity
                          FROM information_schema.columns WHERE table_schema = 'public'""").fetchall()
    found = {(t, c): (d, n == "NO", dflt or "", ident == "YES") for t, c, d, n, dflt, ident in rows}
    problems = []
    for (table, column), (kind, not_null) in COLUMNS.items():
        got = found.get((table, column))
        if got is None:
            problems.append(f"{table}.{column} is missing")
            continue
        if got[0] != kind:
            problems.append(f"{table}.{column} is {got[0]}, not {kind}")
        if got[1] != not_null:
            problems.append(f"{table}.{column} is {'NOT NULL' if got[1] else 'nullable'}")
    if found.get(("outbox", "seq"), (0, 0, 0, False))[3] is False:
        problems.append("outbox.seq is not GENERATED ALWAYS AS IDENTITY")
    if "now()" not in found.get(("outbox", "accepted_at"), ("", "", "", ""))[2]:
        problems.append("outbox.accepted_at has no DEFAULT now()")
    if found.get(("outbox", "fence"), ("", "", "", ""))[2].strip("'") != "0":
        problems.append("outbox.fence has no DEFAULT 0")
    keys = con.execute("""SELECT tc.table_name, tc.constraint_type, string_agg(k.column_name, ',')
                          FROM information_schema.table_constraints tc
                          JOIN information_schema.key_column_usage k USING (constraint_name, table_name)
                          WHERE tc.table_schema = 'public' GROUP BY 1, 2, tc.constraint_name""").fetchall()
    wanted = {("orders", "PRIMARY KEY", "id"), ("outbox", "PRIMARY KEY", "seq"), ("outbox", "UNIQUE", "id"),
              ("inbox", "PRIMARY KEY", "id"), ("stock", "PRIMARY KEY", "sku")}
    for table, kind, cols in sorted(wanted - set(keys)):
        problems.append(f"{table} has no {kind} ({cols})")
    if con.execute("SELECT to_regclass('public.fence_seq')").fetchone()[0] is None:
        problems.append("the sequence fence_seq is missing")
    return problems


def rows(db, table: str) -> list[tuple]:
    """Every row of `table` in `db` (a `servers.Db`), in the table's order."""
    order = {"outbox": "seq", "stock": "sku"}.get(table, "id")
    return db.look(f"SELECT * FROM {table} ORDER BY {order}")  # noqa: S608 (the judge's own names)
