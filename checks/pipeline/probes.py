"""Lab `pipeline`, child side: drive the student's `pipeline` module and report what happened.

Everything here runs inside a judged child with the student's module loaded. It calls, and for
each case reports the calls' outcomes and what the hooks saw; the judge decides what is right
from what it then reads itself through its own privileged connections (the database, the
stream, the group's pending entries, the servers' logs). A child's report counts for return
values and for what only the child can see (inside a hook, the state of its own connection).

A case is a list of operations (data, from the judge): `call` a function of the module with
arguments that may name `$conn` (a connection opened by the judge's rules, so a step does not
depend on step 1), `$r` (a Valkey client with the step's credentials), `$dsn` or a value kept
from an earlier call; `sleep`; `skew` the child's clock; wait at a `barrier` with the other
children of a race. Hooks passed to the student's functions are built from specs (`_hook`).

Imports: the standard library, psycopg and valkey, and labkit.probe / labkit.values.
"""

from __future__ import annotations

import datetime as _datetime
import gc
import os
import time
from typing import Any

from labkit import probe
from labkit.values import decode

_sleep, _time, _time_ns, _exit = time.sleep, time.time, time.time_ns, os._exit
BARRIER = (31337, 4242)  # a two-int advisory key: another key space than open_db's one-int locks


def _connect(dsn: str):
    import psycopg

    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def _valkey(kwargs: dict):
    import valkey

    return valkey.Valkey(**kwargs, socket_timeout=5)


class Case:
    """One case's resources in the child, closed when it ends."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.kept: dict[str, Any] = {}
        self.hooks: list[dict] = []
        self._conn = self._r = self._mine = None

    @property
    def conn(self):
        if self._conn is None:
            self._conn = _connect(self.spec["dsn"])
        return self._conn

    @property
    def r(self):
        if self._r is None:
            self._r = _valkey(self.spec["valkey"])
        return self._r

    @property
    def mine(self):
        """The probe's own connection, for what a hook does or looks at (never the student's)."""
        if self._mine is None:
            self._mine = _connect(self.spec["dsn"])
        return self._mine

    def value(self, arg: Any) -> Any:
        if isinstance(arg, str) and arg.startswith("$"):
            name = arg[1:]
            if name == "conn":
                return self.conn
            if name == "r":
                return self.r
            if name == "dsn":
                return self.spec["dsn"]
            return self.kept[name]
        return decode(arg)

    def close(self) -> None:
        for thing in (self._conn, self._r, self._mine, *self.kept.values()):
            try:
                thing.close()
            except Exception:
                pass


def _hook(case: Case, name: str, spec: dict):
    def hook(arg):
        seen: dict[str, Any] = {"hook": name, "arg": arg}
        only = spec.get("only")
        active = only is None or arg == only
        if spec.get("look") == "row":  # after_add: the row as the judge's rules read it
            seen["xlen"] = case.r.xlen(spec["stream"])
            row = case.mine.execute("SELECT published_at IS NOT NULL, fence FROM outbox WHERE id = %s",
                                    (arg,)).fetchone()
            seen["published"], seen["fence"] = (row[0], row[1]) if row else (None, None)
        if spec.get("look") == "pending":  # before_ack: is the entry still pending, dead-lettered?
            seen["pending"] = bool(case.r.xpending_range(spec["stream"], spec["group"], min=arg, max=arg, count=1))
            dead = case.r.xrange(spec["stream"] + ".dead") if case.r.exists(spec["stream"] + ".dead") else []
            seen["dead_for"] = [fields.get("entry_id") for _id, fields in dead]
        if spec.get("look") == "tx":  # before_commit: is the student's connection inside a transaction?
            seen["in_transaction"] = str(case.conn.info.transaction_status.name)
            seen["writes"] = _writes_in_transaction(case.conn, arg)
        case.hooks.append(seen)
        if active and spec.get("do") == "steal":  # another publisher claims the row meanwhile
            case.mine.execute("UPDATE outbox SET fence = nextval('fence_seq'), claimed_by = 'thief',"
                              " claim_until = clock_timestamp() + interval '1 hour' WHERE id = %s", (arg,))
        if active and spec.get("do") == "cut":  # the server ends the student's connection (waits until it has)
            case.mine.execute("SELECT pg_terminate_backend(%s, 5000)", (case.conn.info.backend_pid,))
        if active and spec.get("do") == "raise":
            raise RuntimeError(f"the judge's {name} fails here")
        if active and spec.get("do") == "exit":
            _exit(spec["code"])
        if active and spec.get("do") == "sleep":  # frozen inside the hook while the judge acts
            _sleep(spec["seconds"])
        if active and spec.get("do") == "hold":  # the judge freezes this process from outside, acts, thaws it
            probe.emit({"event": "note", "kind": "hook", "hook": name})
            probe.hold()

    return hook


def _writes_in_transaction(conn, entry_id: str):
    """What the student's own transaction holds at before_commit, read through its connection:
    this entry's inbox row and its sku's stock, [sku, qty] (None: no inbox row for the entry).
    In a savepoint, so a failing read cannot spoil the student's transaction."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT body::jsonb->>'sku' FROM inbox WHERE stream_id = %s", (entry_id,)).fetchone()
            if row is None:
                return None
            qty = conn.execute("SELECT qty FROM stock WHERE sku = %s", (row[0],)).fetchone()
            return [row[0], qty[0] if qty else 0]
    except Exception as exc:
        return f"unreadable: {type(exc).__name__}"


