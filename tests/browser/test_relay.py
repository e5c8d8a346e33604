"""Lab 03 in a real JupyterLab: the solved notebook's final check shows the crash timeline with
both publishers, the warehouse, the outbox and the tokens.

Reuses the server, browser and page fixtures (conftest.py) and helpers (driver.py) of the browser
tests, and the solved-notebook builder of tests/test_display.py.
"""

from __future__ import annotations

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


def test_relay_final_check_shows_both_publishers_on_the_timeline(lab, page, tmp_path):
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
