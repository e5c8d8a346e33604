"""A judged child forked from a warm interpreter into its box, instead of started fresh.

`spawn(box, ...)` gives what `Box.spawn` gives (a Popen-like `ZygotePopen`), for the same box:
bwrap still makes every mount, the fresh /tmp, the namespaces and the cgroup of each case; only
the interpreter that runs in it is not started and warmed again. The box's command is a shell
that says "ready" once bwrap has set everything up, then stops itself, as a uid of its own
(nothing inside can signal it); the zygote (`zygote_main.py`, one per process and lab) forks the child
into the box's namespaces and cgroup, and the child drops to the box's uid, limits and seccomp
filter itself before the student's module loads. Measured (benchmarks/child_cost.py): a child
costs 13-30 ms of CPU this way, against 37-120 ms started fresh (pipeline's psycopg and valkey
alone are ~100 ms).

For a box a root process makes: the judge's own (a student's checks, the tests) or the
launcher's (grading: `launcher.py`, in the unprivileged judge's namespaces).
A grading batch also keeps templates of the judge, of the kernel and of each lab's children
(`start_template`, `spawn_from`, `use_templates`): each submission's are forked from them into
their own boxes the same way.
`LABKIT_ZYGOTE=off` starts every child (and judge) fresh. When the zygote cannot serve a case (it did not
start, it is gone), `spawn` returns None and the caller starts the child fresh: never a verdict
about the student.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.limits import KILL_GRACE
from labkit.sandbox import reaper
from labkit.sandbox.box import Box, Outcome, Report
from labkit.sandbox.zygote_main import (
    ENDED,
    FD_ENV,
    LISTEN_ENV,
    MAX_MESSAGE,
    NAMESPACES,
    ROLE_ENV,
    STARTED,
)

ENV = "LABKIT_ZYGOTE"  # "off": every judged child starts fresh
ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "labkit" / "probe" / "main.py")  # the child's sys.argv[0], as with `python -m`
JUDGE_MAIN = str(ROOT / "labkit" / "__main__.py")  # a judge's, forked from its template
START_TIMEOUT = 60.0  # the zygote's imports (psycopg, valkey) on a loaded machine
REPLY_TIMEOUT = 30.0
READY_TIMEOUT = 30.0  # bwrap setting up one box
HOLDER_UID = 65534  # "nobody": the box's holder, never the child's uid


class ZygoteGone(OSError):
    """The zygote did not answer (it died, or never started)."""


@dataclass
class Zygote:
    proc: subprocess.Popen | None  # None: a connection to a zygote someone else started
    sock: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fork(self, request: dict, fds: list[int]) -> int:
        """The intermediate's pid (see `zygote_main`); raises ZygoteGone."""
        with self.lock:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
                reply = json.loads(self.sock.recv(MAX_MESSAGE) or b"null")
            except (OSError, ValueError) as exc:
                raise ZygoteGone(str(exc)) from exc
        if not isinstance(reply, dict) or not isinstance(reply.get("pid"), int):
            raise ZygoteGone(f"the zygote refused: {reply!r}")
        return reply["pid"]

    def stop(self) -> None:
        self.sock.close()  # it exits at EOF
        try:
            self.proc.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=KILL_GRACE)


_ZYGOTES: dict[str | None, Zygote | None] = {}  # None: it could not start here
_LOCK = threading.Lock()


def usable(box) -> bool:
    """Whether a case of `box` can be forked from a zygote: a box this (root) process made, that
    drops privileges, with a cgroup (the child joins it). The launcher's boxes, made in a judge's
    namespaces, are such boxes too."""
    return (os.environ.get(ENV, "on") != "off" and isinstance(box, Box) and box.active
            and box.policy.drops_privileges and box.group is not None and os.geteuid() == 0)


def pids() -> set[int]:
    """The zygotes this process runs (long-lived by design: not something a run left behind)."""
    with _LOCK:
        return {z.proc.pid for z in _ZYGOTES.values() if z is not None and z.proc.poll() is None}


def _warm_imports(lab: str | None) -> tuple[list[str], list[str]]:
    """The probes modules and the manifest's `preload` of lab package `lab` (every lab's probes
    and no preload for None): what every child of it imports, early-started or not."""
    from labkit import labs

    every = list(labs.manifests().values())
    chosen = [m for m in every if m.package == lab]
    probes = [m.module(part) for m in chosen or every for part in m.probes]
    return probes, [name for m in chosen for name in m.preload]


