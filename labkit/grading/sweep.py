"""Sweep the control groups that a SIGKILLed grader left behind.

A sandbox's group is removed by the grader that made it (`labkit.sandbox.box`), on every path
it lives through, but a grader killed with SIGKILL (or a machine that lost power) leaves its
`labkit-*` groups behind. Their processes died with the sandbox (bubblewrap's
`--die-with-parent`, the pid namespace), so each is an empty directory that never goes away.
Each `grade` run removes such groups at its start: named like ours, empty, and older than an
hour — a group is joined within milliseconds of being made, so an empty one that old is
nobody's, while a group of another grader still running (on this machine, a second shard)
has processes in it, and the kernel refuses to remove a group with processes or children.
"""

from __future__ import annotations

import time
from pathlib import Path

from labkit.sandbox import cgroups

PREFIX = "labkit-"
STALE_SECONDS = 3600.0


def _empty(group: Path) -> bool:
    try:
        return not (group / "cgroup.procs").read_text().split()
    except OSError:
        return False


def stale_groups(hierarchy: cgroups.Hierarchy | None = None, older_than: float = STALE_SECONDS,
                 now: float | None = None) -> list[Path]:
    """Remove the empty `labkit-*` groups older than `older_than` seconds; return those removed."""
    hierarchy = hierarchy if hierarchy is not None else cgroups.find()
    if hierarchy is None:
        return []
    now = time.time() if now is None else now
    removed = []
    for parent in hierarchy.dirs:
        try:
            children = sorted(parent.iterdir())
        except OSError:
            continue
        for group in children:
            try:
                if not group.name.startswith(PREFIX) or group.is_symlink() or not group.is_dir():
                    continue
                if now - group.stat().st_mtime < older_than or not _empty(group):
                    continue
                group.rmdir()  # the kernel refuses it if a process or a child group appeared meanwhile
            except OSError:
                continue
            removed.append(group)
    return removed
