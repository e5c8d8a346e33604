"""Tests for checks.vending.feed_server, the event-feed TCP server the lab-02 judge runs.

The clients here are tiny and correct on purpose: plain blocking sockets (plus one
asyncio client shaped like the student's, ``limit=64``), so every failure points
at the server.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.vending.feed_server import FAULTS, Feed, start_feed  # noqa: E402

LOG4 = [(0, 5), (1, -2), (2, 7), (3, 1)]


class Client:
    """A blocking line client with a hard timeout on every read."""

    def __init__(self, feed: Feed, timeout: float = 2.0) -> None:
        self.sock = socket.create_connection((feed.host, feed.port), timeout=timeout)
        self.buf = b""

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def readline(self) -> bytes:
        """A LF-terminated line, or whatever is left (maybe b"") at EOF."""
        while b"\n" not in self.buf:
            data = self.sock.recv(4096)
            if not data:
                rest, self.buf = self.buf, b""
                return rest
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def reset(self) -> None:
        """Die abruptly: SO_LINGER 0 makes close() send a RST."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def parse(line: bytes) -> tuple[int, int]:
    word, seq, delta = line.decode("ascii").split(" ")
    assert word == "EVENT" and delta.endswith("\n")
    return int(seq), int(delta)


def consume(feed: Feed, last: int) -> list[tuple[int, int]]:
    """A correct client: RESUME last, ACK every line, stop at EOF."""
    c = Client(feed)
    try:
        c.send(f"RESUME {last}\n".encode())
        got = []
        while line := c.readline():
            seq, delta = parse(line)
            got.append((seq, delta))
            c.send(f"ACK {seq}\n".encode())
        return got
    finally:
        c.close()


def kinds(feed: Feed, conn: int | None = None) -> list[str]:
    return [e["kind"] for e in feed.journal() if conn is None or e["conn"] == conn]


def closed_reasons(feed: Feed) -> list[str]:
    return [e["reason"] for e in feed.journal() if e["kind"] == "closed"]


def faults_seen(feed: Feed) -> list[dict]:
    return [e for e in feed.journal() if e["kind"] == "fault"]


@pytest.fixture
def feeds():
    made: list[Feed] = []

    def make(*args, **kwargs) -> Feed:
        feed = start_feed(*args, **kwargs)
        made.append(feed)
        return feed

    yield make
    for feed in made:
        feed.close()


# -- the normal protocol ------------------------------------------------------------


def test_resume_minus_one_gets_every_event_then_eof(feeds):
    feed = feeds(LOG4)
    assert feed.host == "127.0.0.1" and feed.port > 0
    assert consume(feed, -1) == LOG4
    assert feed.wait_idle(2.0)
    assert feed.resumes() == [-1]
    assert feed.acks() == [0, 1, 2, 3]
    assert feed.connections() == 1
    assert kinds(feed) == ["connect", "resume"] + ["sent", "ack"] * 4 + ["closed"]
    assert closed_reasons(feed) == ["done"]
    journal = feed.journal()
    assert all(e["conn"] == 1 and isinstance(e["t"], float) for e in journal)
    assert [e["t"] for e in journal] == sorted(e["t"] for e in journal)
    sent = [e for e in journal if e["kind"] == "sent"]
    assert sent[1] == {**sent[1], "seq": 1, "delta": -2, "raw": "EVENT 1 -2\n"}
    assert journal[1]["last"] == -1


def test_resume_cursor_gets_only_later_events(feeds):
    feed = feeds(LOG4)
    assert consume(feed, 1) == [(2, 7), (3, 1)]
    assert consume(feed, 3) == []  # nothing after the end: a clean EOF at once
    assert feed.wait_idle(2.0)
    assert feed.resumes() == [1, 3]
    assert feed.acks() == [2, 3]
    assert closed_reasons(feed) == ["done", "done"]


def test_first_seq_trims_the_retained_log(feeds):
    feed = feeds([(10, 1), (11, 2), (12, 3)], first_seq=11)
    assert consume(feed, -1) == [(11, 2), (12, 3)]  # the client must see the gap itself
    with pytest.raises(ValueError):
        start_feed([(10, 1)], first_seq=9)


