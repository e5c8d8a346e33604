"""Lab `outbox`, child side: drive the student's `worker` and report what came back.

Everything here runs inside a child process with the student's module loaded, so a report
from here is evidence about return values and arguments only. Where a rule is about state
(can another connection write now, is the row marked yet, was the socket closed), the probe
asks the judge to look for itself at that moment: `see(...)` is a real HTTP request to the
judge's witness endpoint, and the judge's handler does the looking. This module imports only
what a child may see (labkit.probe, labkit.values): never the judge's side.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import time
import types

from labkit import probe
from labkit.values import decode, encode

see = probe.see  # a real HTTP request to the judge's witness; the judge looks while it waits


def plain(path: str, timeout: float = 1.0) -> sqlite3.Connection:
    """A connection made by the judge's rules, so a step does not depend on step 2."""
    return sqlite3.connect(path, isolation_level=None, timeout=timeout)


def _usable(con: sqlite3.Connection) -> bool:
    try:
        con.execute("SELECT 1").fetchall()
        return True
    except sqlite3.Error:
        return False


# --- step 1 -------------------------------------------------------------------------------


WRAPS = {"MappingProxyType": types.MappingProxyType, "UserDict": collections.UserDict}


def validating(mod, args: dict) -> None:
    """Step 1: each case is one or more calls of validate_event; every call is reported."""
    fn = probe.function(mod, "validate_event")
    for case in args["cases_spec"]:
        probe.started(case["name"])
        calls = []
        wraps = case.get("wraps") or [""] * len(case["inputs"])
        for encoded, wrap in zip(case["inputs"], wraps, strict=True):
            value = decode(encoded)
            if wrap:  # a Mapping that is not a dict: no encoding carries one, so it is made here
                value = WRAPS[wrap](value)
            before = encode(value)
            outcome, result = probe.call_keep(fn, value)
            calls.append({"input": encoded, "outcome": outcome, "received": probe.received([value]),
                          "input_changed": encode(value) != before,
                          "returned_input": outcome["kind"] == "returned" and result is value})
        first = calls[0]["outcome"] if calls else {"kind": "returned", "value": encode(None)}
        # every call's argument, one after the other: a case of several calls received all of them
        probe.report(case["name"], first, received=[r for c in calls for r in c["received"]], calls=calls)


# --- step 2 -------------------------------------------------------------------------------


def _describe_connection(con) -> dict:
    """The returned object, as far as it is a connection (a closed one answers nothing)."""
    if not isinstance(con, sqlite3.Connection):
        return {"connection": False}
    seen: dict = {"connection": True, "usable": _usable(con)}
    if not seen["usable"]:
        return seen
    try:
        seen["isolation_level"] = encode(con.isolation_level)
        seen["busy_timeout"] = probe.pragma(con, "busy_timeout")
        files = [row[2] for row in probe.plain_rows(con, "PRAGMA database_list") if row[1] == "main"]
        seen["file"] = os.path.realpath(files[0]) if files and files[0] else ""
    except sqlite3.Error as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
    return seen


def stores(mod, args: dict) -> None:
    """Step 2: open new and existing files, and files that cannot be opened as the contract's."""
    with probe.tracked_connections() as opened:
        for case in args["cases_spec"]:
            probe.started(case["name"])
            opened.clear()
            outcome, value = probe.call_keep(probe.function(mod, case["fn"]), case["path"])
            observed = {"received": probe.received([case["path"]])}
            if outcome["kind"] == "returned":
                observed.update(_describe_connection(value))
                observed["judge"] = see(args["witness"], case["name"], "after")  # while it is still open
            else:  # the judge counts the files this process still holds open (the count is a claim)
                observed["judge"] = see(args["witness"], case["name"], "raised")
                observed["left_open"] = sum(1 for c in opened if probe.is_open(c))
            for con in [value, *opened]:
                if isinstance(con, sqlite3.Connection):
                    try:
                        con.close()
                    except sqlite3.Error:
                        pass
            probe.report(case["name"], outcome, **observed)
    for case in args.get("interrupted", []):
        probe.report_interrupted(probe.function(mod, case["fn"]), case)


# --- steps 3-6 ----------------------------------------------------------------------------


def on_connection(mod, args: dict) -> None:
    """Steps 3–6: call a function on a connection to a DB the judge prepared, then let the
    judge look at the file while that connection is still open."""
    cons: dict[str, sqlite3.Connection] = {}
    try:
        for spec in args["calls"]:
            probe.started(spec["name"])
            db = spec["db"]
            if db not in cons or not _usable(cons[db]):
                cons[db] = plain(db)  # a function that closed the last one gets a fresh one
            values = [decode(a) for a in spec["args"]]
            outcome, result = probe.call_keep(probe.function(mod, spec["fn"]), cons[db], *values)
            shared = False
            if spec.get("twice") and outcome["kind"] == "returned":
                # the caller changes what it got, then calls again: the new answer must not show it
                first = result if isinstance(result, list) else []
                for item in first:
                    if isinstance(item, dict):
                        item["qty"] = -1
                outcome, result = probe.call_keep(probe.function(mod, spec["fn"]), cons[db], *values)
                seen = {id(item) for item in first}  # `first` is still alive: its ids are its own
                shared = isinstance(result, list) and any(id(item) in seen for item in result)
            still_open = _usable(cons[db])
            see(args["witness"], spec["name"], "after")
            probe.report(spec["name"], outcome, connection_open=still_open, received=probe.received(values),
                         shared=shared)
    finally:
        for con in cons.values():
            con.close()


