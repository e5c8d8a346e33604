"""Steps 3, 5 and 6 of lab `outbox`: what happens around a transaction, statement by statement.

A function that is right whenever nobody else writes can still be wrong the moment someone
does: an id looked up before `BEGIN IMMEDIATE` and written after it, a deferred `BEGIN` that
fails at its first write, "database is locked" taken for a duplicate, a handler that catches
only `Exception`. These cases find such mistakes deterministically, by statement number, not
by timing: the child (`interleaving` in probes.py) calls the function once per
statement boundary, each time on a fresh copy of the same file, and

- "compete": just before statement k, the judge does the same work with its own connection
  (takes the write lock without waiting, writes, keeps the lock HOLD seconds, commits);
- "hold": the judge keeps the write lock for the whole call, past the short busy timeout of
  the connection the student gets;
- a fault: statement k raises a KeyboardInterrupt or an sqlite3 error instead of running;
- AFTER_END: the k-th COMMIT or ROLLBACK runs, then a KeyboardInterrupt arrives — the
  transaction is over, so a clean-up that rolls back unconditionally fails and replaces it.

After each call the judge reads the file and tries to write it itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.outbox import db
from checks.outbox.common import outcome_text, told
from labkit.judge.expect import TRANSACTION_HINT, Miss, Plan
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.judge.witness import Witness
from labkit.values import encode, show

MAX_STATEMENTS = 10  # boundaries tried per call; the contract's functions need about five
# s the competing writer keeps its lock: a BEGIN IMMEDIATE waits that out (busy timeout 1 s), and a
# deferred BEGIN's first write meets it unless the student's process sleeps longer than this in between
HOLD = 0.05
SHORT_BUSY = 0.02  # s: the busy timeout of the connection given in the "hold" case (the lock outlasts any)
KI_HINT = ("Roll back in `except BaseException:` (or `finally`), not `except Exception:`: a KeyboardInterrupt "
           "(Ctrl-C) part-way must not leave the transaction open.")
FAULT_MESSAGE = "disk I/O error (injected by the judge)"
NO_STATEMENT_HINT = "Make the plain call work first: this case faults each SQL statement the call runs."
AFTER_END = "KeyboardInterrupt after the transaction ended"  # a mode of probes.interleaving
ENDED_HINT = ("The KeyboardInterrupt came after COMMIT or ROLLBACK had run, so no transaction was open: roll back "
              "only `if con.in_transaction:`, then re-raise (a bare `raise`). An unconditional ROLLBACK raises "
              "'cannot rollback - no transaction is active', and that error replaces the one the caller must see.")


@dataclass
class Interleaved:
    """One step's interleaving cases, run in a child of their own beside the step's other cases."""

    ctx: StepContext
    fn: str
    snapshot: Callable[[Path], Any]
    plans: list[Plan] = field(default_factory=list)
    specs: list[dict] = field(default_factory=list)
    files: dict[str, list[Path]] = field(default_factory=dict)
    competitors: dict[str, Callable[[Path], db.Competing]] = field(default_factory=dict)
    holding: dict[tuple[str, int], db.Competing] = field(default_factory=dict)

    def __post_init__(self):
        self.ctx = self.ctx.apart("interleaving")  # its child runs beside the step's other one
        self.lock = threading.Lock()
        self.witness = Witness(self._look)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        k = said.get("k")
        paths = self.files.get(case, [])
        if not isinstance(k, int) or not 1 <= k <= len(paths):
            return {}, {}
        path = paths[k - 1]
        if point == "between":
            competing = self.competitors[case](path)
            with self.lock:
                self.holding[(case, k)] = competing
            return {"competitor": competing.error, "changed": competing.rows}, {}
        if point == "after":
            with self.lock:
                competing = self.holding.pop((case, k), None)
            if competing is not None:
                competing.finish()  # the judge's own writer ends before the judge looks
            return {"write": db.try_write(path), "state": self.snapshot(path)}, {}
        return {}, {}

    def add(self, label: str, mode: str, make: Callable[[Path], Path], args: list, called: str, expected: str,
            judge: Callable[[list[dict]], Miss | None], clauses: tuple[str, ...],
            compete: Callable[[Path], db.Competing] | None = None) -> None:
        """`judge(runs)`: the runs as the child reported them, each with what the judge saw
        `between` (its competing writer) and `after` (its write, the file) added."""
        count = 1 if mode == "hold" else 3 if mode == AFTER_END else MAX_STATEMENTS
        stem = f"i{len(self.specs)}"
        self.files[label] = [make(self.ctx.path(f"{stem}-{k}.db")) for k in range(1, count + 1)]
        if mode == "hold":  # the write lock, taken at the first statement, kept until the call ends
            self.competitors[label] = lambda path: db.Competing(path, [], 0, commit=False)
        elif compete is not None:
            self.competitors[label] = compete
        spec = {"name": label, "mode": mode, "fn": self.fn, "args": [encode(a) for a in args],
                "files": [str(p) for p in self.files[label]]}
        if mode == "hold":
            spec["busy"] = SHORT_BUSY
        self.specs.append(spec)

        def check(record: dict) -> Miss | None:
            runs = record["observed"].get("runs")
            if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
                return Miss("the probe reported no call", "Don't patch or replace the checker's code.")
            for run in runs:
                k = run.get("k")
                after = self.witness.sightings(label, "after")
                between = self.witness.sightings(label, "between")
                run["after"] = next((s.saw for s in after if s.said.get("k") == k), None)
                run["between"] = next((s.saw for s in between if s.said.get("k") == k), None)
            miss = judge(runs)
            if miss is not None and getattr(miss, "run", None) is not None:
                record["outcome"] = miss.run["outcome"]  # the student's traceback is that run's
            return miss

        self.plans.append(Plan(label, called, expected, check, clauses=clauses))

    def run(self) -> list[Case]:
        try:
            with self.witness:
                return self.ctx.cases("interleaving", self.plans, {"runs": self.specs, "witness": self.witness.url})
        finally:  # a child that died mid-call never asked for its "after": end the judge's writers
            with self.lock:
                left, self.holding = list(self.holding.values()), {}
            for competing in left:
                competing.finish()


class RunMiss(Miss):
    """A miss found in one run: the case shows that run's outcome and traceback."""

    def __init__(self, run: dict, got: str, hint: str = "", clause: str = ""):
        super().__init__(got, hint, clause=clause)
        self.run = run