def test_journal_is_a_copy(feeds):
    feed = feeds(LOG4[:1])
    consume(feed, -1)
    feed.wait_idle(2.0)
    j = feed.journal()
    j[0]["kind"] = "tampered"
    j.clear()
    feed.acks().append(99)
    feed.resumes().append(99)
    assert feed.journal()[0]["kind"] == "connect"
    assert feed.acks() == [0] and feed.resumes() == [-1]


# -- a client that dies before its ACK --------------------------------------------


def test_event_not_acked_is_resent_to_the_next_connection(feeds):
    feed = feeds(LOG4)
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 5\n"
    c.send(b"ACK 0\n")
    assert c.readline() == b"EVENT 1 -2\n"
    c.reset()  # killed after committing 1, before ACKing it
    assert feed.wait_idle(2.0)
    assert closed_reasons(feed) == ["reset"]

    # The new process resumes from its store's cursor, 1: "send what comes after 1". Only the
    # resend rule (what the feed sent and never saw ACKed goes out again) brings 1 back; a feed
    # that forgot it would start at 2.
    assert consume(feed, 1) == [(1, -2), (2, 7), (3, 1)]
    assert feed.wait_idle(2.0)
    assert feed.resumes() == [-1, 1]
    assert feed.acks() == [0, 1, 2, 3]
    assert [e["seq"] for e in feed.journal() if e["kind"] == "sent"] == [0, 1, 1, 2, 3]
    assert feed.connections() == 2


def test_commit_then_kill_before_ack_duplicate_acks_are_recorded(feeds):
    feed = feeds(LOG4[:3])
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 5\n"
    c.send(b"ACK 0\n")
    assert c.readline() == b"EVENT 1 -2\n"
    c.close()  # a plain close (FIN) while the server waits for ACK 1
    assert feed.wait_idle(2.0)
    assert closed_reasons(feed) == ["eof"]
    # The committed-but-unacked client says RESUME 1: the feed resends 1, which it never saw
    # ACKed, then continues after the cursor.
    assert consume(feed, 1) == [(1, -2), (2, 7)]
    # A client that resumes from further back is sent (and ACKs) what follows its cursor.
    assert consume(feed, 0) == [(1, -2), (2, 7)]
    assert feed.wait_idle(2.0)
    assert feed.resumes() == [-1, 1, 0]
    assert feed.acks() == [0, 1, 2, 1, 2]


def test_on_ack_observes_the_moment_each_ack_arrives_before_the_next_line(feeds):
    """The observer runs in the feed's thread between the ACK and the next line: what it sees is
    the state at that ACK (here: how many lines the client had been sent by then)."""
    sent_then: list[int] = []
    feed = None

    def observe(conn: int, seq: int) -> dict:
        sent_then.append(len([e for e in feed.journal() if e["kind"] == "sent"]))
        return {"conn": conn, "seq": seq}

    feed = feeds(LOG4[:3], on_ack=observe)
    assert consume(feed, -1) == LOG4[:3]
    assert feed.wait_idle(2.0)
    acks = [e for e in feed.journal() if e["kind"] == "ack"]
    assert [e["observed"] for e in acks] == [{"conn": 1, "seq": s} for s in (0, 1, 2)]
    assert sent_then == [1, 2, 3]  # never a line ahead of the ACK being observed


def test_a_failing_ack_observer_is_journaled_not_raised(feeds):
    def broken(conn: int, seq: int) -> dict:
        raise RuntimeError("observer broke")

    feed = feeds(LOG4[:2], on_ack=broken)
    assert consume(feed, -1) == LOG4[:2]
    assert feed.wait_idle(2.0)
    assert feed.acks() == [0, 1]
    assert all("observer broke" in e["observed"]["error"] for e in feed.journal() if e["kind"] == "ack")
    assert closed_reasons(feed) == ["done"]


