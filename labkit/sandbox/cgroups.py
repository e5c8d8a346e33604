"""Per-sandbox control groups: memory (tmpfs and shared memory included) and process count.

A sandbox's group is made below the group the caller itself is in (the machine's delegation
is respected), its limits written, and its `cgroup.procs` file(s) handed to the command line,
which joins them before bubblewrap starts. Afterwards everything still in it is killed, what
it used is read, and the group is removed. cgroup v1 (`memory` and `pids` hierarchies) and
v2 (the unified hierarchy with those controllers) are both understood.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from labkit.sandbox import reaper

MOUNT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")


def _own_groups() -> dict[str, str]:
    """controller → the caller's group path ("" → v2's unified hierarchy), from /proc/self/cgroup."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


@dataclass
class Hierarchy:
    """Where new groups go for each controller (v1: one dir per controller; v2: one dir)."""

    version: int
    parents: dict[str, Path]

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.parents.values()))


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def find() -> Hierarchy | None:
    """The hierarchy to use here, or None (no cgroups, or none we may write)."""
    own = _own_groups()
    v1 = {name: MOUNT / name / own[name].lstrip("/") for name in CONTROLLERS if name in own}
    if len(v1) == len(CONTROLLERS) and all(_writable(p) for p in v1.values()):
        return Hierarchy(1, v1)
    if "" in own:
        for base in (MOUNT, MOUNT / "unified"):
            parent = base / own[""].lstrip("/")
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if all(c in enabled for c in CONTROLLERS) and _writable(parent):
                return Hierarchy(2, {c: parent for c in CONTROLLERS})
    return None


@dataclass
class Usage:
    memory_peak: int | None = None
    oom_kills: int = 0
    pids_refused: int = 0  # forks refused at the process limit


