"""The ports the judge's own servers and listeners take: never from the kernel's range.

The kernel hands out ports by itself from `ip_local_port_range` (a bind to port 0, the local
end of a connection). Programs that must name their ports (a Jupyter kernel, Valkey) get one
from it by binding port 0 and releasing it, then bind it again later: a judge listener that
asked for port 0 in between could be given that very port, and take the other program's
clients for its own (a kernel's ZeroMQ peer seen as an HTTP client that never closed, a
readiness probe seen as "a connection before validating"). So the judge binds below that
range, where nothing is handed out by itself: `LISTENERS` for its listeners, `SERVERS` for
the servers it starts by port number (apart, so that a listener never takes a server's port
between its kill and its restart).
"""

from __future__ import annotations

import functools
import random
import socket
from pathlib import Path

SERVERS = range(20000, 25000)
LISTENERS = range(25000, 32768)
TRIES = 64


@functools.cache
def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports it hands out by itself (Linux's default if unreadable); read
    once a process (step 8 alone binds ~60 listeners a run)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def bind(sock: socket.socket, host: str = "127.0.0.1", ports: range = LISTENERS) -> int:
    """Bind `sock` to a free port of `ports` below the kernel's range (drawn at random: judges
    side by side rarely want the same one); to a port the kernel gives when none is free there
    (a machine whose range starts lower). Returns the port."""
    usable = range(ports.start, min(ports.stop, ephemeral_ports()[0]))
    if len(usable) > TRIES:
        for port in random.sample(usable, TRIES):
            try:
                sock.bind((host, port))
            except OSError:  # taken, or still in TIME_WAIT
                continue
            return port
    sock.bind((host, 0))
    return sock.getsockname()[1]


def refusing_port() -> socket.socket:
    """A loopback socket bound and never listening: a connection to it is refused, and as long
    as it stays bound no server can take its port (no race with later servers)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        bind(sock)
    except OSError:
        sock.close()
        raise
    return sock