def where(run: dict) -> str:
    sql = run.get("sql") or "?"
    return f"statement {run.get('k')} ({show(sql, 70)})"


def raised(run: dict, kind: str) -> bool:
    outcome = run.get("outcome", {})
    return outcome.get("kind") == "raised" and kind in outcome.get("mro", [])


def returned(run: dict) -> Any:
    outcome = run.get("outcome", {})
    return told(outcome["value"]) if outcome.get("kind") == "returned" else None


def left_state(run: dict, clause: str, hint: str = TRANSACTION_HINT) -> RunMiss | None:
    """The connection open and no transaction left: the judge's own write after the call."""
    if run.get("connection_open") is False:
        return RunMiss(run, "the function closed the connection it was given",
                       "The caller owns the connection: use it, but don't close it.", clause)
    after = run.get("after")
    if after is None:
        return RunMiss(run, "the judge was never asked to look after this call (the probe's request did not "
                            "arrive)", "Don't patch or replace the checker's code.", clause)
    if after.get("write"):
        return RunMiss(run, f"with a fault at {where(run)}: {outcome_text(run['outcome'], 60)}, and right "
                            f"afterwards the judge's own connection could not write: {after['write']}", hint, clause)
    return None


def fault_judge(kind: str, clauses: dict[str, str], allowed: Callable[[Any], bool]) -> Callable:
    """Every run with its fault: that same error out, the file as before (or, for a fault after
    the commit, as after a clean call), no transaction left. `clauses`: error, state, left."""

    ended = kind == AFTER_END

    def judge(runs: list[dict]) -> Miss | None:
        if not any(r.get("reached") for r in runs):  # nothing was faulted: never a pass
            if ended:
                return RunMiss(runs[0], f"the call {outcome_text(runs[0]['outcome'], 80)} without ending a "
                                        "transaction (no COMMIT or ROLLBACK ran), so no interrupt could follow one",
                               TRANSACTION_HINT, clauses["error"])
            return RunMiss(runs[0], f"the call {outcome_text(runs[0]['outcome'], 80)} before running any SQL "
                                    "statement, so no fault could be tried", NO_STATEMENT_HINT, clauses["error"])
        clean = [r for r in runs if not r.get("reached")]
        done = clean[-1]["after"].get("state") if clean and clean[-1].get("after") else None
        for run in runs:
            if not run.get("reached"):
                continue
            after = run.get("after") or {}
            if ended:
                if not raised(run, "KeyboardInterrupt"):
                    return RunMiss(run, f"a KeyboardInterrupt just after {show(run.get('sql') or '?', 40)} had ended the transaction: "
                                        f"the call {outcome_text(run['outcome'], 100)}", ENDED_HINT, clauses["error"])
            elif kind == "KeyboardInterrupt":
                if not raised(run, "KeyboardInterrupt"):
                    return RunMiss(run, f"a KeyboardInterrupt at {where(run)}: the call "
                                        f"{outcome_text(run['outcome'], 80)}",
                                   "Never swallow a KeyboardInterrupt: roll back, then re-raise it (a bare `raise`).",
                                   clauses["error"])
            elif not raised(run, kind) or FAULT_MESSAGE not in run["outcome"].get("message", ""):
                return RunMiss(run, f"sqlite3 raised OperationalError('{FAULT_MESSAGE}') at {where(run)}, and the "
                                    f"call {outcome_text(run['outcome'], 80)}",
                               "Re-raise the original error after ROLLBACK (a bare `raise`), and roll back only "
                               "`if con.in_transaction`: a ROLLBACK that fails replaces the original error.",
                               clauses["error"])
            miss = left_state(run, clauses["left"], KI_HINT if kind != "OperationalError" else TRANSACTION_HINT)
            if miss is not None:
                return miss
            state = after.get("state")
            if not allowed(state) and state != done:
                return RunMiss(run, f"a {kind} at {where(run)} left part of the work in the file",
                               "All the writes in one transaction, rolled back on any error (BaseException too).",
                               clauses["state"])
        return None

    return judge


