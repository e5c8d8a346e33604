"""Ports the judge holds for a step: a loopback port that refuses every connection."""

from __future__ import annotations

import socket


def refusing_port() -> socket.socket:
    """A loopback socket bound to an ephemeral port and never listening: a connection to it is
    refused, and as long as it stays bound no server can take its port (no race with later servers)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
    except OSError:
        sock.close()
        raise
    return sock
