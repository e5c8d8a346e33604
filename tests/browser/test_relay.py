"""Lab 03 in a real JupyterLab: the solved notebook's final check shows the crash timeline with
both publishers, the warehouse, the outbox and the tokens.

Reuses the server, browser and page helpers of tests/browser/test_jupyterlab.py (imported, not
copied: fixtures included), and the solved-notebook builder of tests/test_display.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_display import SOURCES, solved_notebook  # noqa: E402
from test_jupyterlab import (  # noqa: E402, F401  (browser, lab, page: fixtures; pytestmark: the marks)
    RUN_TIMEOUT_MS,
    browser,
    lab,
    open_and_run_all,
    page,
    place,
    pytestmark,
    shot,
    wait_for_panels,
)

RELAY = SOURCES / "03-relay.md"


def test_relay_final_check_shows_both_publishers_on_the_timeline(lab, page, tmp_path):  # noqa: F811
    checks = place(lab, solved_notebook(RELAY, tmp_path), "03-relay.ipynb")
    open_and_run_all(page, lab, "03-relay.ipynb")
    wait_for_panels(page, checks)

    panels = page.locator(".lk-live.lk-step")
    assert page.locator(".lk-live.lk-step.passed").count() == checks
    final = panels.filter(has_text="Final check")
    timeline = final.locator("svg.lk-timeline")
    timeline.wait_for(timeout=RUN_TIMEOUT_MS)
    assert timeline.is_visible()
    lanes = timeline.locator("text").all_text_contents()
    for lane in ("publisher A #1", "publisher A #2", "publisher B", "warehouse", "outbox"):
        assert lane in lanes, f"no lane {lane!r} on the timeline: {lanes[:12]}"
    assert timeline.locator(".lk-kill").count() == 1  # A #1, killed in after_claim
    assert timeline.locator(".lk-duplicate").count() >= 1  # A #2's late send of snack-2
    assert any("token" in text for text in lanes)
    box = timeline.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 300
    assert final.get_by_text("Faults injected and seen to take effect").is_visible()
    shot(page, final, "relay-final-check.png")
