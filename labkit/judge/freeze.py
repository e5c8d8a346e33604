"""Stop a judged child's processes from outside (SIGSTOP), without the lead's cgroup code.

`box_pids(proc)`: every process of the child's sandbox: what the box itself lists
(`program_pids`, when the box has one) and every process in the pid namespace bwrap made for it
(so a `setsid` helper with a cleared environment is found too). `stop_all(...)`: SIGSTOP them
until no new one appears and each is seen stopped (bounded). `thaw(pids)`: SIGCONT.

SIGSTOP cannot be caught, blocked or ignored; sent by the judge, not by the child, it stops a
process whatever the student's code did to `os.kill`, signal handlers or atexit. A v1 freezer
cgroup would do the same in one write; it belongs with the lead's `labkit/sandbox/cgroups.py`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable

from labkit.sandbox import reaper


def _ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def box_pids(proc) -> list[int]:
    """The processes of `proc`'s sandbox (none for an unsandboxed child: see `group_pids`)."""
    found: set[int] = set()
    box = getattr(proc, "_box", None)
    listed = getattr(box, "program_pids", None)
    if callable(listed):
        try:
            found.update(listed())
        except Exception:  # noqa: BLE001 - a box closed meanwhile lists nothing
            pass
    if callable(listed) and (getattr(box, "group", None) is not None or getattr(box, "remote", False)):
        return sorted(found - {os.getpid()})  # a cgroup lists every process of the box, setsid or not
    pid = getattr(proc, "pid", None)
    mine = _ns(os.getpid())
    if isinstance(pid, int) and box is not None and getattr(box, "active", False):
        spaces = set()
        for other in _all_pids():
            seen = reaper.state_and_parent(other)
            if seen is not None and seen[1] == pid and (space := _ns(other)) and space != mine:
                spaces.add(space)
        if spaces:
            found.update(p for p in _all_pids() if _ns(p) in spaces)
    found.discard(os.getpid())
    return sorted(found)


def group_pids(pgid: int, marker: str | None = None) -> list[int]:
    """An unsandboxed child: its process group and what carries its marker."""
    found = set(reaper.marked_pids(marker)) if marker else set()
    for pid in _all_pids():
        try:
            if os.getpgid(pid) == pgid:
                found.add(pid)
        except OSError:
            continue
    found.discard(os.getpid())
    return sorted(found)


def child_pids(proc, marker: str | None = None) -> list[int]:
    box = getattr(proc, "_box", None)
    if box is not None and getattr(box, "active", False):
        return box_pids(proc)
    return group_pids(proc.pid, marker)


def stopped(pid: int) -> bool:
    seen = reaper.state_and_parent(pid)
    return seen is None or seen[0] in ("T", "t", "Z", "X")


def stop_all(pids: Iterable[int] | Callable[[], Iterable[int]], deadline: float) -> list[int]:
    """SIGSTOP every process (re-listing them when given a callable, so a fork made meanwhile is
    stopped too) until all are seen stopped, or `deadline`. Returns the pids stopped."""
    lister = pids if callable(pids) else (lambda fixed=list(pids): fixed)
    signalled: set[int] = set()
    while True:
        current = set(lister())
        for pid in current - signalled:
            try:
                os.kill(pid, signal.SIGSTOP)
                signalled.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        settled = current <= signalled and all(stopped(p) for p in current)
        if (settled and set(lister()) <= signalled) or time.monotonic() >= deadline:
            return sorted(signalled)
        time.sleep(0.002)


def freeze(proc, marker: str | None = None, grace: float = 2.0) -> list[int]:
    """Stop every process of `proc`'s sandbox (or group) from outside; the pids stopped."""
    return stop_all(lambda: child_pids(proc, marker), time.monotonic() + grace)


def thaw(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
