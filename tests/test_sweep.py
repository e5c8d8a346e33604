"""The control groups a SIGKILLed grader leaves behind are swept; nobody else's are touched."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from labkit.grading import sweep
from labkit.sandbox import cgroups

HIERARCHY = cgroups.find()
pytestmark = pytest.mark.skipif(HIERARCHY is None, reason="no writable cgroup hierarchy here")


def _group(age: float) -> cgroups.Group:
    group = cgroups.Group.create(HIERARCHY, 64 * 2**20, 16)
    then = time.time() - age
    for path in group.paths.values():
        os.utime(path, (then, then))
    return group


def _exists(group: cgroups.Group) -> bool:
    return all(path.is_dir() for path in group.paths.values())


def test_an_old_empty_group_goes_a_fresh_or_busy_one_stays():
    old, fresh, busy = _group(2 * 3600), _group(0), _group(2 * 3600)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for procs in busy.procs_files:
            procs.write_text(str(sleeper.pid))
        removed = sweep.stale_groups(HIERARCHY)
        assert set(old.paths.values()) <= set(removed)
        assert not _exists(old) and _exists(fresh) and _exists(busy)
    finally:
        sleeper.kill()
        sleeper.wait()
        for group in (old, fresh, busy):
            group.kill()
            group.remove()
    assert not _exists(busy) and not _exists(fresh)


def test_groups_not_named_like_ours_are_left_alone():
    other = cgroups.Group.create(HIERARCHY, 64 * 2**20, 16, prefix="someone")
    try:
        then = time.time() - 2 * 3600
        for path in other.paths.values():
            os.utime(path, (then, then))
        sweep.stale_groups(HIERARCHY)
        assert _exists(other)
    finally:
        other.remove()


MAKER = """
import json, os, subprocess, sys, time
sys.path.insert(0, {root!r})
from labkit.sandbox import cgroups
group = cgroups.Group.create(cgroups.find(), 64 * 2**20, 16)
sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
for procs in group.procs_files:
    procs.write_text(str(sleeper.pid))
print(json.dumps({{"name": group.name, "sleeper": sleeper.pid}}), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_group_whose_maker_was_killed_is_emptied_and_removed_and_a_live_makers_is_not():
    """A judge SIGKILLed while a sandbox started leaves a group nobody closes, with a process in
    it for good (a bwrap that never got --die-with-parent); the next process that sandboxes
    clears it. A group of a maker still running is left alone, busy as it is."""
    import json
    import signal
    import sys
    from pathlib import Path

    maker = subprocess.Popen([sys.executable, "-c", MAKER.format(root=str(Path(__file__).parents[1]))],
                             stdout=subprocess.PIPE, text=True)
    made = json.loads(maker.stdout.readline())
    mine = cgroups.Group.create(HIERARCHY, 64 * 2**20, 16)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        for procs in mine.procs_files:
            procs.write_text(str(sleeper.pid))
        orphan = [parent / made["name"] for parent in HIERARCHY.dirs]
        assert all(p.is_dir() for p in orphan) and _running(made["sleeper"])
        assert not cgroups.owner_gone(made["name"])
        assert cgroups.sweep_orphans(HIERARCHY) == [] and all(p.is_dir() for p in orphan), "its maker is alive"
        os.kill(maker.pid, signal.SIGKILL)
        maker.wait(timeout=10)
        assert cgroups.owner_gone(made["name"])
        removed = cgroups.sweep_orphans(HIERARCHY)
        assert set(orphan) <= set(removed) and not any(p.is_dir() for p in orphan)
        deadline = time.monotonic() + 5
        while _running(made["sleeper"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(made["sleeper"]), "what the dead maker's group held still runs"
        assert _exists(mine) and sleeper.poll() is None, "a live maker's group was touched"
    finally:
        maker.kill()
        maker.wait(timeout=10)
        sleeper.kill()
        sleeper.wait(timeout=10)
        mine.kill()
        mine.remove()
        with contextlib.suppress(ProcessLookupError):
            os.kill(made["sleeper"], signal.SIGKILL)


def test_an_owner_is_a_process_not_a_number():
    """A pid that was reused since (another start time), or a name of another pid namespace or
    of an older grader (no owner in it), is never taken for the maker."""
    ours = cgroups.OWNER
    pidns, pid, start = ours.split(".")
    assert not cgroups.owner_gone(f"labkit-0123456789ab-{ours}")
    assert cgroups.owner_gone(f"labkit-0123456789ab-{pidns}.{pid}.{int(start) + 1}")
    assert not cgroups.owner_gone(f"labkit-0123456789ab-{int(pidns) + 1}.{pid}.{int(start) + 1}")
    assert not cgroups.owner_gone("labkit-0123456789ab")
