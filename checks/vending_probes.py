"""Lab `vending`, child side: drive the student's `client` and report what happened.

Everything here runs inside a child process with the student's module loaded. It only
calls and observes; the judge (`checks/vending.py`) decides what is right. The async
functions run under `asyncio` here, each case in a fresh event loop:

- cases against the judge's feed use a real loop and real loopback TCP;
- cases whose I/O is all in this process (a fed `StreamReader`, a fake writer whose
  `drain` or `wait_closed` hangs) use `VirtualClockLoop`, where time jumps to the next timer
  whenever nothing is ready. A 1 s close wait then costs no real time, and timings are
  exact, so verdicts do not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from labkit import probe
from labkit.values import decode, encode

# Taken before the student's module is imported: our own connections are never tracked.
REAL_CONNECT = sqlite3.connect
REAL_OPEN_CONNECTION = asyncio.open_connection


def plain(path: str, timeout: float = 1.0) -> sqlite3.Connection:
    """A connection made by the judge's rules, so a step does not depend on step 2."""
    return REAL_CONNECT(path, isolation_level=None, timeout=timeout)


def peek(db: str) -> dict | None:
    """The committed state as another connection sees it right now (None if unreadable)."""
    try:
        other = plain(db, timeout=0.2)
        try:
            row = other.execute("SELECT last, total FROM checkpoint WHERE id = 1").fetchone()
            ledger = other.execute("SELECT seq, delta FROM ledger ORDER BY seq").fetchall()
        finally:
            other.close()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    return {"last": row[0], "total": row[1], "ledger": [list(r) for r in ledger]}


# --- step 2: open_store and state --------------------------------------------------------


def stores(mod, args: dict) -> None:
    """open_store on new, re-opened, saved and broken files; state on judge-made stores."""
    with probe.tracked_connections() as opened:
        for case in args["opens"]:
            probe.started(case["name"])
            opened.clear()
            outcome, con = probe.call_keep(probe.function(mod, "open_store"), case["path"])
            observed: dict[str, Any] = {"left_open": sum(1 for c in opened if probe.is_open(c))}
            if outcome["kind"] == "returned" and isinstance(con, sqlite3.Connection):
                observed.update(isolation_level=encode(con.isolation_level),
                                busy_timeout=con.execute("PRAGMA busy_timeout").fetchone()[0],
                                in_transaction=con.in_transaction)
            for c in opened:
                c.close()
            probe.report(case["name"], outcome, **observed)
    for case in args["states"]:
        probe.started(case["name"])
        con = plain(case["path"])
        outcome = probe.call(probe.function(mod, "state"), con)
        probe.report(case["name"], outcome, in_transaction=con.in_transaction)
        con.close()


# --- steps 3 and 5: apply_event and consume_line on a judge-made store -------------------


def on_store(mod, args: dict) -> None:
    """Call a function on a connection to a store the judge prepared; watch every fault()."""
    connections: dict[str, sqlite3.Connection] = {}
    for spec in args["calls"]:
        probe.started(spec["name"])
        db = spec["db"]
        con = connections.get(db) or connections.setdefault(db, plain(db))
        values = [decode(a) for a in spec["args"]]
        faults: list[dict] = []
        raised: list[BaseException] = []
        mode = spec.get("fault")

        def fault(db=db, con=con, faults=faults, raised=raised, mode=mode):
            faults.append({"in_transaction": con.in_transaction, "inside": _inside(con),
                           "outside": peek(db)})
            if mode == "raise":
                error = RuntimeError("the vending arm jammed (a fault injected by the judge)")
                raised.append(error)
                raise error

        kwargs = {"fault": fault} if spec.get("fault") else {}
        outcome, error = probe.call_keep(probe.function(mod, spec["fn"]), con, *values, **kwargs)
        probe.report(spec["name"], outcome, in_transaction=con.in_transaction,
                     after=peek(db), can_write=probe.other_can_write(db), faults=faults,
                     same_error=bool(raised) and error is raised[-1])
    for con in connections.values():
        con.close()


