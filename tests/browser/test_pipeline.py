"""Lab 04 (pipeline) in a real JupyterLab, top to bottom, as a self-study reader with the reference
revealed step by step: the released notebook (every step still the skeleton) opens on a fresh
kernel; the setup and provided-code cells run; then for each step 1..8 a scratch cell below the
step runs `lab.reveal(N, confirm=True)`, the code it shows goes into the `%%step N` cell, that cell
runs, and its check (hidden source, run without revealing it) turns green. Finally the final check
runs real PostgreSQL and Valkey servers, kills them, and passes with its timeline: lanes for the
publishers, consumers and both servers, the kills marked, and the faults it saw take effect. Every
reveal is recorded in `work/revealed-pipeline.json` beside the notebook.

So it proves that what `lab.reveal` shows is exactly what passes in the student's own notebook:
copied from the page (not read from the lesson source), typed into the cell, saved by `%%step`,
judged by the kernel's warm judge. Screenshots: `artifacts/pipeline-reveal-4.png`,
`artifacts/pipeline-step-4-passed.png`, `artifacts/pipeline-final-check.png`, its timeline
scrolled to the servers' lanes (`pipeline-final-timeline-servers.png`) and the whole picture
(`pipeline-final-timeline.png`). The time of each reveal, step cell and check
is printed (`-rP` shows it).
"""

from __future__ import annotations

import json
import re
import time

import nbformat
import pytest

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

from driver import (  # noqa: E402
    ACTIVE,
    BROWSER_MARKS,
    ROOT,
    RUN_TIMEOUT_MS,
    cells,
    place,
    run_cell,
    shot,
    wait_cell_done,
    wait_for_kernel,
)

# Eight checks and a final check that starts, kills and restarts two servers, one after the
# other, each bounded by RUN_TIMEOUT_MS: more than the suite's default 300 s on a loaded machine.
pytestmark = [*BROWSER_MARKS, pytest.mark.timeout(1800)]

NOTEBOOK = "04-pipeline.ipynb"
LAB = "pipeline"
STEPS = [str(n) for n in range(1, 9)]
SHOT_STEP = "4"  # the mid-way step whose reveal and passing panel are kept as screenshots


def _index(nb, found) -> int:
    hits = [i for i, cell in enumerate(nb.cells) if found(cell)]
    assert len(hits) == 1, hits
    return hits[0]


def step_index(nb, step: str) -> int:
    return _index(nb, lambda c: c.cell_type == "code" and c.source.startswith(f"%%step {step}\n"))


def check_index(nb, step: str) -> int:
    return _index(nb, lambda c: c.metadata.get("labkit", {}).get("check") == step)


def _command_mode_on(page, index: int) -> None:
    """Select one cell by a mousedown on the cell itself (as driver.run_cell does) and leave its
    editor: the next keys are notebook commands."""
    cell = cells(page).nth(index)
    cell.scroll_into_view_if_needed(timeout=30_000)
    cell.dispatch_event("mousedown", {"button": 0})
    page.locator(f"{ACTIVE} .jp-Notebook").focus()
    page.keyboard.press("Escape")


def _type_into(page, index: int, source: str) -> None:
    """Replace a cell's text, as tests/browser/test_kernel_explains.py does: insert_text, so the
    editor does not auto-indent or close brackets."""
    editor = cells(page).nth(index).locator(".cm-content")
    editor.scroll_into_view_if_needed(timeout=30_000)
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(source)


def _wait_count(page, count: int) -> None:
    page.wait_for_function(
        "([active, n]) => document.querySelectorAll(active + ' .jp-Notebook .jp-Cell').length === n",
        arg=[ACTIVE, count], timeout=30_000)


