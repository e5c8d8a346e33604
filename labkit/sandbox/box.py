"""One run of one program in a sandbox: prepare, spawn, then close and say what happened.

    box = Box.open(policy)                 # cgroup made, writable dirs handed to the uid
    proc = box.spawn(argv, stdout=..., ...)   # subprocess.Popen of the wrapped command line
    ...                                    # the caller waits, reads pipes, kills on timeout
    report = box.close(proc)               # everything in it killed, usage read, cgroup gone

The named outcomes (`Outcome`) follow CMS's sandbox statuses. `NullBox` runs the program as
it is (no sandbox) behind the same interface, so callers never branch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from labkit.sandbox import bwrap, cgroups, seccomp
from labkit.sandbox.policy import Policy

# bwrap reports a death by signal N as exit status 128 + N, like a shell.
SIGNAL_BASE = 128
ORPHAN_GRACE = 10.0  # seconds to collect a sandbox's killed processes (only killed ones wait)


class Outcome(StrEnum):
    OK = "ok"  # exit status 0
    NONZERO = "nonzero"  # exited with another status
    SIGNALED = "signaled"  # killed by a signal
    MEMORY_LIMIT = "memory-limit"  # the cgroup's memory limit was hit and the kernel killed it
    # The sandbox never started (no bwrap process: the cgroup could not be joined, bwrap is
    # missing). A failure inside bwrap's own set-up shows as exit 1 with "bwrap: ..." on stderr.
    SANDBOX_ERROR = "sandbox-error"


@dataclass
class Report:
    outcome: Outcome
    returncode: int | None  # like Popen's: negative = killed by that signal
    child_pid: int | None = None  # bwrap's first process inside, as the host sees it
    memory_peak: int | None = None
    oom_kills: int = 0
    pids_refused: int = 0
    leftovers_killed: int = 0


def returncode(raw: int | None) -> int | None:
    """bwrap's exit status → Popen's convention: 128+N (N a signal) → -N; others unchanged."""
    if raw is not None and SIGNAL_BASE < raw <= SIGNAL_BASE + signal.SIGRTMAX:
        return -(raw - SIGNAL_BASE)
    return raw


def hand_over(path: Path, uid: int, gid: int) -> None:
    """Make a dir and what is in it the sandbox uid's, so the program can write there.

    Links are changed, never followed (lchown); nothing outside `path` is touched.
    """
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                os.lchown(os.path.join(root, name), uid, gid)
            except FileNotFoundError:
                pass


def _collect(pids: set[int], grace: float = ORPHAN_GRACE, parents: frozenset[int] = frozenset()) -> None:
    """Collect the killed processes of a sandbox that re-parented to the judge.

    When bwrap dies before its first process inside (a cgroup kill signals both at once), that
    process and whatever it still had inside re-parent to the judge, a subreaper: uncollected,
    they stay zombies of a grader that may run for hours. Waits (bounded) until each is
    collected or gone; a slow pid-namespace teardown on a loaded machine takes seconds.
    """
    from labkit.sandbox import reaper

    reaper.collect(pids, time.monotonic() + grace, parents)


@dataclass
class Box:
    policy: Policy
    group: cgroups.Group | None = None
    _status_r: int | None = None
    _status_w: int | None = None
    _seccomp: int | None = None  # the parent's copy of the filter's fd, until bwrap has started
    _closed: bool = False
    _state: dict = field(default_factory=dict)
    _usage: cgroups.Usage = field(default_factory=cgroups.Usage)
    _killed: int = 0
    active: bool = True
    chowns: bool = False  # its writable folders are handed to its uid (`hand_over_writable`)
    # Set by the launcher (`launcher.py`): writable paths bound from a directory fd the judge
    # sent (inside path → fd), and the judge's network and pid namespaces to start the box in.
    bound_fds: dict[str, int] = field(default_factory=dict)
    netns_fd: int | None = None
    pidns_fd: int | None = None
    mntns_fd: int | None = None
    # The uid and gid its command runs as, when not the policy's (a zygote's holder: `zygote.py`);
    # the policy's are still the box's own (its folders, its processes). Such a command gets no
    # per-process limits (no prlimit): it only holds the box, and the child the zygote forks in
    # sets the policy's own (one exec less per case: ~2 ms of CPU of a child's ~43).
    run_as: tuple[int, int] | None = None
    _early: dict = field(default_factory=dict)
    _pending: bytes = b""
    # Run first when the box closes: what lives in its namespaces but is not its own to end (a
    # judge's box: the launcher's children, nested in its pid namespace, keep its init alive).
    before_close: Callable[[], None] | None = None

    @classmethod
    def open(cls, policy: Policy, hierarchy: cgroups.Hierarchy | None = None, *,
             chown_writable: bool = True) -> Box:
        """`chown_writable=False`: the writable folders are the caller's fds, already the uid's; the
        launcher never walks (or chowns) a path a sandboxed process could have touched."""
        from labkit.sandbox import reaper

        # bwrap's first process inside can outlive bwrap; it must re-parent to us to be collected.
        reaper.become_subreaper()
        box = cls(policy)
        box.chowns = policy.drops_privileges and chown_writable
        box.hand_over_writable()
        if hierarchy is not None and (policy.memory_bytes or policy.max_processes):
            box.group = cgroups.Group.create(hierarchy, policy.memory_bytes, policy.max_processes)
        return box

    def hand_over_writable(self) -> None:
        """Give the policy's writable folders, and what the judge put there, to the box's uid:
        when the box opens, and again for a program started before the judge made its files
        (`BoxedPopen.hand_over`, before the program runs anything of the student's)."""
        if self.chowns:
            for path in self.policy.writable:
                hand_over(Path(path), self.policy.uid, self.policy.gid)

    def command(self, argv: list[str]) -> list[str]:
        """The wrapped command line; pass `pass_fds` to Popen, then call `started()`.

        Raises `seccomp.SeccompUnavailable` (an OSError) when the policy wants a filter that
        cannot be built here: a box never starts without the filter it was meant to have."""
        try:
            if self._status_r is None:
                self._status_r, self._status_w = os.pipe()
            if self.policy.seccomp and self._seccomp is None:  # every command line gets its filter
                kind = seccomp.STUDENT if self.policy.drops_privileges else seccomp.NESTING
                self._seccomp = seccomp.filter_fd(kind)
            policy = self.policy
            if self.run_as is not None:
                policy = dataclasses.replace(policy, uid=self.run_as[0], gid=self.run_as[1],
                                             address_space=None, file_bytes=None)
            return bwrap.command(policy, argv, cgroup_procs=self.group.procs_files if self.group else (),
                                 status_fd=self._status_w, seccomp_fd=self._seccomp,
                                 bound_fds=self.bound_fds, netns_fd=self.netns_fd, pidns_fd=self.pidns_fd,
                                 mntns_fd=self.mntns_fd)
        except BaseException:
            self.started()
            raise

    @property
    def pass_fds(self) -> tuple[int, ...]:
        shared = (self._status_w, self._seccomp, self.netns_fd, self.pidns_fd, self.mntns_fd,
                  *self.bound_fds.values())
        return tuple(fd for fd in shared if fd is not None)

    def wait_child_pid(self, timeout: float) -> int | None:
        """Block (bounded) until bwrap reports its first process inside; its host pid, or None
        when bwrap ended (or said nothing) first. What was read is kept for `close`."""
        import select

        if self._status_r is None:
            return None
        deadline, data = time.monotonic() + timeout, b""
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._status_r], [], [], remaining)[0]:
                break
            chunk = os.read(self._status_r, 65536)
            if not chunk:
                break
            data += chunk
        first, _, rest = data.partition(b"\n")
        try:
            self._early = json.loads(first) if first.strip() else {}
        except ValueError:
            self._early = {}
        self._pending = rest
        return self._early.get("child-pid")

    def spawn(self, argv: list[str], **popen) -> subprocess.Popen:
        """Popen the wrapped command (`pass_fds` given are passed on, plus the box's own).

        The process returned reports exit codes like a plain Popen (-N: killed by signal N)
        and closes the box once it is seen to have ended (`wait`, `poll`).
        """
        try:
            wrapped = self.command(argv)
        except BaseException:
            self.close()
            raise
        popen["pass_fds"] = (*popen.get("pass_fds", ()), *self.pass_fds)
        try:
            return BoxedPopen(self, wrapped, **popen)
        except BaseException:
            self.close()
            raise
        finally:
            self.started()

    def started(self) -> None:
        """After the Popen (or instead of it): the parent's copies of the status pipe's write
        end and of the seccomp filter's fd are closed."""
        if self._status_w is not None:
            os.close(self._status_w)
            self._status_w = None
        if self._seccomp is not None:
            os.close(self._seccomp)
            self._seccomp = None

    def kill(self) -> int:
        """SIGKILL everything in the sandbox now (its cgroup, else its marked processes)."""
        if self.group is not None:
            return self.group.kill()
        pids = self.program_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def signal(self, signum: int) -> None:
        """Send `signum` to the program and what it started (bwrap does not pass signals on)."""
        for pid in self.program_pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def program_pids(self) -> list[int]:
        """The sandboxed program and what it started (not bwrap): processes of the box's uid."""
        if self.group is not None:
            candidates = self.group.pids()
        else:
            from labkit.limits import RUN_MARKER
            from labkit.sandbox import reaper

            marker = self.policy.env.get(RUN_MARKER)
            candidates = set(reaper.marked_pids(marker)) if marker else set()
        found = []
        for pid in sorted(candidates):
            try:
                if os.stat(f"/proc/{pid}").st_uid == self.policy.uid:
                    found.append(pid)
            except OSError:
                continue
        return found

    def terminate(self, proc: subprocess.Popen, grace: float) -> None:
        """SIGTERM the program itself and wait (bounded) for the sandbox to end."""
        self.signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def _status(self) -> dict:
        status: dict = dict(self._early)
        if self._status_r is None:
            return status
        os.set_blocking(self._status_r, False)
        data = self._pending
        try:
            while chunk := os.read(self._status_r, 65536):
                data += chunk
        except BlockingIOError:
            pass
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                status.update(json.loads(line))
            except ValueError:
                continue
        return status

    def close(self, proc: subprocess.Popen | None = None) -> Report:
        """Kill what is left in the sandbox, read what it used, remove its cgroup; say how it ended.

        The clean-up runs once; later calls only report again (with the exit status if it is
        known by then).
        """
        if not self._closed:
            self._closed = True
            if self.before_close is not None:
                self.before_close()
            self.started()
            self._state = self._status()
            if self._status_r is not None:
                os.close(self._status_r)
                self._status_r = None
            orphans: set[int] = set()
            if self.group is not None:
                self._killed = self.group.kill()
                self._usage = self.group.usage()
                self.group.remove()
                orphans |= self.group.orphans
                self.group = None
            # (a launched box's number is the judge's, never ours)
            if "child-pid" in self._state and self.pidns_fd is None:
                orphans.add(int(self._state["child-pid"]))
            if proc is not None:  # bwrap itself is the caller's Popen to wait for, never ours
                orphans.discard(proc.pid)
            # An orphan is on its way to us only through bwrap (our child): waiting for a number
            # that another process took meanwhile cost a judge's box 10 s.
            _collect(orphans, parents=frozenset({proc.pid}) if proc is not None else frozenset())
        raw = proc.__dict__.get("_raw_returncode", proc.returncode) if proc is not None else None
        code = returncode(raw)
        usage = self._usage
        if proc is not None and raw is not None and "child-pid" not in self._state:
            outcome = Outcome.SANDBOX_ERROR
        elif usage.oom_kills:
            outcome = Outcome.MEMORY_LIMIT
        elif code is None or code < 0:
            outcome = Outcome.SIGNALED
        else:
            outcome = Outcome.OK if code == 0 else Outcome.NONZERO
        return Report(outcome, code, self._state.get("child-pid"), usage.memory_peak, usage.oom_kills,
                      usage.pids_refused, self._killed)


