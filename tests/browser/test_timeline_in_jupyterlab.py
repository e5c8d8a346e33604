"""Lab 03's final timeline in a real JupyterLab tells the truth (issue "The student's first two
hours, part two", item 2): every POST above the publisher's "sent, saved under token N" it led
to, no text under 11 px at 100 % zoom (the picture scrolls sideways instead of shrinking), and
A's whole return value, `'stale': 1`, in the table under the picture.

The solved notebook (every step's reference in its cell) as tests/browser/test_relay.py runs it.
"""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from driver import (  # noqa: E402
    BROWSER_MARKS,
    ROOT,
    RUN_TIMEOUT_MS,
    open_and_run_all,
    place,
    shot,
    wait_for_panels,
)

sys.path.insert(0, str(ROOT / "tests"))

from test_display import SOURCES, solved_notebook  # noqa: E402

pytestmark = BROWSER_MARKS

RELAY = SOURCES / "03-relay.md"
MIN_PX = 11


def test_relay_final_timeline_draws_causes_first_at_a_readable_size(lab, page, tmp_path):
    checks = place(lab, solved_notebook(RELAY, tmp_path), "03-relay.ipynb")
    open_and_run_all(page, lab, "03-relay.ipynb")
    wait_for_panels(page, checks)
    final = page.locator(".lk-live.lk-step").filter(has_text="Final check")
    timeline = final.locator("svg.lk-timeline")
    timeline.wait_for(timeout=RUN_TIMEOUT_MS)

    # Order, as drawn: each event's group carries its whole text in its tooltip.
    drawn = timeline.evaluate("""svg => [...svg.querySelectorAll('g.lk-event')].map(g => ({
        title: g.querySelector('title').textContent, y: g.getBoundingClientRect().top}))""")
    posts = {m.groups(): e["y"] for e in drawn if (m := re.search(r"\(\w+\): POST (\S+) with token (\d+)", e["title"]))}
    saves = [(m.groups(), e["y"]) for e in drawn
             if (m := re.search(r"\): (\S+): sent, saved under token (\d+)$", e["title"]))]
    assert len(saves) == 7, [e["title"] for e in drawn]
    for key, y in saves:
        assert key in posts and posts[key] < y, f"{key}: the save is drawn above its POST"

    # Size, as rendered: no text below MIN_PX at 100 % zoom, the picture scrolls instead.
    sizes = timeline.evaluate("""svg => {
        const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
        return [...svg.querySelectorAll('text')].map(t => parseFloat(getComputedStyle(t).fontSize) * scale); }""")
    assert sizes and min(sizes) >= MIN_PX, min(sizes)
    scroll = final.locator(".lk-timeline-scroll")
    overflow = scroll.evaluate("""b => [getComputedStyle(b).overflowX, b.scrollWidth, b.clientWidth,
        b.closest('.lk-step').getBoundingClientRect().width]""")
    assert overflow[0] == "auto" and overflow[1] > overflow[2]  # eight lanes: wider than the panel
    assert overflow[2] <= overflow[3]  # the picture scrolls inside the panel, never widens it

    # The whole return value, in the table under the picture.
    table = final.locator("table.lk-timeline-table")
    assert table.locator("tr.lk-event-row").count() == len(drawn)
    final.locator("details.lk-timeline-events > summary").click()
    stale = table.locator("tr.lk-event-row", has_text="publisher A #2").filter(has_text="relay_once returned")
    assert stale.count() == 1 and "'stale': 1}" in stale.inner_text()
    shot(page, final.locator(".lk-timeline-box"), "relay-timeline-after-jupyterlab.png")
