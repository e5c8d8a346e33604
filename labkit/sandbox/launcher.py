"""The launcher: the only code with privilege while a judge runs. It starts the judge's children.

The judge runs unprivileged (the job's uid, no capabilities, no cgroupfs: `profiles.judge_box`),
so it cannot make a sandbox itself. It asks the launcher, over a socket pair only the two of
them hold, and the launcher — root, in the grader, outside every box — makes one from the
declared child policy (`profiles.launched_child`) and hands back nothing but a handle.

What the launcher never does: open, read, stat, chown or follow a path that a sandboxed
process could have touched. The step folder it binds into a child is a directory fd the judge
opened and sent (`bwrap --bind-fd`); the child's stdio and private pipes are fds the judge sent;
the network and pid namespaces it puts the child in are the judge's, opened once at the start
from the judge's own pid (`/proc/<pid>/ns/*`: kernel objects, not files anyone can replace).
The child itself is forked by the launcher's zygote (`zygote.py`) into the box made for it; the
box's namespaces are opened from the box's own first process, found in its cgroup before
anything of the student's runs there (only the box's holder, uid 65534, does).
What it does refuse: any request outside the policy — another program than the probe, a course module outside `labkit/`, a step folder outside the judge's /tmp, more
children at once than `MAX_BOXES`, a malformed or oversized message.

Requests (one SOCK_SEQPACKET datagram each, JSON, fds attached) and replies:

    {"op": "spawn", "rid": r, "argv": [...], "env": {...}, "workdir": "/tmp/...",
     "code_modules": [...], "lab": "checks.outbox" | null, "fd_env": {"LABKIT_RESULT_FD": i}}   fds: stdin, stdout, stderr, workdir, *pass
        → {"rid": r, "box": b, "pid": <the child (forked) or the box's first process, in the judge's pid namespace>}
    {"op": "kill" | "stop" | "cont", "rid": r, "box": b}         → {"rid": r, "ok": true}
    {"op": "pids", "rid": r, "box": b}                             → {"rid": r, "pids": [...]}
    and, unasked, once a child's sandbox has ended and been cleaned up:
        {"event": "exit", "box": b, "code": <Popen's convention>, "outcome": "...", ...}
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from labkit.sandbox import cgroups, reaper, zygote
from labkit.sandbox.box import Box, BoxedPopen
from labkit.values import too_deep

MAX_MESSAGE = 256 * 1024
MAX_FDS = 16
MAX_BOXES = 64  # children alive at once, per judge
START_TIMEOUT = 20.0  # for bwrap to report its first process
PROGRAMS = ("labkit.probe.main",)  # every judged child, the warehouse's receive included
# How a judged child's interpreter starts (`child.spawn`): -S, no `site` (the probe adds the
# package folders itself, see `labkit.probe.main.add_site_packages`); -P, the student's folder
# never shadows the standard library or labkit.
CHILD_PYTHON = (sys.executable, "-S", "-P", "-m")
FD_ENV = "LABKIT_LAUNCHER_FD"  # in the judge: the fd of its end of the socket pair


class Refused(Exception):
    """A request outside the policy: answered with the reason, nothing started."""


@dataclass
class _Child:
    box: Box
    proc: BoxedPopen
    pid: int | None  # the box's first process, as the judge numbers it


@dataclass
class Launcher:
    """Serves one judge: `Launcher.start(...)`, run the judge with `judge_end`, then `close()`."""

    sock: socket.socket
    judge_end: socket.socket
    uid: int
    module: Path
    hierarchy: cgroups.Hierarchy | None
    judge_tmp: str = "/tmp"
    level: int = 0
    netns: int | None = None
    pidns: int | None = None
    mntns: int | None = None
    children: dict[int, _Child] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _reapers: list[threading.Thread] = field(default_factory=list)
    _closed: bool = False

    @classmethod
    def pair(cls, uid: int, module: Path, hierarchy: cgroups.Hierarchy | None, judge_tmp: str = "/tmp") -> Launcher:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.set_inheritable(False)
        return cls(ours, theirs, uid, Path(module), hierarchy, judge_tmp)

    def attach(self, judge_pid: int) -> None:
        """The judge is running (`judge_pid`: its box's first process, as we see it): take its
        namespaces, then serve its requests in a thread of our own."""
        self.level = len(reaper.ns_pids(judge_pid)) - 1  # how deep the judge's pid namespace is
        self.netns = os.open(f"/proc/{judge_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.pidns = os.open(f"/proc/{judge_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.mntns = os.open(f"/proc/{judge_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.judge_end.close()
        self._thread = threading.Thread(target=self._serve, name="labkit-launcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Kill every child's sandbox, wait for their clean-up, let go of everything. Once."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            children = list(self.children.values())
        for child in children:
            child.box.kill()
        for child in children:
            try:
                child.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - cleaned up below either way
                child.proc.kill()
            child.box.close(child.proc)
        if self._thread is not None:
            self._thread.join(timeout=10)
        for thread in self._reapers:  # each closes its box: cgroups removed, orphans collected
            thread.join(timeout=15)
        # The zygotes it forked the children from, waited for here: a worker ends with os._exit
        # (no atexit), and one that ended after it would be a zombie handed to the grader's caller.
        zygote.stop_all()
        for fd in (self.netns, self.pidns, self.mntns):
            if fd is not None:
                os.close(fd)
        self.netns = self.pidns = self.mntns = None
        self.sock.close()
        if self.judge_end.fileno() >= 0:
            self.judge_end.close()

    # --- serving ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed:
            try:
                data, fds = _receive(self.sock)
            except OSError:
                break
            if not data:
                break  # the judge is gone
            reply: dict = {}
            try:
                if too_deep(data, 16):  # never a recursive parser's RecursionError, even caught
                    raise Refused("a request nested too deep")
                request = json.loads(data)
                if not isinstance(request, dict):
                    raise Refused("a request is a JSON object")
                reply["rid"] = request.get("rid")
                reply.update(self._handle(request, fds))  # a spawn takes (and empties) `fds`
            except Refused as exc:
                reply["error"] = str(exc)
            except (ValueError, RecursionError, TypeError, KeyError) as exc:
                reply["error"] = f"malformed request: {type(exc).__name__}"
            except OSError as exc:
                reply["error"] = f"could not start: {exc}"
            finally:
                for fd in fds:
                    os.close(fd)
            self._send(reply)

    def _send(self, message: dict) -> None:
        with self._send_lock:
            try:
                self.sock.send(json.dumps(message).encode())
            except OSError:
                pass

    def _handle(self, request: dict, fds: list[int]) -> dict:
        op = request.get("op")
        if op == "spawn":
            return self._spawn(request, fds)
        if op not in ("kill", "stop", "cont", "pids"):
            raise Refused(f"unknown request {op!r}")
        if fds:
            raise Refused(f"{op!r} takes no fds")
        child = self.children.get(request.get("box"))
        if child is None:
            raise Refused("no such box")
        if op == "kill":
            return {"killed": child.box.kill()}
        if op in ("stop", "cont"):
            child.box.signal(signal.SIGSTOP if op == "stop" else signal.SIGCONT)
            return {"ok": True}
        return {"pids": [p for p in (self._judge_pid(h) for h in child.box.program_pids()) if p is not None]}

    def _spawn(self, request: dict, fds: list[int]) -> dict:
        from labkit import labs
        from labkit.sandbox import profiles

        argv, env, workdir = request.get("argv"), request.get("env"), request.get("workdir")
        code_modules, fd_env, lab = request.get("code_modules", []), request.get("fd_env", {}), request.get("lab")
        if not (isinstance(argv, list) and len(argv) == len(CHILD_PYTHON) + 1
                and tuple(argv[:-1]) == CHILD_PYTHON
                and argv[-1] in PROGRAMS):
            raise Refused("only the course's probe may be started")
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise Refused("the environment must map text to text")
        if not (isinstance(workdir, str) and _inside(workdir, self.judge_tmp)):
            raise Refused(f"a step folder must be inside the judge's {self.judge_tmp}")
        if not (isinstance(code_modules, list) and all(isinstance(m, str) and m.startswith("labkit.")
                                                       for m in code_modules)):
            raise Refused("only modules of labkit/ may be shown to a child")
        if lab is not None and not (isinstance(lab, str) and labs.package_of(lab) == lab):
            raise Refused("a child may be shown the probes of one of the course's labs only")
        if not (isinstance(fd_env, dict) and len(fds) >= 4 and len(fds) - 4 == len(fd_env)
                and all(isinstance(k, str) and k.startswith("LABKIT_") and k.endswith("_FD")
                        and isinstance(v, int) and 0 <= v < len(fds) - 4 for k, v in fd_env.items())):
            raise Refused("fds: stdin, stdout, stderr, the step folder, then one per *_FD variable")
        with self._lock:
            if len(self.children) >= MAX_BOXES:
                raise Refused(f"more than {MAX_BOXES} children at once")
            self._next += 1
            number = self._next
        taken = fds[:]
        del fds[:]  # ours now: closed below, whatever happens
        stdin, stdout, stderr, folder, *passed = taken
        env = {**env, **{key: str(passed[index]) for key, index in fd_env.items()}}
        try:
            policy = profiles.launched_child(self.uid, module=self.module, workdir=Path(workdir),
                                             code_modules=tuple(code_modules), env=env, lab=lab)
            if [str(path) for path in policy.writable] != [workdir]:  # only ever the fd's folder
                raise Refused("a child may write its step folder only")
            box, proc = self._box_and_child(policy, workdir, folder, env, lab, argv, stdin, stdout, stderr, passed)
        finally:
            for fd in taken:
                os.close(fd)
        if isinstance(proc, zygote.ZygotePopen):  # the child itself, below the box's first process
            judge_pid = self._judge_pid(proc.inner)
        else:
            judge_pid = box.wait_child_pid(START_TIMEOUT)  # numbered in the judge's pid namespace
        child = _Child(box, proc, judge_pid)
        with self._lock:
            self.children[number] = child
        waiter = threading.Thread(target=self._reap, args=(number, child), daemon=True)
        waiter.start()
        self._reapers.append(waiter)
        return {"box": number, "pid": judge_pid}

    def _box_and_child(self, policy, workdir: str, folder: int, env: dict, lab: str | None, argv: list[str],
                       stdin: int, stdout: int, stderr: int, passed: list[int]) -> tuple[Box, subprocess.Popen]:
        """The child's box in the judge's namespaces, the child forked warm into it by this
        launcher's zygote (`zygote.py`), or started fresh when the zygote cannot."""
        box = self._box(policy, workdir, folder)
        if zygote.usable(box):
            proc = zygote.spawn(box, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=tuple(passed), lab=lab,
                                site_packages=env.get("LABKIT_SITE_PACKAGES", ""))
            if proc is not None:
                return box, proc
            box.close()
            box = self._box(policy, workdir, folder)
        return box, box.spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=tuple(passed))

    def _box(self, policy, workdir: str, folder: int) -> Box:
        box = Box.open(policy, self.hierarchy, chown_writable=False)
        box.bound_fds = {workdir: folder}
        box.netns_fd, box.pidns_fd, box.mntns_fd = self.netns, self.pidns, self.mntns
        return box

    def _judge_pid(self, host_pid: int) -> int | None:
        """A host pid as the judge's pid namespace numbers it."""
        numbers = reaper.ns_pids(host_pid)
        return numbers[self.level] if len(numbers) > self.level else None

    def _reap(self, number: int, child: _Child) -> None:
        child.proc.wait()  # closes the box: what is left killed, usage read, cgroup removed
        report = child.proc.sandbox_report or child.box.close(child.proc)
        with self._lock:
            self.children.pop(number, None)
        self._send({"event": "exit", "box": number, "code": child.proc.returncode,
                    "outcome": str(report.outcome), "oom_kills": report.oom_kills,
                    "pids_refused": report.pids_refused})


def _inside(path: str, folder: str) -> bool:
    """Whether `path` names something below `folder`, by its text alone (no .., no //)."""
    parts = path.split("/")
    return (path.startswith(folder.rstrip("/") + "/") and ".." not in parts and "." not in parts
            and "" not in parts[1:] and "\0" not in path)


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    received = list(fds)
    for fd in received:
        os.set_inheritable(fd, False)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in received:
            os.close(fd)
        return b"{}", []  # answered as malformed: too long, or too many fds
    return data, received
