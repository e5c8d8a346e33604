"""Lab `vending`, judge side: look at a store *while* the student's transaction waits in fault().

The `fault` callable a case hands to `apply_event`/`consume_line` is the probe's; it dials this
loopback server and blocks until the judge answers. Meanwhile the judge, in its own process and
with its own connections, tries `BEGIN IMMEDIATE` on the store (it must fail: the student's
transaction holds the write lock) and reads what is committed (it must still be the state before
the event). The child only relays "fault() was called on this store"; a student who patches the
probe's fault() produces no call here, which fails the case. (What the student's *own*
connection sees mid-transaction, the order of the ledger row, total and cursor, can only be
seen inside the child: that part stays the child's report.)

One connection is one fault() call: `FAULT <store path>\\n` in, `OK\\n` out. Paths the judge did
not register are refused, so a child cannot make the judge open other files.
"""

from __future__ import annotations

import socketserver
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from checks.vending import interference
from checks.vending.store import can_write, observe_store, snapshot
from labkit.judge.expect import Plan
from labkit.judge.run import StepContext
from labkit.judge.served import served
from labkit.judge.verdict import Case

LINE_LIMIT = 4096  # a store path under the step's temp dir, and "FAULT "
READ_SECONDS = 5.0


class FaultWitness:
    """A loopback server on an ephemeral port, in the judge's process, for one step's stores."""

    def __init__(self, stores: list[Path], look: Callable[[Path], dict]) -> None:
        self._stores = {str(p): Path(p) for p in stores}
        self._look = look
        self._calls: dict[str, list[dict]] = {}
        self._lock = threading.Lock()
        witness = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = READ_SECONDS

            def handle(self) -> None:
                try:
                    line = self.rfile.readline(LINE_LIMIT)
                except OSError:
                    return
                if not line.startswith(b"FAULT ") or not line.endswith(b"\n"):
                    return
                path = witness._stores.get(line[6:-1].decode("utf-8", "replace"))
                if path is None:
                    return
                seen = look_safely(witness._look, path)
                with witness._lock:
                    witness._calls.setdefault(str(path), []).append(seen)
                try:
                    self.wfile.write(b"OK\n")
                except OSError:
                    pass

        socketserver.ThreadingTCPServer.allow_reuse_address = False
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> list:
        host, port = self._server.server_address[:2]
        return [host, port]

    def calls(self, store: Path | str) -> list[dict]:
        """What the judge saw at each fault() call on `store`, in order."""
        with self._lock:
            return list(self._calls.get(str(store), []))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> FaultWitness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def look_safely(look: Callable[[Path], dict], path: Path) -> dict:
    try:
        return look(path)
    except Exception as exc:  # the judge's own look failed: recorded, never raised into the server
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def look_mid_transaction(path: Path) -> dict:
    """While fault() waits: is the store write-locked, and what is committed? (The judge's own
    connections; `FaultWitness` calls this.)"""
    try:
        locked = not can_write(path)
    except sqlite3.DatabaseError:
        locked = None
    return {"write_locked": locked, "outside": snapshot(path)}


def served_with_witness(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """Store calls whose fault() is watched from the judge's side while it runs."""
    with FaultWitness([Path(s["db"]) for s in specs], look_mid_transaction) as witness:
        for spec in specs:
            spec["witness"] = witness.address
        return served(ctx, "call", plans, specs, lambda pid, spec: (
            interference.observe_sweep(spec, snapshot, can_write) if spec.get("kind") == "sweep"
            else {**observe_store(pid, spec), "faults": witness.calls(spec["db"])}))
