"""The judge's listeners and servers take ports the kernel never hands out by itself.

A program that names its ports (a Jupyter kernel, Valkey) binds port 0, releases the port and
binds it again later. Had the judge's own listeners asked the kernel for port 0 meanwhile, one
could be given that port and take the program's clients for its own (seen in CI: a step 8 case
of lab 01 counting a connection it never had). Each lab here is judged with every listening
socket the judge opens recorded.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from labkit import labs
from labkit.judge import ports
from labkit.judge.run import run_lab

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def listening(monkeypatch):
    """The ports of every socket this process puts in LISTEN state while the test runs."""
    found: list[int] = []
    listen = socket.socket.listen

    def recorded(sock, *args):
        found.append(sock.getsockname()[1])
        return listen(sock, *args)

    monkeypatch.setattr(socket.socket, "listen", recorded)
    return found


@pytest.mark.parametrize(("lab", "solution", "steps"), [
    ("outbox", "worker.py", ["8", "final"]),  # step 8's scripted replies and witness; the warehouse
    ("vending", "client.py", ["6", "7"]),  # the feed server
])
def test_every_listener_a_check_opens_is_below_the_kernels_range(listening, lab, solution, steps):
    verdict = run_lab(labs.load(lab), ROOT / "solutions" / solution, steps=steps, seed=1, explain=False)
    assert verdict.passed
    low, _ = ports.ephemeral_ports()
    assert listening, "no listener was seen: the recording did not reach the checks"
    assert [port for port in listening if port >= low] == []


def test_a_bound_port_is_drawn_from_its_range_and_taken_ones_are_skipped():
    low, _ = ports.ephemeral_ports()
    held = []
    try:
        for _ in range(30):
            sock = socket.socket()
            held.append(sock)
            port = ports.bind(sock)
            assert port in ports.LISTENERS and port < low
        assert len({s.getsockname()[1] for s in held}) == len(held)
        refusing = ports.refusing_port()
        held.append(refusing)
        assert refusing.getsockname()[1] in ports.LISTENERS
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(refusing.getsockname(), timeout=5).close()
    finally:
        for sock in held:
            sock.close()
