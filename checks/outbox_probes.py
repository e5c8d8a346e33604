"""Lab `outbox`, child side: drive the student's `worker` and report what happened.

Everything here runs inside a child process with the student's module loaded. It only
calls and observes; the judge (`checks/outbox.py`) decides what is right.
"""

from __future__ import annotations

import copy
import os
import sqlite3
import time

from labkit import probe
from labkit.values import decode, encode


def plain(path: str, timeout: float = 1.0) -> sqlite3.Connection:
    """A connection made by the judge's rules, so a step does not depend on step 2."""
    return sqlite3.connect(path, isolation_level=None, timeout=timeout)


def stores(mod, args: dict) -> None:
    """Step 2: open new and existing files, and a file that is not a database."""
    with probe.tracked_connections() as opened:
        for case in args["cases_spec"]:
            probe.started(case["name"])
            opened.clear()
            outcome = probe.call(probe.function(mod, case["fn"]), case["path"])
            observed = {}
            if outcome["kind"] == "returned":
                con = opened[-1] if opened else None
                observed = _describe_connection(con)
                if con is not None:
                    con.close()
            else:
                observed["left_open"] = sum(1 for c in opened if probe.is_open(c))
            probe.report(case["name"], outcome, **observed)


def _describe_connection(con) -> dict:
    if con is None:
        return {"connection": False}
    return {
        "connection": True,
        "isolation_level": encode(con.isolation_level),
        "busy_timeout": con.execute("PRAGMA busy_timeout").fetchone()[0],
        "in_transaction": con.in_transaction,
    }


def on_connection(mod, args: dict) -> None:
    """Steps 3–6: call a function on a connection to a DB the judge prepared."""
    con = plain(args["db"])
    for spec in args["calls"]:
        probe.started(spec["name"])
        values = [decode(a) for a in spec["args"]]
        outcome = probe.call(probe.function(mod, spec["fn"]), con, *values)
        probe.report(spec["name"], outcome, in_transaction=con.in_transaction,
                     can_write=probe.other_can_write(args["db"]))
    con.close()


def _row_sent(db: str, event_id: str) -> int | None:
    other = plain(db, timeout=0.5)
    try:
        row = other.execute("SELECT sent FROM outbox WHERE id = ?", (event_id,)).fetchone()
        return row[0] if row else None
    finally:
        other.close()


def dispatching(mod, args: dict) -> None:
    """Step 7: run dispatch with scripted `send` callbacks and watch every call."""
    dispatch = probe.function(mod, "dispatch")
    for case in args["scenarios"]:
        probe.started(case["name"])
        db = case["db"]
        con = plain(db)
        seen: list[dict] = []
        hooks: list[dict] = []
        script = list(case["replies"])
        raised: list[BaseException] = []

        def send(event, script=script, seen=seen, db=db, case=case, raised=raised):
            seen.append({
                "event": encode(copy.deepcopy(event)),
                "sent_flag": _row_sent(db, event.get("id")) if isinstance(event, dict) else None,
                "can_write": probe.other_can_write(db),
            })
            reply = script.pop(0) if script else {"return": encode(True)}
            if case.get("mutate") and isinstance(event, dict):
                event["id"] = case["mutate"]
                event["qty"] = 999
            if "raise" in reply:
                error = OSError(reply["raise"])
                raised.append(error)
                raise error
            return decode(reply["return"])

        def after_delivery(event_id, hooks=hooks, db=db):
            hooks.append({"id": encode(event_id), "sent_flag": _row_sent(db, event_id)})

        kwargs = {"after_delivery": after_delivery} if case.get("hook") else {}
        try:
            outcome, error = probe.call_keep(dispatch, con, send, decode(case["limit"]), **kwargs)
        finally:
            con.close()
        same_error = bool(raised) and error is raised[-1]
        probe.report(case["name"], outcome, sends=seen, hooks=hooks, same_error=same_error)


def sending(mod, args: dict) -> None:
    """Step 8: call send_http against the judge's warehouse, with a hostile environment."""
    send_http = probe.function(mod, "send_http")
    for spec in args["calls"]:
        probe.started(spec["name"])
        values = [decode(a) for a in spec["args"]]
        outcome = probe.call(send_http, *values)
        probe.report(spec["name"], outcome)


def crash_dispatch(mod, args: dict) -> None:
    """Final check: one publisher process. `kill` makes the after-delivery hook die at once."""
    url = args["url"]

    def send(event):
        return mod.send_http(url, event, timeout=args.get("timeout", 2.0))

    def die(event_id):
        probe.emit({"event": "note", "kind": "hook", "id": event_id, "t": time.time()})
        os._exit(args["exit_code"])  # no finally, no close: the process really dies here

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
            source.close()
        probe.report(case["name"], outcome)
