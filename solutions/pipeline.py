# --- provided code -----------------------------------------------
import json
import math
import re

import psycopg


class Conflict(Exception):
    """Same event ID, different content."""


class StaleClaim(Exception):
    """The caller's fence is not the row's current one: another publisher has claimed the row since."""


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
LONGEST = {"id": 64, "sku": 32}  # the most characters of each name


def canonical(event):
    """The one serialisation of an event: keys sorted, no spaces."""
    return json.dumps(event, sort_keys=True, separators=(",", ":"))


def validate_event(event):
    """Lab 01's rules: a new dict with exactly id, sku and qty, or ValueError."""
    if type(event) is not dict or event.keys() != {"id", "sku", "qty"}:
        raise ValueError("an event is a dict with exactly the keys id, sku and qty")
    for key, most in LONGEST.items():
        name = event[key]
        if type(name) is not str or not 1 <= len(name) <= most or not (name.isascii() and NAME.match(name)):
            raise ValueError(f"{key} is 1-{most} letters, digits, '.', '_' or '-', the first a letter "
                             f"or a digit; got {name!r}")
    if type(event["qty"]) is not int or not 1 <= event["qty"] <= 1000:
        raise ValueError(f"qty is an int from 1 to 1000; got {event['qty']!r}")
    return {key: event[key] for key in ("id", "sku", "qty")}


def check_name(what, value):
    """A name for an owner or a consumer: 1-64 printable ASCII characters (space to '~')."""
    if type(value) is not str or not 1 <= len(value) <= 64 or not all(" " <= ch <= "~" for ch in value):
        raise ValueError(f"{what} must be 1-64 printable ASCII characters, not {value!r}")


