"""Lab `vending`, step 7: run_client — validate, open the store, connect (bounded, cancellable), RESUME
from the saved cursor, hand over to consume_session, and close the DB and the socket on every path.
"""

from __future__ import annotations

import os
from pathlib import Path

from checks.vending.feed_looks import (
    acks_seen_committed,
    close_feeds,
    feed_closed,
    feed_saw_close,
    resumes_on,
    sent_on,
    settled,
)
from checks.vending.feed_server import Feed, start_feed
from checks.vending.hints import DB_CLOSE_HINT, SHIELD_HINT, SOCKET_HINT, TIMEOUT_HINT
from checks.vending.inputs import INVALID_TIMEOUTS, distinct_history
from checks.vending.outcomes import cancelled, raises_any, same_error, took
from checks.vending.store import committed_last, judged, make_store, shown, snapshot, store_state
from checks.vending.writer_log import logged, seqs_text
from labkit.judge.expect import Miss, Plan, both, describe, raises, returns, under
from labkit.judge.ports import refusing_port
from labkit.judge.processes import held_files, held_sockets
from labkit.judge.run import StepContext
from labkit.judge.served import served
from labkit.judge.verdict import Case
from labkit.values import decode, encode, show


def check_run_client(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = distinct_history(rng, rng.randint(4, 6))
    total = sum(d for _, d in events)
    every = [s for s, _ in events]
    result = (events[-1][0], total)
    saved_at = rng.randint(1, len(events) - 2)
    plans: list[Plan] = []
    specs: list[dict] = []
    feeds: list[Feed] = []
    call = "run_client(host, port, path, {t}, before_ack=hook)"
    refused = refusing_port()  # bound, never listening, held until the step ends: nobody else gets it

    def scenario(label, called, expected, checks, clauses, faults=None, path=None, feed=None, **spec):
        """One case; `checks(path, feed)` builds its checks (feed: the case's own feed, if any)."""
        path = Path(path or ctx.path(f"c{len(specs)}.db"))
        if faults is not None:
            feed = start_feed(events, faults, stall_seconds=3.0, io_timeout=3.0,
                             on_ack=lambda conn, seq, path=path: {"last": committed_last(path)})
            feeds.append(feed)
        host, port = (feed.host, feed.port) if feed else ("127.0.0.1", refused.getsockname()[1])
        specs.append({"path": str(path), "timeout": encode(spec.pop("timeout")), "host": host, "port": port,
                     "feed": len(feeds) - 1 if faults is not None else None, **spec})
        plans.append(Plan(label, called, expected, both(*checks(path, feed)), clauses=clauses))

    def stored(applied, hint, clause="7.handover"):
        def check(record: dict) -> Miss | None:
            have, expected = judged(record).get("after"), store_state(applied)
            if have != expected:
                return Miss(f"right after run_client ended the judge read {shown(have)}; expected {shown(expected)}",
                           hint, clause=clause)
            return None

        return check

    def normal(path, feed, resume, acked):
        return [under("7.handover", returns(result, "Return what consume_session returns: state(con) at EOF.")),
                db_closed, dialled_with_limit, resumed(resume), feed_resumed(resume), socket_closed,
                stored(events, "Apply every event once; events at or below the saved cursor are duplicates."),
                feed_got_acks(acked), acks_seen_committed]

    try:
        silent = start_feed(events)  # the cases that must never connect use it
        feeds.append(silent)
        scenario("a new store: RESUME -1, then every event", call.format(t=3.0) + " on a new file",
                 f"{result}; the feed saw RESUME -1 and an ACK for each event; DB and socket closed",
                 lambda path, feed: normal(path, feed, -1, every),
                 ("7.open-store", "7.read-limit", "7.resume", "7.resume-drained", "7.handover", "7.db-closed"),
                 faults=["none"], timeout=3.0, guard=5.0)
        saved = make_store(ctx.path("saved.db"), events[: saved_at + 1])
        scenario("a store saved by another process: RESUME from its cursor",
                 call.format(t=3.0) + f" on a store saved at last {saved_at}",
                 f"the feed saw RESUME {saved_at}; {result}; DB closed",
                 lambda path, feed: normal(path, feed, saved_at, every[saved_at + 1:]),
                 ("7.resume", "7.handover", "7.db-closed"), faults=["none"], path=saved, timeout=3.0, guard=5.0)
        scenario("timeout 1 (an int) is accepted", call.format(t=1) + " on a new file",
                 f"{result}; DB and socket closed",
                 lambda path, feed: [under("7.validate-first", returns(result, (
                    "timeout may be an int: test `type(timeout) in (int, float)` and not bool, finite, > 0."))),
                    db_closed],
                 ("7.validate-first",), faults=["none"], timeout=1, guard=5.0)
        for bad in INVALID_TIMEOUTS:
            scenario(f"timeout {bad!r} is refused before anything else", call.format(t=repr(bad)),
                    "ValueError; no store file created, no connection made",
                    lambda path, feed: [under("7.validate-first", raises("ValueError", TIMEOUT_HINT)),
                                        validated_first(path, feed)],
                    ("7.validate-first",), feed=silent, timeout=bad, guard=3.0)
        garbage = ctx.path("not-a-db.db")
        garbage.write_bytes(b"this is not a database, just text\n" * 64)
        scenario("the store file is not a database", call.format(t=3.0) + " on a text file",
                 "sqlite3.DatabaseError from open_store; no connection made",
                 lambda path, feed: [under("7.open-store", raises("DatabaseError", (
                    "Open the store first (open_store(path)) and let its error propagate."))),
                    store_before_connect(feed)],
                 ("7.open-store", "7.errors-propagate"), path=garbage, feed=silent, timeout=3.0, guard=5.0)
        scenario("the feed sends a 100-byte line", call.format(t=3.0) + "; the feed's first line has 100 bytes",
                 "ValueError from readline (limit=64), the line never parsed; DB and socket closed",
                 lambda path, feed: [
                    under("7.read-limit", raises_any(("ValueError", "LimitOverrunError"), (
                        "With `limit=64`, readline raises ValueError on a longer line; let it propagate."))),
                    dialled_with_limit, never_parsed_long, db_closed, socket_closed,
                    stored([], "Apply nothing from an oversized line.", "7.read-limit")],
                 ("7.read-limit", "7.db-closed"), faults=["overlong_line"], timeout=3.0, guard=5.0)
        scenario("nothing listens on the port", call.format(t=3.0) + " to a port that refuses connections",
                 "ConnectionRefusedError; the store opened first, then closed; no socket left",
                 lambda path, feed: [
                    under("7.errors-propagate", raises("ConnectionRefusedError", "Let the connection error "
                                                                                 "propagate.")),
                    db_closed, socket_closed, opened_before_connecting(path)],
                 ("7.errors-propagate", "7.db-closed", "7.open-store"), timeout=3.0, guard=5.0)
        scenario("connecting never completes", call.format(t=0.5) + "; open_connection never returns",
                 "TimeoutError after 0.5 s; DB closed",
                 lambda path, feed: [
                    under("7.connect-bounded", raises("TimeoutError", (
                        "Bound the connect: `await asyncio.wait_for(asyncio.open_connection(host, port, limit=64), "
                        "timeout)`."))),
                    took(0.5, "Bound open_connection by `timeout`.", "7.connect-bounded"), db_closed],
                 ("7.connect-bounded", "7.db-closed"), dial="hang", timeout=0.5, guard=30.0)
        scenario("cancelled while connecting", call.format(t=5.0) + "; open_connection never returns; cancelled "
                                                                   "after 0.05 s",
                 "CancelledError propagates; DB closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed],
                 ("7.cancel-propagates", "7.db-closed"), dial="hang", timeout=5.0, guard=30.0, cancel_after=0.05)
        scenario("cancelled while connecting, the connect finishing later",
                 call.format(t=5.0) + "; open_connection returns after 0.2 s; cancelled after 0.05 s",
                 "CancelledError propagates; DB closed; no socket left open, also 0.2 s later",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed, under("7.socket-closed", lambda r: (
                    None if all(r["observed"].get("sockets_closed", [])) else Miss(
                        "after run_client was cancelled, its connect still finished 0.2 s later and that socket "
                        "was never closed: a connect shielded from the cancellation goes on with nobody left to "
                        "close what it opens", SHIELD_HINT)))],
                 ("7.cancel-propagates", "7.socket-closed"), dial="slow", dial_delay=0.2, timeout=5.0, guard=30.0,
                 cancel_after=0.05)
        scenario("sending RESUME fails", call.format(t=3.0) + "; the drain after RESUME raises ConnectionResetError",
                 "ConnectionResetError; socket and DB closed (the feed sees the connection close)",
                 lambda path, feed: [under("7.errors-propagate", raises("ConnectionResetError",
                                                                       "Let the error from drain propagate.")),
                                    socket_closed, db_closed, feed_saw_close],
                 ("7.errors-propagate", "7.socket-closed", "7.db-closed"), faults=["stall"], drain="raise",
                 timeout=3.0, guard=5.0)
        scenario("the drain after RESUME never finishes", call.format(t=0.5) + "; the drain hangs",
                 "TimeoutError after 0.5 s; socket and DB closed",
                 lambda path, feed: [under("7.resume-drained", raises("TimeoutError",
                                                                     "Bound the drain after RESUME by `timeout`.")),
                                    took(0.5, "Bound the drain after RESUME by `timeout`.", "7.resume-drained"),
                                    socket_closed, db_closed],
                 ("7.resume-drained", "7.socket-closed", "7.db-closed"), dial="fake", drain="hang", timeout=0.5,
                 guard=30.0)
        scenario("cancelled while sending RESUME", call.format(t=5.0) + "; the drain hangs; cancelled after 0.05 s",
                 "CancelledError propagates; socket and DB closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), socket_closed, db_closed],
                 ("7.cancel-propagates", "7.socket-closed", "7.db-closed"), dial="fake", drain="hang", timeout=5.0,
                 guard=30.0, cancel_after=0.05)
        scenario("before_ack raises at seq 1", call.format(t=3.0) + " where hook(1) raises RuntimeError",
                 "that RuntimeError; seq 1 committed, not ACKed; DB and socket closed",
                 lambda path, feed: [
                    hook_called, same_error("Let before_ack's own exception propagate.", "7.errors-propagate"),
                    db_closed,
                    socket_closed, feed_got_acks([0], exact=True),
                    stored(events[:2], "Commit, then before_ack, then ACK.", "7.handover")],
                 ("7.errors-propagate", "7.handover", "7.db-closed"), faults=["none"], timeout=3.0, guard=5.0,
                 hook_fails_at=1)
        scenario("cancelled during the session",
                 call.format(t=3.0) + "; the feed stalls; cancelled 0.05 s after RESUME was written",
                 "CancelledError propagates; DB and socket closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed, socket_closed],
                 ("7.cancel-propagates", "7.db-closed"), faults=["stall"], timeout=3.0, guard=5.0, cancel_after=0.05,
                 cancel_after_resume=True)
        return served(ctx, "client", plans, specs, lambda pid, spec: observe_client_case(feeds, pid, spec))
    finally:
        close_feeds(feeds)
        refused.close()


