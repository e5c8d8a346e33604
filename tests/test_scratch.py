"""Where the judge's throwaway folders go (labkit/scratch.py): a RAM disk, whatever /tmp is."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from server_folders import in_ci

from labkit import labs, scratch
from labkit.judge.run import run_lab

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def disk_tmp(monkeypatch):
    """A temp dir on a disk (this machine's /tmp), as most students' machines have it."""
    if scratch.filesystem_type("/tmp") == "tmpfs" or scratch.fast_place() is None:
        if in_ci():
            pytest.fail("CI's /tmp is a disk and its /dev/shm a RAM disk with room: this must run there")
        pytest.skip("needs /tmp on a disk and /dev/shm on tmpfs")
    folder = Path(tempfile.mkdtemp(prefix="lk-disk-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    folder.rmdir()


def test_a_temp_dir_on_a_disk_sends_the_folders_to_the_ram_disk(disk_tmp):
    assert scratch.place() == str(scratch.FAST_PLACE)
    made = scratch.folder("labkit-test-")
    try:
        assert made.parent == scratch.FAST_PLACE and scratch.filesystem_type(made) == "tmpfs"
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        made.rmdir()


def test_a_temp_dir_on_a_ram_disk_is_kept(disk_tmp, monkeypatch):
    own = Path(tempfile.mkdtemp(prefix="lk-ram-", dir=scratch.FAST_PLACE))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(own))
        assert scratch.place() == str(own)  # a judge box's private /tmp, say
    finally:
        own.rmdir()


def test_a_ram_disk_without_room_is_not_used(disk_tmp, monkeypatch):
    monkeypatch.setattr(scratch, "ROOM", 1 << 62)  # Docker's 64 MiB /dev/shm, say
    assert scratch.fast_place() is None and scratch.place() == str(disk_tmp)


def test_a_steps_sqlite_files_are_written_on_the_ram_disk(disk_tmp, monkeypatch):
    """The student's COMMITs land on tmpfs: every folder the judge made for the step is there."""
    made = []
    real = scratch.folder
    monkeypatch.setattr(scratch, "folder", lambda prefix: made.append(real(prefix)) or made[-1])
    verdict = run_lab(labs.load("outbox"), ROOT / "solutions" / "worker.py", steps=["6"], seed=1)
    assert verdict.passed
    assert made and {scratch.filesystem_type(path.parent) for path in made} == {"tmpfs"}, made
    assert [path for path in made if path.exists()] == []  # and removed with the step
