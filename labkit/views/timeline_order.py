"""The order a crash timeline's events are drawn and listed in: causes first, the clock second.

This is the one place the rule lives; `timeline_svg.rows` (the SVG, its table, the terminal text)
uses it.

Why not simply sort by time: a timeline is written by several recorders, and their stamps are
not one clock. The judge stamps a process's start before spawning it and its end after reaping
it; a child stamps its own notes; the warehouse stamps a request when it arrives; and an
outbox's audit trigger stamps a row change with SQLite's `julianday('now')`, which counts whole
milliseconds. A publisher that sends, gets the ACK and saves "sent" within the same millisecond
has its save stamped *before* the POST that carried it: sorted by time, the picture shows
"sent, saved under token 103" above "POST … with token 103", marking before sending, the very
bug lab 01 teaches. (Lab 03's final check drew that in 4 of its 6 deliveries.)

The rule:

1. **What the judge knows caused what comes first.** An event may name itself (`"id"`) and
   the events it must follow (`"after": [ids]`) or precede (`"before": [ids]`). The judge
   writes these only for order it observed or that a sequence number proves, never for order
   it merely expects of correct code: an outbox's audit entries follow one another by their
   number `n` (one file, one writer at a time), and a POST precedes every audit entry the
   warehouse found not yet written when the POST arrived (`checks/relay/final.py`). A
   publisher that really marks before it sends is drawn that way.
2. **A process's own lane**: its `start` first, its end (`exit`, or a kill) last.
3. **A restart follows the process it replaces**: `"<role> #2"` starts after `"<role> #1"`
   ended (the kill precedes the restart).
4. **Otherwise the clock** (`t`), and for equal times the order the events were recorded in.

An `id` named in `after`/`before` that no event has is ignored. Links that contradict each
other (a cycle: a correct judge never writes one) are broken by rule 4.
Implementation: a topological sort (Kahn) that always takes, among the events whose causes are
all drawn, the earliest by rule 4.
"""

from __future__ import annotations

import heapq
import re


def _number(actor: str) -> tuple[str, int] | None:
    match = re.match(r"^(.*?)\s*#(\d+)\s*$", actor)
    return (match.group(1), int(match.group(2))) if match else None


def _names(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return []


def _time(event: dict) -> float:
    try:
        return float(event.get("t") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def order(timeline: list[dict]) -> list[int]:
    """Indices of `timeline` in the order to draw them (see the module's docstring)."""
    count = len(timeline)
    preds: list[set[int]] = [set() for _ in range(count)]

    def link(first: int, then: int) -> None:
        if first != then:
            preds[then].add(first)

    by_id: dict[str, int] = {}
    for index, event in enumerate(timeline):
        name = event.get("id")
        if isinstance(name, str):
            by_id.setdefault(name, index)
    # Rule 1: the judge's links.
    for index, event in enumerate(timeline):
        for name in _names(event.get("after")):
            if name in by_id:
                link(by_id[name], index)
        for name in _names(event.get("before")):
            if name in by_id:
                link(index, by_id[name])
    # Rules 2 and 3: process lanes (those with a start), and restarts.
    starts: dict[str, int] = {}
    for index, event in enumerate(timeline):
        if event.get("kind") == "start":
            starts.setdefault(str(event.get("actor", "?")), index)
    ends: dict[str, list[int]] = {}
    for index, event in enumerate(timeline):
        actor = str(event.get("actor", "?"))
        if actor in starts and index != starts[actor]:
            link(starts[actor], index)
            kind = str(event.get("kind", "")).lower()
            if kind == "exit" or kind.startswith("kill"):
                ends.setdefault(actor, []).append(index)
    for actor, finals in ends.items():
        for index, event in enumerate(timeline):
            if str(event.get("actor", "?")) == actor and index not in finals and index != starts[actor]:
                for end in finals:
                    link(index, end)
    for actor, start in starts.items():
        numbered = _number(actor)
        if numbered is None:
            continue
        role, n = numbered
        before = next((a for a in starts if _number(a) == (role, n - 1)), None)
        if before is not None:
            for end in ends.get(before, []):
                link(end, start)
    # Rule 4 inside a topological sort.
    key = [(_time(event), index) for index, event in enumerate(timeline)]
    waiting = [len(p) for p in preds]
    follows: list[list[int]] = [[] for _ in range(count)]
    for index, p in enumerate(preds):
        for first in p:
            follows[first].append(index)
    ready = [key[i] for i in range(count) if waiting[i] == 0]
    heapq.heapify(ready)
    done = [False] * count
    out: list[int] = []
    while len(out) < count:
        if not ready:  # a cycle: take the earliest event left, as if its links were not there
            heapq.heappush(ready, min(key[i] for i in range(count) if not done[i]))
        _, index = heapq.heappop(ready)
        if done[index]:
            continue
        done[index] = True
        out.append(index)
        for then in follows[index]:
            waiting[then] -= 1
            if waiting[then] == 0 and not done[then]:
                heapq.heappush(ready, key[then])
    return out