def add_after_end(steps: Interleaved, make: Callable[[Path], Path], args: list, called: str, state: str,
                  clauses: dict[str, str], allowed: Callable[[Any], bool]) -> None:
    """The case of a KeyboardInterrupt just after each COMMIT or ROLLBACK of `steps.fn`."""
    fn = steps.fn
    steps.add(f"a KeyboardInterrupt just after each COMMIT or ROLLBACK of {fn}", AFTER_END, make, args,
              f"{called}, where a KeyboardInterrupt arrives just after {fn}'s 1st, 2nd, … COMMIT or ROLLBACK has "
              "run (a fresh file each time)",
              f"that KeyboardInterrupt out, not an error of the clean-up; {state}; no open transaction",
              fault_judge(AFTER_END, clauses, allowed), tuple(dict.fromkeys(clauses.values())))


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def compete_judge(clause: str, want: Callable[[dict], Any], right: Callable[[dict], str], what: str,
                  lookup_hint: str) -> Callable:
    """Every run with a competing writer: an answer, never an sqlite3 error; the answer the
    competitor's success calls for (`want(run)`); the file right (`right(state)` is '' or what
    is wrong); no transaction left. `what`: the competitor's work, in words."""

    def judge(runs: list[dict]) -> Miss | None:
        for run in runs:
            between = run.get("between") or {}
            wrote = run.get("reached") and between.get("competitor") == ""
            at = f"just before your {where(run)}" if run.get("reached") else "never"
            outcome = run.get("outcome", {})
            if outcome.get("kind") == "raised":
                if "locked" in outcome.get("message", "") and wrote:
                    return RunMiss(run, f"{outcome_text(outcome, 90)}, when another connection {what} {at} and "
                                        f"kept its lock {HOLD} s", DEFERRED_HINT, clause)
                return RunMiss(run, f"{outcome_text(outcome, 90)}, when another connection {what} {at}",
                               lookup_hint, clause)
            expected = want(run)
            got = returned(run)
            if outcome.get("kind") == "returned" and got is not expected:
                return RunMiss(run, f"returned {show(got, 40)}, when another connection {what} {at} "
                                    f"({'it came first' if wrote else 'it could not get the lock'}): "
                                    f"{show(expected)} was right", lookup_hint, clause)
            if outcome.get("kind") != "returned":
                return RunMiss(run, outcome_text(outcome, 90), lookup_hint, clause)
            state = (run.get("after") or {}).get("state")
            wrong = right(state) if isinstance(state, dict) else f"the judge could not read the file ({state})"
            if wrong:
                return RunMiss(run, f"when another connection {what} {at}: {wrong}", lookup_hint, clause)
            miss = left_state(run, clause)
            if miss is not None:
                return miss
        return None

    return judge


