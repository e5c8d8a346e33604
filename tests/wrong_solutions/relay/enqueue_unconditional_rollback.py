"""Wrong: enqueue rolls back on every error, also when the error already ended the transaction. Fails step 2. Clause: 2.one-transaction. Message: cannot rollback"""
# --- provided code -----------------------------------------------
import json
import math
import re
import sqlite3
from contextlib import contextmanager


class Conflict(Exception):
    """Same event ID, different content."""


class StaleLease(Exception):
    """The caller's token is not the row's current one: another publisher owns the row now."""


class PermanentError(Exception):
    """Raised by a send for a failure that retrying cannot fix."""


class DeliveryError(Exception):
    """send returned something other than True: not evidence of delivery (a transient failure)."""


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
        if type(name) is not str or len(name) > most or not (name.isascii() and NAME.match(name)):
            raise ValueError(f"{key} is 1-{most} letters, digits, '.', '_' or '-', the first a letter "
                             f"or a digit; got {name!r}")
    if type(event["qty"]) is not int or event["qty"] not in range(1, 1001):
        raise ValueError(f"qty is an int from 1 to 1000; got {event['qty']!r}")
    return {key: event[key] for key in ("id", "sku", "qty")}


@contextmanager
def write_transaction(con):
    """BEGIN IMMEDIATE ... COMMIT; on any error ROLLBACK and re-raise (labs 01 and 02)."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


# --- step 1 ------------------------------------------------------
SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS outbox(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'leased', 'sent', 'quarantined')),
    attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until REAL,
    fence INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL DEFAULT 0,
    last_error TEXT);
CREATE TABLE IF NOT EXISTS fence_counter(
    id INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL);
INSERT OR IGNORE INTO fence_counter(id, last) VALUES (1, 0);
COMMIT;
"""


def open_outbox(path):
    """Open (or create) the shared outbox in WAL mode, keeping every row and the counter."""
    con = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA)
    except BaseException:
        con.close()
        raise
    return con


# --- step 2 ------------------------------------------------------
def enqueue(con, event):
    """Add an event to the outbox. New → True; identical repeat → False; other content → Conflict."""
    event = validate_event(event)
    body = canonical(event)
    con.execute("BEGIN IMMEDIATE")
    try:
        row = con.execute("SELECT body FROM outbox WHERE id = ?", (event["id"],)).fetchone()
        if row is None:
            con.execute("INSERT INTO outbox(id, body) VALUES (?, ?)", (event["id"], body))
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    if row is None:
        return True
    if row[0] == body:
        return False
    raise Conflict(f"event {event['id']} is already in the outbox with other content")


# --- step 3 ------------------------------------------------------
def _finite(value):
    """An int or a finite float; never a bool."""
    return type(value) is int or (type(value) is float and math.isfinite(value))


def _check_claim(owner, now, lease, limit):
    if (type(owner) is not str or not 1 <= len(owner) <= 64
            or not all(" " <= ch <= "~" for ch in owner)):
        raise ValueError(f"owner must be 1-64 printable ASCII characters, not {owner!r}")
    if not _finite(now) or now < 0:
        raise ValueError(f"now must be a finite number >= 0, not {now!r}")
    if not _finite(lease) or not 0 < lease <= 3600:
        raise ValueError(f"lease must be a finite number in (0, 3600], not {lease!r}")
    if type(limit) is not int or not 1 <= limit <= 16:
        raise ValueError(f"limit must be an int from 1 to 16, not {limit!r}")


def claim(con, owner, now, lease, limit):
    """Lease up to `limit` due rows to `owner`, each with a new token; return them in seq order."""
    _check_claim(owner, now, lease, limit)
    claimed = []
    with write_transaction(con):
        rows = con.execute(
            "SELECT seq, id, body FROM outbox"
            " WHERE (state = 'pending' AND due <= ?) OR (state = 'leased' AND lease_until <= ?)"
            " ORDER BY seq LIMIT ?", (now, now, limit)).fetchall()
        for seq, event_id, body in rows:
            con.execute("UPDATE fence_counter SET last = last + 1 WHERE id = 1")
            (token,) = con.execute("SELECT last FROM fence_counter WHERE id = 1").fetchone()
            con.execute(
                "UPDATE outbox SET state = 'leased', owner = ?, lease_until = ?, fence = ?,"
                " attempts = attempts + 1 WHERE seq = ?", (owner, now + lease, token, seq))
            claimed.append({"seq": seq, "id": event_id, "body": body, "fence": token})
    return claimed


# --- step 4 ------------------------------------------------------
def _check_row_args(seq, fence):
    for name, value in (("seq", seq), ("fence", fence)):
        if type(value) is not int:
            raise ValueError(f"{name} must be an int, not {value!r}")


def _attempts_if_current(con, seq, fence):
    """The row's attempts if `fence` is its current lease's token; else KeyError or StaleLease."""
    row = con.execute("SELECT state, fence, attempts FROM outbox WHERE seq = ?", (seq,)).fetchone()
    if row is None:
        raise KeyError(seq)
    state, current, attempts = row
    if state != "leased" or current != fence:
        raise StaleLease(f"row {seq} is {state} with token {current}, not leased with token {fence}")
    return attempts