def test_reset_does_not_crash_leak_or_print(feeds, capfd):
    hooked = []
    old_hook = threading.excepthook
    threading.excepthook = hooked.append
    try:
        feed = feeds(LOG4)
        for _ in range(3):
            c = Client(feed)
            c.send(b"RESUME -1\n")
            assert c.readline() == b"EVENT 0 5\n"
            c.reset()
        c = Client(feed)
        c.reset()  # dies before even saying RESUME
        assert feed.wait_idle(2.0)
        assert consume(feed, -1) == LOG4  # still serving
        assert feed.wait_idle(2.0)
    finally:
        threading.excepthook = old_hook
    assert hooked == []
    assert closed_reasons(feed) == ["reset", "reset", "reset", "reset", "done"]
    assert capfd.readouterr() == ("", "")


# -- faults, one per connection -------------------------------------------------------


def test_drop_mid_stream(feeds):
    feed = feeds(LOG4, ["drop_mid_stream"])
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 5\n"
    c.send(b"ACK 0\n")
    assert c.readline() == b""  # closed before the second event
    c.close()
    assert feed.wait_idle(2.0)
    assert [(f["fault"], f["before"]) for f in faults_seen(feed)] == [("drop_mid_stream", 1)]
    assert closed_reasons(feed) == ["fault"]
    assert consume(feed, 0) == LOG4[1:]  # faults are consumed: connection 2 is normal
    assert feed.acks() == [0, 1, 2, 3]


def test_torn_last_line(feeds):
    feed = feeds(LOG4, ["torn_last_line"])
    c = Client(feed)
    c.send(b"RESUME 0\n")
    assert c.readline() == b"EVENT 1 -2"  # no LF, then EOF
    assert c.readline() == b""
    c.close()
    assert feed.wait_idle(2.0)
    (f,) = faults_seen(feed)
    assert (f["fault"], f["seq"], f["raw"]) == ("torn_last_line", 1, "EVENT 1 -2")
    assert closed_reasons(feed) == ["fault"]
    assert feed.acks() == []


def test_stall_sends_nothing_then_closes(feeds):
    feed = feeds(LOG4, ["stall"], stall_seconds=0.4)
    c = Client(feed, timeout=0.2)
    t0 = time.monotonic()
    c.send(b"RESUME -1\n")
    with pytest.raises(TimeoutError):
        c.readline()
    c.sock.settimeout(2.0)
    assert c.readline() == b""
    waited = time.monotonic() - t0
    c.close()
    assert 0.35 <= waited < 1.5
    assert feed.wait_idle(2.0)
    assert [f["fault"] for f in faults_seen(feed)] == ["stall"]
    assert "sent" not in kinds(feed)
    assert closed_reasons(feed) == ["fault"]


def test_stall_ends_early_when_the_client_gives_up(feeds):
    feed = feeds(LOG4, ["stall"], stall_seconds=30)
    c = Client(feed)
    c.send(b"RESUME -1\n")
    time.sleep(0.1)
    c.close()  # the client's own timeout fired
    assert feed.wait_idle(1.0)
    assert closed_reasons(feed) == ["eof"]


def test_conflicting_duplicate(feeds):
    feed = feeds([(0, 1000), (1, 3)], ["conflicting_duplicate", "conflicting_duplicate"])
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 1000\n"
    c.send(b"ACK 0\n")
    assert c.readline() == b"EVENT 0 999\n"  # 1001 would be out of range
    c.close()  # a correct client refuses it (Conflict) and sends no ACK
    assert feed.wait_idle(2.0)
    assert closed_reasons(feed) == ["eof"]

    c = Client(feed)
    c.send(b"RESUME 0\n")
    assert c.readline() == b"EVENT 1 3\n"
    c.send(b"ACK 1\n")
    assert c.readline() == b"EVENT 1 4\n"
    c.send(b"ACK 1\n")  # a client that ACKs it anyway: the stream just goes on
    assert c.readline() == b""
    c.close()
    assert feed.wait_idle(2.0)
    assert [(f["fault"], f["seq"], f["delta"]) for f in faults_seen(feed)] == [
        ("conflicting_duplicate", 0, 999),
        ("conflicting_duplicate", 1, 4),
    ]
    assert feed.acks() == [0, 1, 1]
    assert closed_reasons(feed) == ["eof", "done"]


