"""Lab `vending`, judge side: the event-feed TCP server the judge runs for steps 6, 7 and final.

The feed runs in the judge's process, never runs student code, and lives in
background threads of its own on 127.0.0.1 and an ephemeral port.  Protocol, per
connection::

    client -> RESUME <last>\\n
    server -> EVENT <seq> <delta>\\n      (every retained event with seq > last)
    client -> ACK <seq>\\n                (lock-step: one ACK before the next line)
    ...
    server closes after the last ACK (the client then reads EOF)

Faults are consumed one per *connection*, in connection order: connection 1 gets
``faults[0]``, connection 2 gets ``faults[1]``, ..., then ``"none"``.

Everything the server sees or does is recorded in a thread-safe journal of dicts,
each with ``"t"`` (``time.time()``), ``"conn"`` (1-based connection number) and
``"kind"``. With ``on_ack``, each ACK entry also holds what that callback observed at the
very moment the ACK arrived (e.g. the judge reading the client's store with its own
connection: "after the ACK, another connection already sees the commit").  The server never prints: peer resets and protocol errors are journal
entries, not exceptions.

Blocking sockets and threads: one accept thread plus one thread per connection.
Every wait is sliced (``_SLICE`` seconds) so ``close()`` is noticed quickly, and
``close()`` joins every thread and closes every socket within a bounded time.
"""

from __future__ import annotations

import math
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.judge import ports

__all__ = ["FAULTS", "Feed", "start_feed"]

FAULTS = (
    "none",
    "drop_mid_stream",
    "torn_last_line",
    "stall",
    "conflicting_duplicate",
    "skip_seq",
    "overlong_line",
)

HOST = "127.0.0.1"
MAX_LINE = 64  # longest client line (RESUME / ACK) accepted, LF included
SEQ_MAX = 2147483647
DELTA_MAX = 1000
OVERLONG_LEN = 100
_SLICE = 0.05  # granularity of every wait, so close() is noticed quickly
_CLOSE_BUDGET = 3.0  # upper bound for close() to join the threads

_RESUME_RE = re.compile(rb"RESUME (-1|0|[1-9][0-9]{0,9})\n")
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class _Stopped(Exception):
    """The feed is closing."""


class _Eof(Exception):
    """The peer closed its side; ``partial`` holds unterminated bytes, if any."""

    def __init__(self, partial: bytes = b"") -> None:
        super().__init__(partial)
        self.partial = partial


class _Timeout(Exception):
    """A bounded wait ran out."""


class _TooLong(Exception):
    """A client line exceeded ``MAX_LINE`` bytes without a LF."""

    def __init__(self, head: bytes) -> None:
        super().__init__(head)
        self.head = head


def _text(raw: bytes) -> str:
    return raw.decode("ascii", "backslashreplace")


class _Conn:
    """A connected socket with a line buffer and sliced, interruptible waits."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock = sock
        self.stop = stop
        self.buf = bytearray()

    def _pump(self, deadline: float) -> None:
        """Wait (until ``deadline``) for more bytes and append them to the buffer."""
        while True:
            if self.stop.is_set():
                raise _Stopped
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout
            readable, _, _ = select.select([self.sock], [], [], min(_SLICE, left))
            if not readable:
                continue
            data = self.sock.recv(4096)
            if not data:
                if self.stop.is_set():
                    raise _Stopped
                raise _Eof(bytes(self.buf))
            self.buf += data
            return

    def readline(self, timeout: float) -> bytes:
        """One LF-terminated line (LF included), at most ``MAX_LINE`` bytes."""
        deadline = time.monotonic() + timeout
        while True:
            nl = self.buf.find(b"\n")
            if 0 <= nl < MAX_LINE:
                line = bytes(self.buf[: nl + 1])
                del self.buf[: nl + 1]
                return line
            if nl >= MAX_LINE or len(self.buf) > MAX_LINE:
                raise _TooLong(bytes(self.buf[: MAX_LINE + 1]))
            self._pump(deadline)

    def idle(self, seconds: float) -> None:
        """Send nothing for ``seconds``; raises ``_Eof`` if the peer leaves meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._pump(deadline)
            except _Timeout:
                return

    def send(self, raw: bytes) -> None:
        if self.stop.is_set():
            raise _Stopped
        self.sock.sendall(raw, _SEND_FLAGS)


