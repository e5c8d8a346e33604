"""Lab `vending`, final check: the evidence it shows — a timeline of the two clients and the feed,
and the ladder (committed, ACK sent, seen, resent, recognised), each rung only what was observed.
"""

from __future__ import annotations

from checks.vending.crash_scenario import KILL, killed_by_judge
from checks.vending.store import shown
from labkit.judge import timeline as evidence
from labkit.judge.hooks import KILLED_TEXT
from labkit.judge.verdict import Case


def _before_ack(note: dict) -> tuple[str, str] | None:
    if note.get("kind") != "before_ack":
        return None
    return "hook", f"before_ack({evidence.noted(note, 'seq')}) (as the process reported it)"


def timeline_process(timeline: list[dict], label: str, run, kill: int | None, timeout: float,
                     hook: dict | None = None) -> None:
    late = " (no answer in time: killed by the judge)" if killed_by_judge(run, timeout) else ""
    timeline.extend(evidence.process(label, run, _before_ack, killed=kill is not None and hook is not None,
                                     ended=late))


def timeline_feed(timeline: list[dict], journal: list[dict], conns1: set[int], conns2: set[int],
                  recognised: int | None = None) -> None:
    """The feed's journal as timeline events. `recognised`: the killed seq, when the judge saw
    it committed before client #2 started, resent, ACKed by client #2 and counted once — only
    then is that ACK marked as a duplicate."""
    owner = {**{c: "client #1" for c in conns1}, **{c: "client #2" for c in conns2}}
    for e in journal:
        who = owner.get(e["conn"], "unknown client")
        if e["kind"] == "ack" and who == "client #2" and e.get("seq") == recognised:
            timeline.append(evidence.event(e["t"], "feed", "duplicate",
                                           f"[{who}] ← ACK {recognised}: a resent seq the ledger already held, counted once"))
            continue
        text = {
            "connect": f"connection {e['conn']} from {who}",
            "resume": f"← RESUME {e.get('last')}",
            "sent": f"→ EVENT {e.get('seq')} {e.get('delta')}",
            "ack": f"← ACK {e.get('seq')}",
            "closed": f"connection {e['conn']} closed ({e.get('reason')})",
        }.get(e["kind"], f"{e['kind']} {({k: v for k, v in e.items() if k not in ('t', 'conn', 'kind')})}")
        timeline.append(evidence.event(e["t"], "feed", e["kind"], f"[{who}] {text}"))


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
    seen = (f"yes: the feed got ACK {KILL} from client #1" if ack1
            else f"no: the feed has no ACK {KILL} from client #1")
    again = (not_restarted if not restarted else f"yes: the feed sent EVENT {KILL} again to client #2"
             if resent else f"no: the feed did not send seq {KILL} to client #2")
    missing = (f"no ACK {KILL} from client #2" if not ack2
               else f"the total is {after_all['total'] if after_all else None}, expected {total}")
    once = (not_restarted if not restarted else
            f"yes: client #2 ACKed {KILL} and the total {after_all['total']} counts it once" if duplicate
            else f"no: {missing}")
    return [
        evidence.rung("committed", committed, "after client #1 ended"),
        evidence.rung("ACK sent", sent, "client #1"),
        evidence.rung("ACK seen by the feed", seen, "client #1's connection"),
        evidence.rung("resent", again, "client #2's connection"),
        evidence.rung("recognised as duplicate", once, "after client #2"),
    ]