def held_judge(clause: str, unchanged: Callable[[Any], bool], fn: str) -> Callable:
    """The judge held the write lock for the whole call: sqlite3's OperationalError out, nothing
    changed, nothing left open."""

    def judge(runs: list[dict]) -> Miss | None:
        run = runs[0]
        if not run.get("reached"):
            return RunMiss(run, f"{fn} ran no SQL statement at all ({outcome_text(run['outcome'], 60)})",
                           f"{fn} works on the connection it is given.", clause)
        if not raised(run, "OperationalError") or "locked" not in run["outcome"].get("message", ""):
            return RunMiss(run, f"{outcome_text(run['outcome'], 80)}, while another connection held the write lock "
                                f"longer than the connection's busy timeout", LOCKED_HINT, clause)
        state = (run.get("after") or {}).get("state")
        if not unchanged(state):
            return RunMiss(run, "raised 'database is locked', but the file changed", LOCKED_HINT, clause)
        return left_state(run, clause)

    return judge


DEFERRED_HINT = ("Open the transaction with `BEGIN IMMEDIATE`: it waits for another writer's lock (the busy "
                 "timeout); a deferred `BEGIN` that has already read cannot wait, and fails at its first write.")
LOCKED_HINT = ("Let sqlite3's OperationalError ('database is locked') propagate, and change nothing: a lock held "
               "by another writer says nothing about this event (it is not a duplicate, not a conflict); the "
               "caller can try again later.")


def _rows(path: Path, sql: str, params: tuple) -> list | db.Broken:
    from checks.outbox import schema as stores

    return db.read(stores.rows, path, sql, params)


