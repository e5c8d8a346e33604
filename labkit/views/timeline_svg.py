"""A crash scenario's timeline as an SVG sequence diagram: pure Python, no JavaScript.

One lane per actor, derived from the data (`Evidence.timeline`: `{"t", "actor", "kind",
"text"}`), time running downwards, one row per event. Lanes of the same role stay together
("publisher #1", "publisher #2"), in order of first appearance. A lane whose events include a
`start` is a process: its lifetime is drawn as a bar from start to its end (`exit` or a kill).
An event on another lane while exactly one process is alive is drawn as a message from that
process (or to it, when the event's text starts with "→": the server sent it). Kills are marked across the whole diagram; duplicates recognised by an inbox or a
ledger are highlighted. The same string works in JupyterLab, exported HTML and feedback pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape

LANE_WIDTH = 160
LEFT = 72  # the time axis
TOP = 58  # lane headers
ROW = 30
LABEL_CHARS = 64  # longer labels are cut; the full text is in the tooltip
CHAR_WIDTH = 6.1  # estimated width of one character at FONT_SIZE
FONT_SIZE = 11
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"

INK, MUTED, LINE = "#263238", "#607d8b", "#b0bec5"
GREEN, RED, AMBER, BLUE = "#2e7d32", "#c62828", "#e69100", "#1565c0"
LANE_FILL = "#eceff1"


@dataclass
class Row:
    t: float
    actor: str
    kind: str
    text: str


def _role(actor: str) -> str:
    """"publisher #2" and "publisher #1" share the role "publisher"."""
    return re.sub(r"\s*#\d+\s*$", "", actor)


def lanes(timeline: list[dict]) -> list[str]:
    """Actors in display order: roles by first appearance, actors of one role side by side."""
    first_actor: dict[str, int] = {}
    first_role: dict[str, int] = {}
    for index, event in enumerate(timeline):
        actor = str(event.get("actor", "?"))
        first_actor.setdefault(actor, index)
        first_role.setdefault(_role(actor), index)

    def key(actor: str) -> tuple[int, int, str]:
        number = re.search(r"#(\d+)\s*$", actor)
        return first_role[_role(actor)], int(number.group(1)) if number else -1, actor

    return sorted(first_actor, key=key)


def is_kill(kind: str) -> bool:
    return kind.lower().startswith("kill")


def is_duplicate(kind: str, text: str = "") -> bool:
    """A repeat recognised by an inbox or a ledger: the moment "applied once" is earned."""
    return "duplicate" in kind.lower() or "duplicate" in text.lower()


def outgoing(text: str) -> bool:
    """A server lane's event that it sent ("→ EVENT 2 -265", "[client #1] → …"), not received."""
    return re.sub(r"^\[[^\]]*\]\s*", "", text).startswith("→")


def message_label(text: str, sender: str) -> str:
    """A server's journal line drawn as an arrow: the arrow already says who and which way, so the
    journal's own "[client #1] ←" (seen from the server: "received from") is dropped. Left in, it
    pointed against the drawn arrow ("← RESUME 2" on an arrow from the client to the feed)."""
    who = re.match(r"^\[([^\]]*)\]\s*", text)
    if who and who.group(1) == sender:
        text = text[who.end():]
    return re.sub(r"^[←→]\s*", "", text) if (who is None or who.group(1) == sender) else text


def rows(timeline: list[dict]) -> list[Row]:
    """Events in time order; equal times keep the order they were recorded in."""
    events = [Row(float(e.get("t") or 0.0), str(e.get("actor", "?")), str(e.get("kind", "")), str(e.get("text", "")))
              for e in timeline]
    order = sorted(range(len(events)), key=lambda i: (events[i].t, i))
    return [events[i] for i in order]


def lifetimes(events: list[Row]) -> dict[str, tuple[int, int | None]]:
    """Process lanes (those with a `start`): the row it started in and the row it ended in."""
    spans: dict[str, tuple[int, int | None]] = {}
    for index, event in enumerate(events):
        if event.kind == "start" and event.actor not in spans:
            spans[event.actor] = (index, None)
        elif event.actor in spans and (event.kind == "exit" or is_kill(event.kind)):
            start, end = spans[event.actor]
            if end is None:
                spans[event.actor] = (start, index)
    return spans


