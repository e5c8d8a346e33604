"""The child's side of a check: call the student's functions and report what happened.

Runs inside the child process only. Each record is one JSON line on the result pipe; the
judge never sees the student's objects, only these descriptions of them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import json
import os
import signal
import socket
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from labkit.values import decode, encode

REAL_CONNECT = sqlite3.connect  # before any student code runs (it may patch sqlite3)

WITNESS_TIMEOUT = 10.0  # the judge's look is bounded well below this
MAX_WITNESS_REPLY = 1 << 20  # the witness answers a few hundred bytes

_out = None
_module_file = ""
_cpu_budget: dict[str, float] = {}  # case → CPU seconds it may use (`budget_cpu`)
# Taken before the student's module loads, as `_read` below: a patch cannot switch the budget off.
_setitimer = signal.setitimer


def attach(fd: int, module_file: str) -> None:
    global _out, _module_file
    _out = os.fdopen(fd, "w", buffering=1, encoding="utf-8", closefd=True)
    _module_file = os.path.realpath(module_file)


def emit(record: dict) -> None:
    # A write before os._exit must not wait in a buffer: flush every record.
    assert _out is not None, "probe.attach() was not called"
    _out.write(json.dumps(record, separators=(",", ":")) + "\n")
    _out.flush()


def trace_of(exc: BaseException) -> str:
    """The student's own frames only; frames of the probe and the standard library are noise."""
    # Lines are looked up, and paths resolved, only for the frames kept: the judge calls this for
    # each exception of its oracle (no student module: none kept), hundreds of times a step.
    summary = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False)
    real = functools.lru_cache(maxsize=None)(os.path.realpath)
    frames = [f for f in summary if _module_file and real(f.filename) == _module_file]
    lines = traceback.format_list(frames[-6:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)[-2000:]


def describe_exception(exc: BaseException) -> dict:
    kind = type(exc)
    if isinstance(exc, NotImplementedError):
        return {"kind": "not_implemented", "message": str(exc)[:300]}
    try:
        message = str(exc)[:500]
    except Exception:
        message = "<str() of the exception failed>"
    return {
        "kind": "raised",
        "type": kind.__name__,
        "module": kind.__module__,
        "mro": [c.__name__ for c in kind.__mro__],
        "bases": [c.__name__ for c in kind.__bases__],
        "message": message,
        "trace": trace_of(exc),
    }


def call(fn: Callable | None, *args: Any, **kwargs: Any) -> dict:
    """Call a student function and describe the outcome as data."""
    return call_keep(fn, *args, **kwargs)[0]


def call_keep(fn: Callable | None, *args: Any, **kwargs: Any) -> tuple[dict, Any]:
    """Like `call`, and also keep the returned value or the raised exception itself,
    for identity checks ("the same object", "a new dict")."""
    if fn is None:
        return {"kind": "missing"}, None
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return describe_exception(exc), exc
    return {"kind": "returned", "value": encode(value)}, value


def function(module: ModuleType, name: str) -> Callable | None:
    fn = getattr(module, name, None)
    return fn if callable(fn) else None


def report(case: str, outcome: dict, **observed: Any) -> None:
    """One case's result: the call's outcome plus anything the probe observed around it."""
    emit({"event": "case", "case": case, "outcome": outcome, "observed": observed})


def budget_cpu(budgets: dict[str, float]) -> None:
    """The cases (by name) that may use at most so many CPU seconds each (`limits.CPU_BUDGET_KEY`)."""
    _cpu_budget.clear()
    _cpu_budget.update(budgets or {})


def started(case: str) -> None:
    """Announce a case before running it, so a hang or a death can be pinned to it; a case with
    a CPU budget runs with a CPU-time timer of that many seconds (`_limit_cpu`), every other
    case with none."""
    if _cpu_budget:
        _limit_cpu(_cpu_budget.get(case))
    emit({"event": "start", "case": case})


def budget_import(importing: bool) -> None:
    """While the student's module imports, a CPU-time timer of `limits.IMPORT_CPU_SECONDS`
    (`_limit_cpu`); none once it is done."""
    from labkit.limits import IMPORT_CPU_SECONDS

    _limit_cpu(IMPORT_CPU_SECONDS if importing else None)


def _limit_cpu(seconds: float | None) -> None:
    """SIGPROF (which ends the process: `child._out_of_cpu`) once this process has used `seconds`
    more of CPU; None disarms it. A timer (ITIMER_PROF), not a soft RLIMIT_CPU: a limit, once
    set, keeps the kernel's process-wide CPU timer running until the process reaches it, even
    after it is lifted, and meanwhile `time.process_time` advances by whole ticks: the calls of
    a property test, a few ms each, measured 0 and its CPU budget never tripped."""
    with contextlib.suppress(ValueError, OSError):
        _setitimer(signal.ITIMER_PROF, seconds or 0)


# Taken when the probe is imported, before the student's module is: what `hold` calls cannot be
# replaced by patching the os module.
_read, _sleep, _environ = os.read, time.sleep, os.environ


def hold() -> None:
    """Wait at a hook until the judge acts: it kills the whole sandbox from outside (a crash at
    the hook), or writes a line on the private request pipe (it let the process go on).

    Blocks on the request pipe (LABKIT_REQUEST_FD); without one, sleeps. Returns only when the
    judge released it; nothing the student's module did to os, signal or atexit changes that."""
    fd = _environ.get("LABKIT_REQUEST_FD")
    if fd is None:
        while True:
            _sleep(3600)
    line = b""
    while not line.endswith(b"\n"):
        chunk = _read(int(fd), 1)
        if not chunk:  # the judge closed the pipe without a word: it is ending this process
            while True:
                _sleep(3600)
        line += chunk


def noop(module: ModuleType, args: dict) -> None:
    """Import only: used to find out once whether the module loads at all."""


SIZED = (str, bytes, bytearray, list, dict, tuple)


def received(values: list) -> list[dict]:
    """What a call is about to receive, per argument: its exact type name; for str, bytes,
    bytearray, list, dict and tuple its length; for a dict, the same for each value under a
    str key ("items"). Reported under the observation key `received` by every probe that
    passes arguments, so a test can check that a case called "a bytearray", "65 bytes" or
    "id has 65 characters" really sent one."""
    return [_seen(value, nested=True) for value in values]


def _seen(value: Any, nested: bool = False) -> dict:
    seen: dict[str, Any] = {"type": type(value).__name__}
    if type(value) in SIZED:
        seen["len"] = len(value)
    if nested and type(value) is dict:
        seen["items"] = {key: _seen(item) for key, item in value.items() if type(key) is str}
    return seen


def call_observed(fn: Callable | None, values: list) -> tuple[dict, dict]:
    """Call `fn(*values)`; the outcome, and what the generic probes observe around the call:
    `received` (see above), `input_changed` (the call modified an argument) and
    `returned_input` (it returned its first argument itself, not a new object)."""
    outcome, observed, _value = observed_call(fn, values)
    return outcome, observed


def observed_call(fn: Callable | None, values: list) -> tuple[dict, dict, Any]:
    """`call_observed`, also giving back what the call returned (or the exception it raised)."""
    seen = received(values)
    before = encode(copy.deepcopy(values))
    outcome, value = call_keep(fn, *values)
    returned_input = outcome["kind"] == "returned" and bool(values) and value is values[0]
    return outcome, {"received": seen, "input_changed": encode(values) != before,
                     "returned_input": returned_input}, value


MUTABLE = (list, dict, set, bytearray)


def calls(module: ModuleType, args: dict) -> None:
    """Generic probe: one plain function call per case, with decoded arguments
    (observations: see `call_observed`, and `returned_earlier`: the answer is the very object an
    earlier case's call returned, a cache the caller's changes reach)."""
    answers: list = []  # kept alive, so `is` cannot meet a reused id
    for spec in args["calls"]:
        started(spec["name"])
        outcome, observed, value = observed_call(function(module, spec["fn"]), [decode(a) for a in spec["args"]])
        mutable = outcome["kind"] == "returned" and isinstance(value, MUTABLE)
        observed["returned_earlier"] = mutable and any(value is earlier for earlier in answers)
        if mutable:
            answers.append(value)
        report(spec["name"], outcome, **observed)


def serve(module: ModuleType, args: dict) -> None:
    """Persistent probe (`labkit.judge.child.child_session`): answer call requests one at a time.

    Reads JSON lines from the private request pipe (LABKIT_REQUEST_FD) until the judge closes
    it: `{"id": n, "fn": "parse_line", "args": [<encoded>...], "adapter": "checks.<lab>.probes:f"}`.
    Replies `{"event": "reply", "id": n, "outcome": <as call()>, "observed": <as call_observed(),
    plus "cpu": the CPU seconds the call used, "wall": its seconds on the clock>}`.
    Without an adapter it calls `module.fn(*args)`; with one it calls `adapter(fn, *args)`, so
    a lab can build in the child what cannot cross the pipe (a `random.Random(seed)`, a
    connection) before calling the student's function. A missing function is reported as
    missing without calling the adapter.
    """
    adapters: dict[str, Callable] = {}
    with os.fdopen(int(os.environ["LABKIT_REQUEST_FD"]), "rb", closefd=True) as requests:
        for line in requests:
            request = json.loads(line)
            fn = function(module, request["fn"])
            name = request.get("adapter")
            if fn is not None and name:
                if name not in adapters:
                    target_module, _, target = name.partition(":")
                    adapters[name] = getattr(importlib.import_module(target_module), target)
                fn = functools.partial(adapters[name], fn)
            values = [decode(a) for a in request["args"]]
            started, clock = time.process_time(), time.monotonic()
            outcome, observed = call_observed(fn, values)
            observed["cpu"] = time.process_time() - started  # seconds of CPU, not of waiting
            observed["wall"] = time.monotonic() - clock  # the call's own time, sleeps included
            emit({"event": "reply", "id": request["id"], "outcome": outcome, "observed": observed})


@contextmanager
def tracked_connections() -> Iterator[list[sqlite3.Connection]]:
    """Every sqlite3 connection opened inside the block, so a probe can ask which are open."""
    real_connect = sqlite3.connect
    opened: list[sqlite3.Connection] = []

    def tracking_connect(*a, **kw):
        con = real_connect(*a, **kw)
        opened.append(con)
        return con

    sqlite3.connect = tracking_connect
    try:
        yield opened
    finally:
        sqlite3.connect = real_connect


def is_open(con: sqlite3.Connection) -> bool:
    try:
        con.execute("SELECT 1")
        return True
    except sqlite3.ProgrammingError:
        return False


def plain_rows(con: sqlite3.Connection, sql: str) -> list[tuple]:
    """`sql`'s rows on the student's connection as tuples, whatever its row_factory (a dict or a
    namedtuple factory is theirs to choose). sqlite3's errors propagate."""
    cursor = con.cursor()
    cursor.row_factory = None
    return cursor.execute(sql).fetchall()


def opening(outcome: dict, con: Any, opened: list, path: str) -> dict[str, Any]:
    """What the judge is told of one call of an `open_*` function (`opened`: every connection it
    made, from `tracked_connections`): how many it left open, what it was given, and of the
    connection it returned, whether it was closed already, else how it is set up."""
    observed: dict[str, Any] = {"left_open": sum(1 for c in opened if is_open(c)), "received": received([path])}
    if outcome["kind"] == "returned" and isinstance(con, sqlite3.Connection):
        if not is_open(con):
            observed["closed"] = True
        else:
            observed.update(isolation_level=encode(con.isolation_level), busy_timeout=pragma(con, "busy_timeout"),
                            in_transaction=con.in_transaction)
    return observed


def interrupted(fn: Callable | None, folder: str, *args: Any) -> tuple[dict, dict]:
    """(outcome, observed) of `interrupted_opens` in `folder`. A function that runs no statement
    at all (missing, still the skeleton) is described by one plain call instead."""
    tries = interrupted_opens(fn, folder, *args)
    outcome = {"kind": "returned", "value": encode(None)} if tries else \
        call(fn, os.path.join(folder, "plain.db"), *args)
    return outcome, {"interrupted": tries}


def report_interrupted(fn: Callable | None, case: dict, *args: Any) -> None:
    """The case `case["name"]`: `interrupted` in `case["folder"]`, reported."""
    started(case["name"])
    outcome, observed = interrupted(fn, case["folder"], *args)
    report(case["name"], outcome, **observed)


# How long the lock stays held once the call began a write: long enough that only a busy wait gets
# through (a deferred BEGIN that cannot wait fails at once), short enough not to be the student's wait.
WRITE_SEEN_HOLD = 0.05
WRITES = ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE", "INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP",
          "ALTER")


