"""Who holds a TCP connection: the kernel's socket table asked by netlink (sock_diag), one row at a time.

/proc/net/tcp is the same table as text, every row of it on every read, TIME_WAIT rows
included: a long judge run (CI, a grading batch) leaves tens of thousands of those, and one read
then costs ~20 ms of CPU at 20 000 rows, ~40 at 37 000 (`benchmarks/tcp_lookup.py`; psutil's
per-process `net_connections` reads it too, and parses it in Python). NETLINK_SOCK_DIAG answers an exact four-tuple from the kernel's hash table
(`owner`), or dumps only the states asked for (`connections`), skipping TIME_WAIT rows unformatted.

Where netlink is refused (a seccomp profile or a kernel without sock_diag), both raise
`Unavailable` and the caller reads /proc as before. Only the caller's own network namespace is
seen, as with /proc.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NO_COOKIE = 0xFFFFFFFF
# Kernel TCP states (include/net/tcp_states.h), by the names psutil uses.
STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
          7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}
# Rows a process can hold: TIME_WAIT and half-open SYN_RECV rows belong to no file descriptor.
HELD_STATES = sum(1 << s for s in STATES if s not in (3, 6))
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
MESSAGE = struct.Struct("=BBBB48sIIIII")  # inet_diag_msg: family, state, timer, retrans, id, ..., uid, inode
RECEIVE_BYTES = 1 << 16
TIMEOUT = 2.0  # s: the kernel answers in microseconds; this only bounds a wait that cannot happen


class Unavailable(OSError):
    """The kernel's socket table cannot be asked by netlink here."""


@dataclass(frozen=True)
class Row:
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str
    uid: int
    inode: int


def owner(local: tuple[str, int], remote: tuple[str, int]) -> Row | None:
    """The IPv4 TCP socket connected from `local` to `remote`, or None when there is none."""
    rows = _ask(_request(socket.AF_INET, 0xFFFFFFFF, local, remote, dump=False), dump=False)
    return rows[0] if len(rows) == 1 else None


def connections(family: int = socket.AF_INET, states: int = HELD_STATES) -> list[Row]:
    """Every TCP socket of `family` in one of `states` (a bit mask, 1 << state)."""
    anywhere = ("0.0.0.0" if family == socket.AF_INET else "::", 0)
    return _ask(_request(family, states, anywhere, anywhere, dump=True), dump=True)


def held_by(pids) -> dict[int, int]:
    """Socket inode -> pid, for every socket these processes hold open (/proc/*/fd)."""
    found = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # it has ended, or is not ours to read
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                found[int(link[8:-1])] = pid
    return found


def _request(family: int, states: int, local: tuple[str, int], remote: tuple[str, int], *, dump: bool) -> bytes:
    sockid = (struct.pack("!HH", local[1], remote[1]) + _address(family, local[0]) + _address(family, remote[0])
              + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE))
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states) + sockid
    flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
    return HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, flags, 1, 0) + body


def _address(family: int, ip: str) -> bytes:
    return socket.inet_pton(family, ip).ljust(16, b"\0")


def _ask(request: bytes, *, dump: bool) -> list[Row]:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    except OSError as exc:
        raise Unavailable(exc.errno, f"netlink's sock_diag: {exc.strerror}") from exc
    rows: list[Row] = []
    try:
        sock.settimeout(TIMEOUT)
        sock.sendall(request)
        while True:
            data = sock.recv(RECEIVE_BYTES)
            at = 0
            while at + HEADER.size <= len(data):
                length, kind, _flags, _seq, _port = HEADER.unpack_from(data, at)
                if length < HEADER.size or kind == NLMSG_DONE:
                    return rows
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, at + HEADER.size)[0]
                    if code in (0, errno.ENOENT):  # ENOENT: no such socket
                        return rows
                    raise Unavailable(code, f"netlink's sock_diag: {os.strerror(code)}")
                if kind == SOCK_DIAG_BY_FAMILY:
                    rows.append(_row(data, at + HEADER.size))
                at += (length + 3) & ~3
            if not dump:
                return rows
    except Unavailable:
        raise
    except OSError as exc:
        raise Unavailable(exc.errno, f"netlink's sock_diag: {exc}") from exc
    finally:
        sock.close()


def _row(data: bytes, at: int) -> Row:
    family, state, _timer, _retrans, sockid, _expires, _rq, _wq, uid, inode = MESSAGE.unpack_from(data, at)
    sport, dport = struct.unpack_from("!HH", sockid)
    size = 4 if family == socket.AF_INET else 16
    src, dst = (socket.inet_ntop(family, sockid[4 + k:4 + k + size]) for k in (0, 16))
    return Row((src, sport), (dst, dport), STATES.get(state, str(state)), uid, inode)
