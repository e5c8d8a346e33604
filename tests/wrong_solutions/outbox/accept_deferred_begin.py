"""Wrong: accept opens its transaction with a deferred BEGIN, which fails at its first write while another connection writes, where BEGIN IMMEDIATE would wait. Fails step 3. Clause: 3.concurrent-writer. Message: when another connection accepted the same order just before your statement"""

# --- provided code -----------------------------------------------
import json
import re
import sqlite3
import urllib.error
import urllib.request
from ipaddress import ip_address
from math import isfinite
from urllib.parse import urlsplit


class Conflict(Exception):
    """Same business ID, different content."""


class DeliveryError(Exception):
    """A reply that is not evidence of delivery."""


MAX_ACK_BYTES = 1024


def canonical(event):
    """The one serialisation of an event: keys sorted, no spaces."""
    return json.dumps(event, sort_keys=True, separators=(",", ":"))


# --- step 1 ------------------------------------------------------
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def validate_event(event):
    """Return a new dict with exactly id, sku and qty, or raise ValueError."""
    if type(event) is not dict:
        raise ValueError("an event must be a dict")
    if set(event) != {"id", "sku", "qty"}:
        raise ValueError(f"an event has exactly the keys id, sku, qty; got {sorted(map(str, event))}")
    for key, longest in (("id", 64), ("sku", 32)):
        value = event[key]
        if type(value) is not str or not 1 <= len(value) <= longest:
            raise ValueError(f"{key} must be a str of 1-{longest} characters")
        if not value.isascii() or not NAME.match(value):
            raise ValueError(f"{key} has a character that is not allowed: {value!r}")
    qty = event["qty"]
    if type(qty) is not int or not 1 <= qty <= 1000:
        raise ValueError(f"qty must be an int from 1 to 1000, not {qty!r}")
    return {"id": event["id"], "sku": event["sku"], "qty": qty}


# --- step 2 ------------------------------------------------------
def _open(path, schema):
    con = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    try:
        con.executescript(schema)
    except BaseException:
        con.close()
        raise
    return con


def open_source(path):
    """Open (or create) the intake's DB with the tables orders and outbox."""
    return _open(path, """
        CREATE TABLE IF NOT EXISTS orders(
            id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS outbox(
            seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, body TEXT NOT NULL,
            sent INTEGER NOT NULL DEFAULT 0 CHECK (sent IN (0, 1)));
    """)


def open_sink(path):
    """Open (or create) the warehouse's DB with the tables inbox and stock."""
    return _open(path, """
        CREATE TABLE IF NOT EXISTS inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY, qty INTEGER NOT NULL);
    """)


# --- step 3 ------------------------------------------------------
def accept(con, event):
    """Save an order and its outbox row in one transaction. New → True, repeat → False."""
    event = validate_event(event)
    body = canonical(event)
    con.execute("BEGIN")
    try:
        row = con.execute("SELECT body FROM outbox WHERE id = ?", (event["id"],)).fetchone()
        if row is not None:
            con.execute("ROLLBACK")
            if row[0] == body:
                return False
            raise Conflict(f"order {event['id']} already exists with other content")
        con.execute("INSERT INTO orders(id, sku, qty) VALUES (?, ?, ?)",
                    (event["id"], event["sku"], event["qty"]))
        con.execute("INSERT INTO outbox(id, body) VALUES (?, ?)", (event["id"], body))
        con.execute("COMMIT")
        return True
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


# --- step 4 ------------------------------------------------------
def pending(con, limit):
    """At most `limit` unsent events, oldest first (by seq)."""
    if type(limit) is not int or not 1 <= limit <= 16:
        raise ValueError(f"limit must be an int from 1 to 16, not {limit!r}")
    rows = con.execute(
        "SELECT body FROM outbox WHERE sent = 0 ORDER BY seq LIMIT ?", (limit,)).fetchall()
    return [json.loads(body) for (body,) in rows]