@dataclass
class Group:
    """One sandbox's group(s): made with its limits, joined by the command line, removed after."""

    hierarchy: Hierarchy
    name: str
    paths: dict[str, Path] = field(default_factory=dict)
    # What `kill` signalled that was not this process's own child: when its parent (bwrap) dies
    # first it re-parents to us, a subreaper, and must be collected. Our own children (bwrap
    # itself) are left to the Popen that started them.
    orphans: set[int] = field(default_factory=set)

    @classmethod
    def create(cls, hierarchy: Hierarchy, memory_bytes: int | None, max_processes: int | None,
               prefix: str = "labkit") -> Group:
        remove_later()
        group = cls(hierarchy, f"{prefix}-{uuid.uuid4().hex[:12]}-{OWNER}")
        for controller, parent in hierarchy.parents.items():
            path = parent / group.name
            if path not in group.paths.values():
                path.mkdir()
            group.paths[controller] = path
        try:
            if hierarchy.version == 1:
                if memory_bytes:
                    (group.paths["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    _try_write(group.paths["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
                if max_processes:
                    (group.paths["pids"] / "pids.max").write_text(str(max_processes))
            else:
                if memory_bytes:
                    (group.paths["memory"] / "memory.max").write_text(str(memory_bytes))
                    _try_write(group.paths["memory"] / "memory.swap.max", "0")
                if max_processes:
                    (group.paths["pids"] / "pids.max").write_text(str(max_processes))
        except OSError:
            group.remove()
            raise
        return group

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(p / "cgroup.procs" for p in self.paths.values()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(x) for x in procs.read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def usage(self) -> Usage:
        mem = self.paths["memory"]
        usage = Usage()
        if self.hierarchy.version == 1:
            usage.memory_peak = _read_int(mem / "memory.max_usage_in_bytes")
            usage.oom_kills = _read_key(mem / "memory.oom_control", "oom_kill")
            usage.pids_refused = _read_key(self.paths["pids"] / "pids.events", "max")
        else:
            usage.memory_peak = _read_int(mem / "memory.peak")
            usage.oom_kills = _read_key(mem / "memory.events", "oom_kill")
            usage.pids_refused = _read_key(self.paths["pids"] / "pids.events", "max")
        return usage

    def kill(self, grace: float = 2.0) -> int:
        """SIGKILL every process in the group until it is empty (bounded)."""
        killed: set[int] = set()
        if self.hierarchy.version == 2 and _try_write(self.paths["pids"] / "cgroup.kill", "1"):
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    seen = reaper.state_and_parent(pid)
                    parent = seen[1] if seen else None
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                    if parent != os.getpid():
                        self.orphans.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        return len(killed)

    def remove(self, grace: float = 2.0) -> bool:
        """Remove the group (after `kill`); True when it is gone.

        A group still in use is killed again: a command line that joined it after `kill` looked
        (a box closed while its shell was still starting) would otherwise run on in a group
        nobody removes."""
        deadline = time.monotonic() + grace
        remaining = list(dict.fromkeys(self.paths.values()))
        while remaining:
            remaining = _rmdirs(remaining)
            if not remaining or time.monotonic() > deadline:
                break
            if self.pids():
                self.kill(grace=max(0.0, deadline - time.monotonic()))
            time.sleep(0.01)
        # Still busy after the grace (a pid namespace that takes seconds to tear down on a loaded
        # machine): removed later, when the next group is made or this process exits.
        with _LATER_LOCK:
            _LATER.update(remaining)
        return not remaining


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _process_id(pid: int) -> str | None:
    """`pidns.pid.start`: a process as no later one with the same number can be (its pid
    namespace, its number there, its start time in clock ticks)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return f"{_pid_namespace()}.{pid}.{int(fh.read().rsplit(b')', 1)[1].split()[19])}"
    except (OSError, IndexError, ValueError):
        return None


# Who makes a group is in its name (`labkit-<random>-<pidns>.<pid>.<start>`): a group whose maker
# is gone is nobody's, whatever is still in it. A forked process names its own groups.
OWNER = _process_id(os.getpid()) or "unknown"


def _forked() -> None:
    global OWNER
    OWNER = _process_id(os.getpid()) or "unknown"


os.register_at_fork(after_in_child=_forked)


def owner_gone(name: str) -> bool:
    """Whether the process that made the group `name` has ended. False when the name does not
    say, or says a process of another pid namespace (its numbers mean nothing here)."""
    parts = name.rsplit("-", 1)[-1].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or parts[0] != _pid_namespace():
        return False
    return _process_id(int(parts[1])) != ".".join(parts)


def sweep_orphans(hierarchy: Hierarchy | None = None, prefix: str = "labkit-") -> list[Path]:
    """Empty and remove every `prefix` group whose maker has ended; return those removed.

    A judge killed while a sandbox was starting (a kernel restarted mid-check, a grader's worker
    SIGKILLed) leaves a group nobody will close, and bubblewrap can leave a process in it for
    good: its inner half, killed before the outer half let it go on, waits forever and never
    got --die-with-parent (seen after a CI run: one bwrap asleep on an eventfd, its group kept).
    Groups of a maker still running, or named otherwise, are not touched."""
    hierarchy = hierarchy if hierarchy is not None else find()
    removed: list[Path] = []
    if hierarchy is None:
        return removed
    names: set[str] = set()
    for parent in hierarchy.dirs:
        try:
            names.update(p.name for p in parent.iterdir() if p.name.startswith(prefix))
        except OSError:
            continue
    for name in sorted(n for n in names if owner_gone(n)):
        paths = {c: p / name for c, p in hierarchy.parents.items() if (p / name).is_dir()}
        group = Group(hierarchy, name, paths)
        group.kill()
        if group.remove(grace=1.0):
            removed += list(dict.fromkeys(paths.values()))
    return removed


# Groups whose removal was still refused at the end of `Group.remove`: everything in them was
# killed, so they empty soon; each try is one rmdir, never a wait.
_LATER: set[Path] = set()
_LATER_LOCK = threading.Lock()


def remove_later() -> int:
    """Remove the groups left for later that are empty by now; how many are still left."""
    with _LATER_LOCK:
        left = _rmdirs(_LATER)
        _LATER.intersection_update(left)
        return len(_LATER)


def _rmdirs(paths) -> list[Path]:
    """One rmdir of each path; those still there (busy)."""
    left = []
    for path in paths:
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(path)
    return left


@atexit.register
def _remove_at_exit(grace: float = 5.0) -> None:
    deadline = time.monotonic() + grace
    while remove_later() and time.monotonic() < deadline:
        time.sleep(0.05)


def _try_write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_key(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
