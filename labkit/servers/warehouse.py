"""The warehouse: a loopback HTTP server that applies outbox events, for the judge.

`POST /events` takes one JSON event, applies it (through the lab's `receive`, or a built-in
in-memory inbox) and answers `200 {"ack": id}` for applied and duplicate events, 409 for a
conflict, 400 for bad input. Every request is written to a JSON Lines log that the judge reads
as its own evidence. A list of faults (one per `POST /events`, in arrival order) makes the
server misbehave in the ways a publisher must survive. Per-event faults (`EventFault`, keyed
by event ID) refuse one event in a way that lasts: 503 for its first N deliveries, 422 with a
reason until `lift(id)`, or a slow ACK. Each log line also carries the fencing token the
publisher sent in the `Fencing-Token` header (lab 03), so the judge sees which token
delivered what.

Two ways to run it:
- in process: `start_warehouse(...)` — for labkit's own receive or trusted test code;
- with the student's `receive`: `spawn_warehouse(...)`. The HTTP side stays in the judge's
  process (the *front*: it listens, applies the faults, keeps the request log and answers);
  only `open_sink` + `receive` run in a judged child (`labkit.probe.warehouse`, started
  through `labkit.judge.child`), which gets each event on a private pipe and answers
  applied / duplicate / conflict / bad_request / error. The child never sees the log or the
  faults, so nothing it does (rewriting files, patching this module in its own process) can
  change what `requests()` returns; an answer the judge cannot read is a 500 and a log entry.

`requests()` is the judge's own memory. The file at `log_path` is a copy for people reading a
run, created anew by the judge (`step_files.create`: a child's link there is removed, never
followed). Standard library only (plus labkit). Nothing is printed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from labkit.judge import ports
from labkit.limits import STEP_TIMEOUT
from labkit.probe.warehouse import _describe  # one way to quote a student's exception

FAULTS = (
    "none",
    "drop_after_commit",
    "wrong_id",
    "oversized",
    "redirect_302",
    "redirect_307",
    "slow",
    "status_500",
    "not_json",
    "conflict_409",
)

EVENTS_PATH = "/events"
FENCE_HEADER = "Fencing-Token"  # the publisher's claim token, logged as "token" (lab 03)
EVENT_FAULT_MODES = ("unavailable", "refused", "slow")
REDIRECT_LOCATION = "/events/elsewhere"
MAX_BODY = 64 * 1024  # request bodies above this get 413
DRAIN_LIMIT = 1024 * 1024  # an oversized body up to this is read and discarded (see _read_body)
OVERSIZED_PAD = 4096  # the `oversized` fault pads its ACK past the lab's 1,024-byte limit
SOCKET_TIMEOUT = 10.0  # a client that stalls mid-request cannot hold a handler forever
POLL_INTERVAL = 0.05  # how quickly the accept loop notices close()
CLOSE_JOIN_SECONDS = 1.5  # close() waits at most this long for handler threads
MAX_ERROR_CHARS = 500  # keeps each log line one short atomic write

_ERROR_BODIES = {
    400: b'{"error": "bad_request"}',
    404: b'{"error": "not_found"}',
    405: b'{"error": "method_not_allowed"}',
    409: b'{"error": "conflict"}',
    413: b'{"error": "too_large"}',
    500: b'{"error": "internal"}',
    503: b'{"error": "unavailable"}',
}
_OUTCOME_STATUS = {"conflict": 409, "bad_request": 400, "error": 500}

Receive = Callable[[Any, dict], Any]
OpenSink = Callable[[Path], Any]


class WarehouseStartError(RuntimeError):
    """The warehouse child process did not come up; the message says why."""


# ---------------------------------------------------------------------------------------------
# The request log


def read_log(log_path: Path) -> list[dict]:
    """Parse the JSON Lines log. A torn last line (no newline yet) is skipped. Read as the judge
    reads any file in a step folder (`step_files`: no link, no FIFO, bounded)."""
    from labkit.judge import step_files

    data = step_files.read_bytes(log_path, what="the request log")
    lines = data.split(b"\n")
    # Everything after the last newline is a line still being written (or torn by a kill).
    complete = lines[:-1]
    records = []
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except ValueError as exc:
            raise ValueError(f"{log_path}: line {number} is not valid JSON: {exc}") from None
    return records


def _open_log(path: Path) -> int | None:
    """The judge's descriptor for the log's copy on disk (None if it cannot be made: the
    records in memory are what the judge reads anyway)."""
    from labkit.judge import step_files

    try:
        return step_files.create(path)
    except OSError:
        return None


def _append_line(fd: int | None, record: dict) -> None:
    # One os.write on the judge's own O_APPEND descriptor: the line lands whole and is visible
    # to readers at once. Whatever a child does to the name afterwards, this fd is the judge's.
    if fd is None:
        return
    data = (json.dumps(record) + "\n").encode("ascii")
    with contextlib.suppress(OSError):
        os.write(fd, data)


@dataclass(frozen=True)
class EventFault:
    """How the warehouse treats every delivery of one event ID.

    `unavailable`: 503, not applied, for the first `times` deliveries (a transient failure);
    `refused`: 422 `{"error": "unprocessable", "reason": reason}`, not applied, until lifted
    (a permanent one); `slow`: applied, then the ACK after `seconds`.
    """

    mode: str
    times: int = 0
    reason: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in EVENT_FAULT_MODES:
            raise ValueError(f"unknown event fault {self.mode!r}; known: {', '.join(EVENT_FAULT_MODES)}")
        if self.mode == "unavailable" and (type(self.times) is not int or self.times < 1):
            raise ValueError(f"an unavailable fault needs times >= 1, got {self.times!r}")
        if self.mode == "slow" and (isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float))
                                    or not math.isfinite(self.seconds) or self.seconds < 0):
            raise ValueError(f"a slow fault needs finite seconds >= 0, got {self.seconds!r}")


def unavailable(times: int) -> EventFault:
    return EventFault("unavailable", times=times)


def refused(reason: str) -> EventFault:
    return EventFault("refused", reason=reason)


def slow(seconds: float) -> EventFault:
    return EventFault("slow", seconds=seconds)


def _check_faults(faults: Sequence[str]) -> tuple[str, ...]:
    if isinstance(faults, str):
        raise TypeError("faults must be a sequence of fault names, not a single string")
    faults = tuple(faults)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    return faults


def _check_event_fault(fault: EventFault) -> EventFault:
    if not isinstance(fault, EventFault):
        raise TypeError(f"event faults are EventFault values, not {type(fault).__name__}")
    return fault


# ---------------------------------------------------------------------------------------------
# Shared server state


@dataclass
class _State:
    log_path: Path
    log_fd: int | None
    faults: tuple[str, ...]
    receive: Receive | None
    open_sink: OpenSink | None
    sink_path: Path | None
    slow_seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    log_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    n: int = 0  # requests seen (all paths and methods)
    fault_index: int = 0  # POST /events requests seen
    inbox: dict[str, str] = field(default_factory=dict)  # built-in inbox: id -> canonical body
    event_faults: dict[str, EventFault] = field(default_factory=dict)
    deliveries: dict[str, int] = field(default_factory=dict)  # POST /events per event ID
    # What `Warehouse.requests()` returns: the judge's own memory, not the file in a folder a
    # sandboxed child can write to (the file stays, for people reading a run).
    records: list[dict] = field(default_factory=list)
    # With the student's receive in a child: the judge's channel to it (`_Remote`).
    remote: _Remote | None = None
    # What the judge looks at the moment a request arrives (`start_warehouse(on_request=...)`).
    on_request: Callable[[], Any] | None = None

    def next_n(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    def take_fault(self) -> str:
        with self.lock:
            i = self.fault_index
            self.fault_index += 1
        return self.faults[i] if i < len(self.faults) else "none"

    def event_fault(self, event_id: str) -> EventFault | None:
        """Count one delivery of `event_id`; the fault that applies to this delivery, if any."""
        with self.lock:
            n = self.deliveries[event_id] = self.deliveries.get(event_id, 0) + 1
            fault = self.event_faults.get(event_id)
        if fault is not None and fault.mode == "unavailable" and n > fault.times:
            return None
        return fault

    def log(self, record: dict) -> None:
        with self.log_lock:
            self.records.append(dict(record))
            _append_line(self.log_fd, record)

    def close_log(self) -> None:
        with self.log_lock:
            if self.log_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.log_fd)
                self.log_fd = None

    def apply(self, event: dict) -> tuple[str, str | None]:
        """Apply one event; returns (outcome, error message or None)."""
        if self.remote is not None:
            return self.remote.apply(event)
        if self.receive is None:
            return self._apply_builtin(event)
        return self._apply_receive(event)

    def _apply_builtin(self, event: dict) -> tuple[str, str | None]:
        event_id = event.get("id")
        if not isinstance(event_id, str):
            return "bad_request", "event has no string 'id'"
        body = json.dumps(event, sort_keys=True, separators=(",", ":"))
        with self.lock:
            known = self.inbox.get(event_id)
            if known is None:
                self.inbox[event_id] = body
                return "applied", None
        return ("duplicate", None) if known == body else ("conflict", "different body, same id")

    def _apply_receive(self, event: dict) -> tuple[str, str | None]:
        # The lab's connections are not shared across threads: open one here, in the thread
        # that calls receive, and close it before answering. No commit on receive's behalf:
        # an uncommitted change must be lost, so the judge sees it missing from the sink.
        assert self.receive is not None
        assert self.open_sink is not None
        from labkit.probe.warehouse import apply  # the one reading of receive's outcome

        return apply(self.open_sink, self.receive, self.sink_path, event)


# ---------------------------------------------------------------------------------------------
# HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a thread stuck in student code must not block interpreter exit
    block_on_close = False  # we join our own threads, with a timeout (ThreadingMixIn's has none)

    def __init__(self, state: _State) -> None:
        self.state = state
        self.active: set[socket.socket] = set()  # request sockets not yet closed
        self.threads: list[threading.Thread] = []
        self.conn_count = 0
        super().__init__(("127.0.0.1", 0), _Handler)
        self.timeout = POLL_INTERVAL

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup we neither need nor want;
        # the port comes from below the kernel's range (`labkit.judge.ports`)
        if self.allow_reuse_address:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server_address = (self.server_address[0], ports.bind(self.socket, self.server_address[0]))
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:
        # Like ThreadingMixIn's, plus: named threads (tests look for leftovers by name) and a
        # registry of threads and sockets that close() can wake and join.
        with self.state.lock:
            thread = None
            if not self.state.stopping.is_set():
                self.conn_count += 1
                thread = threading.Thread(
                    target=self.process_request_thread, args=(request, client_address),
                    name=f"warehouse-{self.server_port}-conn-{self.conn_count}", daemon=True)
                self.active.add(request)
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        if thread is None:
            self.shutdown_request(request)
        else:
            thread.start()

    def shutdown_request(self, request) -> None:
        # Under the lock, so close() never shuts down a socket object while it is closed here.
        with self.state.lock:
            self.active.discard(request)
            super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # the default prints a traceback to stderr, and the server must stay silent


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection
    timeout = SOCKET_TIMEOUT
    # Per-request facts for the log line; one request per handler instance.
    _n: int | None = None
    _t_start: float = 0.0
    _seen: Any = None  # what on_request observed when this request arrived
    _fault: str = "none"
    _event_id: str | None = None
    _body: str | None = None  # the raw POST body, for the judge's canonical-body check

    def log_message(self, *args: Any) -> None:
        pass  # silent: student-facing output must not carry our access log

    def _begin(self) -> None:
        if self._n is None:
            self._t_start = time.time()
            self._n = self.server.state.next_n()
            observe = self.server.state.on_request
            if observe is not None:
                try:  # before anything of the request is read or answered
                    self._seen = observe()
                except Exception as exc:  # the observer's own failure is evidence, not a crash
                    self._seen = {"error": repr(exc)}

    def _reply(self, outcome: str, response: str, status: int | None, body: bytes = b"", *,
               content_type: str = "application/json", headers: dict[str, str] | None = None,
               error: str | None = None) -> None:
        """Log the request, then send the answer (none when status is None).

        Logging first: once a client holds the answer, the judge can already read the line
        that explains it. t_end is therefore the moment the answer was about to be written.
        """
        self._begin()
        self.server.state.log({
            "n": self._n,
            "method": getattr(self, "command", None),
            "path": getattr(self, "path", None),
            "id": self._event_id,
            "body": self._body,
            "content_type": self.headers.get("Content-Type") if getattr(self, "headers", None) else None,
            "fault": self._fault,
            "token": self.headers.get(FENCE_HEADER) if getattr(self, "headers", None) else None,
            "outcome": outcome,
            "response": response,
            "status": status,
            "error": error,
            "t_start": self._t_start,
            "t_end": time.time(),
            **({"seen": self._seen} if self.server.state.on_request is not None else {}),
        })
        self.close_connection = True
        if status is None:
            return
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            pass  # the client went away (or close() shut the socket); the log says what we meant

    def _reply_error(self, outcome: str, status: int, error: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
        self._reply(outcome, str(status), status, _ERROR_BODIES[status], headers=headers,
                    error=error)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Reached only for requests the base class rejects itself (bad request line, unknown
        # method): logged and answered like any other refusal.
        code = int(code)
        self._reply("bad_request", str(code), code,
                    json.dumps({"error": message or "bad_request"}).encode(), error=message)

    def _not_served(self) -> None:
        if self.path == EVENTS_PATH:
            self._reply_error("bad_request", 405, headers={"Allow": "POST"})
        else:
            self._reply_error("bad_request", 404)

    def do_GET(self) -> None:
        # What urllib does with a 302 to a POST: a GET to the new place, without the body.
        # Answer it with an ACK-looking reply, so a client that follows redirects "succeeds"
        # although nothing was delivered (the trap this fault exists to show).
        self._begin()
        if self.path.startswith(REDIRECT_LOCATION + "?id="):
            self._event_id = self.path.split("?id=", 1)[1]
            self._reply("not_applied", "ack_after_redirect", 200,
                        json.dumps({"ack": self._event_id}).encode())
        else:
            self._not_served()

    do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_served

    def do_POST(self) -> None:
        self._begin()
        if self.path != EVENTS_PATH:
            self._not_served()
            return
        state = self.server.state
        self._fault = fault = state.take_fault()

        body, status, problem = self._read_body()
        if status is not None:
            self._reply_error("bad_request", status, problem)
            return
        self._body = body[:4096].decode("utf-8", "replace")
        event, problem = _parse_event(body)
        if event is not None and isinstance(event.get("id"), str):
            self._event_id = event["id"]  # logged even when the event is not applied

        if fault in ("redirect_302", "redirect_307"):
            target = REDIRECT_LOCATION + (f"?id={self._event_id}" if self._event_id else "")
            self._reply("not_applied", "redirect", int(fault[-3:]), b'{"moved": true}',
                        headers={"Location": target})
        elif fault == "status_500":
            self._reply("not_applied", "500", 500, _ERROR_BODIES[500])
        elif fault == "conflict_409":
            self._reply("not_applied", "409", 409, _ERROR_BODIES[409])
        elif event is None:
            self._reply_error("bad_request", 400, problem)
        else:
            per_event = state.event_fault(self._event_id) if fault == "none" and self._event_id else None
            if per_event is not None and per_event.mode != "slow":
                self._refuse(per_event)
                return
            outcome, error = state.apply(event)
            if outcome in ("applied", "duplicate"):
                delay = per_event.seconds if per_event is not None else None
                self._answer_accepted(outcome, str(event.get("id")), delay)
            else:
                self._reply_error(outcome, _OUTCOME_STATUS[outcome], error)

    def _refuse(self, fault: EventFault) -> None:
        """A per-event refusal: nothing is applied."""
        if fault.mode == "unavailable":
            self._fault = "unavailable_503"
            self._reply("not_applied", "503", 503, _ERROR_BODIES[503])
        else:
            self._fault = "refused_422"
            body = json.dumps({"error": "unprocessable", "reason": fault.reason}).encode()
            self._reply("not_applied", "422", 422, body, error=fault.reason[:MAX_ERROR_CHARS])

    def _read_body(self) -> tuple[bytes, int | None, str | None]:
        """Returns (body, error status or None, error message)."""
        if self.headers.get("Transfer-Encoding"):
            return b"", 400, "Transfer-Encoding is not supported; send Content-Length"
        raw = self.headers.get("Content-Length")
        try:
            length = int(raw) if raw is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            return b"", 400, f"missing or invalid Content-Length: {raw!r}"
        if length > MAX_BODY:
            # Read and discard a moderately oversized body: closing a socket with unread data
            # sends a reset, which can destroy the 413 before the client reads it.
            remaining = min(length, DRAIN_LIMIT)
            with contextlib.suppress(OSError):
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 65536))
                    if not chunk:
                        break
                    remaining -= len(chunk)
            return b"", 413, f"body of {length} bytes exceeds {MAX_BODY}"
        try:
            body = self.rfile.read(length)
        except OSError as exc:
            return b"", 400, _describe(exc)
        if len(body) != length:
            return b"", 400, f"body ended after {len(body)} of {length} bytes"
        return body, None, None

    def _answer_accepted(self, outcome: str, event_id: str, delay: float | None = None) -> None:
        """The ACK for an applied or duplicate event; `delay`: a per-event slow reply."""
        fault = self._fault
        ack = json.dumps({"ack": event_id}).encode()
        if delay is not None:
            self._fault = fault = "slow"
        if fault == "drop_after_commit":
            self._reply(outcome, "dropped", None)
            with contextlib.suppress(OSError):
                self.request.shutdown(socket.SHUT_RDWR)  # FIN without a byte of response
        elif fault == "slow":
            wait = self.server.state.slow_seconds if delay is None else delay
            if self.server.state.stopping.wait(wait):
                # close() interrupted the wait: nobody will get this answer.
                self._reply(outcome, "dropped", None, error="server closed during slow reply")
            else:
                self._reply(outcome, "slow_ack", 200, ack)
        elif fault == "wrong_id":
            wrong = json.dumps({"ack": f"{event_id}-other"}).encode()
            self._reply(outcome, "wrong_id", 200, wrong)
        elif fault == "oversized":
            padded = json.dumps({"ack": event_id, "pad": "x" * OVERSIZED_PAD}).encode()
            self._reply(outcome, "oversized", 200, padded)
        elif fault == "not_json":
            self._reply(outcome, "not_json", 200, b"ok", content_type="text/plain")
        else:
            self._reply(outcome, "ack", 200, ack)


def _parse_event(body: bytes) -> tuple[dict | None, str | None]:
    from labkit.limits import MAX_RECORD_DEPTH
    from labkit.values import too_deep

    if too_deep(body, MAX_RECORD_DEPTH):  # refused before a recursive parser sees it (64 KB of "[")
        return None, "event nested too deep"
    try:
        event = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError; 64 KB of "["
        return None, _describe(exc)
    if not isinstance(event, dict):
        return None, f"event must be a JSON object, got {type(event).__name__}"
    return event, None


# ---------------------------------------------------------------------------------------------
# In-process server


@dataclass
class Warehouse:
    """A running warehouse server. Use as a context manager, or call close()."""

    url: str
    port: int
    log_path: Path
    _server: _Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _closed: bool = field(default=False, repr=False)
    _close_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def requests(self) -> list[dict]:
        with self._server.state.log_lock:
            return [dict(r) for r in self._server.state.records]

    def lift(self, event_id: str) -> None:
        """The cause is fixed: deliveries of `event_id` are served normally from now on."""
        state = self._server.state
        with state.lock:
            state.event_faults.pop(event_id, None)

    def close(self) -> None:
        """Stop accepting, interrupt slow replies, shut open sockets, join threads (bounded)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        server = self._server
        state = server.state
        state.stopping.set()  # ends the accept loop and any `slow` wait
        self._thread.join(timeout=CLOSE_JOIN_SECONDS)
        server.server_close()  # the listening socket
        with state.lock:
            # Wake handlers blocked on a client that never finishes its request. Shutdown,
            # not close: the handler thread still owns the descriptor.
            for sock in server.active:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            threads = list(server.threads)
        deadline = time.monotonic() + CLOSE_JOIN_SECONDS
        for thread in threads:
            if thread.ident is not None:  # started (the accept thread may not have finished)
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        state.close_log()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def close_all(warehouses: Sequence[Warehouse]) -> None:
    """Close many servers in about the time of one: signal them all, then join each."""
    for wh in warehouses:
        wh._server.state.stopping.set()
    for wh in warehouses:
        wh.close()


