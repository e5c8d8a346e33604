"""What a child process and everything it started are doing right now, read by the judge itself.

CPU time used, files held open, TCP sockets held: the judge's own view of a child between two
cases (never the child's report). psutil for each process; /proc for the tree (see child_pids);
the kernel's TCP table by netlink for sockets (`tcp_table`).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from labkit.judge import tcp_table
from labkit.limits import WALL_FACTOR

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` and what it started have used so far (user + system), from
    /proc/*/stat as psutil reads it, without a psutil object per process (read between every
    two served cases)."""
    ticks = 0
    for one in tree_pids(pid):
        try:
            with open(f"/proc/{one}/stat", "rb") as fh:
                after_name = fh.read().rpartition(b")")[2].split()  # the name may hold spaces and ")"
            ticks += int(after_name[11]) + int(after_name[12])  # utime, stime (fields 14 and 15)
        except (OSError, ValueError, IndexError):  # it has just ended
            continue
    return ticks / CLOCK_TICKS


def waited_for_cpu(pid: int) -> float:
    """Seconds the threads of `pid` and of what it started have spent runnable but waiting for a
    CPU (/proc/*/task/*/schedstat, second field): the machine's business, not the code's."""
    total = 0
    for one in tree_pids(pid):  # read at every call of a session: plain /proc reads, no psutil objects
        try:
            tasks = os.listdir(f"/proc/{one}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{one}/task/{tid}/schedstat", "rb") as fh:
                    total += int(fh.read().split()[1])
            except (OSError, ValueError, IndexError):  # that thread has just ended
                continue
    return total / 1e9


@dataclass
class Budget:
    """`seconds` of a child's time from `started`: by the clock, plus what its processes waited
    for a CPU meanwhile, at most `WALL_FACTOR` times `seconds` in all. A hanging child (asleep,
    not waiting for a CPU) gets exactly `seconds`; a child slowed by a busy machine gets the
    time the machine took from it, so its verdict does not follow the load."""

    pid: int
    seconds: float
    started: float = field(default_factory=time.monotonic)
    base: float = 0.0

    def __post_init__(self) -> None:
        self.base = waited_for_cpu(self.pid)

    @property
    def first(self) -> float:
        """The deadline if the machine took nothing from the child (read without a look at /proc)."""
        return self.started + self.seconds

    def deadline(self) -> float:
        waited = max(0.0, waited_for_cpu(self.pid) - self.base)
        return self.started + min(self.seconds + waited, WALL_FACTOR * self.seconds)


def process_tree(pid: int) -> list[psutil.Process]:
    """`pid` and everything it started. In a sandbox the child's pid is bwrap's, and the student's
    code runs in a process below it: what it holds is held there."""
    found = []
    for one in tree_pids(pid):
        try:
            found.append(psutil.Process(one))
        except psutil.Error:
            continue
    return found


def tree_pids(pid: int) -> list[int]:
    """`pid` and the pids of everything it started (those that have ended are simply missing)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += child_pids(current)
    return found


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc's per-thread `children` lists: a few small reads,
    where psutil's `children()` reads every process's stat (half a second on a loaded machine)."""
    if not CHILDREN_LISTS:  # a kernel without CONFIG_PROC_CHILDREN
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):  # that thread has just ended
            continue
    return found


CHILDREN_LISTS = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def held_files(pid: int) -> set[str]:
    """The regular files process `pid` (and what it started) holds open right now (real paths)."""
    found: set[str] = set()
    for proc in process_tree(pid):
        try:
            found |= {os.path.realpath(f.path) for f in proc.open_files()}
        except psutil.Error:
            pass
    return found


def held_sockets(pid: int, port: int) -> list[str]:
    """The TCP sockets of process `pid` (and what it started) connected to `port`, as
    "local → remote (status)": the tree's socket inodes (/proc/*/fd), looked up in the kernel's
    table by netlink (`tcp_table`; psutil, which reads all of /proc/net/tcp*, where refused)."""
    inodes = tcp_table.held_by(tree_pids(pid))
    if not inodes:
        return []
    try:
        tables = [tcp_table.connections(family) for family in (socket.AF_INET, socket.AF_INET6)]
    except tcp_table.Unavailable:
        return _held_sockets_psutil(pid, port)
    return [f"{r.local[0]}:{r.local[1]} → {r.remote[0]}:{r.remote[1]} ({r.state})"
            for rows in tables for r in rows if r.inode in inodes and r.remote[1] == port]


def _held_sockets_psutil(pid: int, port: int) -> list[str]:
    found = []
    for proc in process_tree(pid):
        try:
            found += proc.net_connections(kind="tcp")
        except psutil.Error:
            pass
    return [f"{c.laddr.ip}:{c.laddr.port} → {c.raddr.ip}:{c.raddr.port} ({c.status})"
            for c in found if c.raddr and c.raddr.port == port]