def child_env(lab: str | None, site_packages: str) -> dict[str, str]:
    """A child zygote's environment: the box's plain one, never ours, and what it imports."""
    from labkit.sandbox import profiles

    probes, preload = _warm_imports(lab)
    return {**profiles.base_env(), "PYTHONPATH": str(ROOT), "LABKIT_SITE_PACKAGES": site_packages,
            "LABKIT_PRELOAD": ",".join(preload), "LABKIT_ZYGOTE_PROBES": ",".join(probes)}


def _start(lab: str | None, site_packages: str) -> Zygote | None:
    return _launch([sys.executable, *CHILD_FLAGS, "-m", "labkit.sandbox.zygote_main"], child_env(lab, site_packages))


def _launch(argv: list[str], env: dict[str, str], listener: socket.socket | None = None) -> Zygote | None:
    """Start a zygote, send it the seccomp filter, wait until it is warm; None if it cannot."""
    from labkit.sandbox import seccomp

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    passed = [theirs.fileno()] + ([listener.fileno()] if listener is not None else [])
    if listener is not None:
        env = {**env, LISTEN_ENV: str(listener.fileno())}
    try:
        proc = subprocess.Popen(argv, env={**env, FD_ENV: str(theirs.fileno())}, pass_fds=passed,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd="/", start_new_session=True)
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
    zygote = Zygote(proc, ours)
    try:
        ours.settimeout(START_TIMEOUT)
        ours.send(seccomp.program(seccomp.STUDENT))
        ready = json.loads(ours.recv(MAX_MESSAGE) or b"null")
        ours.settimeout(REPLY_TIMEOUT)
    except (OSError, ValueError):
        ready = None
    if not (isinstance(ready, dict) and ready.get("ready")):
        zygote.stop()
        return None
    return zygote


# A child's zygote starts without `site` (its probe adds the package folders,
# `labkit.probe.main`); a template of another program as `python -P -m ...` starts it.
CHILD_FLAGS = ("-S", "-P")


@dataclass
class Template:
    """A grading batch's template of the judge, of the kernel (`zygote_main`'s roles) or of a
    lab's children: each submission's is forked from it into its own box, instead of starting
    Python and importing the same modules again (measured per submission: 0.1-0.3 s of CPU
    for a judge, ~0.2 s for a kernel)."""

    zygote: Zygote
    path: str  # its listening socket, in a folder only root can enter

    def stop(self) -> None:
        self.zygote.stop()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


def start_template(env: dict[str, str], role: dict | None = None) -> Template | None:
    """A template of a child's zygote (`role` None, `env` from `child_env`), or of the program
    that `role` describes (`zygote_main._ROLE`: `judge_box`, `kernel_box`), started with that
    program's own environment `env`; None where it cannot run (then each starts fresh, as with
    `LABKIT_ZYGOTE=off`)."""
    if os.environ.get(ENV, "on") == "off" or os.geteuid() != 0:
        return None
    folder = tempfile.mkdtemp(prefix="labkit-templates-")  # 0700
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
        listener.listen(16)
        flags, env = (CHILD_FLAGS, env) if role is None else (("-P",), {**env, ROLE_ENV: json.dumps(role)})
        zygote = _launch([sys.executable, *flags, "-m", "labkit.sandbox.zygote_main"], env, listener)
    except OSError:
        zygote = None
    finally:
        listener.close()
    if zygote is None:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return Template(zygote, path)


_TEMPLATES: dict[str, str] = {}  # a grading batch's child templates here, by lab package ("": None)


def use_templates(children: dict[str, str]) -> None:
    """In a grading worker: fork its judge's children from the batch's child templates
    (`start_template(child_env(lab, ...))`, by lab package), not from a zygote of its own."""
    _TEMPLATES.clear()
    _TEMPLATES.update(children)


def _zygote(lab: str | None, site_packages: str) -> Zygote | None:
    with _LOCK:
        if lab not in _ZYGOTES:
            _ZYGOTES[lab] = _start(lab, site_packages)
        return _ZYGOTES[lab]


