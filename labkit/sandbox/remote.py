"""The judge's side of the launcher: a box it asks for instead of making (`launcher.py`).

The judge runs unprivileged, so `profiles.child_box` gives it a `RemoteBox` when the grader
started it with a launcher (`LABKIT_LAUNCHER_FD`). `RemoteBox.spawn` sends the launcher the
child's stdio, its private pipes and a directory fd of its step folder, and returns a
`RemotePopen`: the subset of `subprocess.Popen` the judge uses (pid, stdin, poll, wait, kill,
returncode), with the exit status the launcher reports once the child's sandbox is gone.
The pid is the box's first process as the judge's own pid namespace numbers it: the judge (the
same uid as its children, no capabilities) can see, signal and inspect its children there,
and they cannot see it.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

from labkit.sandbox.box import Outcome, Report
from labkit.sandbox.launcher import FD_ENV, MAX_MESSAGE

REPLY_TIMEOUT = 30.0


class LauncherGone(OSError):
    """The launcher closed the socket or did not answer in time."""


@dataclass
class _Connection:
    sock: socket.socket
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _replies: dict[int, dict] = field(default_factory=dict)
    _exits: dict[int, dict] = field(default_factory=dict)
    _next: int = 0
    _gone: bool = False

    def start(self) -> _Connection:
        threading.Thread(target=self._read, name="labkit-launcher-client", daemon=True).start()
        return self

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
                message = json.loads(data) if data else None
            except (OSError, ValueError, RecursionError):
                message = None
            with self._cond:
                if not isinstance(message, dict):
                    self._gone = True
                    self._cond.notify_all()
                    return
                if message.get("event") == "exit" and isinstance(message.get("box"), int):
                    self._exits[message["box"]] = message
                elif isinstance(message.get("rid"), int):
                    self._replies[message["rid"]] = message
                self._cond.notify_all()

    def ask(self, request: dict, fds: list[int] = ()) -> dict:
        with self._cond:
            self._next += 1
            rid = self._next
        data = json.dumps({**request, "rid": rid}).encode()
        with self._send_lock:
            try:
                if fds:
                    self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    self.sock.send(data)
            except OSError as exc:
                raise LauncherGone(f"the launcher is gone: {exc}") from exc
        deadline = time.monotonic() + REPLY_TIMEOUT
        with self._cond:
            while rid not in self._replies:
                remaining = deadline - time.monotonic()
                if self._gone or remaining <= 0:
                    raise LauncherGone("the launcher did not answer")
                self._cond.wait(remaining)
            reply = self._replies.pop(rid)
        if "error" in reply:
            raise LauncherGone(f"the launcher refused: {reply['error']}")
        return reply

    def exit_of(self, box: int, timeout: float | None) -> dict | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while box not in self._exits:
                if self._gone:
                    return {"code": None, "outcome": str(Outcome.SANDBOX_ERROR)}
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining if remaining is not None else 1.0)
            return self._exits[box]


_CONNECTION: _Connection | None = None
_LOCK = threading.Lock()


def connection() -> _Connection | None:
    """The launcher this judge was started with, if any (`LABKIT_LAUNCHER_FD`)."""
    global _CONNECTION
    with _LOCK:
        if _CONNECTION is None and os.environ.get(FD_ENV, "").isdigit():
            sock = socket.socket(fileno=int(os.environ[FD_ENV]))
            sock.set_inheritable(False)
            _CONNECTION = _Connection(sock).start()
        return _CONNECTION


@dataclass
class RemoteBox:
    """A child's sandbox, made and kept by the launcher; the judge holds only its number."""

    conn: _Connection
    code_modules: tuple[str, ...] = ()
    lab: str | None = None  # the lab package whose probes the child sees (`profiles.child`)
    number: int | None = None
    active: bool = True
    remote: bool = True  # its processes are listed by the launcher, from the box's cgroup
    group = None

    def spawn(self, argv: list[str], *, stdin=None, stdout=None, stderr=None, cwd=None, env=None,
              pass_fds: tuple[int, ...] = (), start_new_session: bool = True) -> RemotePopen:
        del start_new_session  # every box is a session and a pid namespace of its own
        env = dict(env or {})
        own = {k: v for k, v in env.items() if os.environ.get(k) != v}
        fd_env = {}
        for index, fd in enumerate(pass_fds):
            named = [k for k, v in own.items() if v == str(fd) and k.startswith("LABKIT_") and k.endswith("_FD")]
            if not named:
                raise ValueError(f"fd {fd} is passed to a child under no LABKIT_*_FD variable")
            fd_env[named[0]] = index
        opened: list[int] = []
        pipe_w = None

        def fd_of(stream, mode: int) -> int:
            if stream is None or stream == subprocess.DEVNULL:
                opened.append(os.open(os.devnull, mode | os.O_CLOEXEC))
                return opened[-1]
            return stream if isinstance(stream, int) else stream.fileno()

        try:
            if stdin == subprocess.PIPE:
                read_end, pipe_w = os.pipe()
                opened.append(read_end)
                stdin_fd = read_end
            else:
                stdin_fd = fd_of(stdin, os.O_RDONLY)
            folder = os.open(str(cwd), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            opened.append(folder)
            fds = [stdin_fd, fd_of(stdout, os.O_WRONLY), fd_of(stderr, os.O_WRONLY), folder, *pass_fds]
            reply = self.conn.ask({"op": "spawn", "argv": list(argv), "env": own, "workdir": str(cwd),
                                   "code_modules": list(self.code_modules), "lab": self.lab,
                                   "fd_env": fd_env}, fds)
        except BaseException:
            if pipe_w is not None:
                os.close(pipe_w)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        self.number = reply["box"]
        if not isinstance(reply.get("pid"), int) or reply["pid"] <= 1:  # never killpg(0): our own group
            self.kill()
            raise LauncherGone(f"the launcher started a box it cannot show us (pid {reply.get('pid')!r})")
        return RemotePopen(self, list(argv), reply.get("pid"), os.fdopen(pipe_w, "wb") if pipe_w is not None else None)

    def _ask(self, op: str) -> dict:
        if self.number is None:
            return {}
        try:
            return self.conn.ask({"op": op, "box": self.number})
        except LauncherGone:
            return {}  # the box has ended (or the launcher has): nothing is left to act on

    def kill(self) -> int:
        return int(self._ask("kill").get("killed", 0))

    def signal(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.kill()
        elif signum in (signal.SIGSTOP, signal.SIGCONT):
            self._ask("stop" if signum == signal.SIGSTOP else "cont")
        else:
            for pid in self.program_pids():
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def program_pids(self) -> list[int]:
        return list(self._ask("pids").get("pids", []))

    def terminate(self, proc: RemotePopen, grace: float) -> None:
        self.signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def close(self, proc: RemotePopen | None = None) -> Report:
        if proc is None or proc.poll() is None:
            self.kill()
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        ended = self.conn.exit_of(self.number, 0) if self.number is not None else None
        if not ended:
            return Report(Outcome.SIGNALED, None)
        return Report(Outcome(ended.get("outcome", Outcome.SIGNALED)), ended.get("code"),
                      oom_kills=int(ended.get("oom_kills") or 0), pids_refused=int(ended.get("pids_refused") or 0))


class RemotePopen:
    """What the judge holds of a launched child: the part of Popen it uses."""

    def __init__(self, box: RemoteBox, args: list[str], pid: int, stdin) -> None:
        self._box = box
        self.args = args
        self.pid = pid
        self.stdin = stdin
        self.stdout = self.stderr = None
        self.returncode: int | None = None
        self.sandbox_report: Report | None = None

    def _ended(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        ended = self._box.conn.exit_of(self._box.number, timeout)
        if ended is None:
            return False
        code = ended.get("code")
        self.returncode = code if isinstance(code, int) else -signal.SIGKILL
        self.sandbox_report = Report(Outcome(ended.get("outcome", Outcome.SIGNALED)), self.returncode,
                                     oom_kills=int(ended.get("oom_kills") or 0))
        return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def kill(self) -> None:
        self._box.kill()

    def terminate(self) -> None:
        self._box.signal(signal.SIGTERM)

    def send_signal(self, signum: int) -> None:
        self._box.signal(signum)

    def communicate(self, input=None, timeout=None):  # noqa: A002 - Popen's own name
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        self.wait(timeout)
        return None, None