def _inside(con: sqlite3.Connection) -> dict | None:
    """What the student's own connection sees mid-transaction (its uncommitted writes)."""
    try:
        last, total = con.execute("SELECT last, total FROM checkpoint WHERE id = 1").fetchone()
        seqs = [r[0] for r in con.execute("SELECT seq FROM ledger ORDER BY seq")]
    except sqlite3.Error:
        return None
    return {"last": last, "total": total, "seqs": seqs}


# --- async machinery for steps 6, 7 and the final check ------------------------------------


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready.

    Only for cases whose I/O never leaves this process: a wait on the network would be
    skipped over instead of waited for.
    """

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        real_select = self._selector.select

        def select(timeout=None):
            events = real_select(0 if timeout is not None else 0.01)
            if not events and timeout:
                self._now += timeout
            return events

        self._selector.select = select

    def time(self) -> float:
        return self._now


def run_async(make: Callable[[], Any], virtual: bool) -> Any:
    """Run one case's coroutine in a fresh loop (virtual clock or real)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop if virtual else None) as runner:
        return runner.run(make())


async def start(fn: Callable | None, *args, **kwargs) -> tuple[asyncio.Task | None, dict | None]:
    """Call a student's async function and wrap the coroutine in a task, or say why not."""
    if fn is None:
        return None, {"kind": "missing"}
    try:
        coro = fn(*args, **kwargs)
    except Exception as exc:
        return None, probe.describe_exception(exc)
    if not inspect.isawaitable(coro):
        return None, {"kind": "not_async", "value": encode(coro)}
    return asyncio.ensure_future(coro), None


async def settle(task: asyncio.Task, seconds: float) -> tuple[dict, Any]:
    """Wait at most `seconds` for the task; describe how it ended (hung, cancelled, ...)."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return {"kind": "hung", "seconds": seconds}, None
    if task.cancelled():
        return {"kind": "cancelled"}, None
    error = task.exception()
    if error is not None:
        return probe.describe_exception(error), error
    return {"kind": "returned", "value": encode(task.result())}, task.result()


class Recorder:
    """Every writer call and hook call of one case, in order, with what the DB showed then."""

    def __init__(self, db: str | None) -> None:
        self.db = db
        self.log: list[dict] = []

    def note(self, kind: str, **data: Any) -> None:
        self.log.append({"kind": kind, **data})

    def last_committed(self) -> int | None:
        seen = peek(self.db) if self.db else None
        return None if seen is None else seen["last"]


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


class FakeTransport:
    def __init__(self, rec: Recorder, real=None) -> None:
        self._rec = rec
        self._real = real

    def abort(self) -> None:
        self._rec.note("abort")
        if self._real is not None:
            self._real.abort()

    def close(self) -> None:
        self._rec.note("transport_close")
        if self._real is not None:
            self._real.close()

    def is_closing(self) -> bool:
        return self._real.is_closing() if self._real is not None else False

    def get_extra_info(self, name, default=None):
        return self._real.get_extra_info(name, default) if self._real is not None else default


class SpyWriter:
    """A StreamWriter seen through a keyhole: records each call, then does it for real.

    `drain` may be told to fail ("raise") or never end ("hang"), once, for fault cases.
    Without a real writer underneath it is a fake whose `wait_closed` can hang or fail.
    """

    def __init__(self, rec: Recorder, real: asyncio.StreamWriter | None = None,
                 drain: str | None = None, wait_closed: str | None = None) -> None:
        self._rec = rec
        self._real = real
        self._drain = drain
        self._wait_closed = wait_closed
        self._closed = False
        self.transport = FakeTransport(rec, real.transport if real is not None else None)

    def write(self, data) -> None:
        self._rec.note("write", data=encode(data), last_committed=self._rec.last_committed())
        if self._real is not None:
            self._real.write(data)

    def drain(self):
        self._rec.note("drain")  # noted when called: wait_for(drain(), 0) may never run it
        return self._drained()

    async def _drained(self) -> None:
        mode, self._drain = self._drain, None
        if mode == "raise":
            raise ConnectionResetError(104, "Connection reset by peer (injected by the judge)")
        if mode == "hang":
            await _never()
        if self._real is not None:
            await self._real.drain()

    def close(self) -> None:
        self._rec.note("close")
        self._closed = True
        if self._real is not None:
            self._real.close()

    def is_closing(self) -> bool:
        return self._real.is_closing() if self._real is not None else self._closed

    def wait_closed(self):
        self._rec.note("wait_closed")  # noted when called, like drain
        return self._closed_waited()

    async def _closed_waited(self) -> None:
        if self._wait_closed == "hang":
            await _never()
        if self._wait_closed == "reset":
            raise ConnectionResetError(104, "Connection reset by peer (injected by the judge)")
        if self._real is not None:
            await self._real.wait_closed()

    def get_extra_info(self, name, default=None):
        return self._real.get_extra_info(name, default) if self._real is not None else default

    def can_write_eof(self) -> bool:
        return False

    @property
    def really_closed(self) -> bool:
        """Was the socket underneath closed (by close() or abort())?"""
        return self._real.is_closing() if self._real is not None else self._closed


def fed_reader(data: bytes, eof: bool) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=64)
    if data:
        reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def _hook(rec: Recorder, fail_at: int | None, raised: list[BaseException]) -> Callable[[int], None]:
    def before_ack(seq):
        rec.note("before_ack", seq=encode(seq), last_committed=rec.last_committed())
        if fail_at is not None and seq == fail_at:
            error = RuntimeError(f"the display failed before ACK {seq} (injected by the judge)")
            raised.append(error)
            raise error

    return before_ack


# --- step 6: consume_session --------------------------------------------------------------


def sessions(mod, args: dict) -> None:
    """consume_session against the judge's feed (real TCP) or fed readers and fake writers."""
    fn = probe.function(mod, "consume_session")
    for case in args["scenarios"]:
        probe.started(case["name"])
        outcome, observed = _session_case(fn, case)
        probe.report(case["name"], outcome, **observed)