def observe_client_case(feeds: list[Feed], pid: int, spec: dict) -> dict:
    """After a run_client case: the store as the judge reads it, whether the child still holds the
    store file or a socket to the case's port, and what the case's feed saw."""
    path = Path(spec["path"])
    seen: dict = {"after": snapshot(path), "exists": path.exists(),
                 "holds_file": os.path.realpath(path) in held_files(pid),
                 "sockets": held_sockets(pid, spec["port"])}
    if spec.get("feed") is not None:
        feed = feeds[spec["feed"]]
        settled(feed, seen["sockets"])
        ended = feed_closed(feed, 1, 0.0)
        journal = feed.journal()
        seen.update(feed_closed=ended, resumes=resumes_on(journal), sent=sent_on(journal),
                   acks=[{"seq": e["seq"], "observed": e.get("observed")} for e in journal if e["kind"] == "ack"])
    return seen


def hook_called(record: dict) -> Miss | None:
    if not any(e["kind"] == "before_ack" for e in logged(record)):
        return Miss(f"before_ack was never called ({describe(record['outcome'])})",
                   "Pass before_ack on: `return await consume_session(reader, writer, con, timeout, before_ack)`.",
                   clause="7.handover")
    return None


def db_closed(record: dict) -> Miss | None:
    if judged(record).get("holds_file"):
        return Miss("after run_client ended, the process still held the store file open", DB_CLOSE_HINT,
                   clause="7.db-closed")
    left = record["observed"].get("db_left_open")
    if left:
        return Miss(f"{left} DB connection(s) still open after run_client ended", DB_CLOSE_HINT, clause="7.db-closed")
    return None