# --- step 5 ------------------------------------------------------
def receive(con, event):
    """Apply an event once. New → True; identical repeat → False; other content → Conflict."""
    event = validate_event(event)
    body = canonical(event)
    con.execute("BEGIN IMMEDIATE")
    try:
        row = con.execute("SELECT body FROM inbox WHERE id = ?", (event["id"],)).fetchone()
        if row is not None:
            con.execute("ROLLBACK")
            if row[0] == body:
                return False
            raise Conflict(f"event {event['id']} was received before with other content")
        con.execute("INSERT INTO inbox(id, body) VALUES (?, ?)", (event["id"], body))
        con.execute(
            "INSERT INTO stock(sku, qty) VALUES (?, ?) "
            "ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty",
            (event["sku"], event["qty"]))
        con.execute("COMMIT")
        return True
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


# --- step 6 ------------------------------------------------------
def mark_sent(con, event_id):
    """Pending → sent: True. Already sent: False. Unknown id: KeyError."""
    con.execute("BEGIN IMMEDIATE")
    try:
        row = con.execute("SELECT sent FROM outbox WHERE id = ?", (event_id,)).fetchone()
        if row is None:
            raise KeyError(event_id)
        if row[0] == 1:
            con.execute("ROLLBACK")
            return False
        con.execute("UPDATE outbox SET sent = 1 WHERE id = ?", (event_id,))
        con.execute("COMMIT")
        return True
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


# --- step 7 ------------------------------------------------------
def dispatch(con, send, limit, after_delivery=None):
    """Send a batch in order; mark each after a True ACK; stop at the first failure."""
    if type(limit) is not int or not 1 <= limit <= 16:
        raise ValueError(f"limit must be an int from 1 to 16, not {limit!r}")
    batch = pending(con, limit)  # the read is finished before the first send
    marked = 0
    for event in batch:
        event_id = event["id"]
        acked = send(dict(event))
        if acked is not True:
            raise DeliveryError(f"send returned {acked!r} for {event_id}, not True")
        if after_delivery is not None:
            after_delivery(event_id)
        mark_sent(con, event_id)
        marked += 1
    return marked


# --- step 8 ------------------------------------------------------
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a redirect is an answer, never a delivery


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _check_url(url):
    if type(url) is not str:
        raise ValueError("url must be a str")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    if (parts.scheme != "http" or parts.path != "/events" or "?" in url or "#" in url
            or "@" in parts.netloc or not port or url != f"http://{parts.netloc}/events"):
        raise ValueError(f"url must be exactly http://HOST:PORT/events (PORT 1-65535), not {url!r}")
    host = parts.netloc.rpartition(":")[0]  # as written: .hostname would lower-case LOCALHOST
    if host == "localhost":
        return
    try:
        loopback = ip_address(host).version == 4 and ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"host must be localhost or in 127.0.0.0/8, not {host!r}")


def send_http(url, event, timeout=2.0):
    """POST one event; return True only for a verified ACK, else raise."""
    _check_url(url)
    if type(timeout) not in (int, float) or not isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive finite number, not {timeout!r}")
    event = validate_event(event)
    request = urllib.request.Request(
        url, data=canonical(event).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    try:
        with _opener.open(request, timeout=timeout) as response:
            status = response.status
            body = response.read(MAX_ACK_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DeliveryError(f"the warehouse answered {exc.code}, not 200") from None
    if status != 200:
        raise DeliveryError(f"the warehouse answered {status}, not 200")
    if len(body) > MAX_ACK_BYTES:
        raise DeliveryError("the reply is over 1,024 bytes")
    try:
        reply = json.loads(body)
    except ValueError:
        raise DeliveryError("the reply is not JSON") from None
    if reply != {"ack": event["id"]}:
        raise DeliveryError(f"the reply {reply!r} does not acknowledge {event['id']}")
    return True