def accept_cases(ctx: StepContext, old: dict, new: dict) -> Interleaved:
    """accept(new) on a source holding `old`, with the same order accepted by another connection."""
    from checks.outbox import schema as stores

    body = stores.canonical(new)
    steps = Interleaved(ctx, "accept", lambda path: {
        "orders": _rows(path, "SELECT id, sku, qty FROM orders WHERE id = ?", (new["id"],)),
        "outbox": _rows(path, "SELECT body, sent FROM outbox WHERE id = ?", (new["id"],))})

    def make(path: Path) -> Path:
        return db.make_source(path, [old])

    def compete(path: Path) -> db.Competing:
        return db.Competing(path, [("INSERT INTO orders VALUES (?, ?, ?)", (new["id"], new["sku"], new["qty"])),
                                   ("INSERT INTO outbox(id, body) VALUES (?, ?)", (new["id"], body))], HOLD)

    def right(state: dict) -> str:
        if state.get("outbox") != [(body, 0)] or len(state.get("orders") or []) != 1:
            return f"the file holds {len(state.get('orders') or [])} orders row(s) and the outbox rows " \
                   f"{show(state.get('outbox'), 80)} for {new['id']}"
        return ""

    empty = {"orders": [], "outbox": []}
    lookup = ("Look the id up inside the `BEGIN IMMEDIATE` transaction that inserts: a lookup made before it (or "
              "in a statement of its own) is stale as soon as another connection writes, and the insert then "
              "hits the UNIQUE constraint.")
    called = f"accept(con, {show(new)})"
    steps.add("another connection accepts the same order at every step of accept", "compete", make, [new],
              f"{called}, while another connection accepts the same order just before accept's 1st, 2nd, … statement "
              "(a fresh file each time)", "False when the other came first, True when it had to wait; never an "
              "sqlite3 error; one order and one outbox row",
              compete_judge("3.concurrent-writer", lambda run: not (run.get("reached") and (run.get("between") or {})
                                                                    .get("competitor") == ""),
                            right, "accepted the same order", lookup),
              ("3.concurrent-writer",), compete)
    steps.add("accept while another connection holds the write lock", "hold", make, [new],
              f"{called} on a connection with a {SHORT_BUSY} s busy timeout, while another connection holds the "
              "write lock", "sqlite3.OperationalError ('database is locked'); nothing written; no open transaction",
              held_judge("3.locked-propagates", lambda state: state == empty, "accept"), ("3.locked-propagates",))
    for kind in ("KeyboardInterrupt", "OperationalError"):
        steps.add(f"{article(kind)} {kind} at every statement of accept", kind, make, [new],
                  f"{called}, where accept's 1st, 2nd, … statement raises {kind} instead of running (a fresh "
                  "file each time)", f"that {kind} out; neither row written; no open transaction",
                  fault_judge(kind, {"error": "3.original-error", "state": "3.one-transaction",
                                     "left": "3.no-transaction-left"}, lambda state: state == empty),
                  ("3.original-error", "3.one-transaction", "3.no-transaction-left"))
    add_after_end(steps, make, [new], called, "the order and its outbox row as the transaction left them",
                  {"error": "3.original-error", "state": "3.one-transaction", "left": "3.no-transaction-left"},
                  lambda state: state == empty)
    return steps


def receive_cases(ctx: StepContext, new: dict, base: int) -> Interleaved:
    """receive(new) on a sink whose stock[new's sku] is `base`, with the same event applied by
    another connection (another warehouse thread)."""
    from checks.outbox import schema as stores

    body = stores.canonical(new)
    steps = Interleaved(ctx, "receive", lambda path: {
        "inbox": _rows(path, "SELECT body FROM inbox WHERE id = ?", (new["id"],)),
        "stock": _rows(path, "SELECT qty FROM stock WHERE sku = ?", (new["sku"],))})

    def make(path: Path) -> Path:
        return db.make_sink(path, f"INSERT INTO stock VALUES ('{new['sku']}', {base});")

    def compete(path: Path) -> db.Competing:
        return db.Competing(path, [("INSERT INTO inbox VALUES (?, ?)", (new["id"], body)),
                                   ("UPDATE stock SET qty = qty + ? WHERE sku = ?", (new["qty"], new["sku"]))], HOLD)

    def right(state: dict) -> str:
        if state.get("inbox") != [(body,)] or state.get("stock") != [(base + new["qty"],)]:
            got = state.get("stock")
            return (f"stock[{new['sku']!r}] is {got[0][0] if got and isinstance(got, list) else got}, "
                    f"expected {base + new['qty']} (applied once), and the inbox holds "
                    f"{len(state.get('inbox') or [])} row(s) for {new['id']}")
        return ""

    before = {"inbox": [], "stock": [(base,)]}
    lookup = ("Look the id up in the inbox inside the `BEGIN IMMEDIATE` transaction that writes: a lookup made "
              "before it is stale as soon as another connection applies the same event.")
    called = f"receive(con, {show(new)})"
    steps.add("another connection receives the same event at every step of receive", "compete", make, [new],
              f"{called}, while another connection applies the same event just before receive's 1st, 2nd, … "
              "statement (a fresh file each time)", "False when the other came first, True when it had to wait; "
              "never an sqlite3 error; the event applied once",
              compete_judge("5.concurrent-writer", lambda run: not (run.get("reached") and (run.get("between") or {})
                                                                    .get("competitor") == ""),
                            right, "applied the same event", lookup),
              ("5.concurrent-writer",), compete)
    steps.add("receive while another connection holds the write lock", "hold", make, [new],
              f"{called} on a connection with a {SHORT_BUSY} s busy timeout, while another connection holds the "
              "write lock", "sqlite3.OperationalError ('database is locked'); nothing written; no open transaction",
              held_judge("5.locked-propagates", lambda state: state == before, "receive"), ("5.locked-propagates",))
    for kind in ("KeyboardInterrupt", "OperationalError"):
        steps.add(f"{article(kind)} {kind} at every statement of receive", kind, make, [new],
                  f"{called}, where receive's 1st, 2nd, … statement raises {kind} instead of running (a fresh "
                  "file each time)", f"that {kind} out; no inbox row, stock unchanged; no open transaction",
                  fault_judge(kind, {"error": "5.original-error", "state": "5.one-transaction",
                                     "left": "5.no-transaction-left"}, lambda state: state == before),
                  ("5.original-error", "5.one-transaction", "5.no-transaction-left"))
    add_after_end(steps, make, [new], called, "the event applied once or not at all, as the transaction left it",
                  {"error": "5.original-error", "state": "5.one-transaction", "left": "5.no-transaction-left"},
                  lambda state: state == before)
    return steps


