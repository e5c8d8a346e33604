"""A sandbox policy: everything one sandboxed program may see and use, declared as data.

Each field mirrors one bubblewrap / setpriv / prlimit / cgroup setting (see `bwrap.py` for
the mapping), so a policy reads like the threat model: who the program runs as, which host
paths it sees (read-only or writable), what it may keep in memory and on its private disk,
how many processes it may have, and whether it has a network of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# An unprivileged host uid with no account: nothing on the host belongs to it. Grading gives
# each concurrent job its own uid above this one (`users.py`).
DEFAULT_UID = 200_000

# The host's system directories a Python runtime needs (C library, shared libraries, the
# tools the sandbox itself execs: setpriv, prlimit). Never /home, /root, /etc, /srv, /work.
SYSTEM_DIRS = ("/usr",)
# Debian's merged-/usr links, recreated as links inside the sandbox when the host has them.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few files under /etc that Python reads: time zone and name resolution of `localhost`.
SYSTEM_FILES = ("/etc/localtime", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl/openssl.cnf")

MiB = 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """What one sandboxed program may do. Paths are host paths, seen at the same place inside."""

    # Who the program runs as: a real unprivileged host uid/gid, no supplementary groups, no
    # capabilities (setpriv). None keeps the caller's identity (only for the judge's own box).
    uid: int | None = DEFAULT_UID
    gid: int | None = DEFAULT_UID
    # Host paths visible read-only, and writable (each exactly where it is on the host).
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    # Host files shown read-only at another place, e.g. inside the private home:
    # ((host file, inside path), ...).
    mapped: tuple[tuple[Path, str], ...] = ()
    # Where the program starts, and its whole environment (nothing is inherited).
    cwd: Path = Path("/tmp")
    env: dict[str, str] = field(default_factory=dict)
    # "private": a network namespace of its own with only `lo` (nothing else is reachable);
    # "shared": the caller's network namespace (the judge's servers are reachable).
    network: str = "private"
    # Private writable tmpfs mounts (/tmp, /dev/shm, HOME live here): size of each.
    tmp_bytes: int = 64 * MiB
    # Extra private tmpfs mounts, e.g. a kernel's working folder: ((inside path, bytes), ...).
    scratch: tuple[tuple[str, int], ...] = ()
    # Resident memory including tmpfs and shared memory (cgroup), and processes + threads.
    memory_bytes: int | None = 1536 * MiB
    max_processes: int | None = 256
    # Per-process limits (prlimit): address space and the largest file it may write.
    address_space: int | None = None
    file_bytes: int | None = 256 * MiB
    # A seccomp filter (`seccomp.py`): no key rings (one per uid, not per namespace: a key would
    # carry a solution from one box to the next), no ptrace, eBPF, perf, io_uring, mounts or
    # new namespaces. True for every box (the judge's own gets the variant that lets it start
    # bwrap); only a test may turn it off, to show what it blocks.
    seccomp: bool = True

    @property
    def drops_privileges(self) -> bool:
        """False only for the judge's own box: trusted code that starts sandboxes itself."""
        return self.uid is not None
