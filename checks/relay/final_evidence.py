"""Lab `relay`'s final check, its evidence: the timeline (processes, the audit, the warehouse's
POSTs, in the order the judge observed them) and the evidence ladder."""

from __future__ import annotations

from checks.relay.final_scene import LEASE, Scene, claims_of, relay_rounds, requests_for
from checks.relay.outbox import shown
from labkit.judge import timeline as evidence
from labkit.judge.run import StepContext


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


def _claimed(note: dict) -> tuple[str, str] | None:
    if note.get("kind") != "claimed":
        return None
    return "hook", f"after_claim({evidence.noted(note, 'seq')}): holds token {note.get('fence')}"


def add_timeline(ctx: StepContext, scene: Scene) -> None:
    timeline = ctx.evidence.timeline
    for label, run in scene.runs.items():
        actor = f"publisher {label}"
        rounds = relay_rounds(run)
        tail = f"; relay_once returned {rounds[-1]}" if rounds and isinstance(rounds[-1], dict) else ""
        timeline.extend(evidence.process(actor, run, _claimed, killed=label in scene.killed, ended=tail))
        if label == "A #2" and scene.stopped_at is not None:
            timeline.append(evidence.event(scene.stopped_at, actor, "stopped",
                                           "stopped by the judge in after_claim: SIGSTOP from outside (it saw state T)"))
        if label == "A #2" and scene.continued_at is not None:
            timeline.append(evidence.event(scene.continued_at, actor, "continued", "SIGCONT from the judge"))
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
            timeline.append(evidence.event(e["t"], "outbox", "committed" if e["state"] == "sent" else e["state"], text,
                                           id=f"audit:{e['file']}:{e['n']}", after=after))
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
        timeline.append(evidence.event(r.get("t_start", 0), "warehouse", kind,
                                       f"POST {r.get('id')} with token {r.get('token')} → {what}",
                                       id=f"post:{r.get('n')}", before=later))
    timeline.extend(scene.notes)
    late = out_of_order(scene.requests, scene.seq, _pills(scene))
    if late and timeline:
        timeline.append(evidence.event(max(e["t"] for e in timeline), "judge", "note",
                                       "delivered out of seq order: " + "; ".join(late)))
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


def add_ladder(ctx: StepContext, scene: Scene) -> None:
    ladder = ctx.evidence.ladder
    for event_id in ("snack-1", "snack-2"):
        claims = claims_of(scene, event_id)
        ladder.append(evidence.rung(f"{event_id}: claimed by whom, with which token",
                                    ", then ".join(f"{c['owner']} with token {c['fence']}" for c in claims) or "never",
                                    "the outbox's audit of every change"))
        sent = [(r.get("token"), r.get("outcome")) for r in requests_for(scene, event_id)]
        ladder.append(evidence.rung(f"{event_id}: sent, with which token",
                                    ", then ".join(f"token {t} → {o}" for t, o in sent) or "never",
                                    "the warehouse's request log"))
        final = scene.rows.get(event_id)
        holder = claims[-1]["fence"] if claims else None
        ok = final is not None and final["state"] == "sent" and final["fence"] == holder
        ladder.append(evidence.rung(f"{event_id}: sent saved by the current token holder",
                                    f"yes: sent under token {final['fence']}" if ok else f"no: {shown(final)}",
                                    "the outbox, at the end"))
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
    ladder.append(evidence.rung("failed, retry due at T", "; ".join(fails) or "none observed",
                                "the outbox, on the judge's clock"))
    ladder.append(evidence.rung("quarantined with error E", "; ".join(quarantined) or "none observed", "the outbox"))
    ladder.append(evidence.rung("redriven", "; ".join(redriven) or "none observed",
                                "the outbox, after the refusal was lifted"))
    late = out_of_order(scene.requests, scene.seq, _pills(scene))
    ladder.append(evidence.rung("delivered out of seq order", "; ".join(late) or "none",
                                "the warehouse's request log: the price of quarantine and retries"))
