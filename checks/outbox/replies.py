"""Scripted HTTP replies for step 8, and the judge's record of what each client did.

`send_http` must be tried against answers no well-behaved warehouse gives: a 201 with a
perfect ACK, a body of exactly 1,024 or 1,025 bytes with or without Content-Length or
chunked, JSON that is not an object, a reply that never ends, a reset, silence. Each
`Listener` answers its connections from a list of `Reply`s, written byte by byte, and keeps a
`Visit` per connection: the request it read, how many bytes of the answer the client took,
when the client was seen to close its end (the judge's evidence for "no leaked socket"), and
how long the judge itself kept the client waiting beyond its script (`Visit.kept_waiting`:
on a busy machine a handler thread can answer late, and a client with a short timeout then
fails through no fault of its own).
"""

from __future__ import annotations

import contextlib
import json
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.judge import ports
from labkit.judge.ports import refusing_port

MAX_HEAD = 64 * 1024
MAX_BODY = 256 * 1024
IO_TIMEOUT = 5.0  # a client that stalls mid-request cannot hold a handler thread
STREAM_CHUNK = 64 * 1024
ENDLESS = 64 * 1024 * 1024  # "a reply that never ends": this many bytes, then the server gives up
# The kernel stamps each segment it receives with its arrival time: the request's real arrival,
# however late a busy judge's thread reads it (Linux's SO_TIMESTAMPNS; Python has no name for it).
TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)

Body = bytes | Callable[[str | None], bytes]  # a function of the request's event id


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Body = b""
    framing: str = "length"  # "length": Content-Length; "close": none, ends at close; "chunked"
    headers: tuple[tuple[str, str | None], ...] = ()  # a value None leaves that header out
    delay: float = 0.0  # silence before the status line
    body_delay: float = 0.0  # silence between the head and the body
    stream: int = 0  # after the body, this many more bytes of spaces
    hang_up: str = ""  # "close": no answer at all; "reset": a TCP reset instead of an answer

    def render_body(self, event_id: str | None) -> bytes:
        return self.body(event_id) if callable(self.body) else self.body


def ack(event_id: str | None) -> bytes:
    return json.dumps({"ack": event_id}).encode()


