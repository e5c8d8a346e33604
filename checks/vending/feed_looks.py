"""Lab `vending`, steps 6, 7 and final: the judge's own looks at its feed — the journal's RESUMEs, lines
and ACKs, how a connection ended, the sockets a child still holds to it.
"""

from __future__ import annotations

import os
import time

from checks.vending.feed_server import Feed
from checks.vending.hints import ACK_AFTER_COMMIT, CLOSE_HINT, SOCKET_HINT
from checks.vending.store import judged
from labkit.judge.expect import Miss
from labkit.judge.processes import held_files, held_sockets
from labkit.judge.run import together


def close_feeds(feeds: list[Feed]) -> None:
    """Close every feed at once (each close joins its threads)."""
    together([feed.close for feed in feeds])


def acks_on(journal: list[dict]) -> list[int]:
    return [e["seq"] for e in journal if e["kind"] == "ack"]


def sent_on(journal: list[dict]) -> list[int]:
    return [e["seq"] for e in journal if e["kind"] == "sent"]


def resumes_on(journal: list[dict]) -> list[int]:
    return [e["last"] for e in journal if e["kind"] == "resume"]


def observe_feed_case(feed: Feed, pid: int, spec: dict) -> dict:
    """After a session case: does the child still hold the store open (the connection it was
    handed); against the feed, also how the feed's connection ended (waiting for it, bounded),
    the ACKs it received with what the judge read at each, and the sockets the child still holds."""
    holds_db = {"holds_db": os.path.realpath(spec["db"]) in held_files(pid)} if spec.get("db") else {}
    conn = spec.get("conn")
    if conn is None:
        return holds_db
    sockets = held_sockets(pid, feed.port)
    settled(feed, sockets)
    ended = feed_closed(feed, conn, 0.0)
    journal = [e for e in feed.journal() if e["conn"] == conn]
    return {**holds_db, "feed_closed": ended, "sockets": sockets,
            "acks": [{"seq": e["seq"], "observed": e.get("observed")} for e in journal if e["kind"] == "ack"]}


def settled(feed: Feed, sockets: list[str]) -> None:
    """Let the feed catch up with what the child did: when the child holds no socket to it, wait
    (bounded) until the feed has no connection open or waiting to be accepted, so a close the
    child made is in the journal. A socket still held means no EOF is coming: no wait."""
    if not sockets:
        feed.wait_idle(5.0)


def feed_closed(feed: Feed, conn: int, seconds: float) -> str | None:
    """How the feed's connection `conn` ended ("eof", "done", ...), waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        for entry in feed.journal():
            if entry["conn"] == conn and entry["kind"] == "closed":
                return entry["reason"]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def feed_saw_close(record: dict) -> Miss | None:
    """Real TCP: the feed itself saw the client hang up (EOF or reset on its side), and the child
    held no socket to the feed any more."""
    seen = judged(record)
    step7 = "dials" in record["observed"]
    hint, clause = (SOCKET_HINT, "7.socket-closed") if step7 else (CLOSE_HINT, "6.close-every-path")
    if seen.get("sockets"):
        return Miss(f"after the call the process still held a socket to the feed: {seen['sockets'][0]}", hint,
                   clause=clause)
    if seen.get("feed_closed") not in ("eof", "reset"):
        return Miss(f"the feed never saw the connection close (it ended: {seen.get('feed_closed') or 'still open'})",
                   hint, clause=clause)
    return None


def acks_seen_committed(record: dict) -> Miss | None:
    """Real TCP: when each ACK reached the feed, the judge's own connection already read its commit."""
    for ack in judged(record).get("acks", []):
        last = (ack.get("observed") or {}).get("last")
        if last is None or last < ack["seq"]:
            return Miss(f"when ACK {ack['seq']} reached the feed, the judge's own connection read last "
                       f"{last}: the ACK went out before the commit", ACK_AFTER_COMMIT,
                       clause="6.hook-before-ack")
    return None
