"""The judge's own eyes at the moments a rule is about, while a child runs the student's code.

A child's report is evidence about return values only: student code runs in the same
process as the probe and could patch it. So where a verdict rests on *state* — can another
connection write right now, is this row already marked, did the client close its socket —
the probe makes a real HTTP request to this endpoint at that moment ("after this call",
"inside send", "inside after_delivery"), and the handler, in the judge's process, looks for
itself: with its own SQLite connections, its own servers' records. What it saw is kept as a
`Sighting`; what the child said is kept beside it, labelled as the child's.

A student who patches the probe's request away simply leaves no sighting, and the case fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.judge import ports, tcp_table

MAX_REQUEST = 256 * 1024  # a sighting's request body (an encoded event, at most)
MAX_HEAD_LINE = 8192
MAX_HEADERS = 32
HANDLER_TIMEOUT = 5.0  # a child that stalls mid-request cannot hold a handler thread
JOIN_SECONDS = 1.0

# look(case, point, said) -> (what the judge saw, the answer the child gets)
Look = Callable[[str, str, dict], tuple[dict, dict]]
_asking = threading.local()  # (child's address, ours) of the connection this handler thread serves


@dataclass
class Sighting:
    case: str
    point: str  # "after" a call, "send", "hook"
    t: float
    said: dict  # what the child sent along (its claim: values only)
    saw: dict  # what the judge observed itself


@dataclass
class Witness:
    """A loopback endpoint in the judge's process; `look` decides what to observe and answer."""

    look: Look
    url: str = ""
    _sightings: list[Sighting] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _server: socketserver.TCPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Witness:
        witness = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = HANDLER_TIMEOUT

            def handle(self):
                try:
                    said = _read_post(self.rfile)
                    case, point = str(said.get("case", "")), str(said.get("point", ""))
                except (ValueError, OSError):
                    self._answer(400, {"error": "bad sighting"})
                    return
                _asking.ends = (self.client_address, self.server.server_address)
                try:
                    saw, answer = witness.look(case, point, said)
                except Exception as exc:  # a judge-side look that fails must still answer the child
                    saw, answer = {"look_error": f"{type(exc).__name__}: {exc}"}, {}
                with witness._lock:
                    witness._sightings.append(Sighting(case, point, time.time(), said, saw))
                self._answer(200, answer)

            def _answer(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                head = (f"HTTP/1.0 {status} {'OK' if status == 200 else 'Bad Request'}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
                try:
                    self.wfile.write(head.encode() + body)
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True

            def server_bind(self):
                self.server_address = ("127.0.0.1", ports.bind(self.socket))

            def handle_error(self, request, client_address):
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.timeout = 0.05
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/see"
        self._thread = threading.Thread(target=self._serve, name="judge-witness", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._server.handle_request()
            except OSError:
                break

    def sightings(self, case: str | None = None, point: str | None = None) -> list[Sighting]:
        with self._lock:
            return [s for s in self._sightings
                    if (case is None or s.case == case) and (point is None or s.point == point)]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._server is not None:
            # wake the serving loop now rather than at its next poll (up to 50 ms of every step)
            with contextlib.suppress(OSError):
                socket.create_connection(self._server.server_address[:2], timeout=JOIN_SECONDS).close()
        if self._thread is not None:
            self._thread.join(JOIN_SECONDS)
        if self._server is not None:
            self._server.server_close()

    def __enter__(self) -> Witness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_post(rfile) -> dict:
    """A sighting's request: one HTTP POST (as `labkit.probe.see` sends it) read with a bounded
    line and header count; its JSON body, which must be an object. http.server's parser (the
    email package, a Date header per answer) was a tenth of a judge's time in the catalogue."""
    if not _line(rfile).startswith(b"POST "):
        raise ValueError("not a POST")
    length = 0
    for _ in range(MAX_HEADERS):
        line = _line(rfile)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    else:
        raise ValueError("too many headers")
    said = json.loads(rfile.read(min(max(length, 0), MAX_REQUEST)) or b"{}")
    if not isinstance(said, dict):
        raise ValueError("not a JSON object")
    return said


def _line(rfile) -> bytes:
    line = rfile.readline(MAX_HEAD_LINE)
    if len(line) == MAX_HEAD_LINE and not line.endswith(b"\n"):
        raise ValueError("a line too long")
    return line


def asker_holds(path) -> int | None:
    """Inside a `look`: how many descriptors the process asking for this sighting holds open on
    the file at `path`, as the kernel lists them (/proc), or None where the judge cannot see them.

    The asker is found from the connection it made: its socket's inode in the kernel's TCP table
    (the child shares the judge's network), then the process holding that socket."""
    ends = getattr(_asking, "ends", None)
    try:
        target = os.stat(path)
    except OSError:
        return None
    pid = _socket_owner(*ends) if ends else None
    if pid is None:
        return None
    held = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in names:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")  # the open file itself, in whatever mount namespace
        except OSError:
            continue
        held += (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino)
    return held


def _socket_owner(local: tuple, remote: tuple) -> int | None:
    """The pid holding the IPv4 TCP socket connected from `local` to `remote`.

    The socket is found in the kernel's table (`tcp_table`, by netlink; /proc/net/tcp where
    that is refused), and the processes of the socket's own uid are looked through first,
    newest first; the rest only when none of them holds it."""
    try:
        found = tcp_table.owner(local, remote)
    except tcp_table.Unavailable:
        found = _proc_net_tcp_row(local, remote)
    if found is None or not found.inode:
        return None
    wanted, uid = f"socket:[{found.inode}]", str(found.uid)
    me = os.getpid()
    pids = sorted((int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me), reverse=True)
    mine = [pid for pid in pids if _owner(pid) == uid]
    rest = set(pids) - set(mine)
    return next((pid for pid in [*mine, *(p for p in pids if p in rest)] if _holds(pid, wanted)), None)


def _proc_net_tcp_row(local: tuple, remote: tuple) -> tcp_table.Row | None:
    """The same row from /proc/net/tcp's text (every TIME_WAIT row of the machine in it: slow)."""

    def hexed(address: tuple) -> str:
        return socket.inet_aton(address[0])[::-1].hex().upper() + f":{address[1]:04X}"

    try:
        wanted_ends = f" {hexed(local)} {hexed(remote)} "
        with open("/proc/net/tcp") as table:
            text = table.read()
    except (OSError, ValueError):
        return None
    found, at = set(), text.find(wanted_ends)
    while at != -1:
        end = text.find("\n", at)
        row = text[text.rfind("\n", 0, at) + 1:end if end != -1 else None].split()
        if len(row) > 9 and row[9] != "0":
            found.add((row[9], row[7]))
        at = text.find(wanted_ends, at + 1)
    if len(found) != 1:
        return None
    inode, uid = found.pop()
    return tcp_table.Row(local, remote, "", int(uid), int(inode))


def _owner(pid: int) -> str | None:
    try:
        return str(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return None


def _holds(pid: int, wanted: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                return True
        except OSError:
            continue
    return False