def socket_closed(record: dict) -> Miss | None:
    sockets = judged(record).get("sockets")
    if sockets:
        return Miss(f"after run_client ended, the process still held a socket: {sockets[0]}", SOCKET_HINT,
                   clause="7.socket-closed")
    if not all(record["observed"].get("sockets_closed", [])):
        return Miss("the socket was still open after run_client ended", SOCKET_HINT, clause="7.socket-closed")
    return None


def dialled_with_limit(record: dict) -> Miss | None:
    dials = record["observed"].get("dials", [])
    if not dials:
        return Miss("asyncio.open_connection was never called",
                   "Connect with `asyncio.open_connection(host, port, limit=64)`.", clause="7.read-limit")
    limit = decode(dials[0]["limit"])
    if limit != 64:
        return Miss(f"asyncio.open_connection was called with limit {show(limit)}",
                   "Pass `limit=64`: then readline refuses any line longer than a frame instead of "
                   "buffering it.", clause="7.read-limit")
    return None


def never_parsed_long(record: dict) -> Miss | None:
    longest = record["observed"].get("longest_frame", 0)
    if longest > 64:
        return Miss(f"readline returned the whole line: parse_line received {longest} bytes",
                   "Pass `limit=64` to open_connection: readline then raises ValueError instead of "
                   "reading an oversized line into memory.", clause="7.read-limit")
    return None


