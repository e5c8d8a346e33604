"""Find and kill every process a judge run started, including those that escaped.

Killing a child's process group is not enough: a student's code can `setsid()` and linger.
Every process the judge starts carries a marker in its environment, which descendants
inherit; we find them through /proc. As a child subreaper the judge also inherits orphans,
so it can reap them instead of leaving zombies. (psutil reads the same /proc files one
process at a time; a direct scan is simpler and faster here.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import uuid
from collections.abc import Collection

from labkit.limits import KILL_GRACE, RUN_MARKER

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_pids(marker: str, name: str = RUN_MARKER) -> list[int]:
    """Processes whose environment holds name=marker."""
    return _marked([marker], name)


def _marked(markers: Collection[str], name: str) -> list[int]:
    """Processes whose environment holds name=M for any M in `markers`: one pass over /proc,
    which on a busy machine (CI: hundreds of processes) costs a millisecond or more."""
    needles = [f"{name}={marker}".encode() + b"\0" for marker in markers]
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read() + b"\0"
        except OSError:  # gone already, or not ours to read
            continue
        if any(needle in environ for needle in needles):
            found.append(int(entry))
    return found


def collect(pids: set[int], deadline: float, parents: frozenset[int] = frozenset()) -> None:
    """Collect the exit status of killed processes that re-parented to us (no zombies).

    A pid that is not our child yet is waited for only while its parent is one of `parents`,
    ourselves or another pid being collected (it is still on its way to us); any other parent
    means the number now belongs to another process (pids wrap at pid_max, 32768 by default).
    Meanwhile the dead of nested pid namespaces that re-parented to us are collected too: an
    exiting namespace's init waits for every one of them (a judge's box held 10 s for its
    launched children's zombies, whose parents had died and whose new parent is us)."""
    waiting = set(pids)
    ours = {os.getpid(), *parents}
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (yet: a killed orphan re-parents to us a
                seen = state_and_parent(pid)  # moment later), gone, or someone else's by now
                done = pid if seen is None or seen[1] not in ours | waiting else 0
            if done:
                waiting.discard(pid)
        if waiting:
            collect_nested_zombies()
            time.sleep(0.01)


def collect_nested_zombies() -> int:
    """Collect our zombie children that lived in a nested pid namespace: sandboxed processes
    re-parented to us, never a child we started ourselves (those are Popens, in our namespace)."""
    collected = 0
    for pid, state in nested_children().items():
        if state == "Z":
            try:
                collected += bool(os.waitpid(pid, os.WNOHANG)[0])
            except ChildProcessError:
                pass
    return collected


def nested_children() -> dict[int, str]:
    """Our children that live in a nested pid namespace (sandboxed processes re-parented to us),
    with their state letter."""
    return {pid: state for pid, state in children().items() if _nested(pid)}


def _nested(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        pass
    return False


def kill_marked(marker: str, grace: float = KILL_GRACE, name: str = RUN_MARKER) -> int:
    """SIGKILL every process carrying name=marker; wait (bounded) until they are gone."""
    return kill_all_marked([marker], grace, name)


def kill_all_marked(markers: Collection[str], grace: float = KILL_GRACE, name: str = RUN_MARKER) -> int:
    """`kill_marked` for many markers at once, one pass over /proc per round."""
    killed: set[int] = set()
    deadline = time.monotonic() + grace
    while markers and time.monotonic() < deadline:
        pids = _marked(markers, name)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    collect(killed, deadline)
    return len(killed)


def state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter (R, S, Z...) and parent pid, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def children() -> dict[int, str]:
    """This process's children and their state letter, read from /proc."""
    me, found = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (seen := state_and_parent(int(entry))) is not None and seen[1] == me:
            found[int(entry)] = seen[0]
    return found


def collect_zombies(keep: set[int] = frozenset()) -> int:
    """Collect every zombie child not in `keep` (the Popens someone will still wait for).

    A subreaper inherits the dead of everything below it; nothing else ever collects them, and
    when it exits they pass up to the next subreaper (a test process, an instructor's shell).
    """
    collected = 0
    for pid, state in children().items():
        if state == "Z" and pid not in keep:
            try:
                collected += bool(os.waitpid(pid, os.WNOHANG)[0])
            except ChildProcessError:
                pass
    return collected


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def ns_pids(host_pid: int) -> list[int]:
    """A process's pid in each pid namespace from ours down to its own (`NSpid`)."""
    try:
        with open(f"/proc/{host_pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"NSpid:"):
                    return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []
