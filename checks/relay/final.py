"""Lab `relay`'s final check: two publishers, a kill and a pause; then a poison pill and a redrive.

Real processes, real 0.3 s leases, one warehouse (in the judge's process, with per-event faults
and a log of the token each request carried):

1-2. On one outbox: publisher A #1 claims snack-1 and dies in after_claim (the judge kills it there);
     publisher A #2 (A restarted) claims snack-2 and is stopped by the judge (SIGSTOP from outside) in after_claim —
     the judge sees the stop in /proc; B takes both over once the leases ran out; then the judge
     sends SIGCONT and A #2's complete must be refused by its stale token.
3-4. On a second outbox, on the judge's clock: five events, one refused for good (422), one twice
     (503); then the refusal is lifted, the quarantined row redriven and delivered.

Every case rests on the judge's own observations: the audit of every row change (recorded by
SQLite in the writer's transaction), the warehouse's request log, exit codes and /proc. The
children's reports are used for return values only (A #2's counts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay import oracle
from checks.relay.outbox import (
    TOKEN_HINT,
    audit,
    claims_in,
    event,
    make_outbox,
    name,
    row,
    rows_of,
    same_number,
    shown,
)
from labkit.judge import freeze
from labkit.judge.child import ChildRun
from labkit.judge.expect import SKELETON_HINT, Miss, describe, import_problem
from labkit.judge.hooks import KILLED_TEXT, release, run_to_hook
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode

LEASE = 0.3  # the final check's real leases, in seconds of wall-clock time
DRAIN_SECONDS = 3.0  # B stops trying after this long (a correct B needs about one lease)


@dataclass
class Scene:
    """What the final check observed, for its cases, its timeline and its ladder."""

    db: Path  # parts 1-2
    pills: Path  # parts 3-4
    ids: dict[str, str] = field(default_factory=dict)  # role → event id (parts 3-4)
    runs: dict[str, ChildRun] = field(default_factory=dict)  # "A #1", "A #2", "B", "C", "D"
    killed: set[str] = field(default_factory=set)  # runs the judge killed at their hook
    stopped_at: float | None = None  # when the judge saw A #2 in state T
    continued_at: float | None = None
    after_death: dict | None = None  # snack-1's row right after A #1 died
    after_b: dict | None = None  # snack-2's row before A #2 was woken
    requests: list[dict] = field(default_factory=list)  # POSTs the warehouse saw
    entries: list[dict] = field(default_factory=list)  # the audit of both files, in time order
    rows: dict[str, dict] = field(default_factory=dict)  # event id → its final row
    seq: dict[str, int] = field(default_factory=dict)  # event id → seq (in its file)
    policy: dict = field(default_factory=dict)
    start: float = 0.0  # the judge's clock for parts 3-4
    b_first_now: float = 0.0  # the `now` of B's first round, inside A's lease
    notes: list[dict] = field(default_factory=list)


COUNTER_START = 100  # the pills' outbox: fence_counter.last before any claim


def check_final(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import refused, start_warehouse, unavailable

    rng = ctx.rng
    scene = Scene(ctx.path("outbox.db"), ctx.path("pills.db"))
    pills = [event(name(rng, "pill"), "snack", rng.randint(1, 1000)) for _ in range(5)]
    # Fixed places: the refused event second, the flaky one fourth, plain events around them. The
    # events behind each show the price of quarantine and retries, and a wrong publisher meets
    # the same situation under every seed.
    refused_at, flaky_at = 1, 3
    scene.ids = {"refused": pills[refused_at]["id"], "flaky": pills[flaky_at]["id"]}
    scene.ids.update({f"plain{k}": e["id"] for k, e in enumerate(
        e for i, e in enumerate(pills) if i not in (refused_at, flaky_at))})
    reason = f"sku {name(rng, 'old', 3)} is discontinued"
    scene.policy = {"base": rng.choice((0.5, 1.0, 2.0)), "cap": 30.0, "max_attempts": 5,
                    "seed": rng.randrange(2**31)}
    make_outbox(scene.db, [row("snack-1", qty=1), row("snack-2", qty=2)])
    make_outbox(scene.pills, [row(e["id"], qty=e["qty"]) for e in pills], counter=COUNTER_START)  # tokens 101, ...
    wh = start_warehouse(ctx.path("warehouse.jsonl"),
                         event_faults={scene.ids["refused"]: refused(reason), scene.ids["flaky"]: unavailable(2)},
                         on_request=lambda: _audit_marks(scene))
    try:
        common = {"url": wh.url, "lease": LEASE, **scene.policy}
        _two_publishers(ctx, scene, {**common, "db": str(scene.db)})
        scene.start = float(int(time.time())) + 1000.0  # the judge's clock, ahead of the wall clock
        scene.runs["C"] = ctx.child("poison", {**common, "db": str(scene.pills), "owner": "C", "start": scene.start,
                                               "limit": 16, "rounds": 6, "cases": ["relay"]})
        if not scene.runs["C"].timed_out:  # a publisher that hangs costs its time limit once, not twice
            wh.lift(scene.ids["refused"])  # the cause is fixed
            scene.notes.append({"t": time.time(), "actor": "warehouse", "kind": "note",
                                "text": f"the refusal of {scene.ids['refused']} is lifted (cause fixed)"})
            scene.runs["D"] = ctx.child("redriving", {**common, "db": str(scene.pills), "owner": "D",
                                                      "ids": [scene.ids["refused"]], "now": scene.start + 100.0,
                                                      "limit": 16, "cases": ["redrive"]})
        scene.requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    scene.entries = sorted([{**e, "file": "outbox"} for e in audit(scene.db)]
                           + [{**e, "file": "pills"} for e in audit(scene.pills)], key=lambda e: e["t"])
    for path in (scene.db, scene.pills):
        for seq, r in rows_of(path).items():
            scene.rows[r["id"]], scene.seq[r["id"]] = r, seq
    cases = _publisher_cases(ctx, scene) + _pill_cases(ctx, scene, reason)
    _timeline(ctx, scene)
    _ladder(ctx, scene)
    return cases


def _audit_marks(scene: Scene) -> dict[str, int]:
    """How far each outbox's audit had got (its last `n`), read by the judge as a POST arrives:
    every later entry was written after that POST arrived. The timeline's order rests on this,
    not on comparing the warehouse's clock with the audit's (whole milliseconds)."""
    return {label: int(stores.rows(path, "SELECT coalesce(max(n), 0) FROM judge_audit")[0][0])
            for label, path in (("outbox", scene.db), ("pills", scene.pills))}


def _two_publishers(ctx: StepContext, scene: Scene, common: dict) -> None:
    """A #1 is killed right after its claim; A #2 is frozen right after its own; B takes both over.

    Both from outside: each after_claim reports the claim and waits; on that report the judge
    SIGKILLs A #1's whole sandbox, and SIGSTOPs every process of A #2's (`labkit.judge.freeze`),
    runs B, then SIGCONTs A #2 and lets its after_claim return."""
    # The judge chooses the `now` of the first calls (A's claims, B's first round) on the wall
    # clock it reads here, so they happen inside the leases whatever the machine's load; from
    # then on the leases run out in real time.
    t1 = time.time()
    claimed = lambda r: r.get("kind") == "claimed"  # noqa: E731
    run, hook = run_to_hook(ctx.solution, f"{ctx.lab.probes}:publisher",
                            {**common, "owner": "A", "mode": "die", "limit": 1, "nows": [t1], "cases": ["relay"]},
                            workdir=ctx.workdir, timeout=ctx.timeout, marker=ctx.marker(),
                            module_name=ctx.lab.module_name, at_hook=claimed)
    scene.runs["A #1"] = run
    if hook is not None:
        scene.killed.add("A #1")
    scene.after_death = rows_of(scene.db).get(1)
    if run.timed_out:
        return  # it hangs: the others would too, each for its full time limit
    first = [e for e in claims_in(audit(scene.db)) if e["id"] == "snack-1"]
    a_ends = first[0]["lease_until"] if first else t1 + LEASE
    scene.b_first_now = a_ends - LEASE / 3  # shortly before A's lease ends: B must take nothing yet
    marker = ctx.marker()

    def paused(record: dict, session) -> str:
        if "B" in scene.runs:  # a second after_claim: nothing more to do there
            release(session)
            return "continue"
        pids = freeze.freeze(session.proc, marker)
        if pids and all(freeze.stopped(p) for p in pids):
            scene.stopped_at = time.time()
        try:
            # B's first round is at a moment inside both leases (the judge's clock): it must take
            # nothing; then it claims on the wall clock until both rows are settled.
            scene.runs["B"] = ctx.child("publisher", {**common, "owner": "B", "mode": "drain", "limit": 16,
                                                      "nows": [scene.b_first_now], "until": ["snack-1", "snack-2"],
                                                      "seconds": DRAIN_SECONDS, "cases": ["relay"]})
            scene.after_b = rows_of(scene.db).get(2)
        finally:
            if pids:
                scene.continued_at = time.time()  # stamped before the signal: nothing it wakes can precede it
                freeze.thaw(pids)
            release(session)
        return "continue"

    scene.runs["A #2"], _ = run_to_hook(
        ctx.solution, f"{ctx.lab.probes}:publisher",
        {**common, "owner": "A", "mode": "pause", "limit": 1, "nows": [t1 + 0.01], "cases": ["relay"]},
        workdir=ctx.workdir, timeout=ctx.timeout, marker=marker, module_name=ctx.lab.module_name,
        at_hook=claimed, on_hook=paused)


