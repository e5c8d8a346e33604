"""The child's side of the warehouse (`labkit.servers.warehouse.spawn_warehouse`).

The judge's own process listens where the publisher posts, applies the faults and keeps the
request log; for each event it must apply it sends one request on this child's private request
pipe, and this probe runs the student's `open_sink` + `receive` and answers what happened:
`{"event": "reply", "id": n, "outcome": "applied" | "duplicate" | "conflict" | "bad_request" |
"error", "error": str | None}`. The child never sees the HTTP request, the faults or the log.
The judge's first request carries no event: the answer `{"ready": true}` says both functions
are there (a missing one ends the probe with AttributeError, which the judge reports).
"""

from __future__ import annotations

import contextlib
import json
import os
from types import ModuleType

from labkit import probe

MAX_ERROR_CHARS = 500


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a student's exception whose __str__ itself raises
        text = f"{type(exc).__name__}: <unprintable>"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def apply(open_sink, receive, sink: str, event: dict) -> tuple[str, str | None]:
    """One event through the student's functions, on a connection of its own, closed after.
    No commit on receive's behalf: an uncommitted change must be lost."""
    con = None
    try:
        con = open_sink(sink)
        result = receive(con, event)
    except BaseException as exc:  # student code may raise anything, even SystemExit
        if any(cls.__name__ == "Conflict" for cls in type(exc).__mro__):
            return "conflict", _describe(exc)
        if isinstance(exc, ValueError):
            return "bad_request", _describe(exc)
        return "error", _describe(exc)
    finally:
        if con is not None:
            with contextlib.suppress(BaseException):
                con.close()
    if result is True:
        return "applied", None
    if result is False:
        return "duplicate", None
    try:
        shown = repr(result)
    except BaseException:
        shown = f"a {type(result).__name__}"
    return "error", f"receive returned {shown}, expected True or False"[:MAX_ERROR_CHARS]


def serve_receive(module: ModuleType, args: dict) -> None:
    """Answer the judge's apply requests one at a time until it closes the request pipe."""
    name = os.path.basename(getattr(module, "__file__", None) or "worker.py")
    for fn in ("receive", "open_sink"):
        if probe.function(module, fn) is None:
            raise AttributeError(f"{name} defines no function {fn!r}")
    sink = args["sink"]
    with os.fdopen(int(os.environ["LABKIT_REQUEST_FD"]), "rb", closefd=True) as requests:
        for line in requests:
            request = json.loads(line)
            if "event" not in request:
                probe.emit({"event": "reply", "id": request["id"], "ready": True})
                continue
            # Looked up per event, as the in-process warehouse would call module.receive.
            outcome, error = apply(module.open_sink, module.receive, sink, request["event"])
            probe.emit({"event": "reply", "id": request["id"], "outcome": outcome, "error": error})