def resumed(last: int):
    """The first write is RESUME <last>, and it is drained before anything else."""

    def check(record: dict) -> Miss | None:
        log = logged(record)
        writes = [(i, decode(e["data"])) for i, e in enumerate(log) if e["kind"] == "write"]
        expected = b"RESUME %d\n" % last
        if not writes or writes[0][1] != expected:
            first = show(writes[0][1]) if writes else "never made"
            return Miss(f"the first write was {first}; expected {expected!r}",
                       "Write `b\"RESUME <last>\\n\"` first, with the `last` read from the store.", clause="7.resume")
        following = [e["kind"] for e in log[writes[0][0] + 1:] if e["kind"] in ("drain", "write")]
        if not following or following[0] != "drain":
            return Miss("RESUME was written but not drained",
                       "After writing RESUME, `await asyncio.wait_for(writer.drain(), timeout)`.",
                       clause="7.resume-drained")
        return None

    return check


def feed_resumed(last: int):
    def check(record: dict) -> Miss | None:
        got = judged(record).get("resumes", [])
        if got != [last]:
            hint = "Send `RESUME <last>` once, with the last the store saved."
            if got == [-1] and last != -1:
                hint = ("the feed saw RESUME -1 from a store saved at a later cursor: read `last` from the "
                       "store, never reset it.")
            said = " then ".join(f"RESUME {n}" for n in got) or "no RESUME at all"
            return Miss(f"the feed received {said}; expected RESUME {last}", hint, clause="7.resume")
        return None

    return check


def feed_got_acks(seqs: list[int], exact: bool = False):
    """The feed got an ACK for each of `seqs`; a feed may resend more, and those need ACKs too."""

    def check(record: dict) -> Miss | None:
        seen = judged(record)
        got, sent = [a["seq"] for a in seen.get("acks", [])], seen.get("sent", [])
        if exact:
            if got != seqs:
                return Miss(f"the feed received ACKs for {seqs_text(got)}; expected {seqs_text(seqs)}",
                           "ACK exactly the lines that were committed and passed before_ack.", clause="7.handover")
            return None
        if any(s not in got for s in seqs) or any(s not in got for s in sent):
            return Miss(f"the feed sent {seqs_text(sent)} and received ACKs for {seqs_text(got)}",
                       "ACK every line after its commit, duplicates included.", clause="7.handover")
        return None

    return check


def validated_first(path: Path, silent: Feed):
    def check(record: dict) -> Miss | None:
        seen = record["observed"]
        if seen.get("dials") or silent.connections():
            return Miss("ValueError, but only after connecting to the feed",
                       "Validate timeout first, before opening the store or a connection.",
                       clause="7.validate-first")
        if judged(record).get("exists") or seen.get("db_opened"):
            return Miss("ValueError, but only after opening the store (the judge found the store file created)",
                       "Validate timeout first, before open_store(path).", clause="7.validate-first")
        return None

    return check


def store_before_connect(silent: Feed):
    def check(record: dict) -> Miss | None:
        if record["observed"].get("dials") or silent.connections():
            return Miss("the store could not be opened, but a connection to the feed was made anyway",
                       "Open the store first, then connect: open_store(path) before asyncio.open_connection.",
                       clause="7.open-store")
        return None

    return check


def opened_before_connecting(path: Path):
    def check(record: dict) -> Miss | None:
        if not judged(record).get("exists"):
            return Miss("the connection was refused, and the judge found no store file: the store was not "
                       "opened before connecting",
                       "Open the store first (open_store(path)), then connect.", clause="7.open-store")
        return None

    return check
