"""What a judge run could leave behind, counted before and after it (see `conftest.nothing_left`).

A snapshot holds: processes carrying a marker with our prefix (found as the reaper finds them,
through /proc/*/environ), child processes of this test process (but its zygotes), zombies among them, listening
TCP sockets of this process and its children, and the judge's `labkit-*` temp dirs in a
private temp dir. Nothing may be new in the second snapshot.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil

from labkit.judge import tcp_table
from labkit.limits import RUN_MARKER
from labkit.sandbox import zygote

LISTEN = 1 << 10  # the kernel's TCP_LISTEN, as a state mask


def marked(prefix: str) -> set[int]:
    """Like reaper.marked_pids, for every marker that starts with `prefix`."""
    needle = f"{RUN_MARKER}={prefix}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read():
                        found.add(int(entry))
            except OSError:
                continue
    return found


def listening_sockets(pids: list[int]) -> set[tuple[int, int]]:
    """(pid, port) of each listening TCP socket these processes hold: their socket inodes
    (/proc/*/fd) in the kernel's table of listening sockets (`tcp_table`, by netlink). psutil's
    `net_connections` reads every row of /proc/net/tcp* for each process, TIME_WAIT included:
    tenths of a second each when a long run has left tens of thousands."""
    tables = [tcp_table.connections(family, LISTEN) for family in (socket.AF_INET, socket.AF_INET6)]
    ports = {row.inode: row.local[1] for rows in tables for row in rows}
    return {(pid, ports[inode]) for inode, pid in tcp_table.held_by(pids).items() if inode in ports}


def snapshot(prefix: str, private: Path) -> dict:
    me = psutil.Process()
    # The judge's zygotes live as long as this process, by design (labkit.sandbox.zygote); what
    # they fork for a run must be gone like everything else.
    children = [c for c in me.children(recursive=True) if c.pid not in zygote.pids()]
    listening = listening_sockets([me.pid, *(c.pid for c in children)])
    zombies = set()
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return {
        "marked processes": marked(prefix),
        "children": {c.pid for c in children},
        "zombies": zombies,
        "listening sockets": listening,
        "labkit temp dirs": sorted(p.name for p in private.glob("labkit-*")),
    }


