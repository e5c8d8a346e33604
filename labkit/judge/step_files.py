"""The one way the judge opens a file in a step folder, where a judged child could have been.

A child writes into its step folder, so any name there may by now be a link to a file only the
judge can read (an oracle, `/proc/self/environ`), a FIFO that blocks whoever opens it, a
folder, or a sparse file of gigabytes. Every judge-side read of such a file goes through here:

- `read(path, limit)`: opened relative to a directory descriptor the judge holds, with
  `O_NOFOLLOW | O_NONBLOCK` (a link is refused by the kernel, a FIFO never blocks the open),
  then `fstat` on the descriptor itself: anything but a regular file is refused with the
  reason; optionally it must belong to `owner`; at most `limit` bytes are read.
- `check_db(path)`: before the judge's sqlite3 connects to a student's database file, the file
  and its `-journal`, `-wal`, `-shm` must not be links or anything but regular files (SQLite
  follows links and opens FIFOs). A refusal is a `DatabaseRefused`, an `sqlite3.DatabaseError`,
  so every check that already turns a broken file into its verdict does so with this too.
- `create(path)`: a new file the judge writes in a step folder (a log): whatever a child left
  under that name is removed first, and the file is made with `O_EXCL | O_NOFOLLOW`.

A refusal's message names the file and what it was, never its contents or a link's target.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LIMIT = 8 * 1024 * 1024
SIDE_FILES = ("-journal", "-wal", "-shm")
_CHUNK = 1024 * 1024


class Refused(OSError):
    """The judge will not read this file; the message says why, in words for a verdict."""


class DatabaseRefused(Refused, sqlite3.DatabaseError):
    """A database file (or its journal) that the judge's sqlite3 must not open."""


def kind_of(mode: int) -> str:
    """What a file is, as a verdict says it ("a link", "a FIFO", ...)."""
    if stat.S_ISLNK(mode):
        return "a link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


@dataclass(frozen=True)
class Contents:
    data: bytes
    size: int  # the file's size as fstat gave it
    cut: bool  # more than the limit was there; `data` holds the first `limit` bytes


def _open_dir(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_file(path: Path | str, *, owner: int | None = None, what: str = "the file") -> tuple[int, os.stat_result]:
    """An O_RDONLY descriptor of the regular file `path` and its fstat (the caller closes it).

    Raises `Refused` for a link, FIFO, directory, device, socket, a file of another owner
    (when `owner` is given) or a missing file."""
    path = Path(path)
    name = f"{what} {path.name}"
    dir_fd = _open_dir(path.parent)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise Refused(f"{name} does not exist") from None
        except OSError as exc:
            # ELOOP: O_NOFOLLOW met a link. Say what it is without following it.
            try:
                mode = os.lstat(path.name, dir_fd=dir_fd).st_mode
            except OSError:
                mode = 0
            if stat.S_ISLNK(mode):
                raise Refused(f"{name} was replaced by a link; the judge does not follow links") from None
            raise Refused(f"{name} could not be opened ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{name} is {kind_of(info.st_mode)}, not a regular file; the judge does not read it")
        if owner is not None and info.st_uid != owner:
            raise Refused(f"{name} belongs to uid {info.st_uid}, not to the judge (uid {owner}): it was replaced")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read(path: Path | str, limit: int = DEFAULT_LIMIT, *, owner: int | None = None,
         what: str = "the file") -> Contents:
    """At most `limit` bytes of the regular file `path` (see `open_file` for what is refused)."""
    fd, info = open_file(path, owner=owner, what=what)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return Contents(data[:limit], info.st_size, len(data) > limit)


def read_bytes(path: Path | str, limit: int = DEFAULT_LIMIT, *, owner: int | None = None,
               what: str = "the file") -> bytes:
    return read(path, limit, owner=owner, what=what).data


def read_text(path: Path | str, limit: int = DEFAULT_LIMIT, *, owner: int | None = None,
              what: str = "the file") -> str:
    return read_bytes(path, limit, owner=owner, what=what).decode("utf-8", "replace")


@dataclass(frozen=True)
class DbFiles:
    """What `check_db` saw of an accepted database file, in the same pass."""

    exists: bool  # the database file itself is there
    journal: bool  # a rollback journal or a WAL file lies beside it
    wal_mode: bool  # the file's header says WAL mode

    @property
    def needs_writer(self) -> bool:
        """Whether even a read needs a read-write connection: a hot journal is rolled back, a WAL
        needs its index, and a missing file is made (as SQLite always did)."""
        return self.journal or self.wal_mode or not self.exists


def check_db(path: Path | str) -> DbFiles:
    """Refuse (`DatabaseRefused`) a database path whose file or `-journal`/`-wal`/`-shm` is a link
    or anything but a regular file; absent files are fine (SQLite makes them). Returns what it
    saw: one directory descriptor, one lstat per name and the header, for every read the judge makes."""
    path = Path(path)
    dir_fd = _open_dir(path.parent)
    try:
        present = set()
        for suffix in ("", *SIDE_FILES):
            try:
                mode = os.lstat(path.name + suffix, dir_fd=dir_fd).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                which = "the database file" if not suffix else f"the database's {suffix[1:]} file"
                raise DatabaseRefused(f"{which} ({path.name}{suffix}) was replaced by {kind_of(mode)}; "
                                      "the judge does not open it")
            present.add(suffix)
        wal_mode = "" in present and _wal_header(path.name, dir_fd)
    finally:
        os.close(dir_fd)
    return DbFiles("" in present, bool(present & {"-journal", "-wal"}), wal_mode)


def _wal_header(name: str, dir_fd: int) -> bool:
    """Whether the database header's read and write versions (bytes 18, 19) say WAL; opened as
    `open_file` opens (no link followed, no FIFO waited on), False if it cannot be read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        header = os.read(fd, 100)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(header) >= 20 and (header[18] == 2 or header[19] == 2)


def create(path: Path | str, mode: int = 0o644) -> int:
    """A descriptor of a NEW file `path` for the judge to write (O_APPEND); whatever was under that
    name (a child's link, FIFO or file) is removed first. Raises OSError if that cannot be done
    (a directory in its place)."""
    path = Path(path)
    dir_fd = _open_dir(path.parent)
    try:
        try:
            os.unlink(path.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        return os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC,
                       mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def copy(source: Path | str, target: Path | str, limit: int = 512 * 1024 * 1024, *, what: str = "the file") -> Path:
    """Copy the regular file `source` (refused as `read` refuses; at most `limit` bytes, else
    `Refused`) to a new file `target` made by `create`."""
    fd, info = open_file(source, what=what)
    try:
        if info.st_size > limit:
            raise Refused(f"{what} {Path(source).name} is larger than {limit} bytes; the judge does not copy it")
        out = create(target)
        try:
            copied = 0
            while copied <= limit:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                copied += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return Path(target)
