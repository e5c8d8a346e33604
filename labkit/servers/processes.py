"""A real server's processes: who they run as, how they are found by their folder, how they end.

The PostgreSQL and Valkey servers (`postgres.py`, `valkey.py`) each run in one folder that the
caller gives them, and everything they are lives there: data, sockets, logs. Both rewrite their
own command line and environment (their process titles), so a marker in either is lost; what
stays is the working directory, which each of them sets to its data directory inside the
folder. `processes_in(folder)` finds them by it, and `end(...)` kills what it finds until nothing
is left: that is how every path, a server that died included, leaves no process behind.

As root the servers run as `nobody`: PostgreSQL refuses to run as root, and neither needs it.
A caller that is not root runs them as itself.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from labkit.judge import ports

NOBODY = 65534  # the uid a root caller's servers run as (Debian's `nobody`: it has an account)
SERVER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}


class ServerMissing(RuntimeError):
    """No program for a server here: the message says what is missing and how to install it."""


class ServerFailed(RuntimeError):
    """A server that did not start or stop as asked: the message says why and quotes its log."""


@dataclass(frozen=True)
class RunAs:
    """Who a server's processes run as; `uid` None: as the caller."""

    uid: int | None = None
    gid: int | None = None

    def popen_args(self) -> dict:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def has_account(self) -> bool:
        """initdb looks its user up by uid; a uid without a passwd entry cannot run it."""
        try:
            pwd.getpwuid(os.geteuid() if self.uid is None else self.uid)
            return True
        except KeyError:
            return False


def server_user() -> RunAs:
    return RunAs(NOBODY, NOBODY) if os.geteuid() == 0 else RunAs()


def prepare_folder(folder: Path, who: RunAs) -> Path:
    """The server's folder, made here and the server user's own: it must not exist yet (its
    parent must), since stopping the server removes it whole.

    0711: other uids (a judged child) may reach a socket inside by its name, never list it.
    """
    folder = Path(folder).absolute()
    folder.mkdir(mode=0o711)
    os.chmod(folder, 0o711)
    if who.uid is not None:
        os.chown(folder, who.uid, who.gid)
        for parent in folder.parents:
            mode = os.stat(parent).st_mode
            if not mode & stat.S_IXOTH:
                raise ServerFailed(
                    f"the server runs as uid {who.uid} (root's servers never run as root), which "
                    f"cannot reach {folder}: {parent} is mode {stat.filemode(mode)}. Give the server "
                    f"a folder whose parents others may traverse (e.g. under a 0711 mkdtemp in /tmp).")
    return folder


def spawn(argv: list[str], *, who: RunAs, log: Path, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """A server process in a session of its own: a Ctrl-C to the judge's process group (a kernel
    interrupt signals the whole group) must not stop it behind the judge's back; the judge's
    `with` block stops it instead."""
    with open(log, "ab") as out:
        if who.uid is not None:
            os.chown(log, who.uid, who.gid)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=cwd, env={**SERVER_ENV, **(env or {})}, start_new_session=True,
                                close_fds=True, **who.popen_args())


def _cwd(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:  # gone, a zombie, or not ours to look at
        return None


def processes_in(*folders: Path) -> list[int]:
    """Live processes whose working directory is one of `folders` or below (zombies have none)."""
    places = [str(Path(folder).absolute()) for folder in folders]
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            cwd = _cwd(pid)
            if cwd is not None and any(cwd == place or cwd.startswith(place + "/") for place in places):
                found.append(int(pid))
    return found


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Signal each; one already gone, or not ours to signal, is passed over (`end` names what
    outlived it)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(process: subprocess.Popen | None, timeout: float) -> bool:
    """Wait for our own child to end (so it leaves no zombie); False if it is still running."""
    if process is None:
        return True
    try:
        process.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def end(folder: Path | Iterable[Path], process: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGKILL the server's main process, then everything still running in its folder (or
    folders), until nothing is (a PostgreSQL backend outlives a killed postmaster until it is
    killed too)."""
    places = [folder] if isinstance(folder, (str, Path)) else list(folder)
    if process is not None and process.poll() is None:
        signal_all([process.pid], signal.SIGKILL)
    reap(process, timeout)
    deadline = time.monotonic() + timeout
    while pids := processes_in(*places):
        signal_all(pids, signal.SIGCONT)  # a stopped process dies of SIGKILL too; this is for clarity
        signal_all(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ServerFailed(f"processes {pids} in {', '.join(map(str, places))} did not end after SIGKILL")
        time.sleep(0.005)


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    if Path(folder).exists():  # ignore_errors hides why; say it
        shutil.rmtree(folder)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds now, for a server that cannot be told "port 0" (Valkey takes 0 to
    mean "no TCP"): from `ports.SERVERS`, below the kernel's own range, so no listener or
    connection elsewhere is given it before the server binds it, or between a kill and its
    restart. A program binding that very port by number can still take it first, so the
    caller retries a start that says the address is in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return ports.bind(sock, host, ports.SERVERS)


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