def test_skip_seq(feeds):
    feed = feeds(LOG4, ["skip_seq"])
    c = Client(feed)
    c.send(b"RESUME 0\n")
    assert c.readline() == b"EVENT 2 7\n"  # 1 is skipped: a gap
    c.close()
    assert feed.wait_idle(2.0)
    assert [(f["fault"], f["skipped"]) for f in faults_seen(feed)] == [("skip_seq", 1)]
    assert [e["seq"] for e in feed.journal() if e["kind"] == "sent"] == [2]


def test_overlong_line(feeds):
    feed = feeds(LOG4, ["overlong_line"])
    c = Client(feed)
    c.send(b"RESUME -1\n")
    line = c.readline()
    assert len(line) == 100 and line.startswith(b"EVENT 1 ") and line.endswith(b"\n")
    assert line[8:-1].isdigit()
    assert c.readline() == b""
    c.close()
    assert feed.wait_idle(2.0)
    (f,) = faults_seen(feed)
    assert f["fault"] == "overlong_line" and f["raw"] == line.decode()
    assert closed_reasons(feed) == ["fault"]


def test_student_shaped_asyncio_client_sees_torn_and_overlong(feeds):
    feed = feeds(LOG4, ["torn_last_line", "overlong_line"])

    async def first_line() -> bytes:
        reader, writer = await asyncio.open_connection(feed.host, feed.port, limit=64)
        try:
            writer.write(b"RESUME -1\n")
            await writer.drain()
            return await asyncio.wait_for(reader.readline(), 2.0)
        finally:
            writer.close()
            await writer.wait_closed()

    assert asyncio.run(first_line()) == b"EVENT 0 5"  # partial line at EOF
    with pytest.raises(ValueError):  # StreamReader's limit overrun
        asyncio.run(first_line())


def test_faults_follow_connection_order_then_none(feeds):
    feed = feeds(LOG4, ["stall", "skip_seq"], stall_seconds=0.1)
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b""  # stall, then close
    c.close()
    feed.wait_idle(2.0)
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 1 -2\n"
    c.close()
    feed.wait_idle(2.0)
    assert consume(feed, -1) == LOG4
    assert [(f["conn"], f["fault"]) for f in faults_seen(feed)] == [(1, "stall"), (2, "skip_seq")]


def test_fault_with_too_few_events_is_marked_not_applied(feeds):
    feed = feeds(LOG4, ["drop_mid_stream"])
    assert consume(feed, 2) == [(3, 1)]
    assert feed.wait_idle(2.0)
    (f,) = faults_seen(feed)
    assert f["fault"] == "drop_mid_stream" and f["applied"] is False


# -- protocol errors and timeouts ---------------------------------------------------------


@pytest.mark.parametrize("ack", [b"ACK 1\n", b"ACK 00\n", b"ACK 0\r\n", b"ack 0\n", b"NACK\n"])
def test_bad_ack_is_journaled_and_closes(feeds, ack):
    feed = feeds(LOG4)
    c = Client(feed)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 5\n"
    c.send(ack)
    assert c.readline() == b""
    c.close()
    assert feed.wait_idle(2.0)
    bad = [e for e in feed.journal() if e["kind"] == "bad_ack"]
    assert [(e["line"], e["expected"]) for e in bad] == [(ack.decode(), 0)]
    assert feed.acks() == []
    assert closed_reasons(feed) == ["bad_ack"]


@pytest.mark.parametrize(
    "hello",
    [b"HELLO\n", b"RESUME\n", b"RESUME -2\n", b"RESUME 01\n", b"RESUME 1\r\n", b"X" * 80],
)
def test_bad_hello_is_journaled_and_closes(feeds, hello):
    feed = feeds(LOG4)
    c = Client(feed)
    c.send(hello)
    assert c.readline() == b""
    c.close()
    assert feed.wait_idle(2.0)
    assert kinds(feed) == ["connect", "bad_hello", "closed"]
    assert feed.journal()[1]["line"].startswith(hello[:10].decode().rstrip("\n"))
    assert feed.resumes() == []
    assert closed_reasons(feed) == ["bad_hello"]


