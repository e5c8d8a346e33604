"""Lab `pipeline`, the final check: real publisher and consumer processes on real servers, killed
at the worst moments — and the servers too (labs/pipeline.md, "Final check").

The scenarios run in order on one database and one stream, each building on the state the one
before left: a publisher dies after its XADD; a consumer dies between its commit and its XACK;
Valkey is SIGKILLed and restarted; PostgreSQL is stopped in immediate mode while a consumer's
transaction is open; a poison body and a deadly event. The final check starts servers of its
own (`Servers()`), since it kills them and the steps running beside it must not notice. Every
process is a judged child running the student's `pipeline.py` with the role's and the Valkey
user's credentials only; the judge decides from what it reads itself and from exit codes."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from checks.pipeline.common import call
from checks.pipeline.servers import Servers
from labkit.judge import expect, freeze, hooks
from labkit.judge.child import ChildRun, ChildSession, child_session
from labkit.judge.run import StepContext
from labkit.judge.timeline import event, rung
from labkit.judge.verdict import Case, Outcome
from labkit.servers import postgres, valkey
from labkit.values import show

GROUP = "g"
LEASE = 0.3
MAX_DELIVERIES = 2
SKUS = ("snack", "chips")


class Fail(Exception):
    def __init__(self, got: str, hint: str = "", outcome: Outcome = Outcome.WRONG) -> None:
        super().__init__(got)
        self.got, self.hint, self.outcome = got, hint, outcome


def ev(i: int | str, sku: str | None = None, qty: int | None = None) -> dict:
    n = i if isinstance(i, int) else 1
    return {"id": i if isinstance(i, str) else f"snack-{i}", "sku": sku or SKUS[n % 2], "qty": qty or n}


class Warm:
    """The scene's processes, started ahead: while the judge runs one actor (or starts or kills
    a server), the next interpreters start and import the student's module, so an actor's
    process is ready when the scenario needs it. Each still runs ONE actor and ends (or dies),
    in a process of its own; `run` gives it its ops and returns its ChildRun, `started_at` the
    moment it got them. `close` ends those not needed; run_lab's markers end them on every
    other path."""

    PROBE = "checks.pipeline.probes:script_when_asked"
    AHEAD = 2  # processes started ahead: an actor's run is shorter than a process's start

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.AHEAD, thread_name_prefix="pipeline-warm")
        self._ahead: list[Future] = []
        self._closed = False

    def _start(self) -> tuple[contextlib.ExitStack, ChildSession]:
        for attempt in (1, 2):
            stack = contextlib.ExitStack()
            try:
                session = stack.enter_context(child_session(
                    self.ctx.solution, workdir=self.ctx.workdir, timeout=self.ctx.timeout,
                    marker=self.ctx.marker(), module_name=self.ctx.lab.module_name, probe=self.PROBE))
            except BaseException:
                stack.close()
                raise
            # As run_child does: a child that ended before it reached the student's module ran
            # only the course's code (seen on a loaded machine), so it is started once more.
            if session.imported or session.run.reached_module or attempt == 2:
                return stack, session
            stack.close()
        raise AssertionError("unreachable")

    def prime(self) -> None:
        """Start the first processes now (they need no server yet: a DSN comes with the ops)."""
        with self._lock:
            while not self._closed and len(self._ahead) < self.AHEAD:
                self._ahead.append(self._pool.submit(self._start))

    def _take(self) -> Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("the scene's processes are closed")
            while len(self._ahead) < self.AHEAD + 1:
                self._ahead.append(self._pool.submit(self._start))
            return self._ahead.pop(0)

    def run(self, args: dict, timeout: float, on_note=None) -> ChildRun:
        stack, session = self._take().result()
        with stack:
            session.run.started_at = time.time()
            if session.imported:
                reply = session.call({"args": args}, timeout=timeout, on_note=on_note)
                if reply.get("event") == "reply":  # it ends by itself now: wait for its exit code
                    try:
                        session.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
        return session.run

    def close(self) -> None:
        with self._lock:
            self._closed, spares, self._ahead = True, self._ahead, []
        try:
            for spare in spares:
                try:
                    stack, _session = spare.result()
                except Exception:  # it failed to start: child_session cleaned up after it
                    continue
                stack.close()
        finally:
            self._pool.shutdown(wait=True)


class Scene:
    def __init__(self, ctx: StepContext, own: Servers, warm: Warm) -> None:
        self.ctx, self.own, self.warm = ctx, own, warm
        self.db = own.database("final", settings=False)
        self.user = own.user("final")
        self.key = self.user.prefix + "orders"
        self.accepted: list[dict] = []
        self.last_run: ChildRun | None = None  # the last process's run, for notes of what it did
        self.t0 = time.time()

    # --- the judge's looks -------------------------------------------------------------------
    def t(self, at: float | None = None) -> float:
        return round((time.time() if at is None else at) - self.t0, 3)

    def note(self, actor: str, kind: str, text: str, at: float | None = None) -> None:
        self.ctx.evidence.timeline.append(event(self.t(at), actor, kind, text))

    def fault(self, text: str) -> None:
        self.ctx.evidence.faults.append(text)

    def query(self, sql: str, params=None) -> list[tuple]:
        return self.db.look(sql, params)

    def entries(self) -> list:
        with self.own.judge_valkey() as judge:
            return judge.xrange(self.key) if judge.exists(self.key) else []

    def pel(self) -> list[tuple]:
        with self.own.judge_valkey() as judge:
            return [(p["message_id"], p["consumer"], p["times_delivered"])
                    for p in judge.xpending_range(self.key, GROUP, min="-", max="+", count=1000)]

    def dead(self) -> list:
        with self.own.judge_valkey() as judge:
            return judge.xrange(self.key + ".dead") if judge.exists(self.key + ".dead") else []

    # --- a process -----------------------------------------------------------------------------
    def process(self, actor: str, ops: list[dict], exit_code: int | None = 0, timeout: float | None = None,
                on_note=None, hook_exit: int | None = None) -> dict:
        """Run `ops` (after open_db) in a new child; its record, checked against the exit code
        the scenario expects (None: any; a hook's os._exit code, or 0 for a normal end).
        `on_note(record, session)`: what the judge does when a hook of it reports and holds.
        `hook_exit`: with exit_code None, the code that shows a death in its hook (on the timeline
        and among the faults) when the process ends with it."""
        spec = {"name": actor, "dsn": self.db.dsn(self.ctx.workdir), "valkey": self.user.kwargs,
                "ops": [call("open_db", "$dsn", keep="db"), *ops]}
        run = self.last_run = self.warm.run({"cases": [spec]}, timeout or self.ctx.timeout, on_note)
        self.note(actor, "start", "process started", run.started_at)
        record = run.cases().get(actor)
        if run.import_error is not None or not run.imported:
            got, hint, _trace = expect.import_problem(run, self.ctx.timeout)
            raise Fail(got, hint, Outcome.IMPORT_FAILED)
        for outcome in (record or {}).get("observed", {}).get("calls", []) if record else []:
            if outcome.get("kind") in ("not_implemented", "missing"):
                raise Fail(expect.describe(outcome), expect.SKELETON_HINT, Outcome.NOT_IMPLEMENTED)
        if run.timed_out:
            self.note(actor, "killed", "did not finish in time: killed by the judge", run.ended_at)
            raise Fail(f"{actor} did not finish in time", "Look for a wait without a timeout.", Outcome.TIMED_OUT)
        code = run.exit_code
        if code is not None and code != 0 and code in (exit_code, hook_exit):
            self.note(actor, "killed", f"died in its hook (os._exit({code}))", run.ended_at)
            self.fault(f"{actor} died in its hook with exit code {code}")
        else:
            self.note(actor, "exit", f"exit code {code}", run.ended_at)
        if exit_code is not None and code != exit_code:
            said = ""
            if record is not None:
                said = "; its calls: " + ", ".join(expect.describe(o) for o in record["observed"].get("calls", []))
            raise Fail(f"{actor} ended with exit code {code}, not {exit_code}{said}",
                       "The hook never ran where the scenario needs it: check the order of your calls and hooks.")
        if exit_code == 0:
            if record is None:
                raise Fail(f"{actor} reported nothing", "")
            for outcome in record["observed"].get("calls", []):
                if outcome["kind"] != "returned":
                    raise Fail(f"{actor}: {expect.describe(outcome)}", "")
        return record or {}

    @staticmethod
    def values(record: dict) -> list:
        from labkit.values import decode

        return [decode(o["value"]) if o.get("kind") == "returned" else None
                for o in record.get("observed", {}).get("calls", [])]

    # --- the scenarios -------------------------------------------------------------------------
    def publisher_dies(self) -> None:
        events = [ev(i) for i in range(1, 7)]
        self.accepted += events
        record = self.process("setup", [*(call("accept", "$db", e) for e in events),
                                        call("ensure_group", "$r", self.key, GROUP)])
        if self.values(record)[1:] != [True] * 6 + [True]:
            raise Fail(f"accept and ensure_group returned {self.values(record)[1:]}", "")
        self.ctx.evidence.ladder.append(rung("accepted in PostgreSQL", f"{len(events)} rows in outbox", "outbox"))
        self.process("publisher #1", [call("publish", "$db", "$r", "publisher-1", 1, LEASE, self.key,
                                           hooks={"after_add": {"do": "exit", "code": 75, "only": "snack-1"}})],
                     exit_code=75)
        row = self.query("SELECT claimed_by, fence, published_at IS NOT NULL FROM outbox WHERE id = 'snack-1'")
        entries = self.entries()
        if row != [("publisher-1", row[0][1], False)] or len(entries) != 1 or entries[0][1].get("id") != "snack-1":
            raise Fail(f"after publisher #1 died: row {row}, stream {show([f for _i, f in entries])}",
                       "XADD, then after_add, then save: publisher #1 died in after_add, so the row must still be "
                       "claimed by it, unpublished, with one entry in the stream.")
        first_fence = row[0][1]
        self.note("Valkey", "entry", f"{entries[0][0]}: snack-1 with fence {first_fence}")
        self.wait_expired("snack-1")
        self.note("PostgreSQL", "expired", "publisher #1's claim on snack-1 expired (database clock)")
        record = self.process("publisher #2", [call("publish", "$db", "$r", "publisher-2", 16, 5, self.key)])
        entries = self.entries()
        twice = [f for _i, f in entries if f.get("id") == "snack-1"]
        rows = self.query("SELECT id, fence, stream_id, published_at IS NOT NULL FROM outbox ORDER BY seq")
        if self.values(record)[1] != {"published": 6, "stale": 0} or len(entries) != 7 or len(twice) != 2 \
                or not int(twice[1]["fence"]) > int(twice[0]["fence"]) or not all(r[3] for r in rows):
            raise Fail(f"publisher #2 returned {show(self.values(record)[1])}; the stream holds {len(entries)} "
                       f"entries, snack-1's fences {[f.get('fence') for f in twice]}",
                       "After the lease, another publisher claims the row with a larger fence and adds it again.")
        for _i, fields in entries[1:]:
            self.note("Valkey", "entry", f"{_i}: {fields.get('id')} with fence {fields.get('fence')}")
        self.ctx.evidence.ladder += [
            rung("claimed with fence F", f"snack-1: publisher-1 with {twice[0]['fence']}, then publisher-2 with "
                 f"{twice[1]['fence']}", "outbox.fence, stream entries"),
            rung("in the stream as entry E", f"snack-1 twice: {[i for i, f in entries if f.get('id') == 'snack-1']}",
                 "XRANGE"),
            rung("published saved by the fence holder", f"snack-1: stream_id {rows[0][2]} (fence {rows[0][1]})",
                 "outbox.stream_id")]

    def consumer_dies(self) -> None:
        first = self.entries()[0][0]
        self.process("consumer A", [call("consume", "$db", "$r", self.key, GROUP, "consumer-A", 1, 0,
                                         hooks={"before_ack": {"do": "exit", "code": 76}})], exit_code=76)
        inbox = self.query("SELECT id, stream_id FROM inbox")
        pel = self.pel()
        if inbox != [("snack-1", first)] or [p[:2] for p in pel] != [(first, "consumer-A")]:
            raise Fail(f"after consumer A died before XACK: inbox {inbox}, pending {pel}",
                       "Commit, then before_ack, then XACK: A died in before_ack, so the event is applied and the "
                       "entry still pending for A.")
        self.wait_idle(first, 200)
        record = self.process("consumer B", [call("reclaim", "$r", self.key, GROUP, "consumer-B", 200, 3),
                                             call("consume", "$db", "$r", self.key, GROUP, "consumer-B", 100, 0)])
        reclaimed, consumed = self.values(record)[1:]
        if reclaimed != {"claimed": [first], "dead": 0} or consumed != {"applied": 5, "duplicate": 2, "dead": 0}:
            raise Fail(f"consumer B: reclaim returned {show(reclaimed)}, consume {show(consumed)}",
                       "B takes A's idle entry over; its consume finds snack-1 applied (a duplicate, twice: A's "
                       "entry and publisher #2's) and applies the five others.")
        self.note("consumer B", "duplicate", "consume found snack-1 applied already: 2 entries acknowledged "
                  "without effect (A's, and publisher #2's copy)", self.last_run.ended_at - 0.001)
        self.check_stock("after consumer B")
        if self.pel():
            raise Fail(f"entries still pending after B: {self.pel()}", "XACK every entry B processed.")
        self.ctx.evidence.ladder += [
            rung("delivered to consumer C (count k)", f"{first} to consumer-A, then consumer-B", "XPENDING"),
            rung("applied in the inbox", f"snack-1 once, from {first}", "inbox")]

    def valkey_killed(self) -> None:
        events = [ev(i) for i in range(7, 10)]
        self.accepted += events
        self.process("publisher #3", [*(call("accept", "$db", e) for e in events),
                                      call("publish", "$db", "$r", "publisher-3", 16, 5, self.key)])
        with self.own.judge_valkey() as judge:
            judge.xreadgroup(GROUP, "consumer-C", {self.key: ">"}, count=2)
        before_entries, before_pel = [i for i, _f in self.entries()], [p[:2] for p in self.pel()]
        valkey.kill(self.own.vk)
        self.note("Valkey", "killed", "SIGKILL by the judge")
        self.fault("Valkey killed with SIGKILL and restarted on the same data")
        # A publisher that runs while Valkey is down: its XADD is never answered, so the error
        # propagates and the row stays claimed (step 4's rule, met on a real outage).
        late = ev(11)
        self.accepted.append(late)
        record = self.process("publisher #3b", [call("accept", "$db", late),
                                                call("publish", "$db", "$r", "publisher-3b", 16, LEASE, self.key)],
                              exit_code=None)
        self.outage_publish(record, late["id"])
        valkey.restart(self.own.vk)
        self.note("Valkey", "restarted", "restarted on the same data, port and users")
        after_entries, after_pel = [i for i, _f in self.entries()], [p[:2] for p in self.pel()]
        if after_entries != before_entries or after_pel != before_pel:
            raise Fail(f"after the restart: {len(after_entries)} entries (before {len(before_entries)}), "
                       f"pending {after_pel} (before {before_pel})", "")
        self.wait_expired(late["id"])
        record = self.process("worker D", [call("publish", "$db", "$r", "publisher-D", 16, 5, self.key),
                                           call("reclaim", "$r", self.key, GROUP, "consumer-D", 0, 3),
                                           call("consume", "$db", "$r", self.key, GROUP, "consumer-D", 100, 0)])
        published, _reclaimed, consumed = self.values(record)[1:]
        if published != {"published": 1, "stale": 0}:
            raise Fail(f"worker D's publish returned {show(published)} after the restart",
                       f"{late['id']}'s claim expired while Valkey was down: the next publisher claims it and adds it.")
        if consumed != {"applied": 4, "duplicate": 0, "dead": 0} or self.pel():
            raise Fail(f"worker D's consume returned {show(consumed)}; pending {self.pel()}",
                       "After the restart, a new consumer reclaims C's entries and applies them, and the two new "
                       "ones: four in all.")
        self.check_stock("after Valkey's restart")

    def outage_publish(self, record: dict, event_id: str) -> None:
        """What publisher #3b did while Valkey was down: it must not save a row whose XADD was
        never answered, and its publish must raise the connection error."""
        rows = self.query("SELECT claimed_by, fence, published_at IS NOT NULL, stream_id FROM outbox WHERE id = %s",
                          (event_id,))
        calls = record.get("observed", {}).get("calls", [])
        outcome = calls[-1] if len(calls) == 3 else {"kind": "missing"}
        if rows and rows[0][2]:
            raise Fail(f"publisher #3b saved {event_id} as published (stream_id {rows[0][3]!r}) while Valkey was "
                       f"down: its XADD was never answered, and the stream has no such entry",
                       "A lost connection is an XADD error: let it propagate and save nothing, so the row stays "
                       "claimed until its lease expires and another publisher adds it. Saved without an entry, the "
                       "event is lost for good.")
        if outcome.get("kind") != "raised" or "ConnectionError" not in outcome.get("mro", []):
            raise Fail(f"publisher #3b's publish, with Valkey down: {expect.describe(outcome)}",
                       "An XADD error (here the connection refused) stops the batch and propagates.")
        if not rows or rows[0][0] != "publisher-3b" or not rows[0][1]:
            raise Fail(f"{event_id}'s row after the failed XADD: {rows}",
                       "Leave the row claimed: its lease expires and another publisher retries it.")

    def wait_idle(self, entry_id: str, ms: int) -> None:
        """Until the pending entry has been idle `ms` as XPENDING reports it (bounded)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.own.judge_valkey() as judge:
                found = judge.xpending_range(self.key, GROUP, min=entry_id, max=entry_id, count=1)
            if not found or found[0]["time_since_delivered"] > ms:
                return
            time.sleep(max(0.005, min(0.05, (ms - found[0]["time_since_delivered"] + 1) / 1000)))

    def wait_expired(self, event_id: str) -> None:
        """Until the row's claim has expired on the database's clock (bounded)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self.query(
                "SELECT claim_until < clock_timestamp() FROM outbox WHERE id = %s", (event_id,))[0][0]:
            time.sleep(0.02)

    def postgres_crash(self) -> None:
        event_ = ev(10)
        self.accepted.append(event_)
        self.process("publisher #4", [call("accept", "$db", event_),
                                      call("publish", "$db", "$r", "publisher-4", 16, 5, self.key)])
        entry_id = self.entries()[-1][0]
        seen: dict = {}

        def crash_while_frozen(record: dict, session) -> None:
            """Consumer E holds in before_commit: the judge stops every process of it (SIGSTOP
            from outside), checks that its transaction is open with a write in it, stops
            PostgreSQL in immediate mode and restarts it, then SIGCONTs E and lets it go on."""
            if seen:  # a second hook call: nothing more to do there
                hooks.release(session)
                return
            pids = freeze.freeze(session.proc, session.marker)
            try:
                seen["stopped"] = bool(pids) and all(freeze.stopped(p) for p in pids)
                seen["open_tx"] = bool(self.query(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND usename <> 'judge'"
                    " AND state = 'idle in transaction' AND backend_xid IS NOT NULL"))
                if not (seen["stopped"] and seen["open_tx"]):
                    return
                self.note("consumer E", "frozen", "stopped by the judge in before_commit (SIGSTOP from outside, "
                          "state T), its apply transaction open")
                postgres.stop_immediately(self.own.pg)
                self.note("PostgreSQL", "killed", "stopped in immediate mode by the judge")
                self.fault("PostgreSQL stopped in immediate mode with consumer E's transaction open "
                           "(E frozen with SIGSTOP in before_commit)")
                postgres.restart(self.own.pg)
                self.note("PostgreSQL", "restarted", "recovered from its WAL")
            finally:
                freeze.thaw(pids)
                if seen.get("open_tx"):
                    self.note("consumer E", "continued", "SIGCONT from the judge: its connection is gone")
                hooks.release(session)

        try:
            self.process("consumer E", [call("consume", "$db", "$r", self.key, GROUP, "consumer-E", 1, 0,
                                              hooks={"before_commit": {"do": "hold"}})],
                         exit_code=None, on_note=crash_while_frozen)
        except Fail as exc:
            if exc.outcome is not Outcome.WRONG:
                raise
        if not seen:
            raise Fail("consumer E never called before_commit", "Call before_commit inside the transaction, after "
                       "the inbox insert and the stock update, just before the commit.")
        if not seen.get("stopped"):
            raise Fail("the judge never saw consumer E stopped in before_commit (no process of it in state T)", "")
        if not seen.get("open_tx"):
            raise Fail("consumer E never held an open transaction with a write in before_commit",
                       "Call before_commit inside the transaction, after the inbox insert.")
        if self.query("SELECT 1 FROM inbox WHERE id = %s", (event_["id"],)):
            raise Fail("the half-done apply survived the crash", "")
        if [p[:2] for p in self.pel()] != [(entry_id, "consumer-E")]:
            raise Fail(f"after the crash the entry is pending as {self.pel()}",
                       "A failed transaction must leave the entry pending (never XACK before the commit).")
        record = self.process("consumer F", [call("reclaim", "$r", self.key, GROUP, "consumer-F", 0, 3),
                                             call("consume", "$db", "$r", self.key, GROUP, "consumer-F", 100, 0)])
        consumed = self.values(record)[2]
        if consumed != {"applied": 1, "duplicate": 0, "dead": 0} or self.pel():
            raise Fail(f"consumer F's consume returned {show(consumed)}; pending {self.pel()}",
                       "A new consumer takes the entry over and applies it once.")
        self.check_stock("after PostgreSQL's restart")

    def poison(self) -> None:
        with self.own.judge_valkey() as judge:
            junk = judge.xadd(self.key, {"id": "junk-1", "body": "not an event"})
        self.note("Valkey", "entry", f"{junk}: a body that is not an event (added by the judge)")
        deadly = ev("deadly-1", "snack", 2)
        self.accepted.append(deadly)
        self.process("publisher #5", [call("accept", "$db", deadly),
                                      call("publish", "$db", "$r", "publisher-5", 16, 5, self.key)])
        deadly_id = self.entries()[-1][0]
        deaths = 0
        for k in range(MAX_DELIVERIES + 3):
            record = self.process(f"consumer K{k}", [
                call("reclaim", "$r", self.key, GROUP, f"consumer-K{k}", 0, MAX_DELIVERIES),
                call("consume", "$db", "$r", self.key, GROUP, f"consumer-K{k}", 1, 0,
                     hooks={"before_ack": {"do": "exit", "code": 78, "only": deadly_id}})], exit_code=None,
                hook_exit=78)
            if record and record.get("outcome", {}).get("kind") == "returned":
                if not self.pel() and len(self.dead()) >= 2:
                    break
            else:
                deaths += 1
        dead = [(f.get("entry_id"), f.get("reason", "")) for _i, f in self.dead()]
        if sorted(i for i, _r in dead) != sorted([junk, deadly_id]) or not all(r for _i, r in dead) or self.pel():
            raise Fail(f"the dead-letter stream holds {show(dead)}; {deaths} consumers died on deadly-1; "
                       f"pending {self.pel()}",
                       "consume dead-letters a body that is not an event; reclaim dead-letters an entry delivered "
                       f"more than max_deliveries={MAX_DELIVERIES} times, with a reason.")
        if deaths > MAX_DELIVERIES + 1:
            raise Fail(f"{deaths} consumers died on deadly-1", "Count deliveries as XPENDING reports them.")
        self.ctx.evidence.ladder.append(rung("acknowledged (PEL empty)", "no entry pending", "XPENDING"))

    def final_state(self) -> None:
        self.check_stock("at the end")
        unpublished = self.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0]
        record = self.process("operator", [call("lag", "$db", "$r", self.key, GROUP)])
        said = self.values(record)[1]
        if unpublished or self.pel() or not isinstance(said, dict) or \
                (said.get("unpublished"), said.get("pending"), said.get("dead")) != (0, 0, 2):
            raise Fail(f"{unpublished} unpublished, pending {self.pel()}; lag said {show(said)}",
                       "lag reads both servers: nothing unpublished, nothing pending, the two dead letters.")

    def check_stock(self, when: str) -> None:
        want: dict[str, int] = {}
        applied = {row[0] for row in self.query("SELECT id FROM inbox")}
        for e in self.accepted:
            if e["id"] in applied:
                want[e["sku"]] = want.get(e["sku"], 0) + e["qty"]
        got = dict(self.query("SELECT sku, qty FROM stock"))
        if got != want:
            raise Fail(f"stock {when} is {got}, the applied events add up to {want}",
                       "Add to stock only when the inbox row is new, in the same transaction.")


SCENARIOS = [
    ("publisher #1 dies after XADD; #2 adds snack-1 again", "final.publisher-dies", "publisher_dies"),
    ("consumer A dies between commit and XACK; B reclaims", "final.consumer-dies", "consumer_dies"),
    ("Valkey is killed and restarted", "final.valkey-killed", "valkey_killed"),
    ("PostgreSQL crashes mid-transaction", "final.postgres-crash", "postgres_crash"),
    ("a poison body and a deadly event", "final.poison", "poison"),
    ("every order applied once, nothing pending, lag says so", "final.poison", "final_state"),
]


def check_final(ctx: StepContext) -> list[Case]:
    cases: list[Case] = []
    warm = Warm(ctx)
    try:
        warm.prime()  # the first processes start while the servers do
        with Servers() as own:
            _run_scenarios(Scene(ctx, own, warm), cases)
    finally:
        warm.close()
    # consumer E's process is noted when its thread ends, after what the judge did meanwhile
    ctx.evidence.timeline.sort(key=lambda e: e["t"])
    return cases


def _run_scenarios(scene: Scene, cases: list[Case]) -> None:
    stopped = None
    for name, clause, method in SCENARIOS:
        if stopped is not None:
            cases.append(Case(name, Outcome.NOT_REACHED, method, "", f"not run: {stopped} failed first",
                              clauses=(clause,)))
            continue
        try:
            getattr(scene, method)()
        except Fail as exc:
            cases.append(Case(name, exc.outcome, method.replace("_", " "), "", exc.got, exc.hint,
                              clauses=(clause,)))
            stopped = name
        else:
            cases.append(Case(name, Outcome.PASSED, method.replace("_", " "), "", clauses=(clause,)))