def _serve(server: _Server) -> None:
    # Our own loop instead of serve_forever(): BaseServer.shutdown() waits without a timeout.
    while not server.state.stopping.is_set():
        try:
            server.handle_request()  # returns after one request or POLL_INTERVAL
        except OSError:
            # Only a closed listening socket gets here; stop quietly (a thread traceback
            # would land on the stderr of whoever runs the judge).
            break


def start_warehouse(
    log_path: Path,
    faults: Sequence[str] = (),
    *,
    receive: Receive | None = None,
    open_sink: OpenSink | None = None,
    sink_path: Path | None = None,
    slow_seconds: float = 3.0,
    event_faults: dict[str, EventFault] | None = None,
    on_request: Callable[[], Any] | None = None,
) -> Warehouse:
    """Start a warehouse on 127.0.0.1 and an ephemeral port, serving in background threads.

    `faults[i]` applies to the (i+1)-th `POST /events`; later requests are served normally.
    `event_faults[id]` applies to every delivery of that event ID (a positional fault wins).
    With `receive` and `open_sink` (and `sink_path`), each request opens its own sink
    connection in the handler thread; without them a built-in in-memory inbox is used.
    `on_request()` is called in the judge's process the moment each request arrives, before its
    body is read; what it returns is the request's `seen` in the log (lab 03's final check reads
    how far each outbox's audit had got: every later entry was written after this POST arrived).
    """
    faults = _check_faults(faults)
    if (receive is None) != (open_sink is None):
        raise ValueError("give both receive and open_sink, or neither")
    if receive is not None and sink_path is None:
        raise ValueError("sink_path is required with receive/open_sink")
    if (isinstance(slow_seconds, bool) or not isinstance(slow_seconds, (int, float))
            or not math.isfinite(slow_seconds) or slow_seconds < 0):
        raise ValueError(f"slow_seconds must be a finite number >= 0, got {slow_seconds!r}")
    log_path = Path(log_path)
    state = _State(
        log_path=log_path, log_fd=_open_log(log_path),  # exists (empty) as soon as the server does
        faults=faults, receive=receive, open_sink=open_sink,
        sink_path=Path(sink_path) if sink_path is not None else None,
        slow_seconds=float(slow_seconds),
        event_faults={str(k): _check_event_fault(v) for k, v in (event_faults or {}).items()},
        on_request=on_request,
    )
    return _launch(state)


