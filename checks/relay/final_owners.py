"""Lab `relay`'s final check, parts 1-2: publisher A killed after its claim, the restarted A
frozen after its own, B taking both over once the leases ran out, the woken A refused."""

from __future__ import annotations

from checks.relay.final_scene import (
    LEASE,
    Scene,
    claims_of,
    final_case,
    relay_rounds,
    report_of,
    requests_for,
    run_problem,
    token_of,
)
from checks.relay.outbox import TOKEN_HINT, shown
from labkit.judge.child import ChildRun
from labkit.judge.expect import Miss
from labkit.judge.hooks import KILLED_TEXT
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome


def owner_cases(ctx: StepContext, scene: Scene) -> list[Case]:
    a1, a2, b = scene.runs.get("A #1"), scene.runs.get("A #2"), scene.runs.get("B")
    s1, s2 = claims_of(scene, "snack-1"), claims_of(scene, "snack-2")
    return [
        final_case("A dies right after claiming snack-1",
                   "relay_once(con, 'A', send, now, 0.3, 1, policy, after_claim=hook) where the judge kills the "
                   "process in the hook", f"{KILLED_TEXT}; snack-1 leased by A; nothing sent",
                   "final.dead-owner", _dead_owner(ctx, scene, a1, s1)),
        final_case("B does not take snack-1 while A's lease is live",
                   "relay_once(con, 'B', …) in a new process: first at a now shortly before A's lease ends, then every "
                   "20 ms on the wall clock",
                   "no claim of snack-1 before A's lease_until", "final.lease-respected", _lease_respected(ctx, s1, b)),
        final_case("B takes snack-1 over with a larger token and delivers it once", "the same B process",
                   "snack-1 claimed by B with a larger token; one POST with that token, applied; sent under it",
                   "final.takeover", _takeover(ctx, scene, s1, b)),
        final_case("A, restarted, is frozen right after claiming snack-2; B takes it over",
                   "relay_once(con, 'A', …) where the judge stops every process of A in after_claim (SIGSTOP); B as "
                   "above; then SIGCONT",
                   "the judge sees A stopped before it sent anything; B claims snack-2 after A's lease, with a larger "
                   "token, and completes it", "final.paused-owner", _paused_owner(ctx, scene, a2, b, s2)),
        final_case("the woken A is refused by its stale token", "SIGCONT: A sends snack-2, then calls complete",
                   "the warehouse sees a duplicate; complete raises StaleLease; the row stays sent under B's token; A's "
                   "counts say stale 1", "final.stale-complete", _stale_complete(ctx, scene, a2, b, s2)),
    ]


def _dead_owner(ctx: StepContext, scene: Scene, a1: ChildRun | None, s1: list[dict]) -> Miss | None:
    hooked = a1 is not None and any(n.get("kind") == "claimed" for n in a1.messages())
    if a1 is not None and "A #1" in scene.killed:
        sent_by_a = [r for r in requests_for(scene, "snack-1") if r.get("t_start", 0) <= a1.ended_at]
        if sent_by_a:
            return Miss("the warehouse got snack-1 from A before A died", "Call after_claim(seq) right after the "
                                                                           "claim, before send(event).")
        if not s1 or s1[0]["owner"] != "A" or (scene.after_death or {}).get("state") != "leased":
            return Miss(f"after A died the judge read snack-1 as {shown(scene.after_death)}",
                        "claim commits the lease before relay_once calls after_claim.")
        ctx.evidence.faults.append(f"publisher A {KILLED_TEXT} in after_claim; snack-1 left leased by A with "
                                   f"token {s1[0]['fence']}")
        return None
    problem = run_problem(a1, "A", ctx.timeout)
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
    first_round = relay_rounds(b)[:1]
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
    record = report_of(b, "relay")
    rounds = record["observed"].get("rounds", []) if record else []
    return rounds[0]["now"] if rounds else float("nan")