def test_silent_client_times_out(feeds):
    feed = feeds(LOG4, io_timeout=0.2)
    mute = Client(feed)  # never says RESUME
    lazy = Client(feed)
    lazy.send(b"RESUME -1\n")
    assert lazy.readline() == b"EVENT 0 5\n"  # ... and never ACKs
    assert feed.wait_idle(2.0)
    assert mute.readline() == b"" and lazy.readline() == b""
    mute.close()
    lazy.close()
    assert closed_reasons(feed) == ["timeout", "timeout"]


# -- lifecycle -----------------------------------------------------------------------


def test_wait_idle(feeds):
    feed = feeds(LOG4)
    assert feed.wait_idle(0.0)  # nobody connected yet
    c = Client(feed)  # connected, even if not accepted yet: not idle
    assert not feed.wait_idle(0.0)
    assert not feed.wait_idle(0.2)
    c.send(b"RESUME -1\n")
    assert c.readline() == b"EVENT 0 5\n"
    assert not feed.wait_idle(0.1)
    t0 = time.monotonic()
    threading.Timer(0.2, c.close).start()
    assert feed.wait_idle(2.0)
    assert 0.15 <= time.monotonic() - t0 < 1.0


def open_fds() -> set[str]:
    fd_dir = Path("/proc/self/fd")
    return set(p.name for p in fd_dir.iterdir()) if fd_dir.exists() else set()


def test_close_leaves_no_thread_and_refuses_new_connections():
    before = set(threading.enumerate())
    fds = open_fds()
    feed = start_feed(LOG4, ["stall"], stall_seconds=30)
    stalled = Client(feed)
    stalled.send(b"RESUME -1\n")
    mute = Client(feed)
    mid = Client(feed)
    mid.send(b"RESUME -1\n")
    assert mid.readline() == b"EVENT 0 5\n"
    assert [t for t in threading.enumerate() if t.name.startswith("labkit-feed")]
    t0 = time.monotonic()
    feed.close()
    assert time.monotonic() - t0 < 1.0  # the 30 s stall was interrupted
    feed.close()  # idempotent
    # the feed's own threads: another test's server in this worker may still be ending one of its own
    assert [t for t in set(threading.enumerate()) - before if t.name.startswith("labkit-feed")] == []
    for c in (stalled, mute, mid):
        try:
            assert c.readline() == b""
        except ConnectionResetError:  # its request still unread when the feed closed (a loaded
            assert c is stalled  # machine): Linux then ends the connection with a reset, not a FIN
        c.close()
    assert open_fds() <= fds  # listener and every accepted socket are closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((feed.host, feed.port), timeout=1.0)
    assert closed_reasons(feed).count("shutdown") == 3
    assert feed.wait_idle(0.0)


def test_context_manager_closes():
    before = set(threading.enumerate())
    with start_feed(LOG4) as feed:
        assert consume(feed, -1) == LOG4
        port = feed.port
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"events": [(0, 1), (2, 1)]},
        {"events": [(1, 1), (0, 1)]},
        {"events": [(True, 1)]},
        {"events": [(0, 1.5)]},
        {"events": [(-1, 1)]},
        {"events": [[0, 1]]},
        {"events": LOG4, "faults": ["explode"]},
        {"events": LOG4, "stall_seconds": -1},
        {"events": LOG4, "stall_seconds": float("inf")},
        {"events": LOG4, "io_timeout": 0},
    ],
)
def test_start_feed_validates(kwargs):
    before = set(threading.enumerate())
    with pytest.raises(ValueError):
        start_feed(**kwargs)
    assert set(threading.enumerate()) - before == set()


def test_fault_names():
    assert FAULTS == (
        "none",
        "drop_mid_stream",
        "torn_last_line",
        "stall",
        "conflicting_duplicate",
        "skip_seq",
        "overlong_line",
    )