def _session_case(fn, case: dict) -> tuple[dict, dict]:
    rec = Recorder(case["db"])
    con = plain(case["db"])
    raised: list[BaseException] = []
    before_ack = _hook(rec, case.get("hook_fails_at"), raised)
    timeout = decode(case["timeout"])
    result: dict[str, Any] = {}

    async def scenario():
        loop = asyncio.get_running_loop()
        real = None
        if case["io"] == "feed":
            reader, real = await asyncio.wait_for(
                REAL_OPEN_CONNECTION(case["host"], case["port"], limit=64), 2.0)
            real.write(b"RESUME -1\n")
            await asyncio.wait_for(real.drain(), 2.0)
            writer = SpyWriter(rec, real)
        else:
            reader = fed_reader(case["input"].encode("latin-1"), case.get("eof", True))
            writer = SpyWriter(rec, None, drain=case.get("drain"), wait_closed=case.get("wait_closed"))
        try:
            began = loop.time()
            task, failed = await start(fn, reader, writer, con, timeout, before_ack=before_ack)
            if task is None:
                result["outcome"], error = failed, None
            else:
                if case.get("cancel_after") is not None:
                    await asyncio.sleep(case["cancel_after"])
                    task.cancel()
                result["outcome"], error = await settle(task, case["guard"])
            result["seconds"] = round(loop.time() - began, 3)
            result["closed"] = writer.really_closed
            result["same_error"] = bool(raised) and error is raised[-1]
        finally:
            if real is not None and not real.is_closing():
                real.transport.abort()  # cleanup after a case that left the socket open

    try:
        run_async(scenario, virtual=case["io"] != "feed")
        con_open = probe.is_open(con)
    finally:
        con.close()
    outcome = result.pop("outcome", {"kind": "raised", "type": "probe", "mro": [], "message": "no result"})
    return outcome, {"log": rec.log, "con_open": con_open, "after": peek(case["db"]), **result}


# --- step 7: run_client ---------------------------------------------------------------------


def clients(mod, args: dict) -> None:
    """run_client against the judge's feeds, with every connection and socket watched."""
    fn = probe.function(mod, "run_client")
    for case in args["scenarios"]:
        probe.started(case["name"])
        outcome, observed = _client_case(mod, fn, case)
        probe.report(case["name"], outcome, **observed)


