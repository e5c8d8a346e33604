"""Lab `vending`, final check: the evidence it shows — a timeline of the two clients and the feed,
and the ladder (committed, ACK sent, seen, resent, recognised), each rung only what was observed.
"""

from __future__ import annotations

from checks.vending.crash_scenario import KILL, killed_by_judge
from checks.vending.store import shown
from labkit.judge.hooks import KILLED_TEXT
from labkit.judge.verdict import Case
from labkit.values import decode


def timeline_process(timeline: list[dict], label: str, run, kill: int | None, timeout: float,
                     hook: dict | None = None) -> None:
    timeline.append({"t": run.started_at, "actor": label, "kind": "start", "text": "process started"})
    for note in run.messages():
        if note.get("kind") == "before_ack":
            try:  # what a child wrote: anything at all
                seq = decode(note["seq"])
            except Exception:  # noqa: BLE001
                seq = "?"
            text = f"before_ack({seq}) (as the process reported it)"
            t = note.get("t")
            t = t if isinstance(t, (int, float)) and run.started_at <= t <= run.ended_at else run.ended_at
            timeline.append({"t": t, "actor": label, "kind": "hook", "text": text})
    if kill is not None and hook is not None:
        timeline.append({"t": run.ended_at, "actor": label, "kind": "killed", "text": KILLED_TEXT})
        return
    timeline.append({"t": run.ended_at, "actor": label, "kind": "exit",
                    "text": f"exit code {run.exit_code}" + (" (no answer in time: killed by the judge)"
                                                            if killed_by_judge(run, timeout) else "")})


def timeline_feed(timeline: list[dict], journal: list[dict], conns1: set[int], conns2: set[int],
                  recognised: int | None = None) -> None:
    """The feed's journal as timeline events. `recognised`: the killed seq, when the judge saw
    it committed before client #2 started, resent, ACKed by client #2 and counted once — only
    then is that ACK marked as a duplicate."""
    owner = {**{c: "client #1" for c in conns1}, **{c: "client #2" for c in conns2}}
    for e in journal:
        who = owner.get(e["conn"], "unknown client")
        if e["kind"] == "ack" and who == "client #2" and e.get("seq") == recognised:
            timeline.append({"t": e["t"], "actor": "feed", "kind": "duplicate",
                            "text": f"[{who}] ← ACK {recognised}: a resent seq the ledger already held, counted once"})
            continue
        text = {
            "connect": f"connection {e['conn']} from {who}",
            "resume": f"← RESUME {e.get('last')}",
            "sent": f"→ EVENT {e.get('seq')} {e.get('delta')}",
            "ack": f"← ACK {e.get('seq')}",
            "closed": f"connection {e['conn']} closed ({e.get('reason')})",
        }.get(e["kind"], f"{e['kind']} {({k: v for k, v in e.items() if k not in ('t', 'conn', 'kind')})}")
        timeline.append({"t": e["t"], "actor": "feed", "kind": e["kind"], "text": f"[{who}] {text}"})


def ladder(events, died: Case, after_kill, j1, j2, after_all, restarted: bool) -> list[dict]:
    """The evidence ladder, each rung filled only with what the judge observed (or "not reached")."""
    seqs1 = [s for s, _ in after_kill["ledger"]] if after_kill else []
    ack1 = [e for e in j1 if e["kind"] == "ack" and e["seq"] == KILL]
    resent = [e for e in j2 if e["kind"] == "sent" and e["seq"] == KILL]
    ack2 = [e for e in j2 if e["kind"] == "ack" and e["seq"] == KILL]
    total = sum(d for _, d in events)
    not_restarted = "not reached: client #2 was not started (client #1 did not die between commit and ACK)"
    if after_kill is None:
        committed = "no: the judge found no readable store after client #1 ended"
    elif KILL in seqs1:
        committed = f"yes: seq {KILL} in the ledger, last {after_kill['last']} (the judge's own read)"
    else:
        committed = f"no: seq {KILL} is not in the ledger (the judge read {shown(after_kill)})"
    if ack1:
        sent = f"yes: ACK {KILL} reached the feed from client #1 before it died"
    elif died.passed:
        sent = f"no: client #1 was {KILLED_TEXT} in before_ack({KILL}) and no ACK {KILL} reached the feed"
    else:
        sent = "not observed: client #1 did not die in before_ack"
    duplicate = bool(ack2) and after_all is not None and after_all["total"] == total and KILL in seqs1
    return [
        {"rung": "committed", "observed": committed, "when": "after client #1 ended"},
        {"rung": "ACK sent", "observed": sent, "when": "client #1"},
        {"rung": "ACK seen by the feed",
         "observed": f"yes: the feed got ACK {KILL} from client #1" if ack1 else f"no: the feed has no ACK {KILL} "
                                                                                 "from client #1",
         "when": "client #1's connection"},
        {"rung": "resent",
         "observed": (not_restarted if not restarted else f"yes: the feed sent EVENT {KILL} again to client #2"
                     if resent else f"no: the feed did not send seq {KILL} to client #2"),
         "when": "client #2's connection"},
        {"rung": "recognised as duplicate",
         "observed": (not_restarted if not restarted else
                     f"yes: client #2 ACKed {KILL} and the total {after_all['total']} counts it once" if duplicate
                     else f"no: {'no ACK ' + str(KILL) + ' from client #2' if not ack2 else 'the total is ' + str(after_all['total'] if after_all else None) + ', expected ' + str(total)}"),
         "when": "after client #2"},
    ]