# --- what the runs returned (evidence about return values only) --------------------------------


def _report(run: ChildRun | None, case: str) -> dict | None:
    return None if run is None else run.cases().get(case)


def _rounds(run: ChildRun | None) -> list:
    """What each relay_once call of a publisher returned (or how it failed)."""
    record = _report(run, "relay")
    if record is None:
        return []
    return [decode(r["outcome"]["value"]) if r["outcome"]["kind"] == "returned" else describe(r["outcome"])
            for r in record["observed"].get("rounds", [])]


def _problem(run: ChildRun | None, label: str, timeout: float, case: str = "relay") -> Miss | None:
    """Why a publisher process did not run its calls to the end (None: it did)."""
    if run is None:
        return Miss(f"publisher {label} was never started", outcome=Outcome.NOT_REACHED)
    if not run.imported:
        got, hint, _ = import_problem(run, timeout)
        return Miss(got, hint, Outcome.IMPORT_FAILED)
    record = run.cases().get(case)
    if record is None:
        if run.timed_out:
            return Miss(f"publisher {label} did not finish in time and was killed", "Look for a wait without a "
                                                                                     "timeout.", Outcome.TIMED_OUT)
        return Miss(f"publisher {label} ended with exit code {run.exit_code} before its calls returned",
                    "Something ended the interpreter (os._exit, a crash).", Outcome.DIED)
    outcomes = [record["outcome"]] + [r["outcome"] for r in record["observed"].get("rounds", [])]
    for outcome in outcomes:
        if outcome.get("kind") == "not_implemented":
            return Miss(f"publisher {label}: {describe(outcome)}", SKELETON_HINT, Outcome.NOT_IMPLEMENTED)
        if outcome.get("kind") == "missing":
            return Miss(f"publisher {label}: {describe(outcome)}", "Run every step's cell.", Outcome.MISSING)
    if record["outcome"].get("kind") == "raised":
        return Miss(f"publisher {label}: {describe(record['outcome'])}", "It must not raise here: see the steps' "
                                                                         "own checks.", Outcome.RAISED)
    return None


