"""The course's files a sandbox may read, shown through one bind mount per course folder.

A judge's child sees a few dozen of the course's files (labkit's probe, values and limits, its
lab's probes, each with its compiled file) and none of the others (the judge-side checks). Bound
one by one, that is ~40 mounts, and bubblewrap's mounts were half a child's start: 19 ms of CPU
for a box around /bin/true, 10 ms with the same files shown from two folders
(benchmarks/child_cost.py, both rows in one run). So `collapse` copies exactly those files,
once per process, into a view folder that mirrors the course (`labkit/`, `checks/`), and the
box binds the view's folders where the course's are: the child sees the same files at the same
paths, and still nothing else.

A view is made by the process that starts the boxes, read-only to everyone else (0755/0644,
its owner's), never changed after it is made; a change to any of its files (size, mtime, inode)
makes a new one. Compiled files keep their source's mtime (`copy2`), so Python still uses them.
The maker removes its views at exit; a view whose maker is gone (killed) is removed by the next
process that makes one (`sweep`), as cgroups are.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import stat
import threading
from collections.abc import Iterable
from pathlib import Path

from labkit import scratch
from labkit.sandbox import cgroups

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "labkit-view-"
# Course folders shown through a view; anything else (the venv under the course, a student's
# module) stays a bind of its own.
FOLDERS = ("labkit", "checks")
MAX_BYTES = 32 * 1024 * 1024  # a view larger than this is not made: the files are bound one by one

_lock = threading.Lock()
_views: dict[tuple, Path] = {}  # the files' identities → this process's view of them
_place: Path | None = None  # this process's folder of views
_maker = os.getpid()


def collapse(read_only: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """(the paths still bound one by one, [(view folder, course folder)]) for a box's read-only
    paths: every path inside one of the course's `FOLDERS` is shown through a view instead."""
    keep, inside, files, tops = _plan(tuple(map(str, read_only)))
    if not inside:
        return list(keep), []
    view = _view(files)
    if view is None:
        return [*keep, *inside], []
    return list(keep), [(view / top, ROOT / top) for top in tops]


@functools.lru_cache(maxsize=256)
def _plan(read_only: tuple[str, ...]) -> tuple[tuple[Path, ...], tuple[Path, ...], tuple[str, ...], tuple[str, ...]]:
    """(paths bound as they are, paths shown through a view, the same sorted as text, the course
    folders they are in). A function of the text alone, and every child of a step passes the same
    list: worked out once (it was 1.2 of its 1.5 ms a box); what the files are now, `_identity`
    still reads on every call, so a changed file still gets a new view."""
    paths = [Path(p) for p in read_only]
    whole = {path.name for path in paths if path.parent == ROOT}  # a folder shown whole is bound as it is
    keep, inside = [], []
    for path in paths:
        top = _folder_of(path)
        (inside if top is not None and top not in whole else keep).append(path)
    return tuple(keep), tuple(inside), tuple(sorted(map(str, inside))), tuple(sorted({_folder_of(p) for p in inside}))


def place() -> Path | None:
    """This process's folder of views (made now if need be), None where none can be made (the
    files are then bound one by one): a judge's box shows it read-only at the same path, so the
    boxes the launcher makes in the judge's namespaces find their views."""
    global _place
    with _lock:
        if _place is None or not _place.is_dir():
            base = _base()
            sweep(base)
            made = base / f"{PREFIX}{os.urandom(6).hex()}-{cgroups.OWNER}"  # the maker last: `sweep` reads it
            try:
                made.mkdir(mode=0o755)
                made.chmod(0o755)
            except OSError:
                return None
            _place = made
            _views.clear()
        return _place


def remove() -> None:
    """Remove this process's views (at exit; a forkserver's worker, which ends by os._exit, calls it)."""
    global _place
    with _lock:
        if _place is not None and os.getpid() == _maker:
            shutil.rmtree(_place, ignore_errors=True)
        _place = None
        _views.clear()


def _base() -> Path:
    return scratch.fast_place() or Path("/tmp")  # never $TMPDIR: a test's, removed under us


def sweep_ended() -> list[Path]:
    """`sweep` where views are made: for a process whose makers have ended (a grader whose
    workers were killed), which would otherwise leave their views to the next maker."""
    return sweep(_base())


def sweep(base: Path) -> list[Path]:
    """Remove every folder of views in `base` whose maker has ended; return those removed."""
    removed = []
    for path in base.glob(f"{PREFIX}*"):
        if cgroups.owner_gone(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _folder_of(path: Path) -> str | None:
    try:
        relative = path.relative_to(ROOT)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in FOLDERS else None


def _identity(paths: tuple[str, ...]) -> tuple | None:
    """What the view of `paths` (sorted) depends on: each file's (path, inode, size, mtime); None
    when a path is neither a regular file nor a folder of them (a link: bound as before, never copied)."""
    found = []
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode):
            for folder, dirs, files in os.walk(path):
                if any(os.path.islink(os.path.join(folder, d)) for d in dirs):
                    return None  # a linked folder inside: os.walk would skip it, a bind shows it
                for name in sorted(files):
                    entry = _file(os.path.join(folder, name))
                    if entry is None:
                        return None
                    found.append(entry)
        else:
            entry = _file(path)
            if entry is None:
                return None
            found.append(entry)
    return tuple(found)


def _file(path: str) -> tuple | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (path, info.st_ino, info.st_size, info.st_mtime_ns) if stat.S_ISREG(info.st_mode) else None


def _view(paths: tuple[str, ...]) -> Path | None:
    identity = _identity(paths)
    if identity is None or sum(size for _p, _i, size, _m in identity) > MAX_BYTES:
        return None
    folder = place()
    if folder is None:
        return None
    with _lock:
        if identity in _views:
            return _views[identity]
        view = folder / f"v{len(_views)}"
        try:
            view.mkdir(mode=0o700)
            for source, *_ in identity:
                target = view / Path(source).relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)  # its mtime too: a compiled file must still match it
                target.chmod(0o644)
            for sub, _dirs, _files in os.walk(view):
                os.chmod(sub, 0o755)  # readable only once whole
        except OSError:
            shutil.rmtree(view, ignore_errors=True)
            return None
        _views[identity] = view
        return view


def _forked() -> None:
    global _lock, _place, _maker
    _lock, _place, _maker = threading.Lock(), None, os.getpid()
    _views.clear()  # the parent's, which it removes; a fork makes its own when it needs one


os.register_at_fork(after_in_child=_forked)
atexit.register(remove)
