"""Lab `vending`, child side: drive the student's `client` and report what happened.

Everything here runs inside a child process with the student's module loaded. It only
calls and observes; the judge (the step modules beside this one) decides what is right, and
makes every observation about *state* itself (the DB files through its own connections, the locks on
them, the files and sockets this process still holds, the feed's journal). What a reply
here carries is evidence about return values, and about what only this process can see:
how the student's code used the writer, the reader and the hooks it was given.

`serve` answers one case per request (`labkit.judge.child.child_session`) and then waits:
the judge looks at the files, locks and sockets between two cases, so everything a case
leaves behind is kept alive until the *next* request, then cleaned up.

The async functions run under `asyncio`, each case in a fresh event loop:

- cases against the judge's feed use a real loop and real loopback TCP;
- cases whose I/O is all in this process (a scripted `StreamReader`, a fake writer whose
  `drain` or `wait_closed` hangs) use `VirtualClockLoop`, where time jumps to the next timer
  whenever nothing is ready. A 1 s close wait then costs no real time, and timings are
  exact, so verdicts do not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from checks.vending import sweep_probes as sweep
from checks.vending.fake_streams import (
    INJECTED,
    SpyWriter,
    never,
    run_async,
    scripted_reader,
    settle,
    start,
)
from labkit import probe
from labkit.values import decode, encode

# Taken before the student's module is imported: our own connections are never tracked.
REAL_CONNECT = sqlite3.connect
REAL_OPEN_CONNECTION = asyncio.open_connection


def plain(path: str, timeout: float = 1.0) -> sqlite3.Connection:
    """A connection made by the judge's rules, so a step does not depend on step 2."""
    return REAL_CONNECT(path, isolation_level=None, timeout=timeout)


def peek(db: str) -> dict | None:
    """The committed state as another connection sees it right now (None if unreadable).
    Used only for views the judge cannot take from outside: *during* a call (in fault() or
    before_ack), where the verdict itself rests on the judge's reads after the call."""
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


class Interrupted(BaseException):
    """What a fault() raises to stand for KeyboardInterrupt or a cancellation: not an Exception."""


def in_transaction(con: sqlite3.Connection) -> bool | None:
    """`con.in_transaction`, or None when the student's code closed the connection."""
    try:
        return con.in_transaction
    except sqlite3.ProgrammingError:
        return None


# --- serving one case at a time --------------------------------------------------------------


def serve(mod, args: dict) -> None:
    """Answer `{"id", "kind", "case"}` requests until the judge closes the pipe.

    Replies `{"event": "reply", "id", "outcome", "observed"}`. What a case leaves open (its
    connections, sockets, the exception it raised with its frames) stays alive until the next
    request arrives, so the judge can see it; then it is cleaned up."""
    runners: dict[str, Callable[[Any, dict, list], tuple[dict, dict]]] = {
        "open": open_case, "state": state_case, "call": store_call, "session": session_case,
        "client": client_case, "sweep": sweep_case,
        "interrupted": lambda mod, case, cleanup: probe.interrupted(probe.function(mod, "open_store"), case["folder"]),
        "open_busy": open_busy_case,
    }
    cleanup: list[Callable[[], Any]] = []
    with os.fdopen(int(os.environ["LABKIT_REQUEST_FD"]), "rb", closefd=True) as requests:
        for line in requests:
            _clean(cleanup)
            request = json.loads(line)
            try:
                outcome, observed = runners[request["kind"]](mod, request["case"], cleanup)
            except Exception as exc:  # our own observation failed: say so, never end the process
                outcome = {"kind": "probe_failed", "message": f"{type(exc).__name__}: {exc}"[:300]}
                observed = {}
            probe.emit({"event": "reply", "id": request["id"], "outcome": outcome, "observed": observed})
    _clean(cleanup)


def _clean(cleanup: list[Callable[[], Any]]) -> None:
    for undo in cleanup:
        try:
            undo()
        except Exception:  # a leftover of the student's that will not close: the process ends soon
            pass
    cleanup.clear()


# --- step 2: open_store and state --------------------------------------------------------