def _sender(events: list[Row], index: int, spans: dict[str, tuple[int, int | None]]) -> str | None:
    """The one process alive when a non-process event happened (strictly inside its life)."""
    event = events[index]
    if event.actor in spans:
        return None
    alive = []
    for actor, (start, end) in spans.items():
        started, ended = events[start].t, events[end].t if end is not None else float("inf")
        if start < index and started < event.t < ended:
            alive.append(actor)
    return alive[0] if len(alive) == 1 else None


def _text(x: float, y: float, text: str, *, anchor: str = "start", color: str = INK, weight: str = "normal",
          size: int = FONT_SIZE, halo: bool = True) -> str:
    shown = text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"
    halo_attrs = ' stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke"' if halo else ""
    tooltip = f"<title>{escape(text)}</title>" if shown != text else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}" font-size="{size}" '
            f'font-weight="{weight}"{halo_attrs}>{tooltip}{escape(shown)}</text>')


def _glyph(kind: str, text: str, x: float, y: float, lane_color: str, legend: bool = False) -> str:
    if is_kill(kind):
        css = "" if legend else ' class="lk-kill"'  # only the real kill is marked for readers and tests
        return (f'<g{css} stroke="{RED}" stroke-width="3" stroke-linecap="round">'
                f'<line x1="{x - 7}" y1="{y - 7}" x2="{x + 7}" y2="{y + 7}"/>'
                f'<line x1="{x - 7}" y1="{y + 7}" x2="{x + 7}" y2="{y - 7}"/></g>')
    if kind == "start":
        return f'<circle cx="{x}" cy="{y}" r="5" fill="#fff" stroke="{lane_color}" stroke-width="2"/>'
    if kind == "exit":
        return f'<rect x="{x - 5}" y="{y - 5}" width="10" height="10" fill="{MUTED}"/>'
    if kind == "snapshot":
        return (f'<g fill="#fff" stroke="{BLUE}" stroke-width="1.5"><rect x="{x - 6}" y="{y - 5}" width="12" height="10" rx="1"/>'
                f'<line x1="{x - 6}" y1="{y - 1}" x2="{x + 6}" y2="{y - 1}"/></g>')
    if is_duplicate(kind, text):
        return f'<circle cx="{x}" cy="{y}" r="6" fill="{AMBER}" stroke="#fff" stroke-width="1.5"/>'
    color = GREEN if kind in ("ack", "applied", "committed", "saved") else BLUE
    return f'<circle cx="{x}" cy="{y}" r="5" fill="{color}"/>'


def _legend(events: list[Row], y: float) -> str:
    kinds = {e.kind for e in events}
    entries = []
    if "start" in kinds:
        entries.append(("start", "process starts"))
    if any(is_kill(k) for k in kinds):
        entries.append(("killed", "process killed"))
    if "exit" in kinds:
        entries.append(("exit", "process exits"))
    if any(k in ("ack", "applied", "committed", "saved") for k in kinds):
        entries.append(("applied", "applied / ACK"))
    if any(is_duplicate(e.kind, e.text) for e in events):
        entries.append(("duplicate", "duplicate recognised"))
    if "snapshot" in kinds:
        entries.append(("snapshot", "the judge reads the DB"))
    parts, x = [], LEFT
    for kind, label in entries:
        parts.append(_glyph(kind, kind, x + 6, y, MUTED, legend=True))
        parts.append(_text(x + 18, y + 4, label, color=MUTED, halo=False))
        x += 30 + len(label) * CHAR_WIDTH
    return f'<g class="lk-legend">{"".join(parts)}</g>'