def reveal_below(page, step_at: int, step: str, total: int) -> str:
    """A scratch cell below the step cell runs `lab.reveal(N, confirm=True)`; the code it shows
    (the `<pre>` of display.code_html), read from the page. The scratch cell is deleted after,
    so the notebook's indexes stay those of the file."""
    _command_mode_on(page, step_at)
    page.keyboard.press("b")
    _wait_count(page, total + 1)
    scratch = step_at + 1
    _type_into(page, scratch, f"lab.reveal({step}, confirm=True)")
    page.keyboard.press("Control+Enter")  # run in place: no new cell below
    wait_cell_done(page, scratch)
    shown = cells(page).nth(scratch).locator(".jp-OutputArea-output .lk-step")
    expect(shown.locator(".lk-head")).to_contain_text(f"Step {step}'s reference solution", timeout=30_000)
    if step == SHOT_STEP:
        shot(page, shown, f"pipeline-reveal-{step}.png")
    code = shown.locator("pre.lk-trace").text_content()
    _command_mode_on(page, scratch)
    page.keyboard.press("d")
    page.keyboard.press("d")
    _wait_count(page, total)
    assert "lab.reveal" not in cells(page).nth(scratch).inner_text()  # the check cell is back below the step
    return code


def wait_passed(page, index: int, what: str):
    """The live panel of the check cell at `index`, once it shows; it must be green."""
    panel = cells(page).nth(index).locator(".lk-live.lk-step")
    panel.wait_for(timeout=RUN_TIMEOUT_MS)
    classes = panel.get_attribute("class") or ""
    assert re.search(r"\bpassed\b", classes), f"{what} did not pass ({classes}):\n{panel.inner_text()[:3000]}"
    return panel


def shoot_final(page, final) -> None:
    """Three pictures of the final panel. The panel whole, as the page shows it: the window made
    as tall as the panel needs (it is taller than the fixture's 2000 px, and the notebook clips
    what is outside its own scroll area). The timeline's box scrolled sideways to the servers'
    lanes, as a reader scrolls to them. And the whole picture: the same `<svg>` in a blank page as
    wide as it, since in the panel (62em at most) its box shows only the first lanes."""
    size = page.viewport_size
    try:
        height = final.bounding_box()["height"]
        page.set_viewport_size({"width": size["width"], "height": max(size["height"], int(height) + 400)})
        shot(page, final, "pipeline-final-check.png")
        box = final.locator(".lk-timeline-scroll")
        box.evaluate("""b => { const svg = b.querySelector('svg.lk-timeline');
            const lane = [...svg.querySelectorAll(':scope > text')].find(t => t.textContent === 'Valkey');
            b.scrollLeft = lane.getBBox().x - 120; }""")
        shot(page, box, "pipeline-final-timeline-servers.png")
    finally:
        page.set_viewport_size(size)
    picture = final.locator("svg.lk-timeline").evaluate("svg => svg.outerHTML")
    alone = page.context.new_page()
    try:
        alone.set_content(f"<body style='margin:0;background:#fff'>{picture}</body>")
        shot(alone, alone.locator("svg.lk-timeline"), "pipeline-final-timeline.png")
    finally:
        alone.close()