def check_int(what, value, low, high):
    """An int (never a bool) from low to high."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} must be an int from {low} to {high}, not {value!r}")


def check_key(what, value):
    """A stream or group name: a non-empty str."""
    if type(value) is not str or not value:
        raise ValueError(f"{what} must be a non-empty str, not {value!r}")


# --- step 1 ------------------------------------------------------
SCHEMA = [
    """CREATE TABLE IF NOT EXISTS orders(
        id text PRIMARY KEY, sku text NOT NULL, qty integer NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS outbox(
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id text NOT NULL UNIQUE,
        body text NOT NULL,
        accepted_at timestamptz NOT NULL DEFAULT now(),
        claimed_by text,
        claim_until timestamptz,
        fence bigint NOT NULL DEFAULT 0,
        published_at timestamptz,
        stream_id text)""",
    "CREATE SEQUENCE IF NOT EXISTS fence_seq",
    """CREATE TABLE IF NOT EXISTS inbox(
        id text PRIMARY KEY, body text NOT NULL, stream_id text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE TABLE IF NOT EXISTS stock(sku text PRIMARY KEY, qty integer NOT NULL)",
]
SCHEMA_LOCK = 4004  # any fixed number: every process that creates the schema takes the same lock


def open_db(dsn):
    """Connect in autocommit mode and create whatever is missing, one process at a time."""
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            for statement in SCHEMA:
                conn.execute(statement)
    except BaseException:
        conn.close()
        raise
    return conn


# --- step 2 ------------------------------------------------------
def accept(conn, event):
    """Record an order and its outbox row. New → True; same content → False; other content → Conflict."""
    event = validate_event(event)
    body = canonical(event)
    with conn.transaction():
        new = conn.execute(
            "INSERT INTO outbox(id, body) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING RETURNING seq",
            (event["id"], body)).fetchone()
        if new is not None:
            conn.execute("INSERT INTO orders(id, sku, qty) VALUES (%s, %s, %s)",
                         (event["id"], event["sku"], event["qty"]))
            return True
        (stored,) = conn.execute("SELECT body FROM outbox WHERE id = %s", (event["id"],)).fetchone()
    if stored == body:
        return False
    raise Conflict(f"event {event['id']} was accepted before with other content")


# --- step 3 ------------------------------------------------------
def _check_claim(owner, limit, lease_s):
    check_name("owner", owner)
    check_int("limit", limit, 1, 16)
    if not (type(lease_s) is int or (type(lease_s) is float and math.isfinite(lease_s))) \
            or not 0 < lease_s <= 3600:
        raise ValueError(f"lease_s must be a finite number in (0, 3600], not {lease_s!r}")


CLAIMABLE = """
    SELECT seq, id, body FROM outbox
    WHERE published_at IS NULL AND (claim_until IS NULL OR claim_until < clock_timestamp())
    ORDER BY seq
    LIMIT %s
    FOR UPDATE SKIP LOCKED"""

TAKE = """
    UPDATE outbox
    SET fence = nextval('fence_seq'), claimed_by = %s,
        claim_until = clock_timestamp() + make_interval(secs => %s)
    WHERE seq = %s
    RETURNING fence"""


def claim(conn, owner, limit, lease_s):
    """Take up to `limit` unpublished rows, each with a new fence; return them in seq order."""
    _check_claim(owner, limit, lease_s)
    claimed = []
    with conn.transaction():
        for seq, event_id, body in conn.execute(CLAIMABLE, (limit,)).fetchall():
            (fence,) = conn.execute(TAKE, (owner, float(lease_s), seq)).fetchone()
            claimed.append({"seq": seq, "id": event_id, "event": json.loads(body), "fence": fence})
    return claimed


# --- step 4 ------------------------------------------------------
def _save_published(conn, seq, fence, entry_id):
    """Published, in one transaction, only if the row still carries this fence; else StaleClaim."""
    with conn.transaction():
        saved = conn.execute(
            "UPDATE outbox SET published_at = now(), stream_id = %s, claimed_by = NULL, claim_until = NULL"
            " WHERE seq = %s AND fence = %s RETURNING seq", (entry_id, seq, fence)).fetchone()
    if saved is None:
        raise StaleClaim(f"row {seq} no longer carries fence {fence}: another publisher claimed it")


def publish(conn, r, owner, limit, lease_s, stream, after_add=None):
    """Claim a batch, XADD each row, then save it as published if this fence still holds it."""
    _check_claim(owner, limit, lease_s)
    check_key("stream", stream)
    counts = {"published": 0, "stale": 0}
    for row in claim(conn, owner, limit, lease_s):
        entry_id = r.xadd(stream, {"id": row["id"], "body": canonical(row["event"]),
                                   "fence": row["fence"]})
        if after_add is not None:
            after_add(row["id"])
        try:
            _save_published(conn, row["seq"], row["fence"], entry_id)
            counts["published"] += 1
        except StaleClaim:
            counts["stale"] += 1  # somebody else's row now; the stream holds one more copy
    return counts


# --- step 5 ------------------------------------------------------
def ensure_group(r, stream, group):
    """Create the consumer group at id 0 (and the stream if missing). New → True; exists → False."""
    check_key("stream", stream)
    check_key("group", group)
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception as exc:  # the client's ResponseError; the server's code comes first
        if str(exc).startswith("BUSYGROUP"):
            return False
        raise
    return True


# --- step 6 ------------------------------------------------------
def _entries(reply):
    """XREADGROUP's answer, [[stream, [(entry id, fields), ...]]], → [(entry id, fields), ...]."""
    return [entry for _stream, batch in reply or [] for entry in batch]


def _read(r, stream, group, consumer, count, block_ms):
    """This consumer's own pending entries first, then new ones: at most `count` in all."""
    entries = _entries(r.xreadgroup(group, consumer, {stream: "0"}, count=count))
    if len(entries) < count:
        wait = block_ms if block_ms > 0 and not entries else None  # never BLOCK 0: that waits forever
        entries += _entries(r.xreadgroup(group, consumer, {stream: ">"}, count=count - len(entries),
                                         block=wait))
    return entries


def _decode(fields):
    """An entry's fields → a valid event, or ValueError saying why it is poison."""
    if not fields or "body" not in fields:
        raise ValueError("the entry has no body field")
    try:
        event = json.loads(fields["body"])
    except (ValueError, RecursionError):  # nested a thousand deep: RecursionError, not ValueError
        raise ValueError("the body is not JSON (or is nested too deeply)") from None
    event = validate_event(event)
    if "id" in fields and fields["id"] != event["id"]:
        raise ValueError(f"the id field says {fields['id']!r}, the body says {event['id']!r}")
    return event


def _apply(conn, event, entry_id, before_commit):
    """One transaction: the inbox row and, only if it is new, the stock. → applied/duplicate/conflict."""
    body = canonical(event)
    with conn.transaction():
        new = conn.execute(
            "INSERT INTO inbox(id, body, stream_id) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING"
            " RETURNING id", (event["id"], body, entry_id)).fetchone()
        if new is not None:
            conn.execute("INSERT INTO stock(sku, qty) VALUES (%s, %s)"
                         " ON CONFLICT (sku) DO UPDATE SET qty = stock.qty + EXCLUDED.qty",
                         (event["sku"], event["qty"]))
            outcome = "applied"
        else:
            (stored,) = conn.execute("SELECT body FROM inbox WHERE id = %s", (event["id"],)).fetchone()
            outcome = "duplicate" if stored == body else "conflict"
        if before_commit is not None:
            before_commit(entry_id)
    return outcome


def dead_letter(r, stream, entry_id, fields, reason):
    """Add a copy of the entry, and why, to `<stream>.dead`. Acknowledge it only after this."""
    r.xadd(f"{stream}.dead", {"entry_id": entry_id, "fields": json.dumps(fields or {}),
                              "reason": reason})


def consume(conn, r, stream, group, consumer, count, block_ms, before_commit=None, before_ack=None):
    """Apply entries exactly once through the inbox, then acknowledge them; poison goes to <stream>.dead."""
    for what, value in (("stream", stream), ("group", group)):
        check_key(what, value)
    check_name("consumer", consumer)
    check_int("count", count, 1, 1000)
    check_int("block_ms", block_ms, 0, 60_000)
    counts = {"applied": 0, "duplicate": 0, "dead": 0}
    for entry_id, fields in _read(r, stream, group, consumer, count, block_ms):
        try:
            event = _decode(fields)
        except ValueError as exc:
            outcome, reason = "dead", f"not an event: {exc}"
        else:
            outcome = _apply(conn, event, entry_id, before_commit)
            if outcome == "conflict":
                outcome, reason = "dead", f"{event['id']} was applied before with another body"
        if outcome == "dead":
            dead_letter(r, stream, entry_id, fields, reason)
        if before_ack is not None:
            before_ack(entry_id)
        r.xack(stream, group, entry_id)
        counts[outcome] += 1
    return counts


# --- step 7 ------------------------------------------------------
PAGE = 100  # entries per XPENDING or XAUTOCLAIM call
MOST_PAGES = 100  # a bound on the walk: at most 10,000 pending entries per call


def _pending(r, stream, group, min_idle_ms=0):
    """Every pending entry idle for at least min_idle_ms, in id order, page by page (bounded)."""
    found, start = [], "-"
    for _ in range(MOST_PAGES):
        page = r.xpending_range(stream, group, min=start, max="+", count=PAGE, idle=min_idle_ms)
        found += page
        if len(page) < PAGE:
            break
        start = "(" + page[-1]["message_id"]  # "(" : strictly after the last one seen
    return found


def reclaim(r, stream, group, consumer, min_idle_ms, max_deliveries):
    """Dead-letter idle entries delivered too often; take the other idle ones over with XAUTOCLAIM."""
    for what, value in (("stream", stream), ("group", group)):
        check_key(what, value)
    check_name("consumer", consumer)
    check_int("min_idle_ms", min_idle_ms, 0, 86_400_000)
    check_int("max_deliveries", max_deliveries, 1, 1000)
    dead = 0
    for entry in _pending(r, stream, group, min_idle_ms):
        if entry["times_delivered"] <= max_deliveries:
            continue
        entry_id = entry["message_id"]
        # Take it first (JUSTID: no delivery counted): of two reclaimers, only one gets it.
        if not r.xclaim(stream, group, consumer, min_idle_ms, [entry_id], justid=True):
            continue
        found = r.xrange(stream, min=entry_id, max=entry_id)
        fields = found[0][1] if found else {}
        dead_letter(r, stream, entry_id, fields,
                    f"delivered {entry['times_delivered']} times, more than max_deliveries={max_deliveries}")
        r.xack(stream, group, entry_id)
        dead += 1
    claimed, cursor = [], "0-0"
    for _ in range(MOST_PAGES):
        cursor, entries, *_deleted = r.xautoclaim(stream, group, consumer, min_idle_ms,
                                                  start_id=cursor, count=PAGE)
        claimed += [entry_id for entry_id, _fields in entries]
        if cursor == "0-0":
            break
    return {"claimed": claimed, "dead": dead}


# --- step 8 ------------------------------------------------------
def lag(conn, r, stream, group):
    """The operator's view, read-only: what waits in PostgreSQL, what waits in the group, what is dead."""
    check_key("stream", stream)
    check_key("group", group)
    unpublished, oldest_s = conn.execute(
        "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(accepted_at)), 0)::float8"
        " FROM outbox WHERE published_at IS NULL").fetchone()
    try:
        groups = r.xinfo_groups(stream)
    except Exception as exc:  # a stream that does not exist yet has no groups
        if "no such key" not in str(exc).lower():
            raise
        groups = []
    pending = next((g["pending"] for g in groups if g["name"] == group), 0)
    entries = _pending(r, stream, group) if pending else []
    return {
        "unpublished": unpublished,
        "oldest_unpublished_s": max(oldest_s, 0.0),
        "pending": pending,
        "oldest_pending_ms": max((e["time_since_delivered"] for e in entries), default=0),
        "max_deliveries": max((e["times_delivered"] for e in entries), default=0),
        "dead": r.xlen(f"{stream}.dead"),
    }
