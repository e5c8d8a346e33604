"""The kernel's TCP table by netlink (`labkit.judge.tcp_table`) against /proc/net/tcp and psutil.

Each answer is checked against another reader of the same table: the socket's own inode
(fstat), /proc/net/tcp's text, psutil's per-process connections. Closed connections are left
in TIME_WAIT first, as in a long judge run, where the speed-up comes from skipping them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import pytest

from labkit.judge import processes, tcp_table, witness


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    with server:
        yield server


def pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname(), timeout=5)
    accepted, _ = server.accept()
    return client, accepted


def timewait(server: socket.socket, count: int) -> None:
    """`count` connections closed by the server side first: rows that stay in TIME_WAIT."""
    for _ in range(count):
        client, accepted = pair(server)
        accepted.close()
        client.close()


def test_owner_finds_each_end_with_its_inode_and_uid(listener):
    timewait(listener, 20)
    client, accepted = pair(listener)
    with client, accepted:
        for sock in (client, accepted):
            row = tcp_table.owner(sock.getsockname(), sock.getpeername())
            assert row is not None
            assert (row.inode, row.uid, row.state) == (os.fstat(sock.fileno()).st_ino, os.geteuid(), "ESTABLISHED")
            assert row.inode == witness._proc_net_tcp_row(sock.getsockname(), sock.getpeername()).inode
    assert tcp_table.owner(("127.0.0.1", 1), ("127.0.0.1", 2)) is None


def test_a_dump_leaves_out_time_wait_rows_and_keeps_every_held_one(listener):
    timewait(listener, 30)
    port = listener.getsockname()[1]
    with open("/proc/net/tcp") as table:
        waiting = sum(1 for line in table if line.split()[3:4] == ["06"] and f":{port:04X} " in line)
    assert waiting >= 30  # the server ends' rows, left by `timewait`
    client, accepted = pair(listener)
    with client, accepted:
        rows = tcp_table.connections()
        assert all(r.state != "TIME_WAIT" for r in rows)
        mine = {r.inode for r in rows} & {os.fstat(s.fileno()).st_ino for s in (client, accepted, listener)}
        assert len(mine) == 3  # both ends and the listening socket


CONNECT = textwrap.dedent("""
    import socket, sys, time
    held = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(2)]
    print("connected", flush=True)
    time.sleep(30)
""")


@contextmanager
def child_connected(server: socket.socket):
    """A child holding two connections to `server`: yields (child, the two accepted ends);
    every end and the child are gone afterwards, on every path."""
    host, port = server.getsockname()[:2]
    child = subprocess.Popen([sys.executable, "-c", CONNECT, host, str(port)], stdout=subprocess.PIPE, text=True)
    ends = []
    try:
        assert child.stdout.readline().strip() == "connected"
        ends += [server.accept()[0] for _ in range(2)]
        yield child, ends
    finally:
        for end in ends:
            end.close()
        child.kill()
        child.wait(timeout=10)
        child.stdout.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_held_sockets_reads_as_psutil_did(host):
    family = socket.AF_INET if "." in host else socket.AF_INET6
    with socket.socket(family) as server:
        try:
            server.bind((host, 0))
        except OSError as exc:
            pytest.fail(f"{host} is not usable here: {exc}")
        server.listen()
        port = server.getsockname()[1]
        with child_connected(server) as (child, ends):
            ends[0].close()  # the child's end of it: CLOSE_WAIT
            time.sleep(0.2)
            seen = processes.held_sockets(child.pid, port)
            assert sorted(seen) == sorted(processes._held_sockets_psutil(child.pid, port))
            assert sorted(s.rsplit(" ", 1)[1] for s in seen) == ["(CLOSE_WAIT)", "(ESTABLISHED)"], seen
            assert processes.held_sockets(child.pid, port + 1 if port < 65535 else port - 1) == []


@pytest.mark.parametrize("netlink", ["asked", "refused"])
def test_the_witness_finds_the_process_holding_the_connection(monkeypatch, listener, netlink):
    if netlink == "refused":
        real = socket.socket

        def no_netlink(family=-1, *args, **kwargs):
            if family == socket.AF_NETLINK:
                raise PermissionError(1, "refused by the test")
            return real(family, *args, **kwargs)

        monkeypatch.setattr(socket, "socket", no_netlink)
    timewait(listener, 20)
    port = listener.getsockname()[1]
    with child_connected(listener) as (child, ends):
        if netlink == "refused":
            with pytest.raises(tcp_table.Unavailable):
                tcp_table.owner(ends[0].getsockname(), ends[0].getpeername())
        # the child's end of each connection: from its local address to the listener
        assert [witness._socket_owner(e.getpeername(), e.getsockname()) for e in ends] == [child.pid] * 2
        assert len(processes.held_sockets(child.pid, port)) == 2