def _takeover(ctx: StepContext, scene: Scene, s1: list[dict], b: ChildRun | None) -> Miss | None:
    if not s1 or s1[0]["owner"] != "A":
        return Miss("not checked: A never held snack-1", outcome=Outcome.NOT_REACHED)
    problem = run_problem(b, "B", ctx.timeout)
    if problem is not None:
        return problem
    if len(s1) < 2:
        return Miss(f"snack-1 was never claimed again after A died (B's rounds returned {relay_rounds(b)[:3]}…)",
                    "A leased row whose lease_until <= now is claimed again: its owner is presumed dead. "
                    "Otherwise a dead owner's row is stuck forever.")
    takeover = s1[1]
    if takeover["owner"] != "B" or takeover["fence"] <= s1[0]["fence"]:
        return Miss(f"snack-1's second claim: owner {takeover['owner']!r}, token {takeover['fence']} (A had "
                    f"{s1[0]['fence']})", "A claim writes the new owner and a new, larger token from fence_counter.")
    got = [(token_of(r.get("token")), r.get("outcome")) for r in requests_for(scene, "snack-1")]
    if got != [(takeover["fence"], "applied")]:
        return Miss(f"the warehouse saw snack-1 as (token, outcome) {got}", "B sends snack-1 once and completes it.")
    final = scene.rows["snack-1"]
    if final["state"] != "sent" or final["fence"] != takeover["fence"]:
        return Miss(f"snack-1 ended {shown(final)}", "complete after the ACK, with the token of the claim.")
    return None


def _paused_owner(ctx: StepContext, scene: Scene, a2: ChildRun | None, b: ChildRun | None,
                  s2: list[dict]) -> Miss | None:
    if scene.stopped_at is None:
        problem = run_problem(a2, "A (restarted)", ctx.timeout)
        if problem is not None and problem.outcome is not Outcome.DIED:
            return problem
        return Miss("the judge never saw the restarted A stopped (no process of it in state T)",
                    "Call after_claim(seq) right after the claim: that is where the judge stops it.")
    if not s2 or s2[0]["owner"] != "A":
        return Miss(f"the restarted A did not claim snack-2 first (claims: {[(c['owner'], c['fence']) for c in s2]})",
                    "claim takes the first due rows in seq order: snack-1 was still leased by the dead A.")
    early = [r for r in requests_for(scene, "snack-2") if r.get("t_start", 0) <= scene.stopped_at]
    if early:
        return Miss("the warehouse got snack-2 from A before A was stopped", "Call after_claim(seq) right after the "
                                                                             "claim, before send(event).")
    problem = run_problem(b, "B", ctx.timeout)
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
    problem = run_problem(a2, "A (restarted)", ctx.timeout)
    if problem is not None:
        return problem
    got = [(token_of(r.get("token")), r.get("outcome")) for r in requests_for(scene, "snack-2")]
    want = [(s2[1]["fence"], "applied"), (s2[0]["fence"], "duplicate")]
    if got != want:
        return Miss(f"the warehouse saw snack-2 as (token, outcome) {got}",
                    f"After SIGCONT, A goes on where it stopped: it sends snack-2 (with its old token "
                    f"{s2[0]['fence']}), and the warehouse recognises the duplicate.")
    final = scene.rows["snack-2"]
    if final["state"] != "sent" or final["fence"] != s2[1]["fence"]:
        return Miss(f"snack-2 ended {shown(final)}", "A's complete must raise StaleLease and change nothing: the row "
                                                     "stays sent under B's token. " + TOKEN_HINT)
    counts = relay_rounds(a2)
    if not counts or counts[-1] != {"sent": 0, "retry": 0, "quarantined": 0, "stale": 1}:
        return Miss(f"A's relay_once returned {counts[-1] if counts else None}",
                    "complete raised StaleLease: count the row as 'stale' (not 'sent'), and never retry it.")
    ctx.evidence.faults.append(f"snack-2 delivered twice (token {s2[1]['fence']}, then the stale token "
                               f"{s2[0]['fence']}) — the warehouse recognised the duplicate; A's complete got "
                               "StaleLease")
    return None
