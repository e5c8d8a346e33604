"""The student's view in a real JupyterLab, driven by headless Chromium: verdict panels, the
timeline, the progress bar, the quiz, exports and reopened notebooks, on copies of the notebooks
placed in a temp server root (the fresh-clone start is in test_first_hour.py).
"""

from __future__ import annotations

import json
import re
import sys

import pytest

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

from driver import (  # noqa: E402
    BROWSER_MARKS,
    ROOT,
    RUN_TIMEOUT_MS,
    menu,
    open_and_run_all,
    place,
    shot,
    wait_for_kernel,
    wait_for_panels,
)

sys.path.insert(0, str(ROOT / "tests"))

from test_display import ORDER_BY_ID, OUTBOX, START, execute, solved_notebook  # noqa: E402

from labkit.notebook import build  # noqa: E402

pytestmark = BROWSER_MARKS


def test_solved_lab_shows_passing_panels_timeline_and_a_full_progress_bar(lab, page, tmp_path):
    checks = place(lab, solved_notebook(OUTBOX, tmp_path), "01-outbox.ipynb")
    open_and_run_all(page, lab, "01-outbox.ipynb")
    wait_for_panels(page, checks)

    panels = page.locator(".lk-live.lk-step")
    assert panels.count() == checks
    assert page.locator(".lk-live.lk-step.passed").count() == checks
    for i in range(checks):
        assert panels.nth(i).is_visible()
    # The static copies are in the page but hidden while their widget is rendered.
    assert page.locator(".lk-pair").count() >= checks
    assert not any(page.locator(".lk-pair").nth(i).is_visible() for i in range(page.locator(".lk-pair").count()))

    final = page.locator(".lk-live.lk-step", has_text="Final check")
    timeline = final.locator("svg.lk-timeline")
    assert timeline.is_visible()
    assert timeline.locator(".lk-kill").count() == 1 and timeline.locator(".lk-duplicate").count() >= 1
    assert final.get_by_text("Faults injected and seen to take effect").is_visible()
    shot(page, final, "final-check-passed.png")

    bar = page.locator(".lk-progress-live")
    page.wait_for_function("document.querySelector('.lk-progress-live .lk-progress-summary')"
                           f".textContent.startsWith('{checks} of {checks} steps passed')", timeout=30_000)
    fill = bar.locator(".progress-bar")
    width = fill.evaluate("el => el.getBoundingClientRect().width / el.parentElement.getBoundingClientRect().width")
    assert width > 0.99, width
    shot(page, bar, "progress-full.png")
    shot(page, panels.nth(0), "step-passed.png")

    quiz = page.locator(".lk-live.lk-quiz")
    quiz.locator(".lk-option").first.click()
    why = quiz.locator(".lk-quiz-why").first
    why.get_by_text("your answer").wait_for(timeout=10_000)
    answers = json.loads((lab.root / "work" / "quiz-outbox.json").read_text())
    assert answers["answered"] == 1 and answers["answers"]["power-loss"]["choice"] == 0
    shot(page, quiz, "quiz.png")


def test_wrong_pending_shows_the_failing_step_with_its_hint(lab, page, tmp_path):
    checks = place(lab, solved_notebook(OUTBOX, tmp_path, ORDER_BY_ID), "01-outbox-wrong.ipynb")
    open_and_run_all(page, lab, "01-outbox-wrong.ipynb")
    wait_for_panels(page, checks)

    step4 = page.locator(".lk-live.lk-step.failed", has_text="Step 4 — pending")
    assert step4.is_visible()
    # One row per cause: the first shows its case in full with its specific hint inline.
    first = step4.locator(".lk-case-row").first
    expect(first.locator(".lk-toggle").first).to_contain_text("limit 16 with 18 pending")
    detail = first.locator(".lk-case-detail")
    expect(detail).to_be_visible()  # the first failing cause is open
    expect(detail).to_contain_text("pending(con, 16)")
    expect(detail).to_contain_text("ORDER BY seq")
    shot(page, step4, "step-failed-with-hint.png")

    # Other causes start closed and open on a click.
    rows = step4.locator(".lk-case-row")
    if rows.count() > 1:
        second = rows.nth(1)
        expect(second.locator(".lk-case-detail")).to_be_hidden()
        second.locator(".lk-toggle").first.click()
        expect(second.locator(".lk-case-detail")).to_be_visible()

    expect(page.locator(".lk-progress-live .lk-progress-summary")).to_contain_text(f"{checks - 2} of {checks} steps passed")
    shot(page, page.locator(".lk-progress-live"), "progress-partial.png")


def test_exported_html_shows_the_static_verdicts_offline(browser, tmp_path):
    """What a reader of an nbconvert export sees without a kernel or the network."""
    from nbconvert import HTMLExporter

    nb = execute(solved_notebook(OUTBOX, tmp_path), tmp_path / "run")
    html, _ = HTMLExporter().from_notebook_node(nb)
    export = tmp_path / "export.html"
    export.write_text(html)
    context = browser.new_context(viewport={"width": 1100, "height": 900}, offline=True)
    try:
        page = context.new_page()
        page.goto(export.as_uri())
        statics = page.locator(".lk-pair .lk-step")
        assert statics.count() >= 9
        final = page.locator(".lk-pair .lk-step", has_text="Final check")
        assert final.locator("svg.lk-timeline").is_visible()
        shot(page, final, "export-final-check.png")
    finally:
        context.close()


def test_start_here_skeleton_is_calm_and_a_reopened_notebook_keeps_its_verdict(lab, page):
    """The warm-up as a student first gets it; then saved, kernel shut down, page reloaded."""
    place(lab, build.student_notebook(build.parse(START)), "00-start-here.ipynb")
    open_and_run_all(page, lab, "00-start-here.ipynb")
    panel = page.locator(".lk-live.lk-step")
    panel.wait_for(timeout=RUN_TIMEOUT_MS)
    expect(panel).to_have_class(re.compile(r"\bnot_implemented\b"))
    expect(panel).to_contain_text("not implemented yet")
    expect(panel.locator(".lk-bad")).to_have_count(0)  # calm grey, no red cross
    expect(page.locator(".lk-progress-live .lk-progress-summary")).to_contain_text("0 of 1 steps passed")
    shot(page, panel, "step-not-implemented.png")

    menu(page, "File", "Save Notebook")
    page.wait_for_function("!document.querySelector('.jp-mod-dirty')", timeout=30_000)
    menu(page, "Kernel", "Shut Down Kernel")
    page.locator("#jp-main-statusbar").get_by_text(re.compile("No Kernel|Unknown|Idle")).wait_for(timeout=30_000)
    page.reload()
    wait_for_kernel(page)
    # No live widget any more: the static copy shows, and the dead widget output stays hidden.
    expect(page.locator(".lk-live")).to_have_count(0)
    static = page.locator(".lk-pair .lk-step")
    expect(static).to_be_visible()
    expect(static).to_contain_text("not implemented yet")
    expect(page.locator(".lk-pair .lk-progress").first).to_be_visible()
    for text in ("Error displaying widget", "Loading widget"):
        hits = page.get_by_text(text)
        assert not any(hits.nth(i).is_visible() for i in range(hits.count())), text
    shot(page, static, "step-reopened-static.png")
