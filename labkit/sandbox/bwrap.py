"""A `Policy` → one command line: bubblewrap, then setpriv, then prlimit, then the program.

    [sh -c 'join the cgroups' --] bwrap <namespaces, mounts, env> -- setpriv <uid, no caps>
        -- prlimit <per-process limits> -- PROGRAM ARGS

- bubblewrap runs as root *without* a user namespace, so it can mount as real root: new pid,
  ipc, uts, mount (and network) namespaces, a tmpfs root holding only the listed host paths,
  private /tmp and /dev/shm. The course's files it lists are shown through one bind per
  course folder, from a view holding exactly those files (`course_view.py`).
  `--die-with-parent` and the pid namespace mean that when bwrap goes, everything started
  inside goes too: nothing outlives its sandbox.
- setpriv then becomes a real unprivileged host uid with no capabilities, no supplementary
  groups and `no_new_privs` (a user namespace that merely maps root would keep root's file
  access; this does not).
- prlimit sets the per-process limits (address space, file size, no core files).
- a seccomp filter (`seccomp.py`, read by bwrap from an fd) is installed right before the
  exec of setpriv, so the whole chain and everything it starts runs under it; /proc's views
  of kernel-wide state (key rings, kernel memory and symbols, timers) are masked by
  /dev/null, as Docker masks them.
- The cgroup is joined by a one-line shell before bwrap starts, so every process of the
  sandbox is counted from its first instruction (memory incl. tmpfs and shared memory,
  number of processes).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from labkit.sandbox import course_view
from labkit.sandbox.policy import SYSTEM_DIRS, SYSTEM_FILES, SYSTEM_LINKS, Policy

# Joins every cgroup named before `--`, then execs the rest. Exit 125: could not join.
JOIN_CGROUPS = 'p=$$; while [ "$1" != -- ]; do echo "$p" > "$1" || exit 125; shift; done; shift; exec "$@"'
TOOLS = ("bwrap", "setpriv", "prlimit", "nsenter")
# /proc files that show (or poke) kernel-wide state, not the box's own: each one that exists
# here is covered by /dev/null inside (Docker's masked paths; the kernel is the same inside).
MASKED_PROC = ("/proc/keys", "/proc/key-users", "/proc/kcore", "/proc/kallsyms", "/proc/timer_list",
               "/proc/sched_debug", "/proc/sysrq-trigger", "/proc/latency_stats")


def tool(name: str) -> str | None:
    """Where a tool is, if it is under /usr (the only system dir a sandbox sees)."""
    found = shutil.which(name, path="/usr/bin:/usr/sbin:/bin:/sbin")
    return str(Path(found)) if found else None


@functools.lru_cache(maxsize=1)
def _system_mounts() -> tuple[str, ...]:
    """The host's system folders, links and files, read-only: the same for every box a process
    makes (the host's layout does not change under a judge), so read once (0.5 ms a box)."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        if os.path.isdir(name):
            args += ["--ro-bind", name, name]
    for name in SYSTEM_LINKS:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    files = [name for name in SYSTEM_FILES if os.path.exists(name)]
    for directory in _ancestors(files, set(SYSTEM_DIRS), set()):
        args += ["--perms", "0755", "--dir", directory]
    for name in files:
        args += ["--ro-bind", os.path.realpath(name), name]
    return tuple(args)


def _ancestors(paths: list[str], bound: set[str], roots: set[str]) -> list[str]:
    """Directories to create (in order) so each path can be reached.

    None inside a `bound` host dir (they exist there already) and none that is one of the
    `roots` (mount points that exist already: /, /tmp, /dev).
    """
    needed: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            if any(parent == b or parent.startswith(b + "/") for b in bound):
                break
            if parent not in roots:
                needed.add(parent)
            parent = os.path.dirname(parent)
    return sorted(needed, key=lambda p: (p.count("/"), p))


def command(policy: Policy, argv: list[str], *, cgroup_procs: tuple[Path, ...] = (),
            status_fd: int | None = None, seccomp_fd: int | None = None,
            bound_fds: dict[str, int] | None = None, netns_fd: int | None = None,
            pidns_fd: int | None = None, mntns_fd: int | None = None) -> list[str]:
    """The full command line that runs `argv` under `policy`.

    `cgroup_procs`: the `cgroup.procs` files to join first; `status_fd`: an fd that bwrap
    writes its JSON status to (the child's pid, then its exit code); `seccomp_fd`: an fd to
    read the compiled seccomp filter from (`seccomp.filter_fd`); `bound_fds`: writable paths
    bound from a directory fd (`--bind-fd`), never by resolving a host path; `netns_fd`,
    `pidns_fd`, `mntns_fd`: start inside these namespaces (the judge's, with `nsenter`),
    so the judge's servers are reachable, the judge sees the box's processes (never the
    reverse), and every path is resolved in the judge's view, never the host's.
    """
    bound_fds = bound_fds or {}
    bwrap = tool("bwrap") or "bwrap"
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
            "--die-with-parent"]
    if policy.network == "private":
        args.append("--unshare-net")
    if policy.drops_privileges:
        args.append("--unshare-cgroup-try")
    else:
        args += ["--cap-add", "ALL"]  # the judge's own box: it mounts and chowns for its children
    if status_fd is not None:
        args += ["--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += ["--clearenv"]
    for key, value in sorted(policy.env.items()):
        args += ["--setenv", key, value]
    args += ["--tmpfs", "/", *_system_mounts()]
    covered = set(SYSTEM_DIRS) | {n for n in SYSTEM_LINKS if os.path.isdir(n)}
    read_only, views = course_view.collapse(policy.read_only)
    binds = [(str(p), False) for p in read_only] + [(str(p), True) for p in policy.writable]
    binds += [(str(dest), False) for _view, dest in views]
    binds.sort(key=lambda b: (b[0].count("/"), b[0]))
    source = {str(dest): str(view) for view, dest in views}
    args += ["--proc", "/proc", "--dev", "/dev"]
    for path in MASKED_PROC:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for mount in ("/tmp", "/dev/shm"):  # first: a bind below /tmp (a step's folder) stays visible
        args += ["--perms", "1777", "--size", str(policy.tmp_bytes), "--tmpfs", mount]
    private = {"/tmp", "/dev/shm", *(path for path, _ in policy.scratch)}
    outside = [dest for _host, dest in policy.mapped if not any(dest.startswith(p + "/") for p in private)]
    mounts = [path for path, _ in binds] + [path for path, _ in policy.scratch] + outside
    for directory in _ancestors(mounts, covered, {"/tmp", "/dev", "/dev/shm"}):
        args += ["--perms", "0755", "--dir", directory]
    for path, rw in binds:
        if path in bound_fds:
            args += ["--bind-fd" if rw else "--ro-bind-fd", str(bound_fds[path]), path]
        else:
            args += ["--bind" if rw else "--ro-bind", source.get(path, path), path]
    for path, size in policy.scratch:
        args += ["--perms", "1777", "--size", str(size), "--tmpfs", path]
    inside = [dest for _host, dest in policy.mapped if dest not in outside]
    for directory in _ancestors(inside, covered | {p for p, _ in binds}, private | {"/dev"}):
        if any(directory.startswith(p + "/") for p in private):  # the program's own folders
            args += ["--perms", "1777", "--dir", directory]
    for host, dest in policy.mapped:
        args += ["--ro-bind", str(host), dest]
    args += ["--chdir", str(policy.cwd), "--"]
    if policy.drops_privileges:
        args += [tool("setpriv") or "setpriv", f"--reuid={policy.uid}", f"--regid={policy.gid}",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    limits = [f"--as={policy.address_space}" if policy.address_space else None,
              f"--fsize={policy.file_bytes}" if policy.file_bytes else None]
    if any(limits):
        args += [tool("prlimit") or "prlimit", *filter(None, limits), "--core=0", "--"]
    args += list(argv)
    enter = [f"--net=/proc/self/fd/{netns_fd}"] if netns_fd is not None else []
    enter += [f"--mount=/proc/self/fd/{mntns_fd}"] if mntns_fd is not None else []
    enter += [f"--pid=/proc/self/fd/{pidns_fd}"] if pidns_fd is not None else []  # nsenter forks
    if enter:
        args = [tool("nsenter") or "nsenter", *enter, "--", *args]
    if cgroup_procs:
        args = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *map(str, cgroup_procs), "--", *args]
    return args