def render(timeline: list[dict], title: str = "What happened, in time order") -> str:
    """The timeline as one `<svg>` element (a string); "" for an empty timeline."""
    if not timeline:
        return ""
    events = rows(timeline)
    actors = lanes(timeline)
    column = {actor: i for i, actor in enumerate(actors)}
    spans = lifetimes(events)
    width = LEFT + LANE_WIDTH * len(actors) + 16
    height = TOP + ROW * len(events) + 22 + 34
    t0 = events[0].t

    def lane_x(actor: str) -> float:
        return LEFT + LANE_WIDTH * column[actor] + LANE_WIDTH / 2

    def row_y(index: int) -> float:
        return TOP + 20 + ROW * index

    bottom = row_y(len(events) - 1) + 16
    out = [f'<svg class="lk-timeline" xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" '
           f'height="{height:.0f}" viewBox="0 0 {width} {height:.0f}" font-family="{FONT}" '
           f'style="max-width:100%;height:auto;background:#fff">',
           f"<title>{escape(title)}</title>"]
    # Lane headers and lifelines.
    for actor in actors:
        x = lane_x(actor)
        out.append(f'<rect x="{x - LANE_WIDTH / 2 + 6}" y="8" width="{LANE_WIDTH - 12}" height="26" rx="5" '
                   f'fill="{LANE_FILL}" stroke="{LINE}"/>')
        out.append(_text(x, 25, actor, anchor="middle", weight="600", size=12, halo=False))
        out.append(f'<line x1="{x}" y1="34" x2="{x}" y2="{bottom}" stroke="{LINE}" stroke-dasharray="3 4"/>')
    for actor, (start, end) in spans.items():
        x, y1 = lane_x(actor), row_y(start)
        y2 = row_y(end) if end is not None else bottom
        out.append(f'<rect x="{x - 4}" y="{y1}" width="8" height="{max(y2 - y1, 2)}" rx="2" fill="#cfd8dc"/>')
    # Time axis label.
    out.append(_text(8, TOP - 6, "time ↓", color=MUTED, halo=False))
    for index, event in enumerate(events):
        y = row_y(index)
        x = lane_x(event.actor)
        out.append(_text(8, y + 4, f"+{event.t - t0:.3f} s", color=MUTED, size=10, halo=False))
        if is_kill(event.kind):
            out.append(f'<line x1="{LEFT}" y1="{y}" x2="{width - 8}" y2="{y}" stroke="{RED}" stroke-width="1" '
                       f'stroke-dasharray="6 4" opacity="0.6"/>')
        sender = _sender(events, index, spans)
        if sender is not None:
            sx = lane_x(sender)
            if outgoing(event.text):  # the server's own message to the process: the arrow points back
                start, end = x, sx + (8 if sx < x else -8)
            else:
                start, end = sx, x - (8 if x > sx else -8)
            direction = 1 if end > start else -1
            out.append(f'<line x1="{start}" y1="{y}" x2="{end}" y2="{y}" stroke="{MUTED}" stroke-width="1.3"/>'
                       f'<polygon points="{end},{y - 4} {end},{y + 4} {end + direction * 6},{y}" fill="{MUTED}"/>')
        label = f"killed: {event.text}" if is_kill(event.kind) and "kill" not in event.text.lower() else event.text
        if sender is not None:
            label = message_label(label, sender)
        duplicate = is_duplicate(event.kind, event.text)
        bold = duplicate or is_kill(event.kind)
        label_width = min(len(label), LABEL_CHARS) * CHAR_WIDTH * (1.1 if bold else 1.0)
        on_right = (sender is None and column[event.actor] < len(actors) / 2) or (sender is not None and x > lane_x(sender))
        if on_right and x + 12 + label_width > width - 4:
            on_right = False
        if not on_right and x - 12 - label_width < LEFT - 4:
            on_right = True
        tx = x + 12 if on_right else x - 12
        if duplicate:
            box_x = (x - 10) if on_right else (x - 16 - label_width)
            out.append(f'<rect class="lk-duplicate" x="{box_x:.1f}" y="{y - 11}" width="{label_width + 26:.1f}" height="22" '
                       f'rx="4" fill="#fff3cd" stroke="{AMBER}" stroke-width="1.5"/>')
        out.append(_glyph(event.kind, event.text, x, y, BLUE))
        color = RED if is_kill(event.kind) else INK
        out.append(_text(tx, y + 4, label, anchor="start" if on_right else "end", color=color, halo=not duplicate,
                         weight="600" if bold else "normal"))
    out.append(_legend(events, bottom + 22))
    out.append("</svg>")
    return "".join(out)