def _client_case(mod, fn, case: dict) -> tuple[dict, dict]:
    rec = Recorder(case["path"])
    raised: list[BaseException] = []
    before_ack = _hook(rec, case.get("hook_fails_at"), raised)
    dials: list[dict] = []
    writers: list[SpyWriter] = []
    frames: list[int] = []
    result: dict[str, Any] = {}

    async def spy_open_connection(host=None, port=None, **kw):
        dials.append({"host": encode(host), "port": encode(port),
                      "limit": encode(kw.get("limit", "the default (64 KiB)"))})
        mode = case.get("dial", "real")
        if mode == "hang":
            await _never()
        if mode == "fake":
            writer = SpyWriter(rec, None, drain=case.get("drain"))
            writers.append(writer)
            return fed_reader(b"", eof=False), writer
        reader, real = await REAL_OPEN_CONNECTION(host, port, **kw)
        writer = SpyWriter(rec, real, drain=case.get("drain"))
        writers.append(writer)
        return reader, writer

    real_parse = probe.function(mod, "parse_line")

    def spy_parse(line, *a, **kw):
        if isinstance(line, bytes | bytearray):
            frames.append(len(line))
        return real_parse(line, *a, **kw)

    patches = [(asyncio, "open_connection", spy_open_connection),
               (asyncio.streams, "open_connection", spy_open_connection)]
    if getattr(mod, "open_connection", None) is REAL_OPEN_CONNECTION:
        patches.append((mod, "open_connection", spy_open_connection))
    if real_parse is not None:
        patches.append((mod, "parse_line", spy_parse))
    saved = [(target, attr, getattr(target, attr)) for target, attr, _ in patches]

    async def scenario():
        loop = asyncio.get_running_loop()
        began = loop.time()
        task, failed = await start(fn, case["host"], case["port"], case["path"],
                                   decode(case["timeout"]), before_ack=before_ack)
        if task is None:
            result["outcome"], error = failed, None
        else:
            if case.get("cancel_after") is not None:
                await _parked(task, rec)
                await asyncio.sleep(case["cancel_after"])
                task.cancel()
            result["outcome"], error = await settle(task, case["guard"])
        result["seconds"] = round(loop.time() - began, 3)
        result["same_error"] = bool(raised) and error is raised[-1]
        result["sockets_closed"] = [w.really_closed for w in writers]
        for w in writers:  # cleanup after a case that left a socket open
            if w._real is not None and not w._real.is_closing():
                w._real.transport.abort()

    for target, attr, replacement in patches:
        setattr(target, attr, replacement)
    try:
        with probe.tracked_connections() as opened:
            run_async(scenario, virtual=case.get("dial") in ("hang", "fake"))
    finally:
        for target, attr, original in saved:
            setattr(target, attr, original)
    left_open = sum(1 for c in opened if probe.is_open(c))
    for c in opened:
        c.close()
    outcome = result.pop("outcome", {"kind": "raised", "type": "probe", "mro": [], "message": "no result"})
    return outcome, {"log": rec.log, "dials": dials, "db_opened": len(opened), "db_left_open": left_open,
                     "longest_frame": max(frames, default=0), "file_exists": os.path.exists(case["path"]),
                     **result}


async def _parked(task: asyncio.Task, rec: Recorder, longest: float = 2.0) -> None:
    """Wait until the client has written its RESUME (it then waits for the stalled feed).

    Cancelling earlier could land while `wait_for(open_connection(...))` completes, and
    Python 3.11's wait_for then drops the cancellation: a verdict would depend on timing.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + longest
    while not task.done() and loop.time() < deadline and not any(e["kind"] == "write" for e in rec.log):
        await asyncio.sleep(0.005)


# --- final check: one client process, maybe killed between commit and ACK ------------------


def crash_client(mod, args: dict) -> None:
    """Run run_client once. With `kill`, before_ack(kill) ends the process at once."""
    kill = args.get("kill")

    def before_ack(seq):
        probe.emit({"event": "note", "kind": "before_ack", "seq": encode(seq), "t": time.time()})
        if kill is not None and seq == kill:
            os._exit(args["exit_code"])  # no finally, no close, no ACK: the process dies here

    async def scenario():
        task, failed = await start(probe.function(mod, "run_client"), args["host"], args["port"],
                                   args["db"], args["timeout"], before_ack=before_ack)
        if task is None:
            return failed
        outcome, _ = await settle(task, args["guard"])
        return outcome

    probe.started("run_client")
    probe.report("run_client", run_async(scenario, virtual=False))