def complete(con, seq, fence):
    """Leased with exactly this token → sent. Anything else → StaleLease; unknown seq → KeyError."""
    _check_row_args(seq, fence)
    with write_transaction(con):
        _attempts_if_current(con, seq, fence)
        con.execute("UPDATE outbox SET state = 'sent', owner = NULL, lease_until = NULL"
                    " WHERE seq = ?", (seq,))


# --- step 5 ------------------------------------------------------
def backoff(attempt, base, cap, rng):
    """Full jitter: a uniform draw from [0, min(cap, base * 2 ** (attempt - 1))], from rng."""
    if type(attempt) is not int or attempt < 1:
        raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
    for name, value in (("base", base), ("cap", cap)):
        if not _finite(value):
            raise ValueError(f"{name} must be a finite number, not {value!r}")
    if not 0 < base <= cap:
        raise ValueError(f"need 0 < base <= cap, not base={base!r}, cap={cap!r}")
    ceiling = base
    for _ in range(attempt - 1):  # stops at the cap: never computes 2 ** attempt
        if ceiling >= cap:
            break
        ceiling *= 2
    return rng.uniform(0, min(ceiling, cap))


# --- step 6 ------------------------------------------------------
def _check_policy(policy):
    if type(policy) is not dict or not {"base", "cap", "max_attempts", "rng"} <= set(policy):
        raise ValueError("policy is a dict with base, cap, max_attempts and rng")
    base, cap = policy["base"], policy["cap"]
    if not _finite(base) or not _finite(cap) or not 0 < base <= cap:
        raise ValueError(f"policy needs finite 0 < base <= cap, not base={base!r}, cap={cap!r}")
    if type(policy["max_attempts"]) is not int or policy["max_attempts"] < 1:
        raise ValueError(f"max_attempts must be an int >= 1, not {policy['max_attempts']!r}")
    if not callable(getattr(policy["rng"], "uniform", None)):
        raise ValueError("policy['rng'] must be a random.Random")


def fail(con, seq, fence, error, now, policy):
    """Record a failed delivery: back to pending with a jittered due time, or quarantined."""
    _check_row_args(seq, fence)
    if not _finite(now) or now < 0:
        raise ValueError(f"now must be a finite number >= 0, not {now!r}")
    _check_policy(policy)
    text = f"{type(error).__name__}: {error}"[:200]
    with write_transaction(con):
        attempts = _attempts_if_current(con, seq, fence)
        if isinstance(error, PermanentError) or attempts >= policy["max_attempts"]:
            con.execute("UPDATE outbox SET state = 'quarantined', owner = NULL, lease_until = NULL,"
                        " last_error = ? WHERE seq = ?", (text, seq))
            return "quarantined"
        due = now + backoff(attempts, policy["base"], policy["cap"], policy["rng"])
        con.execute("UPDATE outbox SET state = 'pending', due = ?, owner = NULL, lease_until = NULL,"
                    " last_error = ? WHERE seq = ?", (due, text, seq))
        return "pending"


# --- step 7 ------------------------------------------------------
def redrive(con, ids, now):
    """Quarantined → pending (attempts 0, due now), all or nothing; returns the count."""
    if type(ids) not in (list, tuple, set, frozenset):
        raise ValueError(f"ids must be a list, tuple or set of IDs, not {type(ids).__name__}")
    ids = list(ids)
    if any(type(event_id) is not str for event_id in ids):
        raise ValueError("every id must be a str")
    if len(set(ids)) != len(ids):
        raise ValueError("an id is listed twice")
    if not _finite(now) or now < 0:
        raise ValueError(f"now must be a finite number >= 0, not {now!r}")
    if not ids:
        return 0
    with write_transaction(con):
        for event_id in ids:
            row = con.execute("SELECT state FROM outbox WHERE id = ?", (event_id,)).fetchone()
            if row is None or row[0] != "quarantined":
                state = row[0] if row else "not in the outbox"
                raise ValueError(f"{event_id} is {state}, not quarantined: nothing was redriven")
        con.executemany("UPDATE outbox SET state = 'pending', attempts = 0, due = ? WHERE id = ?",
                        [(now, event_id) for event_id in ids])
    return len(ids)


# --- step 8 ------------------------------------------------------
def relay_once(con, owner, send, now, lease, limit, policy, after_claim=None, after_send=None):
    """Claim a batch; send each row; complete or fail it; count what happened."""
    _check_claim(owner, now, lease, limit)
    _check_policy(policy)
    counts = {"sent": 0, "retry": 0, "quarantined": 0, "stale": 0}
    for row in claim(con, owner, now, lease, limit):
        seq, fence = row["seq"], row["fence"]
        if after_claim is not None:
            after_claim(seq)
        try:
            event = json.loads(row["body"])
        except ValueError:
            event = None
        error = None
        if type(event) is not dict:
            error = PermanentError(f"row {seq}: the stored body is not a JSON object")
        else:
            try:
                acked = send(dict(event))
            except Exception as exc:  # KeyboardInterrupt and SystemExit propagate
                error = exc
            else:
                if acked is not True:
                    error = DeliveryError(f"send returned {acked!r} for {event.get('id')}, not True")
        if error is None and after_send is not None:
            after_send(seq)
        try:
            if error is None:
                complete(con, seq, fence)
                counts["sent"] += 1
            else:
                state = fail(con, seq, fence, error, now, policy)
                counts["retry" if state == "pending" else "quarantined"] += 1
        except StaleLease:
            counts["stale"] += 1  # somebody else's row now: never retried
    return counts