def _skew(module, seconds: float) -> None:
    """The child's clock runs `seconds` ahead: time.time, time.time_ns and datetime.datetime.now
    (also where the student's module imported them by name)."""
    base = _datetime.datetime

    class Skewed(base):
        @classmethod
        def now(cls, tz=None):
            return base.now(tz) + _datetime.timedelta(seconds=seconds)

        @classmethod
        def utcnow(cls):
            return base.utcnow() + _datetime.timedelta(seconds=seconds)

        @classmethod
        def today(cls):
            return cls.now()

    time.time = lambda: _time() + seconds
    time.time_ns = lambda: _time_ns() + int(seconds * 1e9)
    _datetime.datetime = Skewed
    for key, value in list(vars(module).items()):
        if value is base:
            setattr(module, key, Skewed)
        elif value is _time:
            setattr(module, key, time.time)


def _barrier(case: Case) -> None:
    """Wait until the judge lets every racer go at once (it holds the advisory lock). The
    connection the racer's calls get (`$conn`) is opened first: at the release every racer's
    is there, idle and never used, which a race's hold in the database tells from a finished one."""
    if any("$conn" in op.get("args", []) for op in case.spec["ops"]):
        case.conn  # noqa: B018 - opened now, on purpose
    with _connect(case.spec["dsn"]) as con:
        con.execute("SELECT pg_advisory_lock_shared(%s, %s)", BARRIER)
        con.execute("SELECT pg_advisory_unlock_shared(%s, %s)", BARRIER)


def _call(fn, values: list, hooks: dict, interrupt_at: int | None) -> tuple[dict, Any]:
    """The student's call, described; with `interrupt_at` k, the k-th statement any psycopg cursor
    (or connection) executes during it raises KeyboardInterrupt instead of running (Ctrl-C landing
    there), and that KeyboardInterrupt coming out is described like any raised error."""
    if not interrupt_at:
        return probe.call_keep(fn, *values, **hooks)
    import psycopg

    real, seen, fault = psycopg.Cursor.execute, [0], KeyboardInterrupt()

    def execute(self, *args, **kwargs):
        seen[0] += 1
        if seen[0] == interrupt_at:
            raise fault
        return real(self, *args, **kwargs)

    psycopg.Cursor.execute = execute
    try:
        return probe.call_keep(fn, *values, **hooks)
    except KeyboardInterrupt as exc:
        if exc is not fault:
            raise
        return probe.describe_exception(exc), exc
    finally:
        psycopg.Cursor.execute = real


def _open_connections() -> int:
    import psycopg

    return sum(1 for o in gc.get_objects() if isinstance(o, psycopg.Connection) and not o.closed)


def script(mod, args: dict) -> None:
    for spec in args["cases"]:
        probe.started(spec["name"])
        case = Case(spec)
        outcomes, observed = [], {}
        try:
            for op in spec["ops"]:
                if "sleep" in op:
                    _sleep(op["sleep"])
                elif "skew" in op:
                    _skew(mod, op["skew"])
                elif "barrier" in op:
                    _barrier(case)
                else:
                    fn = probe.function(mod, op["call"])
                    hooks = {k: _hook(case, k, v) for k, v in op.get("hooks", {}).items()}
                    values = [case.value(a) for a in op.get("args", [])]
                    observed["received"] = probe.received(values)
                    started = time.monotonic()
                    outcome, value = _call(fn, values, hooks, op.get("interrupt_at"))
                    outcome["seconds"] = round(time.monotonic() - started, 3)
                    outcomes.append(outcome)
                    if op.get("keep") and outcome["kind"] == "returned":
                        case.kept[op["keep"]] = value
                    if op.get("inspect"):
                        observed.update(_inspect(value, outcome))
                    if op.get("keep_error") is not None:
                        observed["connections_open"] = _open_connections()
                    if outcome["kind"] in ("missing", "not_implemented"):
                        break
            outcome = outcomes[-1] if outcomes else {"kind": "returned", "value": None}
            probe.report(spec["name"], outcome, calls=outcomes, hooks=case.hooks, **observed)
        finally:
            case.close()