class _Server:
    def __init__(
        self,
        events: list[tuple[int, int]],
        faults: tuple[str, ...],
        stall_seconds: float,
        io_timeout: float,
        on_ack: Callable[[int, int], Any] | None = None,
    ) -> None:
        self.events = events
        self.on_ack = on_ack
        self.faults = faults
        self.stall_seconds = stall_seconds
        self.io_timeout = io_timeout
        self.lock = threading.Lock()
        self.idle_cond = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.closed = False
        self.log: list[dict[str, Any]] = []
        self.resume_list: list[int] = []
        self.ack_list: list[int] = []
        self.sent_seqs: list[int] = []
        self.count = 0
        self.open = 0
        self.threads: list[threading.Thread] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ports.bind(self.listener, HOST)
            self.listener.listen(16)
            self.listener.setblocking(False)
            self.port = self.listener.getsockname()[1]
            self.acceptor = threading.Thread(
                target=self._accept_loop, name=f"labkit-feed-{self.port}-accept", daemon=True
            )
            self.acceptor.start()
        except BaseException:
            self.listener.close()
            raise

    # -- journal -----------------------------------------------------------------
    def record(self, conn: int, kind: str, **extra: Any) -> None:
        entry: dict[str, Any] = {"t": time.time(), "conn": conn, "kind": kind}
        entry.update(extra)
        with self.lock:
            self.log.append(entry)
            if kind == "resume":
                self.resume_list.append(extra["last"])
            elif kind == "ack":
                self.ack_list.append(extra["seq"])
            elif kind == "sent":
                self.sent_seqs.append(extra["seq"])

    # -- accepting ---------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self.stop.is_set():
            try:
                readable, _, _ = select.select([self.listener], [], [], _SLICE)
            except (OSError, ValueError):
                return
            if not readable:
                continue
            with self.lock:
                if self.stop.is_set():
                    return
                try:
                    sock, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError:
                    return
                self.count += 1
                k = self.count
                self.open += 1
                fault = self.faults[k - 1] if k <= len(self.faults) else "none"
                self.log.append({"t": time.time(), "conn": k, "kind": "connect"})
                thread = threading.Thread(
                    target=self._serve,
                    args=(sock, k, fault),
                    name=f"labkit-feed-{self.port}-conn-{k}",
                    daemon=True,
                )
                self.threads.append(thread)
                try:
                    thread.start()
                except RuntimeError:  # cannot start a thread: give the connection up
                    self.threads.remove(thread)
                    self.open -= 1
                    sock.close()
                    self.log.append(
                        {"t": time.time(), "conn": k, "kind": "closed", "reason": "error"}
                    )
                    self.idle_cond.notify_all()

    # -- one connection ----------------------------------------------------------
    def _serve(self, sock: socket.socket, k: int, fault: str) -> None:
        extra: dict[str, Any] = {}
        try:
            sock.setblocking(True)
            sock.settimeout(max(self.io_timeout, 1.0))  # bounds sendall; reads use select
            reason = self._session(_Conn(sock, self.stop), k, fault)
        except _Stopped:
            reason = "shutdown"
        except _Timeout:
            reason = "timeout"
        except _Eof as exc:
            reason = "shutdown" if self.stop.is_set() else "eof"
            if exc.partial:
                extra["partial"] = _text(exc.partial)
        except OSError as exc:  # ConnectionResetError, BrokenPipeError, TimeoutError...
            if self.stop.is_set():
                reason = "shutdown"
            elif isinstance(exc, TimeoutError):
                reason = "timeout"
            else:
                reason = "reset"
        except Exception as exc:  # a bug here must show in the journal, never print
            reason = "error"
            extra["error"] = repr(exc)
        finally:
            try:
                sock.close()
            except OSError:
                pass
        self.record(k, "closed", reason=reason, **extra)
        with self.lock:
            self.open -= 1
            self.idle_cond.notify_all()

    def _session(self, c: _Conn, k: int, fault: str) -> str:
        try:
            hello = c.readline(self.io_timeout)
        except _TooLong as exc:
            self.record(k, "bad_hello", line=_text(exc.head))
            return "bad_hello"
        m = _RESUME_RE.fullmatch(hello)
        if m is None or int(m.group(1)) > SEQ_MAX:
            self.record(k, "bad_hello", line=_text(hello))
            return "bad_hello"
        last = int(m.group(1))
        self.record(k, "resume", last=last)
        # The contract: send everything after the client's cursor, and resend whatever this
        # feed sent but never saw ACKed (a client killed between its commit and its ACK gets
        # it again, although its RESUME says it has it).
        with self.lock:
            unacked = set(self.sent_seqs) - set(self.ack_list)
        pending = [(s, d) for s, d in self.events if s > last or s in unacked]

        if fault == "stall":
            self.record(k, "fault", fault=fault, seconds=self.stall_seconds)
            c.idle(self.stall_seconds)
            return "fault"
        if fault == "overlong_line":
            raw = b"EVENT 1 " + b"9" * (OVERLONG_LEN - 9) + b"\n"
            self.record(k, "fault", fault=fault, raw=_text(raw))
            c.send(raw)
            return "fault"
        if fault == "skip_seq":
            if len(pending) >= 2:
                self.record(k, "fault", fault=fault, skipped=pending[0][0])
                pending = pending[1:]
            else:  # nothing left to skip *to*: a gap cannot be shown
                self.record(k, "fault", fault=fault, applied=False)
        if fault == "torn_last_line":
            if pending:
                seq, delta = pending[0]
                raw = f"EVENT {seq} {delta}".encode("ascii")
                self.record(k, "fault", fault=fault, seq=seq, raw=_text(raw))
                c.send(raw)
                return "fault"
            self.record(k, "fault", fault=fault, applied=False)

        for i, (seq, delta) in enumerate(pending):
            if fault == "drop_mid_stream" and i == 1:
                self.record(k, "fault", fault=fault, before=seq)
                return "fault"
            reason = self._send_event(c, k, seq, delta)
            if reason:
                return reason
            if fault == "conflicting_duplicate" and i == 0:
                other = delta + 1 if delta + 1 <= DELTA_MAX else delta - 1
                self.record(k, "fault", fault=fault, seq=seq, delta=other)
                reason = self._send_event(c, k, seq, other)
                if reason:
                    return reason
        needed = {"drop_mid_stream": 2, "conflicting_duplicate": 1}.get(fault, 0)
        if len(pending) < needed:  # too few events for the fault to show
            self.record(k, "fault", fault=fault, applied=False)
        return "done"

    def _send_event(self, c: _Conn, k: int, seq: int, delta: int) -> str | None:
        """Send one line and wait for its ACK; a close reason, or None to go on."""
        raw = f"EVENT {seq} {delta}\n".encode("ascii")
        self.record(k, "sent", seq=seq, delta=delta, raw=_text(raw))
        c.send(raw)
        try:
            line = c.readline(self.io_timeout)
        except _TooLong as exc:
            self.record(k, "bad_ack", line=_text(exc.head), expected=seq)
            return "bad_ack"
        if line != f"ACK {seq}\n".encode("ascii"):
            self.record(k, "bad_ack", line=_text(line), expected=seq)
            return "bad_ack"
        if self.on_ack is None:
            self.record(k, "ack", seq=seq)
            return None
        try:  # before the next line goes out, so nothing the client does later can blur it
            seen = self.on_ack(k, seq)
        except Exception as exc:  # the observer's own failure is evidence, not a crash
            seen = {"error": repr(exc)}
        self.record(k, "ack", seq=seq, observed=seen)
        return None

    # -- public helpers ----------------------------------------------------------
    def _pending_accept(self) -> bool:
        try:
            readable, _, _ = select.select([self.listener], [], [], 0)
        except (OSError, ValueError):
            return False
        return bool(readable)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        with self.lock:
            while True:
                # A connection the kernel completed but we have not accepted yet
                # counts as open: the client already believes it is connected.
                if self.open == 0 and (self.closed or not self._pending_accept()):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.idle_cond.wait(min(_SLICE, left))

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.stop.set()
        deadline = time.monotonic() + _CLOSE_BUDGET
        self.acceptor.join(max(0.0, deadline - time.monotonic()))
        self.listener.close()
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Feed:
    """A running feed server; ``close()`` it (or use it as a context manager)."""

    host: str
    port: int
    _srv: _Server = field(repr=False, compare=False)

    def close(self) -> None:
        """Stop accepting, end every connection, join every thread. Idempotent."""
        self._srv.close()

    def journal(self) -> list[dict]:
        """A copy of everything that happened, in order."""
        with self._srv.lock:
            return [dict(e) for e in self._srv.log]

    def resumes(self) -> list[int]:
        """The ``n`` of every ``RESUME n`` received, in order."""
        with self._srv.lock:
            return list(self._srv.resume_list)

    def acks(self) -> list[int]:
        """Every seq ACKed, in order, duplicates included."""
        with self._srv.lock:
            return list(self._srv.ack_list)

    def connections(self) -> int:
        """How many connections have been accepted so far."""
        with self._srv.lock:
            return self._srv.count

    def wait_idle(self, timeout: float) -> bool:
        """True as soon as no connection is open (or pending accept), else False."""
        return self._srv.wait_idle(timeout)

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_seconds(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def start_feed(
    events: Sequence[tuple[int, int]],
    faults: Sequence[str] = (),
    *,
    stall_seconds: float = 5.0,
    first_seq: int | None = None,
    io_timeout: float = 5.0,
    on_ack: Callable[[int, int], Any] | None = None,
) -> Feed:
    """Start a feed serving ``events`` (consecutive ascending ``(seq, delta)``).

    ``faults``: one entry of ``FAULTS`` per connection, in connection order.
    ``first_seq``: the start of the retained log; events with a smaller seq are
    dropped from it (a feed that "forgot" them), default: the first event's seq.
    ``io_timeout``: the bound on waiting for the RESUME line and for each ACK.
    ``on_ack(conn, seq)``: called in the feed's thread the moment a well-formed ACK arrives,
    before anything else is sent on that connection; its result is the ACK entry's
    ``"observed"``. Keep it short and bounded (it delays the next line).
    """
    log: list[tuple[int, int]] = []
    for item in events:
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValueError(f"event must be a (seq, delta) tuple: {item!r}")
        seq, delta = item
        if not (_is_int(seq) and _is_int(delta)) or not 0 <= seq <= SEQ_MAX:
            raise ValueError(f"bad event: {item!r}")
        if log and seq != log[-1][0] + 1:
            raise ValueError(f"events must have consecutive seqs: {log[-1][0]} then {seq}")
        log.append((seq, delta))
    if first_seq is not None:
        if not _is_int(first_seq) or not 0 <= first_seq <= SEQ_MAX:
            raise ValueError(f"bad first_seq: {first_seq!r}")
        if log and not log[0][0] <= first_seq <= log[-1][0] + 1:
            raise ValueError(f"first_seq {first_seq} outside the log {log[0][0]}..{log[-1][0] + 1}")
        log = [e for e in log if e[0] >= first_seq]
    fault_list = tuple(faults) if not isinstance(faults, str) else (faults,)
    for f in fault_list:
        if f not in FAULTS:
            raise ValueError(f"unknown fault {f!r}; known: {FAULTS}")
    if not _is_seconds(stall_seconds):
        raise ValueError(f"bad stall_seconds: {stall_seconds!r}")
    if not _is_seconds(io_timeout) or io_timeout == 0:
        raise ValueError(f"bad io_timeout: {io_timeout!r}")
    srv = _Server(log, fault_list, float(stall_seconds), float(io_timeout), on_ack)
    return Feed(HOST, srv.port, srv)
