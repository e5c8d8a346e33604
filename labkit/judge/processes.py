"""What a child process and everything it started are doing right now, read by the judge itself.

CPU time used, files held open, TCP sockets held: the judge's own view of a child between two
cases (never the child's report). psutil for each process; /proc for the tree (see child_pids).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` and what it started have used so far (user + system)."""
    total = 0.0
    for proc in process_tree(pid):
        try:
            used = proc.cpu_times()
        except psutil.Error:
            continue
        total += used.user + used.system
    return total


def process_tree(pid: int) -> list[psutil.Process]:
    """`pid` and everything it started. In a sandbox the child's pid is bwrap's, and the student's
    code runs in a process below it: what it holds is held there."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            found.append(psutil.Process(current))
        except psutil.Error:
            continue
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
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
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
    "local → remote (status)"."""
    found = []
    for proc in process_tree(pid):
        try:
            found += proc.net_connections(kind="tcp")
        except psutil.Error:
            pass
    return [f"{c.laddr.ip}:{c.laddr.port} → {c.raddr.ip}:{c.raddr.port} ({c.status})"
            for c in found if c.raddr and c.raddr.port == port]