def mark_sent_cases(ctx: StepContext, target: dict, other: dict) -> Interleaved:
    """mark_sent(target's id) on a source where it is pending, with another connection marking it."""
    steps = Interleaved(ctx, "mark_sent", lambda path: db.sent_flags(path))

    def make(path: Path) -> Path:
        return db.make_source(path, [target, other])

    def compete(path: Path) -> db.Competing:
        return db.Competing(path, [("UPDATE outbox SET sent = 1 WHERE id = ? AND sent = 0", (target["id"],))], HOLD)

    def marked_by_other(run: dict) -> bool:
        between = run.get("between") or {}
        return bool(run.get("reached")) and between.get("competitor") == "" and between.get("changed") == 1

    def right(state: dict) -> str:
        want = {target["id"]: 1, other["id"]: 0}
        return "" if state == want else f"afterwards the flags are {show(state, 80)}"

    before = {target["id"]: 0, other["id"]: 0}
    lookup = ("Read the flag and update it in one `BEGIN IMMEDIATE` transaction: a flag read before it is stale "
              "as soon as another connection marks the row, and then two callers both report that they marked it.")
    called = f"mark_sent(con, {target['id']!r})"
    steps.add("another connection marks the same row at every step of mark_sent", "compete", make,
              [target["id"]], f"{called}, while another connection marks that row just before mark_sent's 1st, 2nd, "
              "… statement (a fresh file each time)", "False when the other marked it first, True when it had to "
              "wait; never an sqlite3 error",
              compete_judge("6.concurrent-writer", lambda run: not marked_by_other(run), right,
                            "marked the row sent", lookup), ("6.concurrent-writer",), compete)
    steps.add("mark_sent while another connection holds the write lock", "hold", make, [target["id"]],
              f"{called} on a connection with a {SHORT_BUSY} s busy timeout, while another connection holds the "
              "write lock", "sqlite3.OperationalError ('database is locked'); the row still pending",
              held_judge("6.locked-propagates", lambda state: state == before, "mark_sent"), ("6.locked-propagates",))
    for kind in ("KeyboardInterrupt", "OperationalError"):
        steps.add(f"{article(kind)} {kind} at every statement of mark_sent", kind, make, [target["id"]],
                  f"{called}, where mark_sent's 1st, 2nd, … statement raises {kind} instead of running (a fresh "
                  "file each time)", f"that {kind} out; the row still pending; no open transaction",
                  fault_judge(kind, {"error": "6.no-transaction-left", "state": "6.no-transaction-left",
                                     "left": "6.no-transaction-left"}, lambda state: state == before),
                  ("6.no-transaction-left",))
    add_after_end(steps, make, [target["id"]], called, "the row as the transaction left it",
                  {"error": "6.original-error", "state": "6.no-transaction-left", "left": "6.no-transaction-left"},
                  lambda state: state == before)
    return steps