@dataclass
class Visit:
    """One connection a listener accepted."""

    accepted_at: float
    method: str | None = None
    path: str | None = None
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    body: bytes | None = None
    event_id: str | None = None
    sent: int = 0  # bytes of the answer the client's socket took
    closed_at: float | None = None  # when the client was seen to close its end
    delay: float = 0.0  # the script's silences before the answer is whole (before it, and before its body)
    arrived_at: float | None = None  # when the request's last bytes reached this machine (the kernel's stamp)
    ready_at: float | None = None  # when the judge had answered (head and body sent), or saw the client go
    ended: threading.Event = field(default_factory=threading.Event)
    conn: socket.socket | None = field(default=None, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def kept_waiting(self, now: float) -> float:
        """Seconds the judge kept this client waiting beyond its script: from the request's
        arrival until the judge was ready to answer, or until `now` when it is not yet (a client
        that gave up first is judged meanwhile). Before the whole request is read, only a
        request that waits unread (or a handler not yet started) is the judge's wait."""
        if self.body is None:
            return now - self.accepted_at if self.ready_at is None and self._unread() else 0.0
        end = self.ready_at if self.ready_at is not None else now
        return max(0.0, end - (self.arrived_at or self.accepted_at) - self.delay)

    def _unread(self) -> bool:
        with self.lock:
            if self.conn is None:  # its handler has ended
                return False
            try:
                return bool(select.select([self.conn], [], [], 0)[0])
            except (OSError, ValueError):
                return False

    def client_gone(self) -> bool:
        """Has the client closed its end? Asks the kernel about the socket now, whether or not its
        handler has started, read the request or answered (on a busy machine each may come late)."""
        with self.lock:
            if self.closed_at is not None:
                return True
            if self.conn is None:  # its handler ended with the replier, never having seen a close
                return False
            if not peer_closed(self.conn):
                return False
            self.closed_at = time.time()
            return True


@dataclass
class Listener:
    host: str
    port: int
    replies: list[Reply]
    sock: socket.socket
    visits: list[Visit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held from accept() to the visit's record

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/events"

    def connected(self) -> bool:
        """Did anyone connect? Also counts a connection still waiting in the backlog: the accept
        thread may not have taken it yet when a busy machine lets the judge look first."""
        with self.lock:
            if self.visits:
                return True
            waiting, _, _ = select.select([self.sock], [], [], 0)
            return bool(waiting)

    def kept_waiting(self) -> float:
        """The longest time the judge kept one of this listener's clients waiting beyond its
        script; a connection still in the backlog, not yet accepted, was kept waiting outright."""
        now = time.time()
        with self.lock:
            waits = [v.kept_waiting(now) for v in self.visits]
            if select.select([self.sock], [], [], 0)[0]:
                waits.append(float("inf"))
        return max(waits, default=0.0)

    def forget(self) -> None:
        """Start over: the next connection is the first again (a case run a second time)."""
        with self.lock:
            self.visits.clear()

    def clients_gone(self, wait: float) -> bool:
        """Did every client of this listener close its connection? Polls for at most `wait`
        (a close reaches a loopback peer at once; the wait only covers a busy machine)."""
        deadline = time.monotonic() + wait
        while True:
            if all(v.client_gone() for v in list(self.visits)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


class Replier:
    """Many listeners, one accept thread, one handler thread per connection."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._held: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept_loop, name="outbox-replier", daemon=True)
        self._accepting.start()

    def listen(self, replies: list[Reply], host: str = "127.0.0.1") -> Listener:
        """A listener answering its n-th connection with replies[n] (the last one repeats)."""
        sock = socket.socket()
        if TIMESTAMPNS is not None:
            with contextlib.suppress(OSError):  # accepted connections inherit it
                sock.setsockopt(socket.SOL_SOCKET, TIMESTAMPNS, 1)
        ports.bind(sock, host)
        sock.listen(16)
        sock.setblocking(False)
        listener = Listener(host, sock.getsockname()[1], list(replies), sock)
        with self._lock:
            self._listeners.append(listener)
            self._selector.register(sock, selectors.EVENT_READ, listener)
        return listener

    def refusing_port(self) -> int:
        """A port bound but not listening: connections are refused, and no server started
        later can take the port while we hold it."""
        sock = refusing_port()
        self._held.append(sock)
        return sock.getsockname()[1]

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                empty = not self._listeners
            if empty:
                time.sleep(0.02)
                continue
            for key, _ in self._selector.select(timeout=0.05):
                listener: Listener = key.data
                with listener.lock:
                    try:
                        conn, _addr = listener.sock.accept()
                    except OSError:
                        continue
                    scripted = reply_for(listener, len(listener.visits))
                    # the socket is the visit's from the start: `client_gone` can ask about it
                    # before the handler thread runs (late, on a busy machine)
                    visit = Visit(time.time(), delay=scripted.delay + scripted.body_delay, conn=conn)
                    listener.visits.append(visit)
                reply = reply_for(listener, len(listener.visits) - 1)
                thread = threading.Thread(target=_serve, args=(conn, reply, visit, self._stop),
                                          name=f"outbox-replier-{listener.port}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(1.0)
        with self._lock:
            for listener in self._listeners:
                with contextlib.suppress(Exception):
                    self._selector.unregister(listener.sock)
                listener.sock.close()
            self._selector.close()
        for sock in self._held:
            sock.close()
        deadline = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


# Linux's TCP states (include/net/tcp_states.h) in which the peer has sent its FIN or a reset.
_PEER_CLOSED = {6, 7, 8, 9, 11}  # TIME_WAIT, CLOSE, CLOSE_WAIT, LAST_ACK, CLOSING
_TCP_INFO = getattr(socket, "TCP_INFO", 11 if sys.platform == "linux" else None)


def peer_closed(conn: socket.socket) -> bool:
    """Whether the other end of `conn` has closed (a FIN or a reset arrived), from the socket's
    TCP state: true even while the request it sent before closing is still unread. Elsewhere
    than Linux: EOF or a reset waiting at the head of the socket."""
    try:
        if _TCP_INFO is not None:
            return conn.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0] in _PEER_CLOSED
        if not select.select([conn], [], [], 0)[0]:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True  # a reset, or a socket closed under us: the client's side is gone


def reply_for(listener: Listener, index: int) -> Reply:
    """The reply to a listener's `index`-th connection (from 0; the last one repeats)."""
    return listener.replies[min(index, len(listener.replies) - 1)]


def _serve(conn: socket.socket, reply: Reply, visit: Visit, stop: threading.Event) -> None:
    try:
        conn.settimeout(IO_TIMEOUT)
        if not _read_request(conn, visit):
            visit.closed_at = time.time()
            return
        if reply.hang_up:  # the answer is to hang up, at once
            visit.ready_at = time.time()
        if reply.hang_up == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return  # close() below sends the reset
        if reply.hang_up == "close":
            conn.shutdown(socket.SHUT_RDWR)
            _linger(conn, visit, stop)
            return
        if _silence(conn, reply.delay, visit, stop):
            visit.ready_at = time.time()
            return
        body = reply.render_body(visit.event_id)
        # Ready once the whole scripted answer is with the kernel, not before it is written: on a
        # loaded machine this thread waited for the GIL in between (ci35, then again with the head
        # and body sent apart: "timeout 0.5 is accepted" timed out under one seed while the wait
        # measured stayed under KEPT_WAITING, so no second run). Without a pause they go as one.
        head = _head(reply, len(body))
        if reply.body_delay:  # the head, a scripted pause, then the body (a gone client: `finally` stamps it)
            if not _send(conn, head, visit) or _silence(conn, reply.body_delay, visit, stop):
                return
            head = b""
        sent = _send(conn, head + _frame(reply, body), visit)
        visit.ready_at = time.time()
        if not sent:
            return
        remaining = reply.stream
        while remaining > 0 and not stop.is_set():
            chunk = b" " * min(STREAM_CHUNK, remaining)
            if not _send(conn, _frame(reply, chunk), visit):
                return
            remaining -= len(chunk)
        if reply.framing == "chunked":
            _send(conn, b"0\r\n\r\n", visit)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)  # the end of a close-delimited body; no more from us
        _linger(conn, visit, stop)
    except OSError:
        if visit.closed_at is None:
            visit.closed_at = time.time()
    finally:
        if visit.ready_at is None:  # no answer to give (no request, a hang-up, a reset): nothing kept it
            visit.ready_at = time.time()
        with visit.lock:
            visit.conn = None
            with contextlib.suppress(OSError):
                conn.close()
        visit.ended.set()


def _recv(conn: socket.socket, visit: Visit) -> bytes:
    """One read of the request, noting when its bytes arrived (the kernel's stamp, else now)."""
    if TIMESTAMPNS is None:
        chunk, ancillary = conn.recv(65536), []
    else:
        chunk, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(16))
    stamped = [data for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == TIMESTAMPNS]
    if stamped and len(stamped[0]) >= 16:
        seconds, nanoseconds = struct.unpack("qq", stamped[0][:16])
        visit.arrived_at = seconds + nanoseconds / 1e9
    else:
        visit.arrived_at = time.time()
    return chunk


def _read_request(conn: socket.socket, visit: Visit) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(conn, visit)
        if not chunk:
            return False
        data += chunk
        if len(data) > MAX_HEAD:
            return False
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    visit.method, visit.path = (parts[0], parts[1]) if len(parts) >= 2 else (lines[0], None)
    for line in lines[1:]:
        name, _, value = line.partition(":")
        visit.headers[name.strip().lower()] = value.strip()
    if visit.headers.get("transfer-encoding", "").lower() == "chunked":
        body = _read_chunked(conn, rest, visit)
    else:
        try:
            length = int(visit.headers.get("content-length", "0"))
        except ValueError:
            length = 0
        body = rest
        while len(body) < min(length, MAX_BODY):
            chunk = _recv(conn, visit)
            if not chunk:
                break
            body += chunk
    visit.body = body
    try:
        event_id = json.loads(body).get("id")
        visit.event_id = event_id if isinstance(event_id, str) else None
    except (ValueError, AttributeError):
        visit.event_id = None
    return True


def _read_chunked(conn: socket.socket, data: bytes, visit: Visit) -> bytes:
    body = b""
    while len(body) < MAX_BODY:
        while b"\r\n" not in data:
            chunk = _recv(conn, visit)
            if not chunk:
                return body
            data += chunk
        size_line, _, data = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            return body
        if size == 0:
            return body
        while len(data) < size + 2:
            chunk = _recv(conn, visit)
            if not chunk:
                return body + data
            data += chunk
        body, data = body + data[:size], data[size + 2:]
    return body


def _head(reply: Reply, length: int) -> bytes:
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}", "Connection: close"]
    if reply.framing == "length":
        lines.append(f"Content-Length: {length + reply.stream}")
    elif reply.framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
    if not any(name.lower() == "content-type" for name, _ in reply.headers):
        lines.append("Content-Type: application/json")
    lines += [f"{name}: {value}" for name, value in reply.headers if value is not None]  # None: leave it out
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _frame(reply: Reply, data: bytes) -> bytes:
    if reply.framing != "chunked" or not data:
        return data
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _send(conn: socket.socket, data: bytes, visit: Visit) -> bool:
    try:
        conn.sendall(data)
    except OSError:
        visit.closed_at = visit.closed_at or time.time()
        return False
    visit.sent += len(data)
    return True


