"""Contain a submission's kernel: limits, a private environment, and a sweep afterwards.

The kernel starts through this module (`python -m labkit.grading.sandbox --as N ... -- CMD`),
which applies resource limits and, where Linux allows it (root), gives the kernel a private
mount namespace in which the whole filesystem is read-only except the kernel's own dir, then
drops every capability and execs the kernel: the limits hold for everything it starts. Its environment points every home, temp, Jupyter and IPython
directory into the submission's temp dir, and carries a `LABKIT_RUN` marker: afterwards
every process with that marker is killed (`labkit.judge.reaper`), also those that called `setsid`.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from labkit.grading.settings import ROOT, Limits
from labkit.judge import reaper
from labkit.limits import RUN_MARKER

# Directories under the kernel's own dir, each named after what it replaces.
KERNEL_DIRS = ("home", "tmp", "runtime", "data", "config", "ipython", "cache")


def kernel_dirs(root: Path) -> dict[str, Path]:
    dirs = {name: root / f".{name}" for name in KERNEL_DIRS}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return dirs


def redirected_env(root: Path) -> dict[str, str]:
    """Variables that send every default write location into `root`."""
    d = kernel_dirs(root)
    return {
        "HOME": str(d["home"]),
        "TMPDIR": str(d["tmp"]), "TEMP": str(d["tmp"]), "TMP": str(d["tmp"]),
        "JUPYTER_RUNTIME_DIR": str(d["runtime"]),
        "JUPYTER_DATA_DIR": str(d["data"]),
        "JUPYTER_CONFIG_DIR": str(d["config"]),
        "JUPYTER_PLATFORM_DIRS": "1",
        "IPYTHONDIR": str(d["ipython"]),
        "XDG_CACHE_HOME": str(d["cache"]),
        "XDG_CONFIG_HOME": str(d["config"]),
        "XDG_DATA_HOME": str(d["data"]),
        "MPLCONFIGDIR": str(d["cache"]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def kernel_env(root: Path, marker: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JPY_SESSION_NAME", "NBGRADER_EXECUTION", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)
    env.update(redirected_env(root))
    env[RUN_MARKER] = marker
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def wrapper(limits: Limits, kernel_dir: Path | None = None) -> list[str]:
    """The command prefix that starts a kernel under the limits (and a read-only world)."""
    cmd = [sys.executable, "-m", "labkit.grading.sandbox", "--as", str(limits.kernel_memory),
           "--fsize", str(limits.kernel_file_size)]
    if kernel_dir is not None:
        cmd += ["--private-fs", str(kernel_dir)]
    return [*cmd, "--"]


def sweep(marker: str) -> int:
    """Kill everything a kernel left behind (the marker is inherited through `setsid`)."""
    return reaper.kill_marked(marker)


# --- the launcher (runs between the kernel manager and ipykernel) ---------------------------

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
MOUNT_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                 "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int) -> None:
    import ctypes

    if libc.mount(source.encode() if source else None, target.encode(),
                  fstype.encode() if fstype else None, ctypes.c_ulong(flags), None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), target)


def _mounts() -> list[tuple[str, int]]:
    """Mount points and their per-mount flags, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            flags = 0
            for option in fields[5].split(","):
                flags |= MOUNT_OPTIONS.get(option, 0)
            found.append((point, flags))
    return found


def private_fs(own: Path) -> int:
    """A private mount namespace where everything is read-only except `own` (and a fresh /dev/shm).

    Then every capability is dropped for good, so the kernel cannot undo it. Writes elsewhere
    fail with EROFS; nothing the kernel writes outlives it except in `own`, which the grader
    deletes. Returns how many mounts could not be made read-only (0 = all). Raises OSError
    when namespaces are not available (not root, or a container without CAP_SYS_ADMIN).
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError("unshare(CLONE_NEWNS) is not permitted here")
    own = own.resolve()
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, str(own), str(own), None, MS_BIND | MS_REC)
    os.chdir(own)  # the old cwd is on the mount that is about to become read-only
    missed = 0
    for point, flags in _mounts():
        if point == str(own) or point == "/proc" or point.startswith(("/proc/", str(own) + "/")):
            continue
        try:
            _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            missed += 1
    if os.path.isdir("/dev/shm"):
        try:
            _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV)
        except OSError:
            missed += 1
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return missed


def private_fs_available() -> bool:
    """Whether `private_fs` can work here (tried in a throwaway child)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _libc().unshare(CLONE_NEWNS) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m labkit.grading.sandbox")
    ap.add_argument("--as", dest="memory", type=int, required=True)
    ap.add_argument("--fsize", type=int, required=True)
    ap.add_argument("--private-fs", type=Path)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    if args.private_fs is not None:
        try:
            private_fs(args.private_fs)
        except OSError as exc:  # best effort: the environment redirection still applies
            print(f"[labkit sandbox] no private filesystem view: {exc}", file=sys.stderr)
    resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, args.fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
