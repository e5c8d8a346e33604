"""A crash scenario's evidence, built the same way in every lab: timeline events and ladder rungs.

A final check fills `ctx.evidence.timeline` (what each party did, when, on its own clock) and
`ctx.evidence.ladder` (each rung: what the judge observed that proves one link of the chain).
The lab says what its events mean; these functions say how a process's life becomes events:
its start, the notes it wrote at its hooks (timed by the child, so clamped to the run: a child
may write anything), and how it ended — killed by the judge at a hook, or its exit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.judge.child import ChildRun
from labkit.judge.hooks import KILLED_TEXT
from labkit.values import decode


def event(t: float, actor: str, kind: str, text: str, **order: Any) -> dict:
    """One timeline event; `order` may add `id`, `after` or `before` (labkit.views.timeline_order)."""
    return {"t": t, "actor": actor, "kind": kind, "text": text, **order}


def rung(name: str, observed: str, when: str) -> dict:
    """One rung of the evidence ladder: what the judge observed, and where it looked."""
    return {"rung": name, "observed": observed, "when": when}


def note_time(note: dict, run: ChildRun) -> float:
    """The time a child wrote in its note, if it is a number within the run (else the run's end)."""
    t = note.get("t")
    inside = isinstance(t, (int, float)) and not isinstance(t, bool) and run.started_at <= t <= run.ended_at
    return t if inside else run.ended_at


def noted(note: dict, key: str) -> Any:
    """A value a child put in its note, decoded, or "?" for anything that does not decode."""
    try:
        return decode(note[key])
    except Exception:  # noqa: BLE001 - what a child wrote can be anything at all
        return "?"


def process(actor: str, run: ChildRun, hook: Callable[[dict], tuple[str, str] | None], *,
            killed: bool, ended: str = "") -> list[dict]:
    """A process's life as events: started; every note `hook(note)` turns into (kind, text); then
    killed by the judge at its hook (`killed`) or its exit code, followed by `ended` if given."""
    events = [event(run.started_at, actor, "start", "process started")]
    for note in run.messages():
        shown = hook(note)
        if shown is not None:
            events.append(event(note_time(note, run), actor, *shown))
    if killed:
        events.append(event(run.ended_at, actor, "killed", KILLED_TEXT))
    else:
        events.append(event(run.ended_at, actor, "exit", f"exit code {run.exit_code}{ended}"))
    return events
