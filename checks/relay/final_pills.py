"""Lab `relay`'s final check, parts 3-4, on the judge's clock: a refused event quarantined, a
flaky one retried with jittered waits, the rest not held up; the refusal lifted and redriven."""

from __future__ import annotations

from checks.relay import oracle
from checks.relay.final_scene import (
    COUNTER_START,
    LEASE,
    Scene,
    claims_of,
    final_case,
    report_of,
    requests_for,
    run_problem,
)
from checks.relay.outbox import claims_in, same_number, shown
from labkit.judge.expect import Miss, describe
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode


def pill_cases(ctx: StepContext, scene: Scene, reason: str) -> list[Case]:
    ids = scene.ids
    c_problem = run_problem(scene.runs.get("C"), "C", ctx.timeout)
    return [
        final_case("the refused event is quarantined on its first attempt",
                   f"relay_once(con, 'C', send, now, …) where the warehouse answers 422 for {ids['refused']}",
                   "one request, 422; quarantined after one attempt with last_error 'PermanentError: 422 …'",
                   "final.poison-quarantined", c_problem or _quarantined(scene, reason)),
        final_case("the flaky event is retried with growing, jittered waits",
                   f"relay_once(...) again at each due time of {ids['flaky']} (the judge's clock)",
                   "503, 503, then applied; due = now + backoff(1), then + backoff(2), from the seeded rng",
                   "final.transient-retried", c_problem or _retried(ctx, scene)),
        final_case("the other three are delivered at once", "the first relay_once(con, 'C', ...)",
                   f"{', '.join(v for k, v in ids.items() if k.startswith('plain'))} delivered by the first call",
                   "final.no-head-of-line", c_problem or _at_once(scene)),
        final_case("after the refusal is lifted, the refused event is redriven and delivered",
                   f"redrive(con, [{ids['refused']!r}], now) and relay_once(con, 'D', …) in a new process",
                   "1; pending with attempts 0, last_error kept; then delivered, applied, with a token past every "
                   "earlier one", "final.redrive", _redriven(ctx, scene) or _tokens_continue(scene)),
        final_case("every event applied exactly once, none lost, attempts as expected",
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
        problem = run_problem(run, label, ctx.timeout, "redrive" if label == "D" else "relay")
        if problem is not None and problem.outcome in (Outcome.NOT_IMPLEMENTED, Outcome.MISSING):
            return Miss(f"not checked: {problem.got}", outcome=Outcome.NOT_REACHED)
    return None


def _quarantined(scene: Scene, reason: str) -> Miss | None:
    refused = scene.ids["refused"]
    entries = [e for e in scene.entries if e["id"] == refused]
    first_end = next((e for e in entries if e["state"] != "leased"), None)
    before_lift = [r for r in requests_for(scene, refused) if r.get("response") == "422"]
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
    answers = [r.get("response") for r in requests_for(scene, flaky)]
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
    first = claims_of(scene, refused)[:1]
    batch = first[0]["lease_until"] if first else None
    flaky_requests = requests_for(scene, flaky)
    retried_at = flaky_requests[1]["t_start"] if len(flaky_requests) > 1 else float("inf")
    hint = (f"A failure does not stop the batch: after {refused} (refused) and {flaky} (unavailable), the rows "
            "behind them go on in the same call.")
    for key, event_id in scene.ids.items():
        if not key.startswith("plain"):
            continue
        claims = claims_of(scene, event_id)
        applied = [r for r in requests_for(scene, event_id) if r.get("outcome") == "applied"]
        if len(claims) != 1 or batch is None or not same_number(claims[0]["lease_until"], batch):
            return Miss(f"{event_id} was claimed {len(claims)} times"
                        + ("" if len(claims) != 1 else ", not in the same claim as the refused event"), hint)
        if len(applied) != 1 or applied[0]["t_start"] > retried_at:
            return Miss(f"{event_id} was {'applied only after ' + flaky + ' was retried' if applied else 'not applied'}",
                        hint)
    return None


def _redriven(ctx: StepContext, scene: Scene) -> Miss | None:
    d = scene.runs.get("D")
    record = report_of(d, "redrive")
    if record is None or record["outcome"]["kind"] != "returned":
        return run_problem(d, "D", ctx.timeout, "redrive") or Miss(f"redrive {describe(record['outcome'])}", "")
    if decode(record["outcome"]["value"]) != 1:
        return Miss(f"redrive returned {decode(record['outcome']['value'])!r}", "redrive returns how many rows it "
                                                                                "moved.")
    refused = scene.ids["refused"]
    back = next((e for e in scene.entries if e["id"] == refused and e["state"] == "pending"), None)
    if back is None or back["attempts"] != 0 or not back["last_error"]:
        return Miss(f"after redrive the row was {shown(back) if back else 'never back to pending'}",
                    "Back to pending with attempts 0 and due = now, last_error kept, committed.")
    answers = [r.get("response") for r in requests_for(scene, refused)]
    final = scene.rows[refused]
    if answers[-1:] != ["ack"] or final["state"] != "sent":
        return Miss(f"the warehouse answered {answers}; the row ended {shown(final)}",
                    "After the redrive, the next relay_once delivers it.")
    return None


def _once(scene: Scene) -> Miss | None:
    everything = list(scene.rows)
    applied = {i: sum(1 for r in requests_for(scene, i) if r.get("outcome") == "applied") for i in everything}
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
