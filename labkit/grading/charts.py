"""Small bar charts as inline SVG, written by hand, for the class report.

Why not matplotlib: the report needs three kinds of bars; matplotlib would add a dependency
of ~50 MB installed with numpy, fonttools, pillow and friends, import in about a second on
every `grade` run, and write SVGs that embed fonts as paths and differ from run to run (ids,
dates) unless configured. These charts are a few dozen lines, deterministic, a few KB each,
keep their text as text, and need nothing at all offline. Every chart has a table beside it
with the same numbers (for screen readers and for copying); the SVG is `role="img"` with a
label saying what it shows.
"""

from __future__ import annotations

from html import escape

PASSED, FAILED, NOT_STARTED, REVEALED = "#2e7d32", "#c62828", "#b0bec5", "#f9a825"
INK, GRID, BAR = "#263238", "#cfd8dc", "#1565c0"
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


def _svg(width: int, height: int, label: str, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{escape(label)}" font-family="{FONT}" font-size="12">'
            f'<title>{escape(label)}</title>{"".join(body)}</svg>')


def columns(values: list[tuple[str, int]], label: str, x_title: str, y_title: str,
            height: int = 170) -> str:
    """A column chart (a histogram of scores): one column per value, its count on top."""
    top = max((v for _, v in values), default=0) or 1
    step = max(14, min(40, 520 // max(1, len(values))))
    left, bottom, plot = 34, 34, height - 58
    width = left + step * len(values) + 12
    body = [f'<line x1="{left}" y1="{height - bottom}" x2="{width - 6}" y2="{height - bottom}" stroke="{GRID}"/>',
            f'<text x="{left - 6}" y="{height - bottom - plot}" text-anchor="end" fill="{INK}">{top}</text>',
            f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end" fill="{INK}">0</text>',
            f'<text x="{(left + width) // 2}" y="{height - 4}" text-anchor="middle" fill="{INK}">{escape(x_title)}</text>',
            f'<text x="4" y="12" fill="{INK}">{escape(y_title)}</text>']
    for i, (name, value) in enumerate(values):
        x = left + i * step + 2
        h = round(plot * value / top)
        y = height - bottom - h
        body.append(f'<rect x="{x}" y="{y}" width="{step - 4}" height="{h}" fill="{BAR}"/>')
        if value:
            body.append(f'<text x="{x + (step - 4) / 2:g}" y="{y - 3}" text-anchor="middle" fill="{INK}" '
                        f'font-size="11">{value}</text>')
        body.append(f'<text x="{x + (step - 4) / 2:g}" y="{height - bottom + 14}" text-anchor="middle" '
                    f'fill="{INK}">{escape(name)}</text>')
    return _svg(width, height, label, body)


def stacked(rows: list[tuple[str, list[tuple[int, str]]]], label: str, legend: list[tuple[str, str]],
            width: int = 520) -> str:
    """Horizontal bars, each split into coloured parts (passed / failed / not started)."""
    row_h, gap, top_pad = 18, 6, 26
    left = 14 + 7 * max((len(name) for name, _ in rows), default=6)  # room for the longest label
    plot = width - left - 60
    height = top_pad + len(rows) * (row_h + gap) + 4
    body, x = [], left
    for name, colour in legend:
        body.append(f'<rect x="{x}" y="4" width="11" height="11" fill="{colour}"/>'
                    f'<text x="{x + 15}" y="14" fill="{INK}">{escape(name)}</text>')
        x += 15 + 7 * len(name) + 18
    for i, (name, parts) in enumerate(rows):
        y = top_pad + i * (row_h + gap)
        total = sum(value for value, _ in parts) or 1
        body.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" fill="{INK}">{escape(name)}</text>')
        x = float(left)
        for value, colour in parts:
            w = plot * value / total
            if w > 0:
                body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h}" fill="{colour}"/>')
            x += w
        first = parts[0][0] if parts else 0
        body.append(f'<text x="{left + plot + 6}" y="{y + 13}" fill="{INK}">{first / total:.0%}</text>')
    return _svg(width, height, label, body)


def meter(value: int, most: int, colour: str = FAILED, width: int = 90) -> str:
    """A small bar for a table cell; decorative (the number is in the cell beside it)."""
    w = round(width * value / most) if most else 0
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} 10" width="{width}" height="10" '
            f'aria-hidden="true"><rect x="0" y="0" width="{width}" height="10" fill="#eceff1"/>'
            f'<rect x="0" y="0" width="{w}" height="10" fill="{colour}"/></svg>')
