"""Lab `relay`, child side: drive the student's `relay` module and report what happened.

Everything here runs inside a child process with the student's module loaded. It only calls
and observes; the judge (the lab's checks) decides what is right, from the DB files it reads
itself (an audit trigger in every file it prepares records each row change), the warehouse's
request log, exit codes and /proc. What a child reports is evidence about return values only.
Where a rule is about the file at a moment only the child can time (right after a call, while
`send` or `after_send` runs), the probe never looks itself: `probe.see` asks the judge's
witness (`checks/relay/witness.py`) and waits while the judge looks with its own connections.

Imports: the standard library and labkit.probe / labkit.values / labkit.limits, nothing else.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

from labkit import probe
from labkit.probe import boundaries
from labkit.values import decode, encode

# Taken before the student's module is imported: our own connections are never tracked.
REAL_CONNECT = sqlite3.connect
FENCE_HEADER = "Fencing-Token"  # labkit.servers.warehouse.FENCE_HEADER
BARRIER_SECONDS = 3.0  # the longest a racer waits for its peer (see `race`)
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def plain(path: str, timeout: float = 1.0) -> sqlite3.Connection:
    """A connection made by the judge's rules, so a step does not depend on step 1."""
    return REAL_CONNECT(path, isolation_level=None, timeout=timeout)


def close(con: Any) -> None:
    """Close what the student's open_outbox returned, whatever it turned out to be."""
    try:
        con.close()
    except Exception:
        pass


class Statements:
    """Every SQL statement a connection runs (its first word), seen through a trace callback."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.words: list[str] = []
        con.set_trace_callback(self._seen)

    def _seen(self, sql: str) -> None:
        text = sql.lstrip()
        if not text.startswith("--"):  # "-- TRIGGER ..." lines are the judge's audit trigger
            self.words.append(text.split(None, 1)[0].upper() if text else "")


# --- step 1: open_outbox --------------------------------------------------------------------


def opening(mod, args: dict) -> None:
    """open_outbox on new, re-opened, saved and broken files."""
    with probe.tracked_connections() as opened:
        for case in args["opens"]:
            probe.started(case["name"])
            opened.clear()
            released = probe.hold_write_lock(case["path"], case["locked"]) if case.get("locked") else None
            try:
                outcome, con = probe.call_keep(probe.function(mod, "open_outbox"), case["path"])
            finally:
                if released is not None:
                    released()
            observed = probe.opening(outcome, con, opened, case["path"])
            for c in opened:
                c.close()
            probe.report(case["name"], outcome, **observed)
    if "interrupted" in args:
        probe.report_interrupted(probe.function(mod, "open_outbox"), args["interrupted"])


# --- steps 2-7: one call on a connection to a file the judge prepared -------------------------


class Transient(OSError):
    """The judge's stand-in for a network failure."""


def build(mod, item: dict) -> Any:
    """An argument: a plain value, or an object only the child can make (a Random, an error)."""
    if "value" in item:
        return decode(item["value"])
    if "set" in item:
        return set(item["set"])
    if "policy" in item:
        spec = item["policy"]
        policy = {k: decode(v) for k, v in spec["fields"].items()}
        if "seed" in spec:
            policy["rng"] = random.Random(spec["seed"])
        return policy
    if "error" in item:
        kind, message = item["error"]["kind"], item["error"]["message"]
        if kind == "transient":
            return Transient(message)
        if kind == "permanent":
            return getattr(mod, "PermanentError", RuntimeError)(message)
        if kind == "permanent_subclass":
            base = getattr(mod, "PermanentError", RuntimeError)
            return type("Discontinued", (base,), {})(message)
        return RuntimeError(message)
    raise ValueError(f"unknown argument {item!r}")