def open_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """open_store(path); every connection it opened is kept until the judge has looked."""
    with probe.tracked_connections() as opened:
        outcome, con = probe.call_keep(probe.function(mod, "open_store"), case["path"])
    kept = [con]  # a raised exception keeps its frames (and their connections) alive too
    cleanup.extend(c.close for c in opened)
    cleanup.append(kept.clear)
    return outcome, probe.opening(outcome, con, opened, case["path"])


def open_busy_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """open_store(path) while another connection holds the write lock for `seconds`."""
    released = probe.hold_write_lock(case["path"], case["seconds"])
    try:
        return open_case(mod, case, cleanup)
    finally:
        released()


def state_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    con = plain(case["path"])
    cleanup.append(con.close)
    release = hold_write_lock(case["path"]) if case.get("held") else None
    try:
        outcome = probe.call(probe.function(mod, "state"), con)
    finally:
        if release is not None:
            release()
    return outcome, {"in_transaction": in_transaction(con), "received": probe.received([con])}


def hold_write_lock(db: str) -> Callable[[], None]:
    """Another connection in the middle of a write transaction on `db` (it has written, not yet
    committed) until the returned function rolls it back."""
    other = REAL_CONNECT(db, isolation_level=None, timeout=1.0)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE checkpoint SET total = total WHERE id = 1")

    def release() -> None:
        other.execute("ROLLBACK")
        other.close()

    return release


# --- steps 3 and 5: apply_event and consume_line on a judge-made store -------------------


