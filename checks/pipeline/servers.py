"""Lab `pipeline`: the servers of one judge run, and what each case gets of them.

`Servers` is the lab's `session` (labkit.judge.run): entered once around every step of a judge
run, it starts PostgreSQL and Valkey on first use (labkit.servers.postgres / .valkey) and stops
both, with their folder, on every way out. Each case gets a fresh database owned by a fresh
least-privilege role (`database`) and a fresh Valkey ACL user confined to a key prefix (`user`);
the student's code gets only those credentials, the judge keeps its own superuser connections.

How a judged child reaches PostgreSQL: the server listens only on a Unix socket in the judge's
folder, which a child's box (bubblewrap, labkit.sandbox.profiles.child) does not show. The
socket is hard-linked into the step's work folder, which the box does show, at the same path
(`postgres.socket_in`): connect() on a hard link of a socket reaches the same listening socket
(the kernel looks the socket up by inode). So the student's DSN names `host=<step folder>/.pg`;
the data directory stays out of sight. A restart makes a new socket: call `Db.dsn` again. Valkey listens on loopback TCP, which a child shares with the judge.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import psycopg.sql

from labkit import scratch
from labkit.servers import postgres, valkey

# Per role, set by the judge: a connection left idle inside a transaction is ended by the server,
# and a statement that waits for a lock gives up instead of hanging. Both far above what a busy
# machine adds between a correct client's statements (300 ms ended correct transactions on a
# loaded 2-core CI run); a check that a connection is idle in a transaction reads its status instead.
ROLE_SETTINGS = {"idle_in_transaction_session_timeout": "5s", "lock_timeout": "5s",
                 "statement_timeout": "20s"}
CONNECTIONS = 16  # per role


@dataclass
class Db:
    name: str
    server: postgres.PostgresServer = field(repr=False)
    judge_dsn: str = field(repr=False)
    database: postgres.Database = field(repr=False)
    _look: psycopg.Connection | None = field(default=None, repr=False)
    _look_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def judge(self) -> psycopg.Connection:
        """A new connection of the judge's own, for what holds locks or a transaction."""
        return psycopg.connect(self.judge_dsn, autocommit=True)

    def look(self, sql: str, params=None) -> list[tuple]:
        """One read of the judge's, on a connection kept for reads (a new one costs ~8 ms, and a
        step reads a dozen times); opened again once if a restart or a kill broke it."""
        with self._look_lock:
            try:
                return self._reader().execute(sql, params).fetchall()
            except psycopg.OperationalError:
                self._drop_reader()
                return self._reader().execute(sql, params).fetchall()

    def setup(self, *statements: str | tuple[str, tuple]) -> None:
        """The judge's set-up (a statement, or one with its parameters), in one transaction on
        the kept connection; never retried."""
        with self._look_lock:
            con = self._reader()
            with con.transaction():
                for statement in statements:
                    sql, params = statement if isinstance(statement, tuple) else (statement, None)
                    con.execute(sql, params)  # None: a '%' in the text is only text

    def as_owner(self, statements: list[str]) -> None:
        """Run `statements` in one transaction as the database's own role (what they create is
        the role's, as if the student's code had made it)."""
        self.setup(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(self.name)).as_string(None),
                   *statements)

    def _reader(self) -> psycopg.Connection:
        if self._look is None or self._look.closed or self._look.broken:
            self._look = self.judge()
        return self._look

    def _drop_reader(self) -> None:
        if self._look is not None:
            self._look.close()
            self._look = None

    def close(self) -> None:
        with self._look_lock:
            self._drop_reader()

    def dsn(self, workdir: Path) -> str:
        """What the student's code gets in a child working in `workdir`: the role's own DSN,
        through a hard link of the socket in `workdir/.pg` (made again on every call)."""
        folder = Path(workdir) / ".pg"
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o755)
        return postgres.socket_in(self.server, self.database, folder)


@dataclass
class Stream:
    prefix: str
    kwargs: dict = field(repr=False)  # the student's client arguments


class Servers:
    """Both servers of one judge run, started on first use; `with Servers() as s:`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = itertools.count(1)
        self._dbs: list[Db] = []  # whose reading connections close before the server stops
        self.base: Path | None = None
        self.pg: postgres.PostgresServer | None = None
        self.vk: valkey.ValkeyServer | None = None

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for db in self._dbs:
                db.close()
            self._dbs.clear()
            try:
                if self.vk is not None:
                    valkey.stop(self.vk)
            finally:
                try:
                    if self.pg is not None:
                        postgres.stop(self.pg)
                finally:
                    if self.base is not None:
                        shutil.rmtree(self.base, ignore_errors=True)
                    self.vk = self.pg = self.base = None

    def warm(self) -> None:
        """Start both servers now (a session made ahead: `labkit.judge.ahead`)."""
        self.postgres()
        self.valkey()

    def _folder(self) -> Path:
        if self.base is None:  # as root the servers run as nobody, who must traverse it
            self.base = scratch.folder("labkit-pipeline-")  # where the steps' folders are: a socket's hard link needs it
            os.chmod(self.base, 0o711)
        return self.base

    def postgres(self) -> postgres.PostgresServer:
        with self._lock:
            if self.pg is None:
                self.pg = postgres.start(self._folder() / "pg")
            return self.pg

    def valkey(self) -> valkey.ValkeyServer:
        with self._lock:
            if self.vk is None:
                self.vk = valkey.start(self._folder() / "vk")
                with valkey.judge_client(self.vk) as judge:  # every command, for `commands`
                    judge.config_set("slowlog-log-slower-than", 0)
                    judge.config_set("slowlog-max-len", 100_000)
            return self.vk

    def database(self, step, settings: bool = True) -> Db:
        """A fresh database and role; `settings`: the role gets ROLE_SETTINGS (the final check's
        frozen transaction must outlive them)."""
        server = self.postgres()
        name = f"s{step}_{next(self._count)}"
        # a student's code that opens connection after connection cannot take the server's
        # 64 from the other steps: a case's racers and probes use at most about ten
        db = postgres.fresh_database(server, name, ROLE_SETTINGS if settings else None, CONNECTIONS)
        made = Db(name, server, db.judge_dsn, db)
        self._dbs.append(made)
        return made

    def user(self, step) -> Stream:
        prefix = f"lab:{step}:{next(self._count)}:"
        return Stream(prefix, valkey.fresh_user(self.valkey(), prefix).client_kwargs())

    def judge_valkey(self) -> valkey.Valkey:
        return valkey.judge_client(self.valkey())

    def commands(self, prefix: str) -> list[list[str]]:
        """Every command that named a key under `prefix`, oldest first (the server's slowlog,
        which records every command here: arguments cut to 32, each to 128 characters)."""
        with self.judge_valkey() as judge:
            entries = judge.execute_command("SLOWLOG", "GET", -1)
        found = []
        for entry in reversed(entries):
            args = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in entry[3]]
            if any(a.startswith(prefix) for a in args[1:]):
                found.append(args)
        return found

    def log(self) -> str:
        server = self.postgres()
        try:
            return server.log.read_text(errors="replace")
        except OSError:
            return ""