def on_outbox(mod, args: dict) -> None:
    """Each call: a fresh connection to its file, the student's function, the judge's look right
    after it (while this connection is still open), the statements run, and the rng's next draw.
    A spec with "boundaries" is run once per statement instead (`at_boundaries`)."""
    for spec in args["calls"]:
        probe.started(spec["name"])
        if "boundaries" in spec:
            at_boundaries(mod, spec, args["witness"])
            continue
        con = plain(spec["db"])
        statements = Statements(con)
        values = [build(mod, item) for item in spec["args"]]
        seen = probe.received(values)
        outcome = probe.call(probe.function(mod, spec["fn"]), con, *values)
        probe.see(args["witness"], spec["name"], "after")  # the judge tries BEGIN IMMEDIATE while con is open
        observed: dict[str, Any] = {"received": seen, "in_transaction": con.in_transaction,
                                    "statements": statements.words}
        for value in values:
            if isinstance(value, dict) and isinstance(value.get("rng"), random.Random):
                observed["rng_next"] = value["rng"].random()  # which draw comes next: how many were used
        con.close()
        probe.report(spec["name"], outcome, **observed)


def _competitor(mod, db: str, writer: dict) -> bool:
    """Another publisher commits now, if it can take the write lock at once: the judge's SQL
    ("sql"), or the student's own function on a second connection ("call"), whose success the
    probe then marks in judge_writer."""
    other = plain(db, timeout=0.0)
    try:
        if "call" in writer:
            outcome = probe.call(probe.function(mod, writer["call"]), other, *[build(mod, a) for a in writer["args"]])
            if outcome["kind"] != "returned" or outcome["value"] != writer["landed"]:
                return False  # it could not write now (the lock is held): nothing came between
            other.execute("INSERT INTO judge_writer(k) VALUES (1)")
            return True
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False  # the student's transaction holds the lock: nothing can come between
        for sql, params in writer["sql"]:
            other.execute(sql, [decode(p) for p in params])
        other.execute("COMMIT")
        return True
    finally:
        other.close()


def at_boundaries(mod, spec: dict, witness: str) -> None:
    """For each mode: the student's function once undisturbed (file 0), then once per statement
    k (file k + 1) with `boundaries.run_at`'s mode at statement k: another publisher's commit
    ("write"), a failing statement ("error") or a Ctrl-C ("interrupt"). The judge looks at each
    file while its connection is still open (case name "<name>#<mode>.<run>")."""
    fn = probe.function(mod, spec["fn"])
    runs: list[dict] = []
    for plan in spec["boundaries"]:
        count = None
        for i, db in enumerate(plan["dbs"]):
            k = None if i == 0 else i - 1
            if count is not None and k >= count:
                break
            con = plain(db)
            values = [build(mod, item) for item in spec["args"]]

            def call(con=con, values=values):
                try:
                    return probe.call(fn, con, *values)
                except BaseException as exc:  # the judge's KeyboardInterrupt, as this run intends
                    return probe.describe_exception(exc)

            writer = plan.get("writer")

            def action(db=db, writer=writer):
                return _competitor(mod, db, writer) if writer else False

            seen = boundaries.run_at(con, k, plan["mode"], call, action)
            probe.see(witness, f"{spec['name']}#{plan['mode']}.{i}", "after")
            runs.append({"mode": plan["mode"], "i": i, "k": k, "outcome": seen["result"], "ran": seen["ran"],
                         "fired": seen["fired"], "acted": seen["acted"], "in_transaction": con.in_transaction})
            con.close()
            if i == 0:
                count = len(seen["ran"])
    probe.report(spec["name"], runs[0]["outcome"] if runs else {"kind": "missing"}, runs=runs)


def backoffs(mod, args: dict) -> None:
    """Step 5: backoff with a Random(seed) built here; the next draw shows how many it used."""
    backoff = probe.function(mod, "backoff")
    for spec in args["calls"]:
        probe.started(spec["name"])
        rng = random.Random(spec["seed"])
        before = random.getstate()
        values = [decode(a) for a in spec["args"]]
        seen = probe.received([*values, rng])
        started = time.perf_counter()
        outcome = probe.call(backoff, *values, rng)
        seconds = time.perf_counter() - started
        probe.report(spec["name"], outcome, rng_next=rng.random(), global_used=random.getstate() != before,
                     seconds=seconds, received=seen)