def _requests_for(scene: Scene, event_id: str) -> list[dict]:
    return [r for r in scene.requests if r.get("id") == event_id]


def _claims_of(scene: Scene, event_id: str) -> list[dict]:
    return [e for e in claims_in(scene.entries) if e["id"] == event_id]


def _token(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _case(label: str, called: str, expected: str, clause: str, miss: Miss | None) -> Case:
    case = Case(label, Outcome.PASSED, called, expected, clauses=(clause,))
    if miss is not None:
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
    return case


# --- parts 1-2: the dead owner and the paused owner ---------------------------------------------


def _publisher_cases(ctx: StepContext, scene: Scene) -> list[Case]:
    a1, a2, b = scene.runs.get("A #1"), scene.runs.get("A #2"), scene.runs.get("B")
    s1, s2 = _claims_of(scene, "snack-1"), _claims_of(scene, "snack-2")
    return [
        _case("A dies right after claiming snack-1",
              "relay_once(con, 'A', send, now, 0.3, 1, policy, after_claim=hook) where the judge kills the "
              "process in the hook", f"{KILLED_TEXT}; snack-1 leased by A; nothing sent",
              "final.dead-owner", _dead_owner(ctx, scene, a1, s1)),
        _case("B does not take snack-1 while A's lease is live",
              "relay_once(con, 'B', …) in a new process: first at a now shortly before A's lease ends, then every "
              "20 ms on the wall clock",
              "no claim of snack-1 before A's lease_until", "final.lease-respected", _lease_respected(ctx, s1, b)),
        _case("B takes snack-1 over with a larger token and delivers it once", "the same B process",
              "snack-1 claimed by B with a larger token; one POST with that token, applied; sent under it",
              "final.takeover", _takeover(ctx, scene, s1, b)),
        _case("A, restarted, is frozen right after claiming snack-2; B takes it over",
              "relay_once(con, 'A', …) where the judge stops every process of A in after_claim (SIGSTOP); B as "
              "above; then SIGCONT",
              "the judge sees A stopped before it sent anything; B claims snack-2 after A's lease, with a larger "
              "token, and completes it", "final.paused-owner", _paused_owner(ctx, scene, a2, b, s2)),
        _case("the woken A is refused by its stale token", "SIGCONT: A sends snack-2, then calls complete",
              "the warehouse sees a duplicate; complete raises StaleLease; the row stays sent under B's token; A's "
              "counts say stale 1", "final.stale-complete", _stale_complete(ctx, scene, a2, b, s2)),
    ]


def _dead_owner(ctx: StepContext, scene: Scene, a1: ChildRun | None, s1: list[dict]) -> Miss | None:
    hooked = a1 is not None and any(n.get("kind") == "claimed" for n in a1.messages())
    if a1 is not None and "A #1" in scene.killed:
        sent_by_a = [r for r in _requests_for(scene, "snack-1") if r.get("t_start", 0) <= a1.ended_at]
        if sent_by_a:
            return Miss("the warehouse got snack-1 from A before A died", "Call after_claim(seq) right after the "
                                                                           "claim, before send(event).")
        if not s1 or s1[0]["owner"] != "A" or (scene.after_death or {}).get("state") != "leased":
            return Miss(f"after A died the judge read snack-1 as {shown(scene.after_death)}",
                        "claim commits the lease before relay_once calls after_claim.")
        ctx.evidence.faults.append(f"publisher A {KILLED_TEXT} in after_claim; snack-1 left leased by A with "
                                   f"token {s1[0]['fence']}")
        return None
    problem = _problem(a1, "A", ctx.timeout)
    if problem is not None and problem.outcome is not Outcome.DIED:
        return problem
    return Miss(f"publisher A ended with exit code {None if a1 is None else a1.exit_code}"
                + ("" if hooked else ": after_claim was never called"),
                "Call after_claim(seq) for each claimed row, right after the claim committed and before send.")


def _lease_respected(ctx: StepContext, s1: list[dict], b: ChildRun | None) -> Miss | None:
    if not s1 or s1[0]["owner"] != "A":
        return Miss("not checked: A never held snack-1", outcome=Outcome.NOT_REACHED)
    if b is None:
        return Miss("not checked: B never ran", outcome=Outcome.NOT_REACHED)
    live_until = s1[0]["lease_until"]
    first_round = _rounds(b)[:1]
    if first_round and first_round[0] != {"sent": 0, "retry": 0, "quarantined": 0, "stale": 0}:
        return Miss(f"B's relay_once at now = {b_first_now(ctx, b):.3f} returned {first_round[0]}, while A's lease "
                    f"on snack-1 ran until {live_until:.3f} (and the restarted A's on snack-2 a little longer)",
                    "A live lease (lease_until > now) is never taken: claim with the `now` relay_once was given, "
                    "and only rows whose lease_until <= now.")
    # Early by the wall clock (the audit's time of the write, to the millisecond), or by the `now`
    # the claim was made at (lease_until - lease).
    early = [c for c in s1[1:] if c["t"] < live_until - 0.002 or c["lease_until"] - LEASE < live_until - 1e-9]
    if early:
        c = early[0]
        return Miss(f"{c['owner']} claimed snack-1 at now = {c['lease_until'] - LEASE:.3f}, while A's lease ran until "
                    f"{live_until:.3f}", "A live lease (lease_until > now) is never taken: claim with the `now` "
                                         "relay_once was given, and only rows whose lease_until <= now.")
    return None


def b_first_now(ctx: StepContext, b: ChildRun | None) -> float:
    record = _report(b, "relay")
    rounds = record["observed"].get("rounds", []) if record else []
    return rounds[0]["now"] if rounds else float("nan")


def _takeover(ctx: StepContext, scene: Scene, s1: list[dict], b: ChildRun | None) -> Miss | None:
    if not s1 or s1[0]["owner"] != "A":
        return Miss("not checked: A never held snack-1", outcome=Outcome.NOT_REACHED)
    problem = _problem(b, "B", ctx.timeout)
    if problem is not None:
        return problem
    if len(s1) < 2:
        return Miss(f"snack-1 was never claimed again after A died (B's rounds returned {_rounds(b)[:3]}…)",
                    "A leased row whose lease_until <= now is claimed again: its owner is presumed dead. "
                    "Otherwise a dead owner's row is stuck forever.")
    takeover = s1[1]
    if takeover["owner"] != "B" or takeover["fence"] <= s1[0]["fence"]:
        return Miss(f"snack-1's second claim: owner {takeover['owner']!r}, token {takeover['fence']} (A had "
                    f"{s1[0]['fence']})", "A claim writes the new owner and a new, larger token from fence_counter.")
    got = [(_token(r.get("token")), r.get("outcome")) for r in _requests_for(scene, "snack-1")]
    if got != [(takeover["fence"], "applied")]:
        return Miss(f"the warehouse saw snack-1 as (token, outcome) {got}", "B sends snack-1 once and completes it.")
    final = scene.rows["snack-1"]
    if final["state"] != "sent" or final["fence"] != takeover["fence"]:
        return Miss(f"snack-1 ended {shown(final)}", "complete after the ACK, with the token of the claim.")
    return None


def _paused_owner(ctx: StepContext, scene: Scene, a2: ChildRun | None, b: ChildRun | None,
                  s2: list[dict]) -> Miss | None:
    if scene.stopped_at is None:
        problem = _problem(a2, "A (restarted)", ctx.timeout)
        if problem is not None and problem.outcome is not Outcome.DIED:
            return problem
        return Miss("the judge never saw the restarted A stopped (no process of it in state T)",
                    "Call after_claim(seq) right after the claim: that is where the judge stops it.")
    if not s2 or s2[0]["owner"] != "A":
        return Miss(f"the restarted A did not claim snack-2 first (claims: {[(c['owner'], c['fence']) for c in s2]})",
                    "claim takes the first due rows in seq order: snack-1 was still leased by the dead A.")
    early = [r for r in _requests_for(scene, "snack-2") if r.get("t_start", 0) <= scene.stopped_at]
    if early:
        return Miss("the warehouse got snack-2 from A before A was stopped", "Call after_claim(seq) right after the "
                                                                             "claim, before send(event).")
    problem = _problem(b, "B", ctx.timeout)
    if problem is not None:
        return problem
    if len(s2) < 2 or s2[1]["owner"] != "B" or s2[1]["fence"] <= s2[0]["fence"] or \
            (scene.after_b or {}).get("state") != "sent":
        return Miss(f"while A was stopped snack-2 went from A's claim (token {s2[0]['fence']}) to "
                    f"{shown(scene.after_b)}", "Once A's lease has run out, B claims snack-2 with a larger token "
                                               "and completes it.")
    if s2[1]["t"] < s2[0]["lease_until"] - 0.005:
        return Miss(f"B claimed snack-2 at {s2[1]['t']:.3f}, before A's lease ended at {s2[0]['lease_until']:.3f}",
                    "A live lease is never taken.")
    ctx.evidence.faults.append("the restarted A stopped by the judge (SIGSTOP from outside) in after_claim — state T "
                               "observed in /proc; "
                               "SIGCONT only after B completed snack-2")
    return None


def _stale_complete(ctx: StepContext, scene: Scene, a2: ChildRun | None, b: ChildRun | None,
                    s2: list[dict]) -> Miss | None:
    if scene.stopped_at is None or len(s2) < 2 or b is None:
        return Miss("not checked: A was not frozen holding snack-2 while B took it over",
                    outcome=Outcome.NOT_REACHED)
    problem = _problem(a2, "A (restarted)", ctx.timeout)
    if problem is not None:
        return problem
    got = [(_token(r.get("token")), r.get("outcome")) for r in _requests_for(scene, "snack-2")]
    want = [(s2[1]["fence"], "applied"), (s2[0]["fence"], "duplicate")]
    if got != want:
        return Miss(f"the warehouse saw snack-2 as (token, outcome) {got}",
                    f"After SIGCONT, A goes on where it stopped: it sends snack-2 (with its old token "
                    f"{s2[0]['fence']}), and the warehouse recognises the duplicate.")
    final = scene.rows["snack-2"]
    if final["state"] != "sent" or final["fence"] != s2[1]["fence"]:
        return Miss(f"snack-2 ended {shown(final)}", "A's complete must raise StaleLease and change nothing: the row "
                                                     "stays sent under B's token. " + TOKEN_HINT)
    counts = _rounds(a2)
    if not counts or counts[-1] != {"sent": 0, "retry": 0, "quarantined": 0, "stale": 1}:
        return Miss(f"A's relay_once returned {counts[-1] if counts else None}",
                    "complete raised StaleLease: count the row as 'stale' (not 'sent'), and never retry it.")
    ctx.evidence.faults.append(f"snack-2 delivered twice (token {s2[1]['fence']}, then the stale token "
                               f"{s2[0]['fence']}) — the warehouse recognised the duplicate; A's complete got "
                               "StaleLease")
    return None


# --- parts 3-4: the poison pill and the redrive, on the judge's clock ----------------------------


def _pill_cases(ctx: StepContext, scene: Scene, reason: str) -> list[Case]:
    ids = scene.ids
    c_problem = _problem(scene.runs.get("C"), "C", ctx.timeout)
    return [
        _case("the refused event is quarantined on its first attempt",
              f"relay_once(con, 'C', send, now, …) where the warehouse answers 422 for {ids['refused']}",
              "one request, 422; quarantined after one attempt with last_error 'PermanentError: 422 …'",
              "final.poison-quarantined", c_problem or _quarantined(scene, reason)),
        _case("the flaky event is retried with growing, jittered waits",
              f"relay_once(...) again at each due time of {ids['flaky']} (the judge's clock)",
              "503, 503, then applied; due = now + backoff(1), then + backoff(2), from the seeded rng",
              "final.transient-retried", c_problem or _retried(ctx, scene)),
        _case("the other three are delivered at once", "the first relay_once(con, 'C', ...)",
              f"{', '.join(v for k, v in ids.items() if k.startswith('plain'))} delivered by the first call",
              "final.no-head-of-line", c_problem or _at_once(scene)),
        _case("after the refusal is lifted, the refused event is redriven and delivered",
              f"redrive(con, [{ids['refused']!r}], now) and relay_once(con, 'D', …) in a new process",
              "1; pending with attempts 0, last_error kept; then delivered, applied, with a token past every "
              "earlier one", "final.redrive", _redriven(ctx, scene) or _tokens_continue(scene)),
        _case("every event applied exactly once, none lost, attempts as expected",
              "the judge reads both outboxes and the warehouse's log",
              "7 events applied once each and sent; attempts 2 for snack-1 and snack-2, 3 for the flaky one, 1 for "
              "the others (the redriven one counts from its redrive)", "final.applied-once",
              _unwritten(ctx, scene) or _once(scene)),
    ]


def _tokens_continue(scene: Scene) -> Miss | None:
    """The pills' outbox started with fence_counter.last = COUNTER_START: every claim on it, by
    C and then by D in a new process (which opened the file again), took a larger token."""
    fences = [e["fence"] for e in claims_in([e for e in scene.entries if e["file"] == "pills"])]
    floor = COUNTER_START
    for fence in fences:
        if fence <= floor:
            return Miss(f"the file's fence_counter.last was {COUNTER_START} before any claim, yet the claims took "
                        f"tokens {fences}", "Take each token from fence_counter (last + 1, stored back), and never "
                        "reset or recompute the counter when the file is opened: tokens grow across every claim ever "
                        "made on the file, across reopenings too.")
        floor = fence
    return None


def _unwritten(ctx: StepContext, scene: Scene) -> Miss | None:
    """A publisher still running the skeleton (or missing a function) delivers nothing: the whole
    run cannot be judged yet, and its own case already says which step is missing."""
    for label, run in scene.runs.items():
        problem = _problem(run, label, ctx.timeout, "redrive" if label == "D" else "relay")
        if problem is not None and problem.outcome in (Outcome.NOT_IMPLEMENTED, Outcome.MISSING):
            return Miss(f"not checked: {problem.got}", outcome=Outcome.NOT_REACHED)
    return None


def _quarantined(scene: Scene, reason: str) -> Miss | None:
    refused = scene.ids["refused"]
    entries = [e for e in scene.entries if e["id"] == refused]
    first_end = next((e for e in entries if e["state"] != "leased"), None)
    before_lift = [r for r in _requests_for(scene, refused) if r.get("response") == "422"]
    want = oracle.last_error("PermanentError", f"422 for {refused}: {reason}")
    if first_end is None or first_end["state"] != "quarantined" or first_end["attempts"] != 1:
        return Miss(f"after its first attempt {refused} was {shown(first_end) if first_end else 'never claimed'}",
                    "A PermanentError is quarantined at once: retrying a refusal that cannot change only delays "
                    "the operator's alarm.")
    if len(before_lift) != 1:
        return Miss(f"the warehouse refused {refused} {len(before_lift)} times",
                    "Send a refused event once: a PermanentError is not retried, not even in place.")
    if first_end["last_error"] != want:
        return Miss(f"its last_error is {first_end['last_error']!r}", f"Store the error itself: {want!r}.")
    return None


def _retried(ctx: StepContext, scene: Scene) -> Miss | None:
    flaky, policy = scene.ids["flaky"], scene.policy
    entries = [e for e in scene.entries if e["id"] == flaky]
    claims = [e for e in entries if e["state"] == "leased"]
    fails = [e for e in entries if e["state"] == "pending"]
    answers = [r.get("response") for r in _requests_for(scene, flaky)]
    waits = oracle.draws(policy["seed"], [(1, policy["base"], policy["cap"]), (2, policy["base"], policy["cap"])])
    claimed_at = [c["lease_until"] - LEASE for c in claims]
    if answers != ["503", "503", "ack"] or len(claims) != 3:
        return Miss(f"the warehouse answered {answers} over {len(claims)} claims of {flaky}",
                    "A transient failure goes back to pending with a due time; the next relay_once at that time "
                    "claims it again: pass relay_once's own `now` to claim and fail, never time.time().")
    if len(fails) < 2 or not all(same_number(f["due"], n + w) for f, n, w in zip(fails, claimed_at, waits,
                                                                               strict=False)):
        got = [f"{f['due'] - n:.4g}" for f, n in zip(fails, claimed_at, strict=False)]
        return Miss(f"its waits were {got} s; Random({policy['seed']}) gives {[f'{w:.4g}' for w in waits]} (ceilings "
                    f"{policy['base']:g} and {2 * policy['base']:g} s)",
                    "fail: due = now + backoff(attempts, base, cap, rng), with the policy's rng, drawing only for a "
                    "retry.")
    final = scene.rows[flaky]
    if final["state"] != "sent" or final["attempts"] != 3:
        return Miss(f"it ended {shown(final)}", "The third attempt succeeds: complete it.")
    ctx.evidence.faults.append(f"the warehouse answered 503 twice for {flaky}: retried after "
                               f"{', '.join(f'{w:.3g} s' for w in waits)} (ceilings {policy['base']:g}, "
                               f"{2 * policy['base']:g} s, judge's clock); delivered on attempt 3")
    return None


def _at_once(scene: Scene) -> Miss | None:
    """The other three were claimed once, in the same claim as the refused event (one claim
    gives every row it takes the same lease_until), and applied before the flaky one was tried
    again: nobody waited for a poison row."""
    flaky, refused = scene.ids["flaky"], scene.ids["refused"]
    first = _claims_of(scene, refused)[:1]
    batch = first[0]["lease_until"] if first else None
    flaky_requests = _requests_for(scene, flaky)
    retried_at = flaky_requests[1]["t_start"] if len(flaky_requests) > 1 else float("inf")
    hint = (f"A failure does not stop the batch: after {refused} (refused) and {flaky} (unavailable), the rows "
            "behind them go on in the same call.")
    for key, event_id in scene.ids.items():
        if not key.startswith("plain"):
            continue
        claims = _claims_of(scene, event_id)
        applied = [r for r in _requests_for(scene, event_id) if r.get("outcome") == "applied"]
        if len(claims) != 1 or batch is None or not same_number(claims[0]["lease_until"], batch):
            return Miss(f"{event_id} was claimed {len(claims)} times"
                        + ("" if len(claims) != 1 else ", not in the same claim as the refused event"), hint)
        if len(applied) != 1 or applied[0]["t_start"] > retried_at:
            return Miss(f"{event_id} was {'applied only after ' + flaky + ' was retried' if applied else 'not applied'}",
                        hint)
    return None


def _redriven(ctx: StepContext, scene: Scene) -> Miss | None:
    d = scene.runs.get("D")
    record = _report(d, "redrive")
    if record is None or record["outcome"]["kind"] != "returned":
        return _problem(d, "D", ctx.timeout, "redrive") or Miss(f"redrive {describe(record['outcome'])}", "")
    if decode(record["outcome"]["value"]) != 1:
        return Miss(f"redrive returned {decode(record['outcome']['value'])!r}", "redrive returns how many rows it "
                                                                                "moved.")
    refused = scene.ids["refused"]
    back = next((e for e in scene.entries if e["id"] == refused and e["state"] == "pending"), None)
    if back is None or back["attempts"] != 0 or not back["last_error"]:
        return Miss(f"after redrive the row was {shown(back) if back else 'never back to pending'}",
                    "Back to pending with attempts 0 and due = now, last_error kept, committed.")
    answers = [r.get("response") for r in _requests_for(scene, refused)]
    final = scene.rows[refused]
    if answers[-1:] != ["ack"] or final["state"] != "sent":
        return Miss(f"the warehouse answered {answers}; the row ended {shown(final)}",
                    "After the redrive, the next relay_once delivers it.")
    return None


def _once(scene: Scene) -> Miss | None:
    everything = list(scene.rows)
    applied = {i: sum(1 for r in _requests_for(scene, i) if r.get("outcome") == "applied") for i in everything}
    if any(n != 1 for n in applied.values()):
        return Miss(f"applied per event: {applied}", "Every event must reach the warehouse and be applied once.")
    states = {i: scene.rows[i]["state"] for i in everything}
    if set(states.values()) != {"sent"}:
        return Miss(f"final states {states}", "Every event ends sent.")
    attempts = {i: scene.rows[i]["attempts"] for i in everything}
    want = {**{i: 1 for i in everything}, "snack-1": 2, "snack-2": 2, scene.ids["flaky"]: 3}
    if attempts != want:
        return Miss(f"attempts {attempts}", "attempts counts claims: 2 for the rows taken over, 3 for the flaky "
                                            "one, and 1 for the redriven one (redrive resets it to 0).")
    return None


# --- the timeline and the evidence ladder -------------------------------------------------------


def out_of_order(requests: list[dict], seq: dict[str, int], pills: set[str]) -> list[str]:
    """Events of the second outbox the warehouse applied after an event with a larger seq."""
    order = [r.get("id") for r in requests if r.get("outcome") == "applied" and r.get("id") in pills]
    late = []
    for i, event_id in enumerate(order):
        overtaken = [o for o in order[:i] if seq[o] > seq[event_id]]
        if overtaken:
            late.append(f"{event_id} (seq {seq[event_id]}) after {', '.join(f'{o} (seq {seq[o]})' for o in overtaken)}")
    return late


def _pills(scene: Scene) -> set[str]:
    return {i for i in scene.rows if i not in ("snack-1", "snack-2")}


def _timeline(ctx: StepContext, scene: Scene) -> None:
    timeline = ctx.evidence.timeline
    for label, run in scene.runs.items():
        actor = f"publisher {label}"
        timeline.append({"t": run.started_at, "actor": actor, "kind": "start", "text": "process started"})
        for note in run.messages():
            if note.get("kind") == "claimed":
                try:  # what a child wrote: anything at all
                    seq = decode(note["seq"])
                except Exception:  # noqa: BLE001
                    seq = "?"
                t = note.get("t")
                t = t if isinstance(t, (int, float)) and run.started_at <= t <= run.ended_at else run.ended_at
                timeline.append({"t": t, "actor": actor, "kind": "hook",
                                 "text": f"after_claim({seq}): holds token {note.get('fence')}"})
        if label == "A #2" and scene.stopped_at is not None:
            timeline.append({"t": scene.stopped_at, "actor": actor, "kind": "stopped",
                             "text": "stopped by the judge in after_claim: SIGSTOP from outside (it saw state T)"})
        if label == "A #2" and scene.continued_at is not None:
            timeline.append({"t": scene.continued_at, "actor": actor, "kind": "continued",
                             "text": "SIGCONT from the judge"})
        killed = label in scene.killed
        rounds = _rounds(run)
        tail = f"; relay_once returned {rounds[-1]}" if rounds and isinstance(rounds[-1], dict) else ""
        timeline.append({"t": run.ended_at, "actor": actor, "kind": "killed" if killed else "exit",
                         "text": KILLED_TEXT if killed else f"exit code {run.exit_code}{tail}"})
    claimed_at: dict[str, float] = {}
    drawn: dict[str, list[int]] = {}  # file → the audit numbers on the timeline, in order
    for e in scene.entries:
        if e["state"] == "leased":
            claimed_at[e["id"]] = e["lease_until"] - LEASE
        text = _audit_text(e, claimed_at.get(e["id"]))
        if text:
            # One file's audit is in the order of its numbers, whatever its millisecond stamps say.
            earlier = drawn.setdefault(e["file"], [])
            after = [f"audit:{e['file']}:{earlier[-1]}"] if earlier else []
            earlier.append(e["n"])
            timeline.append({"t": e["t"], "actor": "outbox", "id": f"audit:{e['file']}:{e['n']}", "after": after,
                             "kind": "committed" if e["state"] == "sent" else e["state"], "text": text})
    for r in scene.requests:
        if r.get("outcome") == "duplicate":
            kind, what = "duplicate", "duplicate: recognised, applied once"
        elif r.get("outcome") == "applied":
            kind, what = "applied", "applied"
        else:
            kind, what = "refused", f"{r.get('response')}, not applied"
        # What the judge saw when this POST arrived: every audit entry after that was written later
        # (the publisher's "sent, saved under token N" among them), so it is drawn after the POST.
        seen = r.get("seen") if isinstance(r.get("seen"), dict) else {}
        later = [f"audit:{file}:{next(n for n in numbers if n > seen[file])}" for file, numbers in drawn.items()
                 if isinstance(seen.get(file), int) and any(n > seen[file] for n in numbers)]
        timeline.append({"t": r.get("t_start", 0), "actor": "warehouse", "id": f"post:{r.get('n')}", "before": later,
                         "kind": kind, "text": f"POST {r.get('id')} with token {r.get('token')} → {what}"})
    timeline.extend(scene.notes)
    late = out_of_order(scene.requests, scene.seq, _pills(scene))
    if late and timeline:
        timeline.append({"t": max(e["t"] for e in timeline), "actor": "judge", "kind": "note",
                         "text": "delivered out of seq order: " + "; ".join(late)})
    timeline.sort(key=lambda e: e["t"])


def _audit_text(e: dict, claimed_at: float | None) -> str:
    if e["state"] == "leased":
        return f"{e['id']}: claimed by {e['owner']!r} with token {e['fence']} (attempt {e['attempts']})"
    if e["state"] == "sent":
        return f"{e['id']}: sent, saved under token {e['fence']}"
    if e["state"] == "pending" and e["attempts"] == 0:
        return f"{e['id']}: redriven — pending again, last_error kept"
    if e["state"] == "pending":
        wait = f" +{e['due'] - claimed_at:.3g} s" if claimed_at is not None else ""
        return f"{e['id']}: failed ({e['last_error'] or ''}), retry due{wait}"
    if e["state"] == "quarantined":
        return f"{e['id']}: quarantined with {e['last_error'] or ''!r}"
    return ""


def _ladder(ctx: StepContext, scene: Scene) -> None:
    ladder = ctx.evidence.ladder
    for event_id in ("snack-1", "snack-2"):
        claims = _claims_of(scene, event_id)
        ladder.append({"rung": f"{event_id}: claimed by whom, with which token",
                       "observed": ", then ".join(f"{c['owner']} with token {c['fence']}" for c in claims) or "never",
                       "when": "the outbox's audit of every change"})
        sent = [(r.get("token"), r.get("outcome")) for r in _requests_for(scene, event_id)]
        ladder.append({"rung": f"{event_id}: sent, with which token",
                       "observed": ", then ".join(f"token {t} → {o}" for t, o in sent) or "never",
                       "when": "the warehouse's request log"})
        final = scene.rows.get(event_id)
        holder = claims[-1]["fence"] if claims else None
        ok = final is not None and final["state"] == "sent" and final["fence"] == holder
        ladder.append({"rung": f"{event_id}: sent saved by the current token holder",
                       "observed": f"yes: sent under token {final['fence']}" if ok else f"no: {shown(final)}",
                       "when": "the outbox, at the end"})
    claimed_at: dict[str, float] = {}
    fails, quarantined, redriven = [], [], []
    for e in scene.entries:
        if e["state"] == "leased":
            claimed_at[e["id"]] = e["lease_until"] - LEASE
        elif e["state"] == "pending" and e["attempts"] > 0 and e["id"] in claimed_at:
            fails.append(f"{e['id']} after attempt {e['attempts']}: due {e['due'] - claimed_at[e['id']]:.3g} s later "
                         f"({(e['last_error'] or '')[:24]}…)")
        elif e["state"] == "quarantined":
            quarantined.append(f"{e['id']}: {e['last_error']}")
        elif e["state"] == "pending" and e["attempts"] == 0:
            redriven.append(f"{e['id']}: pending again, attempts 0, last_error kept")
    ladder.append({"rung": "failed, retry due at T", "observed": "; ".join(fails) or "none observed",
                   "when": "the outbox, on the judge's clock"})
    ladder.append({"rung": "quarantined with error E", "observed": "; ".join(quarantined) or "none observed",
                   "when": "the outbox"})
    ladder.append({"rung": "redriven", "observed": "; ".join(redriven) or "none observed",
                   "when": "the outbox, after the refusal was lifted"})
    late = out_of_order(scene.requests, scene.seq, _pills(scene))
    ladder.append({"rung": "delivered out of seq order", "observed": "; ".join(late) or "none",
                   "when": "the warehouse's request log: the price of quarantine and retries"})