def race(mod, args: dict) -> None:
    """Each case of `args["cases"]` in a process of its own, forked from this one once the
    student's module is imported: separate processes and connections, as if each had been
    started alone, without each paying an interpreter and psycopg (~0.15 s of CPU on every
    race). A racer runs `script` on its case and reports on a pipe of its own; this process
    relays whole lines to the judge, so two racers' records never interleave. A racer that ends
    without its report ends this process the same way (exit code or signal), its case last
    started: the judge reads that racer's end as it reads a lone child's."""
    import contextlib
    import selectors
    import signal

    main_fd = probe._out.fileno()
    pipes: dict[int, tuple[int, dict]] = {}
    for spec in args["cases"]:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            for fd in pipes:
                os.close(fd)
            judges = probe._out
            probe.attach(write_fd, probe._module_file)
            judges.close()  # this racer reports on its own pipe only
            code = 0
            try:
                script(mod, {"cases": [spec]})
            except BaseException as exc:  # noqa: BLE001 - as main() reports it
                probe.emit({"event": "aborted", "error": probe.describe_exception(exc)})
                code = 4
            _exit(code)
        os.close(write_fd)
        pipes[read_fd] = (pid, spec)
    reported: set[str] = set()
    buffers = {fd: b"" for fd in pipes}
    statuses: dict[int, int] = {}

    def relay(fd: int, chunk: bytes) -> None:
        *lines, buffers[fd] = (buffers[fd] + chunk).split(b"\n")
        for line in lines:
            if b'"event":"case"' in line:
                reported.add(pipes[fd][1]["name"])
            os.write(main_fd, line + b"\n")

    # Until every racer has exited: a pipe may stay open after its racer ended (something it
    # forked holds it), so the end is the racer's exit, then whatever is left in its pipe.
    with selectors.DefaultSelector() as sel:
        for fd in pipes:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        ended: set[int] = set()  # pipes at their end, the racer's exit status not yet seen
        while len(statuses) < len(pipes):
            for key, _ in sel.select(timeout=0.002 if ended - statuses.keys() else 0.05):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    relay(key.fd, chunk)
                else:
                    sel.unregister(key.fd)
                    ended.add(key.fd)
            for fd, (pid, _spec) in pipes.items():
                if fd not in statuses:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        statuses[fd] = status
                        with contextlib.suppress(BlockingIOError):
                            while chunk := os.read(fd, 65536):
                                relay(fd, chunk)
    for fd in pipes:
        os.close(fd)
    for fd, (_pid, spec) in pipes.items():
        status = statuses[fd]
        if spec["name"] in reported and os.waitstatus_to_exitcode(status) == 0:
            continue
        probe.started(spec["name"])  # the case this process ends in, for the judge
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        _exit(code)


def _inspect(value: Any, outcome: dict) -> dict:
    """What open_db returned, as only the child can see it."""
    if outcome["kind"] != "returned":
        return {}
    seen = {"type": f"{type(value).__module__}.{type(value).__qualname__}"}
    try:
        seen["autocommit"] = bool(value.autocommit)
        seen["status"] = value.info.transaction_status.name
        seen["closed"] = bool(value.closed)
    except Exception as exc:
        seen["inspect_error"] = repr(exc)[:200]
    return seen


def script_when_asked(mod, args: dict) -> None:
    """A process started ahead (`child.child_session`): its interpreter is up and the student's
    module imported before the judge needs it. Waits for ONE request on the private request pipe,
    `{"id": n, "args": {"cases": [...]}}`, runs it as `script` does, replies, and ends: one
    process, one actor, as if it had been started at that moment."""
    import json

    # Read byte by byte and leave the pipe open: a hook's `probe.hold()` reads the judge's "go"
    # from it later (closed, its number would be reused by a socket the hold then read from).
    fd, line = int(os.environ["LABKIT_REQUEST_FD"]), b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    if not line:  # the judge did not need this one
        return
    request = json.loads(line)
    script(mod, request["args"])
    probe.emit({"event": "reply", "id": request["id"], "outcome": {"kind": "returned", "value": None},
                "observed": {}})