class NullBox:
    """No sandbox: the same interface, the program runs as it is."""

    active = False
    group = None
    pass_fds: tuple[int, ...] = ()

    def command(self, argv: list[str]) -> list[str]:
        return list(argv)

    def spawn(self, argv: list[str], **popen) -> subprocess.Popen:
        return subprocess.Popen(list(argv), **popen)

    def started(self) -> None:
        pass

    def kill(self) -> int:
        return 0

    def signal(self, signum: int) -> None:
        pass

    def terminate(self, proc: subprocess.Popen, grace: float) -> None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def close(self, proc: subprocess.Popen | None = None) -> Report:
        code = proc.returncode if proc is not None else None
        if code is None or code < 0:
            outcome = Outcome.SIGNALED
        else:
            outcome = Outcome.OK if code == 0 else Outcome.NONZERO
        return Report(outcome, code)


class BoxedPopen(subprocess.Popen):
    """A Popen of a sandboxed program: faithful exit codes, and the box closed when it ends."""

    def __init__(self, box: Box, args, **popen):
        self._box = box
        self.sandbox_report: Report | None = None
        super().__init__(args, **popen)

    @property
    def returncode(self) -> int | None:
        return returncode(self.__dict__.get("_raw_returncode"))

    @returncode.setter
    def returncode(self, value: int | None) -> None:
        self.__dict__["_raw_returncode"] = value

    def hand_over(self) -> None:
        self._box.hand_over_writable()

    def _ended(self) -> None:
        if self.__dict__.get("_raw_returncode") is not None and self.sandbox_report is None:
            self.sandbox_report = self._box.close(self)

    def poll(self):
        result = super().poll()
        self._ended()
        return result

    def wait(self, timeout=None):
        result = super().wait(timeout)
        self._ended()
        return result