def _launch(state: _State) -> Warehouse:
    try:
        server = _Server(state)
    except BaseException:
        state.close_log()
        raise
    port = server.server_port
    thread = threading.Thread(target=_serve, args=(server,), name=f"warehouse-{port}-accept",
                              daemon=True)
    thread.start()
    return Warehouse(url=f"http://127.0.0.1:{port}{EVENTS_PATH}", port=port, log_path=state.log_path,
                     _server=server, _thread=thread)


# ---------------------------------------------------------------------------------------------
# The student's receive in a judged child, behind the judge's own front

CHILD_PROBE = "labkit.probe.warehouse:serve_receive"
RECEIVE_TIMEOUT = 30.0  # one receive call; far above any check's publisher timeout
_CHILD_OUTCOMES = ("applied", "duplicate", "conflict", "bad_request", "error")


class _Remote:
    """The front's channel to the child running the student's receive: one event at a time
    on the child's private request pipe (`labkit.judge.child.ChildSession`: replies parsed
    bounded in size and depth). Never raises: whatever the child does is an outcome."""

    def __init__(self, session: Any, timeout: float = RECEIVE_TIMEOUT) -> None:
        self.session = session
        self.timeout = timeout
        self.lock = threading.Lock()

    def apply(self, event: dict) -> tuple[str, str | None]:
        try:
            with self.lock:
                reply = self.session.call({"event": event}, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - e.g. an event json cannot write; never the judge's crash
            return "error", f"the warehouse could not hand the event to your receive: {_describe(exc)}"
        try:
            return _answer(reply)
        except Exception as exc:  # noqa: BLE001 - whatever the child wrote, the judge answers 500 and logs it
            return "error", f"the process running your receive sent an answer the judge cannot read ({_describe(exc)})"


def _answer(reply: Any) -> tuple[str, str | None]:
    """(outcome, error) from the child's reply; anything else is the child's failure."""
    if not isinstance(reply, dict):
        return "error", f"the process running your receive sent an answer the judge cannot read: {type(reply).__name__}"
    outcome = reply.get("outcome")
    if reply.get("event") != "reply":  # ChildSession's own word: how the child ended, it never answered
        outcome = outcome if isinstance(outcome, dict) else {}
        kind = outcome.get("kind")
        if kind == "timed_out":
            return "error", (f"your receive did not answer within {outcome.get('seconds')} s; the judge stopped "
                             "the process running it")
        if kind == "aborted":
            error = outcome.get("error") if isinstance(outcome.get("error"), dict) else {}
            return "error", f"the process running your receive stopped: {error.get('type')}: " \
                            f"{str(error.get('message'))[:300]}"
        if kind == "memory_limit":
            return "error", "the process running your receive was killed by the memory limit before it answered"
        return "error", f"the process running your receive ended (exit code {outcome.get('exit_code')}) " \
                        "before it answered"
    error = reply.get("error")
    if isinstance(outcome, str) and outcome in _CHILD_OUTCOMES and (error is None or isinstance(error, str)):
        if outcome in ("applied", "duplicate"):
            return outcome, None
        return outcome, (error or "")[:MAX_ERROR_CHARS] or None
    shown = json.dumps(reply)[:200]
    return "error", f"the process running your receive sent an answer the judge cannot read: {shown}"


class WarehouseProcess:
    """A warehouse whose `receive` is the student's, run in a judged child.

    The HTTP front (port, faults, log) is the judge's own (`Warehouse`); `proc` is the child
    that runs `open_sink` + `receive`. `close()` SIGKILLs the child's whole sandbox from outside
    first (`child.kill_sandbox`: no atexit or handler of the student's module runs before the
    judge reads the sink), then stops the front. `stdout`/`stderr`: what the child printed
    (capped), once closed.
    """

    def __init__(self, front: Warehouse, session: Any, stack: contextlib.ExitStack, marker: str) -> None:
        self._front = front
        self._session = session
        self._stack = stack
        self.marker = marker
        self.url, self.port, self.log_path = front.url, front.port, front.log_path
        self.proc: subprocess.Popen = session.proc
        self.stdout = ""
        self.stderr = ""
        self._closed = False

    def requests(self) -> list[dict]:
        return self._front.requests()

    def close(self) -> None:
        """Idempotent."""
        if self._closed:
            return
        self._closed = True
        from labkit.judge.child import kill_sandbox

        self._front._server.state.stopping.set()  # no new request is taken from here on
        try:
            kill_sandbox(self.proc, self.marker)
        finally:
            self._front.close()
            self._stack.close()  # the session: its group and marked escapees, its output
            self.stdout, self.stderr = self._session.run.stdout, self._session.run.stderr

    def __enter__(self) -> WarehouseProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def spawn_warehouse(
    module_path: Path,
    sink_path: Path,
    log_path: Path,
    workdir: Path,
    faults: Sequence[str] = (),
    ready_timeout: float = STEP_TIMEOUT,  # the import budget every judged child has
    *,
    slow_seconds: float = 3.0,
    marker: str | None = None,
    module_name: str = "worker",
    event_faults: dict[str, EventFault] | None = None,
    receive_timeout: float = RECEIVE_TIMEOUT,
) -> WarehouseProcess:
    """Start the judge's front and a judged child that runs the student's `open_sink` and
    `receive` (imported from `module_path`, in `workdir`), and wait at most `ready_timeout` until
    the child has imported the module and found both functions. Raises WarehouseStartError
    (saying whose fault it is) if it does not come up."""
    from labkit.judge.child import child_session, last_line
    from labkit.sandbox import reaper

    faults = _check_faults(faults)
    if (isinstance(slow_seconds, bool) or not isinstance(slow_seconds, (int, float))
            or not math.isfinite(slow_seconds) or slow_seconds < 0):
        raise ValueError(f"slow_seconds must be a finite number >= 0, got {slow_seconds!r}")
    marker = marker or reaper.new_marker()
    deadline = time.monotonic() + ready_timeout
    stack = contextlib.ExitStack()
    try:
        session = stack.enter_context(child_session(
            Path(module_path), workdir=Path(workdir), timeout=ready_timeout, marker=marker,
            module_name=module_name, probe=CHILD_PROBE, args={"sink": str(Path(sink_path).resolve())}))
        ready = session.call({}, timeout=max(0.1, deadline - time.monotonic())) if session.imported else None
        if ready is None or ready.get("ready") is not True:
            run, ended = session.run, session.ended or (ready or {}).get("outcome") or {}
            ended = ended if isinstance(ended, dict) else {}
            stack.close()  # collects what the child printed
            if run.import_error is not None or ended.get("kind") == "aborted":
                error = run.import_error or ended.get("error")
                error = error if isinstance(error, dict) else {}
                raise WarehouseStartError(f"worker module failed to import: {error.get('type', 'Error')}: "
                                          f"{str(error.get('message', ''))[:MAX_ERROR_CHARS]}")
            if ended.get("kind") == "died" or (run.exit_code is not None and not run.timed_out):
                tail = last_line(run.stderr) if run.stderr.strip() else ""
                raise WarehouseStartError(
                    f"warehouse process exited with code {run.exit_code} before it was ready"
                    + (f"; stderr ends with: {tail}" if tail else ""))
            if not run.reached_module:  # only the course's code ran: never the student's fault
                raise WarehouseStartError(f"the warehouse's process did not get as far as loading your module "
                                          f"within {ready_timeout:g} s: the machine is too busy, not your code")
            raise WarehouseStartError(f"warehouse process was not ready within {ready_timeout:g} s")
        log_path = Path(log_path)
        state = _State(log_path=log_path, log_fd=_open_log(log_path), faults=faults, receive=None,
                       open_sink=None, sink_path=Path(sink_path), slow_seconds=float(slow_seconds),
                       event_faults={str(k): _check_event_fault(v) for k, v in (event_faults or {}).items()},
                       remote=_Remote(session, receive_timeout))
        front = _launch(state)
    except BaseException:
        stack.close()
        raise
    return WarehouseProcess(front, session, stack, marker)