def hold_write_lock(path: str, seconds: float) -> Callable[[], None]:
    """Another connection takes the write lock on `path` now (BEGIN IMMEDIATE) and keeps it
    until a connection opened meanwhile has begun a write and waited `WRITE_SEEN_HOLD` s (its
    statements are traced), or for `seconds` at most (its trace was replaced, or it never
    writes). Returns a function for when the call is over: it lets go at once and waits for
    that (bounded). Keyed to the write, not to a guess of how soon it comes, the lock is held
    while the call writes however busy the machine is, and a correct call waits ~50 ms."""
    other = REAL_CONNECT(path, isolation_level=None, timeout=1.0, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    wake, over = threading.Event(), threading.Event()
    connect = sqlite3.connect

    def noticed(sql: str) -> None:
        if sql.lstrip().upper().startswith(WRITES):
            wake.set()

    def watching_connect(*args, **kwargs):
        con = connect(*args, **kwargs)
        with contextlib.suppress(Exception):  # not a real connection (a factory): untraced, `seconds` then
            con.set_trace_callback(noticed)
        return con

    def release() -> None:
        deadline = time.monotonic() + seconds
        wake.wait(seconds)
        if not over.is_set():  # a write began (or the time is up): let it wait on the lock a moment
            over.wait(min(WRITE_SEEN_HOLD, max(0.0, deadline - time.monotonic())))
        other.execute("ROLLBACK")
        other.close()

    sqlite3.connect = watching_connect
    thread = threading.Thread(target=release, name="labkit-writer", daemon=True)
    thread.start()

    def done() -> None:
        if sqlite3.connect is watching_connect:
            sqlite3.connect = connect
        over.set()
        wake.set()
        thread.join(seconds + 5.0)

    return done


INTERRUPT_TRIES = 24  # more statements than any open_* function of the course runs


def interrupted_opens(fn: Callable | None, folder: str, *args: Any) -> list[dict]:
    """`fn(path, *args)` on a new file once per statement k = 1, 2, ... of the connections it
    opens, with a KeyboardInterrupt (Ctrl-C) raised just before the k-th, until a call runs out of
    statements: for each, the statement, how the call ended ("interrupted": the KeyboardInterrupt
    came out; "returned"; or the name of what was raised instead) and how many connections it
    left open."""
    from labkit.probe import statements

    tries: list[dict] = []
    for k in range(1, INTERRUPT_TRIES + 1) if fn is not None else ():
        fault = KeyboardInterrupt()
        path = os.path.join(folder, f"interrupted-{k}.db")
        with statements.faulty_connects(k, fault) as (counter, opened):
            try:
                fn(path, *args)
                ended = "returned"
            except BaseException as exc:  # noqa: BLE001 - the Ctrl-C, or what replaced it
                ended = "interrupted" if exc is fault else type(exc).__name__
            reached = counter.stop()
        left = sum(1 for con in opened if is_open(con))
        for con in opened:
            con.close()
        if not reached:
            break  # every statement of the call has been interrupted once
        tries.append({"k": k, "sql": counter.sql, "ended": ended, "left_open": left})
    return tries


def pragma(con: sqlite3.Connection, name: str) -> Any:
    """`PRAGMA name`'s value on the student's connection (`plain_rows`); None when it cannot answer."""
    try:
        rows = plain_rows(con, f"PRAGMA {name}")
    except sqlite3.Error:
        return None
    return rows[0][0] if rows else None


def see(url: str, case: str, point: str, **said) -> dict:
    """Ask the judge's witness (`labkit/judge/witness.py`) to look now, and wait for its answer
    ({} or what it says; {"witness_error": ...} when it could not be reached).

    Where a rule is about state at a moment only the child can time (can another connection
    write right now, is this row marked yet), the probe never looks itself: student code shares
    this process and could patch the look. It makes a real HTTP request to the judge at that
    moment, and the judge's handler looks with its own connections while this call waits."""
    # One HTTP/1.0 request on a plain socket (the witness answers and closes): http.client
    # would cost every child ~18 ms of imports (email, ssl) for this one call.
    parts = urlsplit(url)
    body = json.dumps({"case": case, "point": point, **said}).encode()
    head = (f"POST {parts.path} HTTP/1.0\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=WITNESS_TIMEOUT) as conn:
            conn.sendall(head + body)
            reply = bytearray()
            while len(reply) < MAX_WITNESS_REPLY and (chunk := conn.recv(65536)):
                reply += chunk
        status, _, rest = bytes(reply).partition(b"\r\n")
        if not status.startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP answer: {status[:80]!r}")
        return json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}")
    except Exception as exc:  # whatever went wrong, the judge will see no sighting: that is the verdict
        return {"witness_error": f"{type(exc).__name__}: {exc}"}
