"""Where the judge's throwaway folders go: on a RAM disk (tmpfs), so a COMMIT never waits on a device.

A step's folder holds the SQLite files the student's code writes, and every COMMIT asks the file
system to flush them: on a disk that is a device write and a wait, in the child's CPU and the
step's wall time. The labs' crashes are process kills and pauses, never power cuts, and a killed
process's writes are in the page cache either way, so a RAM disk shows the student's code exactly
what a disk would. So a folder goes to the temp dir when that is a tmpfs already (a judge box's
/tmp is), else to /dev/shm when it is a tmpfs with room that we may write, else to the temp dir.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

FAST_PLACE = Path("/dev/shm")
ROOM = 512 * 1024 * 1024  # free bytes the RAM disk must have (Docker's default /dev/shm has 64 MiB)


def filesystem_type(path: Path | str) -> str:
    """The type of the file system `path` is on, by the longest mount point above it ("" unknown)."""
    path, best, kind = os.path.realpath(path), "", ""
    for point, fs_type in _mounts():
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fs_type
    return kind


@functools.cache
def _mounts() -> tuple[tuple[str, str], ...]:
    """(mount point, type) of every mount this process sees, read once: /tmp and /dev/shm are
    not remounted under a running judge, and every step asks (reading it was 1 % of its CPU)."""
    try:
        with open("/proc/self/mounts") as fh:
            return tuple((fields[1].replace("\\040", " "), fields[2])
                         for fields in (line.split() for line in fh) if len(fields) >= 3)
    except OSError:
        return ()


def fast_place() -> Path | None:
    """/dev/shm when it is a tmpfs with `ROOM` free that this process may write, else None."""
    try:
        room = os.statvfs(FAST_PLACE)
    except OSError:
        return None
    if (filesystem_type(FAST_PLACE) != "tmpfs" or room.f_bavail * room.f_frsize < ROOM
            or not os.access(FAST_PLACE, os.W_OK | os.X_OK)):
        return None
    return FAST_PLACE


def place() -> str:
    """The folder throwaway folders go in (see the module's docstring)."""
    temp = tempfile.gettempdir()
    if filesystem_type(temp) == "tmpfs":
        return temp
    fast = fast_place()
    return str(fast) if fast is not None else temp


def folder(prefix: str) -> Path:
    """A new private folder (0700) in `place()`; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=place()))