# --- step 7 -------------------------------------------------------------------------------


class EqualsEverything:
    """A reply that says it equals True (and anything else): `== True` is not `is True`."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 1

    def __bool__(self):
        return True

    def __repr__(self):
        return "an object whose == always says True"


def _reply_value(reply: dict):
    if reply.get("special") == "equals_true":
        return EqualsEverything()
    return decode(reply.get("return", encode(True)))


def _error(mod, spec: dict) -> BaseException:
    kinds = {"OSError": OSError, "ConnectionResetError": ConnectionResetError, "TimeoutError": TimeoutError,
             "RuntimeError": RuntimeError, "KeyError": KeyError, "ValueError": ValueError}
    cls = kinds.get(spec["type"])
    if cls is None:  # the module's own DeliveryError, as send_http would raise it
        cls = getattr(mod, spec["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = type(spec["type"], (Exception,), {})
    return cls(spec["message"])


def dispatching(mod, args: dict) -> None:
    """Step 7: run dispatch with a `send` whose replies the judge scripts. Inside each send and
    each after_delivery the judge looks at the DB file itself (see checks/outbox/lab.py)."""
    dispatch = probe.function(mod, "dispatch")
    real_pending = getattr(mod, "pending", None)
    for case in args["scenarios"]:
        name = case["name"]
        probe.started(name)
        selected: list = []  # the dicts pending() returned, to tell a copy from the original
        if callable(real_pending):
            def watched_pending(*a, selected=selected, **kw):
                result = real_pending(*a, **kw)
                if isinstance(result, list):
                    selected.extend(result)
                return result

            mod.pending = watched_pending
        con = plain(case["db"])
        raised: list[BaseException] = []
        given: list = []
        misuse: list[str] = []

        def send(*call_args, name=name, case=case, raised=raised, given=given, selected=selected, misuse=misuse,
                 **kwargs):
            if len(call_args) + len(kwargs) != 1 or (kwargs and "event" not in kwargs):
                shown = [type(a).__name__ for a in call_args] + [f"{k}=..." for k in kwargs]
                misuse.append(f"send({', '.join(shown)})")
                raise TypeError("send takes one argument: the event")
            event = call_args[0] if call_args else kwargs["event"]
            not_a_copy = any(event is s for s in selected) or any(event is g for g in given)
            given.append(event)
            answer = see(args["witness"], name, "send", event=encode(event), not_a_copy=not_a_copy)
            if case.get("mutate") and isinstance(event, dict):
                event["id"] = case["mutate"]
                event["qty"] = 999
            if "raise" in answer:
                error = _error(mod, answer["raise"])
                raised.append(error)
                raise error
            if "witness_error" in answer:
                raise OSError(f"the judge's send endpoint could not be reached: {answer['witness_error']}")
            return _reply_value(answer)

        def after_delivery(event_id, name=name):
            see(args["witness"], name, "hook", event_id=encode(event_id))

        kwargs = {"after_delivery": after_delivery} if case.get("hook") else {}
        limit = decode(case["limit"])
        first = None
        try:
            outcome, error = probe.call_keep(dispatch, con, send, limit, **kwargs)
            if case.get("again"):  # the next call, in the same process: it must start afresh
                first = outcome
                outcome, error = probe.call_keep(dispatch, con, send, limit, **kwargs)
        finally:
            con.close()
            if callable(real_pending):
                mod.pending = real_pending
        same_error = bool(raised) and error is raised[-1]
        probe.report(name, outcome, same_error=same_error, send_misuse=misuse, received=probe.received([limit]),
                     first_call=first)


# --- step 8 -------------------------------------------------------------------------------


def sending(mod, args: dict) -> None:
    """Step 8: call send_http; while its exception (if any) is still alive, the judge checks
    whether the connection was closed."""
    send_http = probe.function(mod, "send_http")
    for spec in args["calls"]:
        probe.started(spec["name"])
        if spec.get("default_of"):  # the signature's default: a fact about the function itself
            probe.report(spec["name"], _default(send_http, spec["default_of"]), received=[])
            continue
        values = [decode(a) for a in spec["args"]]
        started = time.monotonic()
        outcome, kept = probe.call_keep(send_http, *values)
        seconds = time.monotonic() - started
        if spec.get("look"):
            see(args["witness"], spec["name"], "after")
        del kept
        probe.report(spec["name"], outcome, seconds=round(seconds, 3), received=probe.received(values))


def _default(fn, parameter: str) -> dict:
    import inspect  # here, not at the top: one case needs it, and it costs every child ~7 ms

    if fn is None:
        return {"kind": "missing"}
    try:
        found = inspect.signature(fn).parameters.get(parameter)
    except (TypeError, ValueError) as exc:
        return probe.describe_exception(exc)
    value = None if found is None or found.default is inspect.Parameter.empty else found.default
    return {"kind": "returned", "value": encode(value)}


# --- final check --------------------------------------------------------------------------


def crash_dispatch(mod, args: dict) -> None:
    """Final check: one publisher process. With `kill`, the after-delivery hook reports that it
    was reached and waits: the judge kills the whole sandbox from outside (`labkit.judge.hooks`)."""
    url = args["url"]

    def send(event):
        return mod.send_http(url, event, timeout=args.get("timeout", 2.0))

    def die(event_id):
        probe.emit({"event": "note", "kind": "hook", "id": encode(event_id), "t": time.time()})
        probe.hold()  # no finally, no close: the judge's SIGKILL of the sandbox ends the process here

    hook = die if args.get("kill") else None
    probe.started("dispatch")
    # open_source's own failure (the skeleton, too) is reported as this case's outcome
    outcome, source = probe.call_keep(probe.function(mod, "open_source"), args["source"])
    if outcome["kind"] == "returned":
        outcome = probe.call(probe.function(mod, "dispatch"), source, send, args.get("limit", 16),
                             after_delivery=hook)
    probe.report("dispatch", outcome)


def bad_replies(mod, args: dict) -> None:
    """Final check: dispatch against warehouses whose replies are not evidence of delivery."""
    for case in args["runs"]:
        probe.started(case["name"])
        outcome, source = probe.call_keep(probe.function(mod, "open_source"), case["source"])

        def send(event, url=case["url"]):
            return mod.send_http(url, event, timeout=2.0)

        if outcome["kind"] == "returned":
            outcome = probe.call(probe.function(mod, "dispatch"), source, send, 16)
            if isinstance(source, sqlite3.Connection):
                try:
                    source.close()
                except sqlite3.Error:
                    pass
        probe.report(case["name"], outcome)


# --- steps 3, 5, 6: another writer between statements, a fault at a statement -------------

_FAULTS = {"KeyboardInterrupt": lambda: KeyboardInterrupt(),
           "OperationalError": lambda: sqlite3.OperationalError("disk I/O error (injected by the judge)")}
AFTER_END = "KeyboardInterrupt after the transaction ended"  # the mode's name, as in interleave.py


def interleaving(mod, args: dict) -> None:
    """Steps 3, 5, 6: call one function again and again, each time on a fresh copy of the same
    file, stepping in before its k-th statement (k = 1, 2, ... until a call runs fewer than k):
    - "compete": the judge writes with its own connection there (`see(..., "between")`);
    - "hold": the judge holds the write lock from the first statement until the call ends,
      on a connection whose busy timeout is short;
    - a fault name: that statement raises the fault instead of running;
    - AFTER_END: the k-th statement that ends a transaction runs, then raises KeyboardInterrupt.
    After each call the judge looks at the file itself (`see(..., "after")`)."""
    from labkit.probe import statements

    for spec in args["runs"]:
        name, mode = spec["name"], spec["mode"]
        probe.started(name)
        fn = probe.function(mod, spec["fn"])
        values = [decode(a) for a in spec["args"]]
        runs = []
        for k, path in enumerate(spec["files"], 1):
            if mode in _FAULTS:
                con, counter = statements.faulty(path, k, _FAULTS[mode]())
            elif mode == AFTER_END:
                con, counter = statements.faulty(path, k, KeyboardInterrupt(), after_end=True)
            else:
                # the judge's writer commits HOLD s after it got in: a busy machine must not turn
                # the student's wait for it into 'database is locked'
                con = plain(path, spec.get("busy", 5.0))
                counter = statements.before_statement(
                    con, 1 if mode == "hold" else k,
                    lambda sql, k=k, name=name: see(args["witness"], name, "between", k=k, sql=sql))
            try:
                outcome = probe.call(fn, con, *values)
            except KeyboardInterrupt as exc:  # probe.call lets a BaseException through
                outcome = probe.describe_exception(exc)
            reached = counter.stop()
            still_open = _usable(con)
            if still_open:  # a connection the function closed takes no more calls
                con.set_trace_callback(None)
            see(args["witness"], name, "after", k=k)
            con.close()
            runs.append({"k": k, "outcome": outcome, "reached": reached, "sql": counter.sql,
                         "connection_open": still_open})
            if mode == "hold" or not reached or fn is None:
                break
        probe.report(name, runs[0]["outcome"], runs=runs, received=probe.received(values))
