"""The control groups a SIGKILLed grader leaves behind are swept; nobody else's are touched."""

from __future__ import annotations

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