def test_pipeline_revealed_step_by_step_passes_every_check_and_the_final_timeline(lab, page):
    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    place(lab, nb, NOTEBOOK)
    total = len(nb.cells)
    times: list[tuple[str, float]] = []

    def timed(label: str, started: float) -> None:
        times.append((label, round(time.monotonic() - started, 1)))

    started = time.monotonic()
    page.goto(lab.url(NOTEBOOK))
    wait_for_kernel(page)
    _wait_count(page, total)
    timed("open + kernel", started)
    # From the top to the first step cell: the setup cell (`lab = Lab("pipeline")`) and the
    # provided-code cell (`%%step header`).
    first_step = step_index(nb, "1")
    for index, cell in enumerate(nb.cells[:first_step]):
        if cell.cell_type == "code":
            started = time.monotonic()
            run_cell(page, index)
            wait_cell_done(page, index, timeout=90_000)
            timed(f"cell {index} ({cell.source.splitlines()[0][:30]})", started)
    expect(page.locator(".lk-progress-live .lk-progress-summary")).to_contain_text("0 of", timeout=30_000)

    for step in STEPS:
        at, check = step_index(nb, step), check_index(nb, step)
        started = time.monotonic()
        code = reveal_below(page, at, step, total)
        timed(f"step {step}: reveal", started)
        body = code.split("\n", 1)[1] if code.startswith(f"%%step {step}\n") else code
        assert "NotImplementedError" not in body and body.strip(), code[:500]

        started = time.monotonic()
        _type_into(page, at, f"%%step {step}\n{body}")
        page.keyboard.press("Shift+Enter")
        wait_cell_done(page, at, timeout=90_000)
        timed(f"step {step}: step cell", started)
        outputs = cells(page).nth(at).locator(".jp-OutputArea-output")
        said = " ".join(outputs.nth(i).inner_text() for i in range(outputs.count()))
        assert "NOT saved" not in said and "Error" not in said, said[:2000]
        saved = lab.root / "work" / LAB / "parts" / f"{step}.py"
        assert saved.read_text(encoding="utf-8").rstrip() == body.rstrip(), f"step {step}: the editor changed the code"

        started = time.monotonic()
        run_cell(page, check)
        panel = wait_passed(page, check, f"step {step}'s check")
        timed(f"step {step}: check", started)
        expect(panel.locator(".lk-head")).to_contain_text(f"Step {step}")
        if step == SHOT_STEP:
            shot(page, panel, f"pipeline-step-{step}-passed.png")

    final_at = check_index(nb, "final")
    started = time.monotonic()
    run_cell(page, final_at)
    final = wait_passed(page, final_at, "the final check")
    timed("final check", started)
    expect(final).to_contain_text("Final check")
    timeline = final.locator("svg.lk-timeline")
    expect(timeline).to_be_visible()
    # Lane headers: the bold texts along the top of the picture.
    lanes = timeline.evaluate("svg => [...svg.querySelectorAll(':scope > text[font-weight=\"600\"]')]"
                              ".map(t => t.textContent)")
    for lane in ("publisher #1", "publisher #2", "consumer A", "consumer B", "consumer E", "PostgreSQL", "Valkey"):
        assert lane in lanes, f"no lane {lane!r} on the timeline: {lanes}"
    kills = timeline.locator("g.lk-event[data-kind='killed']")
    killed = {kills.nth(i).get_attribute("data-actor") for i in range(kills.count())}
    assert {"publisher #1", "consumer A", "Valkey", "PostgreSQL"} <= killed, killed
    assert timeline.locator(".lk-kill").count() >= 4
    # The stream's entries with their ids and fences: snack-1 twice, the second with a larger fence.
    entries = timeline.locator("g.lk-event[data-actor='Valkey'][data-kind='entry'] > title").all_text_contents()
    fences = [int(m.group(1)) for e in entries if (m := re.search(r": \d+-\d+: snack-1 with fence (\d+)$", e))]
    assert len(fences) == 2 and fences[0] < fences[1], entries
    assert timeline.locator("g.lk-event[data-actor='Valkey'][data-kind='restarted']").count() == 1
    assert timeline.locator("g.lk-event[data-actor='PostgreSQL'][data-kind='restarted']").count() == 1
    assert final.get_by_text("Faults injected and seen to take effect").is_visible()
    shoot_final(page, final)

    expect(page.locator(".lk-progress-live .lk-progress-summary")).to_contain_text(
        f"{len(STEPS) + 1} of {len(STEPS) + 1} steps passed", timeout=30_000)
    record = json.loads((lab.root / "work" / f"revealed-{LAB}.json").read_text(encoding="utf-8"))
    assert record["lab"] == LAB and sorted(record["steps"], key=int) == STEPS, record
    assert not any(entry["passed_before"] for entry in record["steps"].values()), record

    print("\n".join(f"{label}: {seconds} s" for label, seconds in times))
    print("lanes:", lanes)