# --- step 3: real processes racing to claim ---------------------------------------------------


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _last_line(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def race(mod, args: dict) -> None:
    """Claim until nothing is left, racing the peers on one file.

    A race left to chance hides a broken claim on most runs. So every process traces its own
    statements into `sync/trace-<owner>`, and at the first write of each claim it waits until
    every peer has either reached its own first write (both have read: a non-atomic claim now
    collides for sure), is waiting to BEGIN IMMEDIATE/EXCLUSIVE while this process holds the
    write lock (a correct claim: the peer is locked out), or has finished. Before each call it
    lets a peer that waits to BEGIN go first, so the two take turns. A correct claim never
    waits here more than a moment; a broken one collides on every run.
    """
    sync, me, peers = Path(args["sync"]), args["owner"], args["peers"]
    mine = sync / f"trace-{me}"
    # A correct claim waits for its peer's write lock; on a loaded machine the holder may not run
    # for seconds. The child's own time limit bounds this wait, not the busy timeout.
    con = plain(args["db"], timeout=15.0)
    state = {"armed": False, "locked": False}

    def peer_allows(peer: str) -> bool:
        last = _last_line(sync / f"trace-{peer}")
        if last in ("ARRIVED", "DONE"):
            return True
        return state["locked"] and last in ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE")

    def seen(sql: str) -> None:
        text = " ".join(sql.replace(";", " ").split()).upper()
        if not text or text.startswith("--"):
            return
        words = text.split(" ")
        head = " ".join(words[:2]) if words[0] == "BEGIN" else words[0]
        if head.startswith("BEGIN"):
            state["locked"] = head in ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE")
        elif head in ("COMMIT", "END", "ROLLBACK"):
            state["locked"] = False
        _append(mine, head)
        if state["armed"] and head in WRITES:
            state["armed"] = False
            _append(mine, "ARRIVED")
            deadline = time.monotonic() + BARRIER_SECONDS
            while not all(peer_allows(p) for p in peers) and time.monotonic() < deadline:
                time.sleep(0.001)
            _append(mine, head)

    con.set_trace_callback(seen)
    _append(sync / "ready", me)
    deadline = time.monotonic() + 5.0
    while len(_ready(sync)) < len(peers) + 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    claim = probe.function(mod, "claim")
    probe.started("claims")
    calls: list[dict] = []
    outcome: dict = {"kind": "returned", "value": encode([])}
    for _ in range(args["max_rounds"]):
        # Take turns: a peer waiting to BEGIN goes first, so no process claims everything alone
        # while the other sleeps in its busy handler (a stale read then shows on every run).
        deadline = time.monotonic() + BARRIER_SECONDS
        while any(_last_line(sync / f"trace-{p}") in ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE", "BEGIN", "BEGIN DEFERRED")
                  for p in peers) and time.monotonic() < deadline:
            time.sleep(0.001)
        state["armed"] = True
        _append(mine, "CALL")
        outcome = probe.call(claim, con, me, args["now"], args["lease"], args["limit"])
        state["armed"] = False
        calls.append(outcome)
        if outcome["kind"] != "returned" or not decode(outcome["value"]):
            break
    _append(mine, "DONE")
    con.close()
    probe.report("claims", outcome, calls=calls)


def _ready(sync: Path) -> list[str]:
    try:
        return (sync / "ready").read_text().split()
    except OSError:
        return []


# --- step 8: relay_once with scripted sends ---------------------------------------------------


def _take_over(db: str, seq: int, owner: str, lease_until: float) -> None:
    """Another publisher claims the row right now (what a correct claim would write)."""
    other = plain(db, timeout=2.0)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE fence_counter SET last = last + 1 WHERE id = 1")
        (token,) = other.execute("SELECT last FROM fence_counter WHERE id = 1").fetchone()
        other.execute("UPDATE outbox SET state = 'leased', owner = ?, lease_until = ?, fence = ?,"
                      " attempts = attempts + 1 WHERE seq = ?", (owner, lease_until, token, seq))
        other.execute("COMMIT")
    finally:
        other.close()


def _break_outbox(db: str) -> None:
    """The outbox table disappears while send runs (an operator's mistake): complete's or fail's
    next statement on it fails with sqlite3's own OperationalError, which is not StaleLease."""
    other = plain(db, timeout=2.0)
    try:
        other.execute("ALTER TABLE outbox RENAME TO outbox_gone")
    finally:
        other.close()


def relaying(mod, args: dict) -> None:
    """Step 8: relay_once with a scripted `send` per event ID, and hooks that watch the file.

    `log` holds the hook and send calls in the order they happened. Inside `send` and
    `after_send`, and right after relay_once returns, the judge looks at the file itself
    (`probe.see`): whether it can BEGIN IMMEDIATE, and the row."""
    relay_once = probe.function(mod, "relay_once")
    witness = args["witness"]
    for case in args["scenarios"]:
        probe.started(case["name"])
        db = case["db"]
        con = plain(db)
        log: list[dict] = []
        seq_of: dict[str, int] = {}

        def after_claim(seq, log=log, case=case):
            log.append({"kind": "after_claim", "seq": encode(seq)})
            if case.get("claim_hook_raises"):
                raise LookupError("the after_claim hook failed")

        def send(event, db=db, log=log, seq_of=seq_of, case=case):
            event_id = event.get("id") if isinstance(event, dict) else None
            seq = _seq_of(db, event_id, seq_of)
            probe.see(witness, case["name"], "send", event_id=event_id if isinstance(event_id, str) else None)
            log.append({"kind": "send", "event": encode(event), "seq": seq})
            if event_id == case.get("take_over") and seq is not None:
                _take_over(db, seq, "B", case["now"] + 60)
            if event_id == case.get("break_outbox"):
                _break_outbox(db)
            reply = case["replies"].get(event_id, {"return": encode(True)})
            if "raise" in reply:
                raise _error(mod, reply["raise"])
            return decode(reply["return"])

        def after_send(seq, log=log, case=case):
            probe.see(witness, case["name"], "after_send", seq=seq if type(seq) is int else None)
            log.append({"kind": "after_send", "seq": encode(seq)})

        policy = {**{k: decode(v) for k, v in case["policy"].items()}, "rng": random.Random(case["seed"])}
        if case.get("drop_rng"):
            del policy["rng"]
        owner, now, lease, limit = (decode(v) for v in case["args"])
        seen = probe.received([owner, send, now, lease, limit, policy])
        try:
            outcome, first = probe.call_keep(relay_once, con, owner, send, now, lease, limit, policy,
                                             after_claim=after_claim, after_send=after_send)
        except BaseException as exc:  # KeyboardInterrupt / SystemExit from send, as the case intends
            outcome, first = probe.describe_exception(exc), None
        again: dict = {}
        if case.get("again") and outcome["kind"] == "returned":
            # The operator lifts the refusal and redrives (the judge's own SQL); the same process
            # then calls relay_once again: nothing may carry over from the first call.
            _redrive_all(db, now)
            case["replies"] = {}
            log.append({"kind": "again", "seq": encode(None)})
            second, kept = probe.call_keep(relay_once, con, owner, send, now, lease, limit, policy,
                                           after_claim=after_claim, after_send=after_send)
            again = {"first": outcome, "second": second, "same_object": kept is first and first is not None}
            outcome = second
        probe.see(witness, case["name"], "after")  # the judge tries BEGIN IMMEDIATE while con is open
        in_transaction = con.in_transaction
        rng_next = policy["rng"].random() if "rng" in policy else None
        con.close()
        probe.report(case["name"], outcome, log=log, in_transaction=in_transaction, rng_next=rng_next,
                     received=seen, again=again)


def _redrive_all(db: str, now: float) -> None:
    other = plain(db, timeout=2.0)
    try:
        other.execute("UPDATE outbox SET state = 'pending', attempts = 0, due = ? WHERE state = 'quarantined'",
                      (now,))
    finally:
        other.close()


def _seq_of(db: str, event_id: Any, cache: dict) -> int | None:
    if not isinstance(event_id, str):
        return None
    if event_id not in cache:
        other = plain(db, timeout=0.5)
        try:
            row = other.execute("SELECT seq FROM outbox WHERE id = ?", (event_id,)).fetchone()
        finally:
            other.close()
        if row is None:
            return None
        cache[event_id] = row[0]
    return cache[event_id]


def _error(mod, kind: str) -> BaseException:
    if kind == "permanent":
        return getattr(mod, "PermanentError", RuntimeError)("the warehouse refuses this event for good")
    if kind == "keyboard":
        return KeyboardInterrupt()
    if kind == "system_exit":
        return SystemExit(3)
    return Transient("the warehouse is unreachable")


# --- final check: publishers against the warehouse --------------------------------------------


def _opener():
    """An opener that follows no redirect and no proxy. Made here, not at import: urllib.request
    (http.client, email, ssl) is a third of a relay child's start, and only the final check's
    children post anything."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())


def http_send(mod, url: str, tokens: dict[str, int], sent: list[dict]):
    """The `send` the final check hands to relay_once: POST the event to the warehouse with the
    token of the claim this process holds on it. 503 → a transient OSError, 422 →
    PermanentError, a 200 ACK naming the event → True, anything else → False."""

    import urllib.error
    import urllib.request

    opener = _opener()

    def send(event):
        event_id = event.get("id") if isinstance(event, dict) else None
        token = tokens.get(event_id)
        body = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers[FENCE_HEADER] = str(token)
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        sent.append({"id": event_id, "token": token, "t": time.time()})
        try:
            with opener.open(request, timeout=5.0) as response:
                status, reply = response.status, response.read(2048)
        except urllib.error.HTTPError as exc:
            reply = exc.read(2048)
            exc.close()
            if exc.code == 503:
                raise Transient(f"the warehouse answered 503 for {event_id}") from None
            if exc.code == 422:
                reason = _reason(reply)
                raise getattr(mod, "PermanentError", RuntimeError)(f"422 for {event_id}: {reason}") from None
            return False
        try:
            return status == 200 and json.loads(reply) == {"ack": event_id}
        except ValueError:
            return False

    return send


def _reason(reply: bytes) -> str:
    try:
        return str(json.loads(reply).get("reason", ""))
    except (ValueError, AttributeError):
        return reply.decode(errors="replace")[:100]


def _token_of(db: str, seq: Any) -> tuple[str | None, int | None]:
    """(id, fence) of a row right after this process claimed it."""
    if type(seq) is not int:
        return None, None
    other = plain(db, timeout=2.0)
    try:
        row = other.execute("SELECT id, fence FROM outbox WHERE seq = ?", (seq,)).fetchone()
    finally:
        other.close()
    return (row[0], row[1]) if row else (None, None)


class Publishing:
    """What each publisher process of the final check shares: the HTTP send with the token of
    each claim this process holds, an after_claim that records that token, and the policy with
    its Random(seed)."""

    def __init__(self, mod, args: dict) -> None:
        self.mod, self.args, self.db = mod, args, args["db"]
        self.tokens: dict[str, int] = {}
        self.sent: list[dict] = []
        self.send = http_send(mod, args["url"], self.tokens, self.sent)
        self.policy = {"base": args["base"], "cap": args["cap"], "max_attempts": args["max_attempts"],
                       "rng": random.Random(args["seed"])}

    def remember(self, seq) -> tuple[str | None, int | None]:
        event_id, fence = _token_of(self.db, seq)
        if event_id is not None:
            self.tokens[event_id] = fence
        return event_id, fence

    def open(self) -> tuple[dict, Any]:
        return probe.call_keep(probe.function(self.mod, "open_outbox"), self.db)

    def relay(self, con, now, after_claim=None) -> dict:
        return probe.call(probe.function(self.mod, "relay_once"), con, self.args["owner"], self.send, now,
                          self.args["lease"], self.args["limit"], self.policy,
                          after_claim=after_claim or self.remember)


def publisher(mod, args: dict) -> None:
    """One publisher process of the final check.

    `mode`: "die" — after_claim reports the claim and waits, and the judge kills the sandbox; "pause" — after_claim reports and waits; the
    judge SIGSTOPs the sandbox from outside, later SIGCONTs it and lets after_claim return; "drain" — relay_once until the judge's `until` IDs
    are sent or quarantined, at the `nows` the judge lists first, then at the real clock.
    """
    mode = args["mode"]
    pub = Publishing(mod, args)

    def after_claim(seq):
        event_id, fence = pub.remember(seq)
        probe.emit({"event": "note", "kind": "claimed", "seq": encode(seq), "id": event_id, "fence": fence,
                    "t": time.time()})
        if mode == "die":
            probe.hold()  # no finally, no close: the judge's SIGKILL of the sandbox ends the process here
        if mode == "pause":
            probe.hold()  # the judge stops every process of this sandbox from outside, then lets it go on

    probe.started("relay")
    outcome, con = pub.open()
    rounds: list[dict] = []
    if outcome["kind"] == "returned":
        nows = list(args.get("nows", []))
        deadline = time.monotonic() + args.get("seconds", 0)
        while True:
            now = nows.pop(0) if nows else time.time()
            outcome = pub.relay(con, now, after_claim)
            rounds.append({"now": now, "outcome": outcome})
            if outcome["kind"] != "returned" or mode != "drain":
                break
            if not nows and (_settled(pub.db, args["until"]) or time.monotonic() > deadline):
                break
            if not nows:
                time.sleep(0.02)
        close(con)
    probe.report("relay", outcome, rounds=rounds, sent=pub.sent)


def _settled(db: str, ids: list[str]) -> bool:
    other = plain(db, timeout=1.0)
    try:
        states = dict(other.execute("SELECT id, state FROM outbox").fetchall())
    finally:
        other.close()
    return all(states.get(i) in ("sent", "quarantined") for i in ids)


def _next_due(db: str) -> float | None:
    other = plain(db, timeout=1.0)
    try:
        (due,) = other.execute("SELECT min(due) FROM outbox WHERE state = 'pending'").fetchone()
    finally:
        other.close()
    return due


def poison(mod, args: dict) -> None:
    """Final check, part 3: relay_once at the judge's clock: `start`, then at each next due time
    of a pending row, until nothing is pending (at most `rounds` calls)."""
    pub = Publishing(mod, args)
    probe.started("relay")
    outcome, con = pub.open()
    rounds: list[dict] = []
    if outcome["kind"] == "returned":
        now = args["start"]
        for _ in range(args["rounds"]):
            outcome = pub.relay(con, now)
            rounds.append({"now": now, "outcome": outcome})
            due = _next_due(pub.db) if outcome["kind"] == "returned" else None
            if due is None:
                break
            now = max(now, due)
        close(con)
    probe.report("relay", outcome, rounds=rounds, sent=pub.sent)


def redriving(mod, args: dict) -> None:
    """Final check, part 4: redrive the quarantined IDs, then one relay_once."""
    pub = Publishing(mod, args)
    probe.started("redrive")
    outcome, con = pub.open()
    relayed = None
    if outcome["kind"] == "returned":
        outcome = probe.call(probe.function(mod, "redrive"), con, args["ids"], args["now"])
        if outcome["kind"] == "returned":
            relayed = pub.relay(con, args["now"])
        close(con)
    probe.report("redrive", outcome, relayed=relayed, sent=pub.sent)


# --- step 5: the child-side half of backoff's differential property test ----------------------


def backoff_adapter(backoff, attempt, base, cap, seed):
    """Called as `adapter(student_backoff, *args)` by `labkit.probe.serve`: builds the Random
    here (it cannot cross the pipe) and returns (wait to 12 digits, the rng's next draw, whether
    the global random module was used) — the same triple `checks.relay.oracle.backoff_triple`
    computes on the judge's side."""
    rng = random.Random(seed)
    before = random.getstate()
    wait = backoff(attempt, base, cap, rng)
    return (twelve_digits(wait), rng.random(), random.getstate() != before)


def twelve_digits(value: Any) -> Any:
    """A float to 12 significant digits: an exact ceiling times rng.random() agrees with the
    oracle whichever exact way the ceiling was computed."""
    return float(f"{value:.12g}") if type(value) is float else value