def _drop(zygote: Zygote) -> None:
    with _LOCK:
        for key, value in list(_ZYGOTES.items()):
            if value is zygote:
                _ZYGOTES[key] = None
    zygote.stop()


def stop_all() -> None:
    with _LOCK:
        found = [z for z in _ZYGOTES.values() if z is not None]
        _ZYGOTES.clear()
    for zygote in found:
        zygote.stop()


def _forget_in_child() -> None:
    """A forked copy of the judge (multiprocessing) must not keep the zygotes' sockets open."""
    for zygote in _ZYGOTES.values():
        if zygote is not None:
            zygote.sock.close()
    _ZYGOTES.clear()


atexit.register(stop_all)
os.register_at_fork(after_in_child=_forget_in_child)


def _fd(stream, opened: list[int]) -> int:
    """An fd to pass for `stream` (an fd, a file, or `subprocess.DEVNULL`: opened, and listed
    in `opened` to be closed)."""
    if stream == subprocess.DEVNULL:
        opened.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
        return opened[-1]
    return stream if isinstance(stream, int) else stream.fileno()


def _inside(box: Box, reported: int | None) -> int | None:
    """A process of the box's own namespaces, as this process numbers it. bwrap reports its
    first process inside, numbered in the pid namespace it was started in: ours, unless the box
    was made in a judge's (`Box.pidns_fd`); then the box's deepest process is found in its cgroup."""
    if box.pidns_fd is None or reported is None:
        return reported
    depth = {pid: len(reaper.ns_pids(pid)) for pid in box.group.pids()}
    return max(depth, key=depth.get) if depth else None


def spawn(box: Box, *, stdin, stdout, stderr, pass_fds: tuple[int, ...], lab: str | None,
          site_packages: str) -> ZygotePopen | None:
    """Run `labkit.probe.main` in `box` as a child forked from the lab's zygote; None when the
    zygote cannot (the box is then untouched, or closed when its set-up failed). `stdin`:
    `subprocess.PIPE` (the returned `stdin` writes to it) or an fd; `stdout`, `stderr`: fds or files."""
    template = _TEMPLATES.get(lab or "")
    if template is not None:
        return spawn_from(template, box, MAIN, [], stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds)
    zygote = _zygote(lab, site_packages)
    if zygote is None:
        return None

    def fork(request: dict, fds: list[int]) -> int:
        try:
            return zygote.fork(request, fds)
        except ZygoteGone:
            _drop(zygote)
            raise

    return _spawn(fork, box, {"argv0": MAIN}, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds)


def spawn_from(template: str, box: Box, argv0: str, argv: list[str], *, stdin, stdout, stderr,
               pass_fds: tuple[int, ...]) -> ZygotePopen | None:
    """The template at `template` (`start_template`) forks its program into `box`, with
    `sys.argv` `[argv0, *argv]`; None when it cannot (the box is then closed)."""

    def fork(request: dict, fds: list[int]) -> int:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.settimeout(REPLY_TIMEOUT)
                sock.connect(template)
                return Zygote(None, sock).fork(request, fds)
        except OSError as exc:
            raise ZygoteGone(str(exc)) from exc

    return _spawn(fork, box, {"argv0": argv0, "argv": list(argv)}, stdin=stdin, stdout=stdout, stderr=stderr,
                  pass_fds=pass_fds)