def _silence(conn: socket.socket, seconds: float, visit: Visit, stop: threading.Event) -> bool:
    """Say nothing for `seconds`, watching for the client to give up; True if it hung up."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if _client_closed(conn, min(left, 0.05), visit):
            return True
    return True


def _linger(conn: socket.socket, visit: Visit, stop: threading.Event) -> None:
    """Keep the connection until the client closes it or the step's replier stops: never for a
    fixed time, since a client that a busy machine keeps off the CPU closes late (and the judge
    asks about the close only after the call returned)."""
    while not stop.is_set():
        if _client_closed(conn, 0.05, visit):
            return


def _client_closed(conn: socket.socket, wait: float, visit: Visit) -> bool:
    ready = selectors.DefaultSelector()
    try:
        ready.register(conn, selectors.EVENT_READ)
        if not ready.select(wait):
            return False
    finally:
        ready.close()
    with visit.lock:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if data:  # more from the client after its request: not a close
            return False
        visit.closed_at = visit.closed_at or time.time()
    return True


_REASONS = {200: "OK", 201: "Created", 202: "Accepted", 203: "Non-Authoritative Information", 204: "No Content",
            300: "Multiple Choices", 301: "Moved Permanently", 302: "Found", 303: "See Other",
            304: "Not Modified", 307: "Temporary Redirect", 308: "Permanent Redirect", 400: "Bad Request",
            404: "Not Found", 409: "Conflict", 500: "Internal Server Error", 503: "Service Unavailable"}
