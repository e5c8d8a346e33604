"""A crash scenario's timeline as an SVG sequence diagram: pure Python, no JavaScript.

One lane per actor, derived from the data (`Evidence.timeline`: `{"t", "actor", "kind",
"text"}`, optionally `"id"`, `"after"`, `"before"`), one row per event, drawn top to bottom in
the order `labkit.views.timeline_order` decides: what caused an event comes before it, then
time (the recorders' clocks differ: see there). Lanes of the same role stay together
("publisher #1", "publisher #2"), in order of first appearance. A lane whose events include a
`start` is a process: its lifetime is drawn as a bar from start to its end (`exit` or a kill).
An event on another lane while exactly one process is alive is drawn as a message from that
process (or to it, when the event's text starts with "→": the server sent it). Kills are
marked across the whole diagram; duplicates recognised by an inbox or a ledger are highlighted.

Readable at 100 %: text is FONT_SIZE (never below MIN_FONT_SIZE), each lane as wide as its
header needs (at least LANE_WIDTH), the picture as wide as its labels need, and never scaled
down to its box: `render` puts it in a box that scrolls sideways. Every event's whole text is
its tooltip (`<title>`) and a row of the table under the picture (`table`), for labels the
picture cuts (beyond LABEL_CHARS), static exports and screen readers. The same string works in
JupyterLab, exported HTML and feedback pages.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from html import escape

from labkit.views import timeline_order

LANE_WIDTH = 160  # the narrowest lane; a lane whose header needs more gets more (`lane_widths`)
LEFT = 84  # the time axis
TOP = 58  # lane headers
ROW = 30
LABEL_CHARS = 160  # longer labels are cut in the picture; the tooltip and the table have them whole
FONT_SIZE = 12
MIN_FONT_SIZE = 11  # no text in the picture is smaller (axis, legend); the picture is never scaled down
CHAR_EM = 0.6  # estimated width of one character, in ems (generous for system-ui, so labels fit)
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
    """"publisher #2", "publisher #1" and "publisher #3b" share the role "publisher"."""
    return re.sub(r"\s*#\d+[a-z]?\s*$", "", actor)


def lanes(timeline: list[dict]) -> list[str]:
    """Actors in display order: roles by first appearance, actors of one role side by side."""
    first_actor: dict[str, int] = {}
    first_role: dict[str, int] = {}
    for index, event in enumerate(timeline):
        actor = str(event.get("actor", "?"))
        first_actor.setdefault(actor, index)
        first_role.setdefault(_role(actor), index)

    def key(actor: str) -> tuple[int, int, str]:
        number = re.search(r"#(\d+)[a-z]?\s*$", actor)
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
    """Events in the order to draw them: causes first, then time (`timeline_order`, the one rule)."""
    events = [Row(_time(e), str(e.get("actor", "?")), str(e.get("kind", "")), str(e.get("text", "")))
              for e in timeline]
    return [events[i] for i in timeline_order.order(timeline)]


def _time(event: dict) -> float:
    try:
        return float(event.get("t") or 0.0)
    except (TypeError, ValueError):
        return 0.0


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
    """The one process alive when a non-process event happened (strictly inside its life, in
    drawing order: causes first, so a stamp from another clock cannot move it out)."""
    event = events[index]
    if event.actor in spans:
        return None
    alive = [actor for actor, (start, end) in spans.items() if start < index and (end is None or index < end)]
    return alive[0] if len(alive) == 1 else None


def char_width(size: int = FONT_SIZE, bold: bool = False) -> float:
    return size * CHAR_EM * (1.1 if bold else 1.0)


def shown(text: str) -> str:
    """A label as the picture shows it: whole up to LABEL_CHARS (the tooltip and the table always)."""
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def lane_widths(actors: list[str]) -> list[int]:
    """Each lane as wide as its header needs, and never narrower than LANE_WIDTH."""
    return [max(LANE_WIDTH, math.ceil(len(a) * char_width(FONT_SIZE, bold=True) + 28)) for a in actors]


def _text(x: float, y: float, text: str, *, anchor: str = "start", color: str = INK, weight: str = "normal",
          size: int = FONT_SIZE, halo: bool = True) -> str:
    size = max(size, MIN_FONT_SIZE)
    label = shown(text)
    halo_attrs = ' stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke"' if halo else ""
    tooltip = f"<title>{escape(text)}</title>" if label != text else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}" font-size="{size}" '
            f'font-weight="{weight}"{halo_attrs}>{tooltip}{escape(label)}</text>')


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
        parts.append(_text(x + 18, y + 4, label, color=MUTED, size=MIN_FONT_SIZE, halo=False))
        x += 30 + len(label) * char_width(MIN_FONT_SIZE)
    return f'<g class="lk-legend">{"".join(parts)}</g>'


def _label(event: Row, sender: str | None) -> str:
    label = f"killed: {event.text}" if is_kill(event.kind) and "kill" not in event.text.lower() else event.text
    return message_label(label, sender) if sender is not None else label


def render(timeline: list[dict], title: str = "What happened, causes first") -> str:
    """The timeline as HTML: the picture in a box that scrolls sideways (never squeezed: its text
    stays at FONT_SIZE, at least MIN_FONT_SIZE), then every event in a table with its full text.
    "" for an empty timeline."""
    if not timeline:
        return ""
    return ('<div class="lk-timeline-figure">'
            # width 0 + min-width 100%: the box is as wide as the panel, and the picture never widens
            # the panel (in a widget's flex layout the panel would otherwise grow to the picture)
            f'<div class="lk-timeline-scroll" style="overflow-x:auto;width:0;min-width:100%">{svg(timeline, title)}'
            f"</div>{table(timeline)}</div>")


def table(timeline: list[dict]) -> str:
    """Every event, in the picture's order, with its whole text: for a static export, a screen
    reader, and any label the picture had to cut."""
    events = rows(timeline)
    if not events:
        return ""
    t0 = events[0].t
    cell = 'style="border:1px solid #cfd8dc;padding:2px 6px;text-align:left;vertical-align:top"'
    text_cell = ('style="border:1px solid #cfd8dc;padding:2px 6px;text-align:left;vertical-align:top;'
                 'white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace"')
    short = cell[:-1] + ';white-space:nowrap"'
    head = "".join(f"<th {cell}>{h}</th>" for h in ("#", "time", "lane", "what", "full text"))
    body = "".join(
        f'<tr class="lk-event-row"><td {short}>{i + 1}</td><td {short}>+{e.t - t0:.3f} s</td>'
        f"<td {short}>{escape(e.actor)}</td><td {short}>{escape(e.kind)}</td>"
        f"<td {text_cell}>{escape(e.text)}</td></tr>"
        for i, e in enumerate(events))
    return ('<details class="lk-timeline-events" style="margin:4px 0">'
            f"<summary style=\"cursor:pointer\">Every event as a table, with its full text ({len(events)} events)"
            "</summary>"
            '<div style="font-size:12px;color:#607d8b;margin:2px 0">In the picture\'s order: what caused an '
            "event comes before it, then time. Times are each recorder's own clock (the judge, a process, "
            "a server, a database's audit trigger in whole milliseconds), so two close ones may look swapped."
            "</div>"
            '<table class="lk-timeline-table" style="border-collapse:collapse;font-size:12px;margin:2px 0">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></details>")


def svg(timeline: list[dict], title: str = "What happened, causes first") -> str:
    """The picture alone: one `<svg>` element (a string); "" for an empty timeline."""
    if not timeline:
        return ""
    events = rows(timeline)
    actors = lanes(timeline)
    column = {actor: i for i, actor in enumerate(actors)}
    widths = lane_widths(actors)
    lefts = [LEFT + sum(widths[:i]) for i in range(len(actors))]
    spans = lifetimes(events)
    t0 = events[0].t

    def lane_x(actor: str) -> float:
        i = column[actor]
        return lefts[i] + widths[i] / 2

    def row_y(index: int) -> float:
        return TOP + 20 + ROW * index

    # Where each label goes: beside its glyph, on the side with room; the picture grows to fit.
    lanes_end = LEFT + sum(widths)
    placed = []
    for index, event in enumerate(events):
        sender = _sender(events, index, spans)
        label = _label(event, sender)
        x = lane_x(event.actor)
        bold = is_duplicate(event.kind, event.text) or is_kill(event.kind)
        label_width = len(shown(label)) * char_width(FONT_SIZE, bold)
        on_right = ((sender is None and column[event.actor] < len(actors) / 2)
                    or (sender is not None and x > lane_x(sender)))
        if on_right and x + 12 + label_width > lanes_end and x - 12 - label_width >= LEFT - 4:
            on_right = False
        if not on_right and x - 12 - label_width < LEFT - 4:
            on_right = True
        placed.append((sender, label, label_width, on_right))
    right_edge = max([lanes_end] + [lane_x(e.actor) + 16 + w for e, (_, _, w, r) in zip(events, placed, strict=True) if r])
    width = math.ceil(right_edge + 16)
    height = TOP + ROW * len(events) + 22 + 34
    bottom = row_y(len(events) - 1) + 16
    # No max-width: a picture scaled down to its box shrinks its text below MIN_FONT_SIZE; the box
    # around it scrolls sideways instead.
    out = [f'<svg class="lk-timeline" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(title)}" '
           f'width="{width}" height="{height:.0f}" viewBox="0 0 {width} {height:.0f}" font-family="{FONT}" '
           f'style="max-width:none;height:auto;background:#fff">',
           f"<title>{escape(title)}</title>"]
    # Lane headers and lifelines.
    for actor in actors:
        x, w = lane_x(actor), widths[column[actor]]
        out.append(f'<rect x="{x - w / 2 + 6}" y="8" width="{w - 12}" height="26" rx="5" '
                   f'fill="{LANE_FILL}" stroke="{LINE}"/>')
        out.append(_text(x, 25, actor, anchor="middle", weight="600", size=FONT_SIZE, halo=False))
        out.append(f'<line x1="{x}" y1="34" x2="{x}" y2="{bottom}" stroke="{LINE}" stroke-dasharray="3 4"/>')
    for actor, (start, end) in spans.items():
        x, y1 = lane_x(actor), row_y(start)
        y2 = row_y(end) if end is not None else bottom
        out.append(f'<rect x="{x - 4}" y="{y1}" width="8" height="{max(y2 - y1, 2)}" rx="2" fill="#cfd8dc"/>')
    out.append(_text(8, TOP - 6, "order ↓", color=MUTED, size=MIN_FONT_SIZE, halo=False))
    for index, (event, (sender, label, label_width, on_right)) in enumerate(zip(events, placed, strict=True)):
        y = row_y(index)
        x = lane_x(event.actor)
        whole = f"#{index + 1}  +{event.t - t0:.3f} s  {event.actor} ({event.kind}): {event.text}"
        out.append(f'<g class="lk-event" data-order="{index + 1}" data-actor="{escape(event.actor)}" '
                   f'data-kind="{escape(event.kind)}"><title>{escape(whole)}</title>')
        out.append(_text(8, y + 4, f"+{event.t - t0:.3f} s", color=MUTED, size=MIN_FONT_SIZE, halo=False))
        if is_kill(event.kind):
            out.append(f'<line x1="{LEFT}" y1="{y}" x2="{width - 8}" y2="{y}" stroke="{RED}" stroke-width="1" '
                       f'stroke-dasharray="6 4" opacity="0.6"/>')
        if sender is not None:
            sx = lane_x(sender)
            if outgoing(event.text):  # the server's own message to the process: the arrow points back
                start, end = x, sx + (8 if sx < x else -8)
            else:
                start, end = sx, x - (8 if x > sx else -8)
            direction = 1 if end > start else -1
            out.append(f'<line x1="{start}" y1="{y}" x2="{end}" y2="{y}" stroke="{MUTED}" stroke-width="1.3"/>'
                       f'<polygon points="{end},{y - 4} {end},{y + 4} {end + direction * 6},{y}" fill="{MUTED}"/>')
        duplicate = is_duplicate(event.kind, event.text)
        bold = duplicate or is_kill(event.kind)
        tx = x + 12 if on_right else x - 12
        # A label on its arrow's side sits just above the arrow, as in any sequence diagram.
        above = sender is not None and on_right == (lane_x(sender) > x) and not duplicate
        ty = y - 5 if above else y + 4
        if duplicate:
            box_x = (x - 10) if on_right else (x - 16 - label_width)
            out.append(f'<rect class="lk-duplicate" x="{box_x:.1f}" y="{y - 11}" width="{label_width + 26:.1f}" '
                       f'height="22" rx="4" fill="#fff3cd" stroke="{AMBER}" stroke-width="1.5"/>')
        out.append(_glyph(event.kind, event.text, x, y, BLUE))
        color = RED if is_kill(event.kind) else INK
        out.append(_text(tx, ty, label, anchor="start" if on_right else "end", color=color, halo=not duplicate,
                         weight="600" if bold else "normal"))
        out.append("</g>")
    out.append(_legend(events, bottom + 22))
    out.append("</svg>")
    return "".join(out)