def _spawn(fork, box: Box, program: dict, *, stdin, stdout, stderr, pass_fds: tuple[int, ...]) -> ZygotePopen | None:
    # The holder runs as a uid of its own: nothing in the box can signal it (the child's
    # kill(-1) would otherwise end its own box, where a fresh child's reaches only its own).
    box.run_as = (HOLDER_UID, HOLDER_UID)
    ready_r, ready_w = os.pipe()
    try:
        # It stops itself rather than exec a sleep (one exec less a child); a stopped process
        # holds the namespaces as well, and the box's end kills it like any other.
        holder = box.spawn(["/bin/sh", "-c", "echo ready; exec >/dev/null; kill -STOP $$"],
                           stdin=subprocess.DEVNULL, stdout=ready_w, stderr=stderr, start_new_session=True)
    finally:
        os.close(ready_w)
    opened: list[int] = []
    in_w = status_r = None
    try:
        reported = box.wait_child_pid(READY_TIMEOUT)
        ready = select.select([ready_r], [], [], READY_TIMEOUT)[0] and os.read(ready_r, 1)
        init = _inside(box, reported) if ready else None
        if init is None:
            raise ZygoteGone("the box did not come up")
        opened += [os.open(f"/proc/{init}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in NAMESPACES]
        status_r, status_w = os.pipe()
        opened.append(status_w)
        if stdin == subprocess.PIPE:
            in_r, in_w = os.pipe()
            opened.append(in_r)
        else:
            in_r = _fd(stdin, opened)
        policy = box.policy
        request = {"cwd": str(policy.cwd), "env": dict(policy.env), "targets": [0, 1, 2, *pass_fds],
                   "uid": policy.uid, "gid": policy.gid, "as": policy.address_space, "fsize": policy.file_bytes,
                   "cgroups": [str(p) for p in box.group.procs_files], **program}
        fds = [*opened[:len(NAMESPACES) + 1], in_r, _fd(stdout, opened), _fd(stderr, opened), *pass_fds]
        pid = fork(request, fds)
        os.close(status_w)
        opened.remove(status_w)
        started = select.select([status_r], [], [], READY_TIMEOUT)[0] and os.read(status_r, STARTED.size)
        if not started or len(started) != STARTED.size:
            raise ZygoteGone("the child was not forked")
        inner = STARTED.unpack(started)[0]
    except (OSError, ValueError):
        for fd in (in_w, status_r):
            if fd is not None:
                os.close(fd)
        box.kill()
        try:
            holder.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            box.close(holder)
        return None
    finally:
        os.close(ready_r)
        for fd in opened:
            os.close(fd)
    proc = ZygotePopen(box, holder, pid, inner, status_r, os.fdopen(in_w, "wb") if in_w is not None else None)
    proc.box_pid = init
    return proc


class ZygotePopen:
    """The subset of Popen the judge uses, for a child forked into `box`: its pid is the
    intermediate's (the child's code runs in a process below it, as below bwrap today); its exit
    code comes on a pipe (Popen's convention: -N for signal N; SIGKILL when the box was killed
    before it could say). When it ends, the rest of its box ends too, as when bwrap's child exits."""

    def __init__(self, box: Box, holder: subprocess.Popen, pid: int, inner: int, status_r: int, stdin) -> None:
        self._box = box
        self.holder = holder
        self.pid = pid
        self.inner = inner  # the child itself, as this process numbers it
        self.box_pid: int | None = None  # the box's first process (its holder), as this process numbers it
        self.cpu_seconds: float | None = None  # the child's user + system time, once it ended
        self.stdin = stdin
        self.stdout = self.stderr = None  # (Popen's: a caller may set its own pipe here)
        self.args = ["labkit.probe.main"]
        self.sandbox_report: Report | None = None
        self.returncode: int | None = None
        self._status_r = status_r
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            self._read(max(0.0, remaining) if remaining is not None else None)
            if self.returncode is not None:
                return self.returncode
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)

    def _read(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None or self._status_r is None:
                return
            if not select.select([self._status_r], [], [], timeout)[0]:
                return
            data = os.read(self._status_r, ENDED.size)
            # closed once, and never read again, even if what follows raises: the number may
            # soon be another thread's file
            os.close(self._status_r)
            self._status_r = None
            if len(data) == ENDED.size:
                code, user, system = ENDED.unpack(data)
                self.cpu_seconds = user + system
            else:
                code = -signal.SIGKILL
            try:
                self._end(code)
            finally:
                self.returncode = code

    def _end(self, code: int) -> None:
        """Its box ends with it; the box's report (usage, OOM kills) with how the child ended."""
        self._box.kill()
        try:
            self.holder.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            self._box.close(self.holder)
        report = getattr(self.holder, "sandbox_report", None) or self._box.close(self.holder)
        if report.oom_kills:
            outcome = Outcome.MEMORY_LIMIT
        elif code < 0:
            outcome = Outcome.SIGNALED
        else:
            outcome = Outcome.OK if code == 0 else Outcome.NONZERO
        self.sandbox_report = dataclasses.replace(report, outcome=outcome, returncode=code)

    def kill(self) -> None:
        self._box.kill()

    def send_signal(self, signum: int) -> None:
        self._box.signal(signum)

    def hand_over(self) -> None:
        self._box.hand_over_writable()