def store_call(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """Call `fn(con, *args[, fault=f])` on a connection to a store the judge prepared; watch every fault()."""
    db = case["db"]
    con = plain(db)
    cleanup.append(con.close)
    values = [decode(a) for a in case["args"]]
    faults: list[dict] = []
    raised: list[BaseException] = []
    mode = case.get("fault")

    def fault():
        faults.append({"in_transaction": in_transaction(con), "inside": _inside(con),
                       "witness": tell_witness(case.get("witness"), case["name"])})
        if mode in ("raise", "interrupt"):
            error = (RuntimeError if mode == "raise" else Interrupted)(f"the vending arm jammed {INJECTED}")
            raised.append(error)
            raise error

    kwargs = {"fault": fault} if mode else {}
    release = hold_write_lock(db) if case.get("held") else None
    try:
        outcome, error = probe.call_keep(probe.function(mod, case["fn"]), con, *values, **kwargs)
    except Interrupted as interrupt:  # a BaseException is a failure too: it must roll back like any other
        outcome, error = probe.describe_exception(interrupt), interrupt
    finally:
        if release is not None:
            release()
    kept = [error]
    cleanup.append(kept.clear)
    return outcome, {"received": probe.received(values), "in_transaction": in_transaction(con),
                     "faults": faults, "same_error": bool(raised) and error is raised[-1]}


def sweep_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """`fn(con, *args)` once per statement k and mode (`checks/vending/sweep_probes.py`), each run
    on its own copy of the store (`case["dbs"]`: `case["runs"]` copies per mode, in mode order),
    until a run ends before statement k. Every connection stays open until the judge has looked."""
    fn = probe.function(mod, case["fn"])
    values = [decode(a) for a in case["args"]]
    runs: list[dict] = []
    kept: list = []
    cleanup.append(kept.clear)
    for block, mode in enumerate(case["modes"]):
        for k in range(case["runs"]):
            copy = block * case["runs"] + k
            db = case["dbs"][copy]
            con = plain(db, timeout=5.0)  # waiting out the competitor's 50 ms must not depend on the load
            cleanup.append(con.close)
            competitor = sweep.Competitor(REAL_CONNECT, db, *values[:2]) if mode == "write" else None
            got: dict[str, Any] = {}

            def call(con=con, got=got):
                try:
                    got["outcome"], error = probe.call_keep(fn, con, *values)
                except KeyboardInterrupt as interrupt:  # what the judge injected, or the student's own
                    got["outcome"], error = probe.describe_exception(interrupt), interrupt
                kept.append(error)

            seen = sweep.run_at(con, k, mode, call, competitor)
            if competitor is not None:
                competitor.join()
                seen["acted"] = competitor.committed
            runs.append({**seen, "mode": mode, "k": k, "copy": copy, "in_transaction": in_transaction(con),
                         "outcome": got.get("outcome", {"kind": "probe_failed", "message": "no outcome"})})
            if seen["fired"] is None:  # the call ran fewer than k + 1 statements: every boundary was tried
                break
    first = runs[0]["outcome"] if runs else {}
    if first.get("kind") in ("not_implemented", "missing"):  # the skeleton: "not yet", not "wrong"
        return first, {"runs": runs}
    return {"kind": "returned", "value": encode(None)}, {"runs": runs}


def tell_witness(url: str | None, case: str) -> str | None:
    """Ask the judge's witness (`labkit/judge/witness.py`; vending's look: `checks/vending/witness.py`)
    to look at this case's store while fault() runs, and wait until it has. Returns what went
    wrong, or None."""
    if not url:
        return "no witness"
    answer = probe.see(url, case, "fault")
    return answer.get("witness_error") or answer.get("refused")


def _inside(con: sqlite3.Connection) -> dict | None:
    """What the student's own connection sees mid-transaction (its uncommitted writes)."""
    try:
        last, total = con.execute("SELECT last, total FROM checkpoint WHERE id = 1").fetchone()
        seqs = [r[0] for r in con.execute("SELECT seq FROM ledger ORDER BY seq")]
    except (sqlite3.Error, TypeError):
        return None
    return {"last": last, "total": total, "seqs": seqs}


# --- async machinery for steps 6, 7 and the final check ------------------------------------


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


def _hook(rec: Recorder, fail_at: int | None, raised: list[BaseException]) -> Callable[[int], None]:
    def before_ack(seq):
        rec.note("before_ack", seq=encode(seq), last_committed=rec.last_committed())
        if fail_at is not None and seq == fail_at:
            error = RuntimeError(f"the display failed before ACK {seq} {INJECTED}")
            raised.append(error)
            raise error

    return before_ack


async def _cancel_later(task: asyncio.Task, case: dict, rec: Recorder) -> None:
    """Cancel `task` where the case says: `cancel_after` seconds (on the loop's clock), counted
    from when the client has written its RESUME if `cancel_after_resume`."""
    if case.get("cancel_after_resume"):
        await _parked(task, rec)
    await asyncio.sleep(case["cancel_after"])
    task.cancel()


async def _parked(task: asyncio.Task, rec: Recorder, longest: float = 4.0) -> None:
    """Wait until the client has written its RESUME (it then waits for the stalled feed).

    Cancelling earlier could land while `wait_for(open_connection(...))` completes, and
    Python 3.11's wait_for then drops the cancellation: a verdict would depend on timing.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + longest
    while not task.done() and loop.time() < deadline and not any(e["kind"] == "write" for e in rec.log):
        await asyncio.sleep(0.005)


# --- step 6: consume_session --------------------------------------------------------------


def session_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """consume_session against the judge's feed (real TCP) or a scripted reader and a fake writer."""
    fn = probe.function(mod, "consume_session")
    rec = Recorder(case["db"])
    con = plain(case["db"])
    cleanup.append(con.close)
    raised: list[BaseException] = []
    before_ack = _hook(rec, case.get("hook_fails_at"), raised)
    timeout = decode(case["timeout"])
    result: dict[str, Any] = {}
    writers: list[SpyWriter] = []

    async def scenario():
        loop = asyncio.get_running_loop()
        if case["io"] == "feed":
            reader, real = await asyncio.wait_for(
                REAL_OPEN_CONNECTION(case["host"], case["port"], limit=64), 2.0)
            real.write(b"RESUME -1\n")
            await asyncio.wait_for(real.drain(), 2.0)
            writer = SpyWriter(rec, real)
        else:
            reader = scripted_reader(case)
            writer = SpyWriter(rec, None, drain=case.get("drain"), wait_closed=case.get("wait_closed"))
        writers.append(writer)
        began = loop.time()
        task, failed = await start(fn, reader, writer, con, timeout, before_ack=before_ack)
        if task is None:
            result["outcome"], error = failed, None
        else:
            if case.get("cancel_after") is not None:
                loop.create_task(_cancel_later(task, case, rec))
            result["outcome"], error = await settle(task, case["guard"])
        result["seconds"] = round(loop.time() - began, 3)
        result["closed"] = writer.really_closed
        result["same_error"] = bool(raised) and error is raised[-1]
        result["error"] = error

    run_async(scenario, virtual=case["io"] != "feed")
    cleanup.extend(w.abandon for w in writers)
    kept = [result.pop("error", None)]
    cleanup.append(kept.clear)
    outcome = result.pop("outcome", {"kind": "probe_failed", "message": "the scenario did not finish"})
    return outcome, {"log": rec.log, "con_open": probe.is_open(con),
                     "received": probe.received([timeout]), **result}


# --- step 7: run_client ---------------------------------------------------------------------


def client_case(mod, case: dict, cleanup: list) -> tuple[dict, dict]:
    """run_client against the judge's feeds, with every connection and socket watched."""
    fn = probe.function(mod, "run_client")
    rec = Recorder(case["path"])
    raised: list[BaseException] = []
    before_ack = _hook(rec, case.get("hook_fails_at"), raised)
    dials: list[dict] = []
    writers: list[SpyWriter] = []
    frames: list[int] = []
    result: dict[str, Any] = {}
    timeout = decode(case["timeout"])

    async def spy_open_connection(host=None, port=None, **kw):
        dials.append({"host": encode(host), "port": encode(port),
                      "limit": encode(kw.get("limit", "the default (64 KiB)"))})
        mode = case.get("dial", "real")
        if mode == "hang":
            await never()
        if mode == "slow":  # connects, but only `dial_delay` seconds later (a far or busy server)
            await asyncio.sleep(case["dial_delay"])
        if mode in ("fake", "slow"):
            writer = SpyWriter(rec, None, drain=case.get("drain"))
            writers.append(writer)
            reader = asyncio.StreamReader(limit=64)
            return reader, writer
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
        task, failed = await start(fn, case["host"], case["port"], case["path"], timeout, before_ack=before_ack)
        if task is None:
            result["outcome"], error = failed, None
        else:
            if case.get("cancel_after") is not None:
                loop.create_task(_cancel_later(task, case, rec))
            result["outcome"], error = await settle(task, case["guard"])
        result["seconds"] = round(loop.time() - began, 3)
        if case.get("dial") == "slow":  # a connect that outlived the call (shielded) completes meanwhile
            await asyncio.sleep(case["dial_delay"])
        result["same_error"] = bool(raised) and error is raised[-1]
        result["sockets_closed"] = [w.really_closed for w in writers]
        result["error"] = error

    for target, attr, replacement in patches:
        setattr(target, attr, replacement)
    try:
        with probe.tracked_connections() as opened:
            run_async(scenario, virtual=case.get("dial") in ("hang", "fake", "slow"))
    finally:
        for target, attr, original in saved:
            setattr(target, attr, original)
    left_open = sum(1 for c in opened if probe.is_open(c))
    kept = [result.pop("error", None)]
    cleanup.extend(w.abandon for w in writers)
    cleanup.extend(c.close for c in opened)
    cleanup.append(kept.clear)
    outcome = result.pop("outcome", {"kind": "probe_failed", "message": "the scenario did not finish"})
    return outcome, {"log": rec.log, "dials": dials, "db_opened": len(opened), "db_left_open": left_open,
                     "longest_frame": max(frames, default=0), "received": probe.received([timeout]), **result}


# --- final check: one client process, maybe killed between commit and ACK ------------------


def crash_client(mod, args: dict) -> None:
    """Run run_client once. With `kill`, before_ack(kill) reports and waits; the judge kills the sandbox."""
    kill = args.get("kill")

    def before_ack(seq):
        probe.emit({"event": "note", "kind": "before_ack", "seq": encode(seq), "t": time.time()})
        if kill is not None and seq == kill:
            probe.hold()  # no finally, no close, no ACK: the judge's SIGKILL of the sandbox ends it here

    async def scenario():
        task, failed = await start(probe.function(mod, "run_client"), args["host"], args["port"],
                                   args["db"], args["timeout"], before_ack=before_ack)
        if task is None:
            return failed
        outcome, _ = await settle(task, args["guard"])
        return outcome

    probe.started("run_client")
    probe.report("run_client", run_async(scenario, virtual=False))
