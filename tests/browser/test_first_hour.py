"""A new student's first hour, in a fresh clone, started exactly as the README says.

The module clones this checkout (with its uncommitted changes) into a temp dir and runs the
README's start command (its last `&&` part: `.venv/bin/python -m labkit start`, with this
test's own interpreter and an ephemeral port and token). Each test then opens a notebook of
the student's workspace on a fresh kernel and does what a student does. Screenshots go to
`artifacts/first-hour-*.png`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

from driver import (  # noqa: E402
    ARTIFACTS,
    BROWSER_MARKS,
    ROOT,
    RUN_TIMEOUT_MS,
    JupyterLab,
    cells,
    menu,
    restart_kernel,
    run_cell,
    shot,
    visible_reds,
    wait_for_kernel,
    wait_for_panels,
)

from labkit.notebook import release  # noqa: E402

pytestmark = BROWSER_MARKS


def readme_start_command() -> list[str]:
    """The README's install-and-start command, its start part run with this interpreter."""
    block = re.search(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text()).group(1)
    start = block.split("&&")[-1].split()
    assert start == [".venv/bin/python", "-m", "labkit", "start"], block
    return [sys.executable, *start[1:]]


def fresh_clone(dest: Path) -> Path:
    """`git clone` of this checkout, plus its uncommitted changes: the code under test."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True, timeout=120)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "HEAD", "--binary"], capture_output=True,
                          check=True, timeout=60).stdout
    if diff.strip():
        subprocess.run(["git", "-C", str(dest), "apply", "--whitespace=nowarn"], input=diff, check=True, timeout=60)
    new = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--others", "--exclude-standard", "-z"],
                         capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, new):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest


def start_course(clone: Path, base: Path) -> JupyterLab:
    base.mkdir(exist_ok=True)
    return JupyterLab(base, command=readme_start_command(), cwd=clone, pythonpath=clone)


class Course:
    """A fresh clone with the course started in it; `restart()` stops it and starts it again,
    as a student does after a `git pull`."""

    def __init__(self, clone: Path, base: Path) -> None:
        self.clone, self.base, self.starts = clone, base, 0
        self.server = self._start()

    def _start(self) -> JupyterLab:
        self.starts += 1
        return start_course(self.clone, self.base / f"jupyter-{self.starts}")

    def restart(self) -> None:
        self.server.stop()
        self.server = self._start()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("first-hour")
    started = Course(fresh_clone(base / "clone"), base)
    try:
        yield started
    finally:
        started.server.stop()


def course_notebook(clone: Path, name: str):
    return nbformat.read(clone / "notebooks" / name, as_version=4)


def index_of(nb, cell_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.get("id") == cell_id)


def open_fresh(page, server: JupyterLab, notebook: str) -> None:
    server.shut_down_kernels()
    page.goto(server.url(notebook, reset=True))
    wait_for_kernel(page)


def test_the_file_browser_shows_the_workspace_notebooks_and_no_reference_code(course, page):
    clone, server = course.clone, course.server
    workspace = clone / "workspace"
    page.goto(server.url(reset=True))
    listing = page.locator(".jp-DirListing-content .jp-DirListing-itemText")
    listing.first.wait_for(timeout=60_000)
    names = sorted(listing.nth(i).inner_text() for i in range(listing.count()))
    student_notebooks = sorted(p.name for p in (clone / "notebooks").glob("*.ipynb"))
    assert len(student_notebooks) >= 3 and names == sorted([*student_notebooks, "work"])
    # Everything the server could hand out, hidden files included, against every reference block.
    assert release.leaks(workspace, release.solution_blocks(clone / "notebooks" / "source")) == []
    ignored = subprocess.run(["git", "-C", str(clone), "check-ignore", "-q", "workspace/01-outbox.ipynb"], timeout=60)
    assert ignored.returncode == 0, "git must ignore the workspace: a course update cannot conflict with it"
    box = page.locator("#filebrowser").bounding_box()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "first-hour-file-browser.png"),
                    clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": 190})


def test_run_all_on_the_untouched_lab_shows_no_red_anywhere(course, page):
    clone, server = course.clone, course.server
    nb = course_notebook(clone, "01-outbox.ipynb")
    checks = sum(1 for c in nb.cells if "check" in c.metadata.get("labkit", {}))
    open_fresh(page, server, "01-outbox.ipynb")
    menu(page, "Run", "Run All Cells")
    wait_for_panels(page, checks)
    page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=RUN_TIMEOUT_MS)
    grey = page.locator(".lk-live.lk-step.not_implemented")
    expect(grey).to_have_count(checks)
    assert visible_reds(page) == []
    bar = page.locator(".lk-progress-live")
    expect(bar).to_contain_text("0 of 9 steps passed")
    expect(bar).to_contain_text("Next: step 1 (validate_event)")
    shot(page, bar, "first-hour-progress-untouched.png")
    shot(page, grey.nth(2), "first-hour-untouched-step.png")


def test_a_check_before_its_step_cell_is_grey_with_the_next_action(course, page):
    clone, server = course.clone, course.server
    nb = course_notebook(clone, "00-start-here.ipynb")
    open_fresh(page, server, "00-start-here.ipynb")
    run_cell(page, index_of(nb, "start-here-setup-1"))
    page.locator(".lk-progress-live").wait_for(timeout=60_000)
    check = index_of(nb, "start-here-check-1")
    run_cell(page, check)
    panel = cells(page).nth(check).locator(".lk-live.lk-step")
    panel.wait_for(timeout=RUN_TIMEOUT_MS)
    expect(panel).to_have_class(re.compile(r"\bnot_implemented\b"))
    expect(panel).to_contain_text("not run yet")
    expect(panel).to_contain_text("Run the %%step 1 cell above first")
    assert visible_reds(page) == []
    shot(page, panel, "first-hour-check-before-step.png")


def test_a_syntax_error_shows_the_cells_own_line_and_is_not_saved(course, page):
    clone, server = course.clone, course.server
    nb = course_notebook(clone, "00-start-here.ipynb")
    open_fresh(page, server, "00-start-here.ipynb")
    for cell_id in ("start-here-setup-1", "start-here-step-header"):
        run_cell(page, index_of(nb, cell_id))
    step = cells(page).nth(index_of(nb, "start-here-step-1"))
    step.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text('%%step 1\ndef normalize_sku(s):\n    if s = "":\n        return s\n')
    page.keyboard.press("Shift+Enter")
    error = step.locator(".jp-OutputArea-output")
    error.first.wait_for(timeout=60_000)
    text = error.first.inner_text()
    assert "SyntaxError in your `%%step 1` cell" in text and "line 3)" in text
    assert 'if s = "":' in text and "^" in text and "was NOT saved" in text
    assert "labkit" not in text and "site-packages" not in text and "File " not in text
    assert not (clone / "workspace" / "work" / "start-here" / "parts" / "1.py").exists()
    shot(page, step, "first-hour-syntax-error.png")


def test_a_restart_then_the_setup_cell_brings_back_live_widgets_and_saved_quiz_clicks(course, page):
    clone, server = course.clone, course.server
    nb = course_notebook(clone, "02-vending.ipynb")
    answers = clone / "workspace" / "work" / "quiz-vending.json"
    checks = sum(1 for c in nb.cells if "check" in c.metadata.get("labkit", {}))
    open_fresh(page, server, "02-vending.ipynb")
    menu(page, "Run", "Run All Cells")
    wait_for_panels(page, checks)
    quiz = page.locator(".lk-live.lk-quiz")
    quiz.locator(".lk-option").nth(1).click()  # question 1, option b
    quiz.locator(".lk-quiz-why").first.get_by_text("your answer").wait_for(timeout=30_000)
    assert json.loads(answers.read_text())["answered"] == 1

    restart_kernel(page)
    page.locator(".lk-restart-note").first.wait_for(state="visible", timeout=30_000)
    # No broken-link widget and no error: each dead widget gives way to its saved copy ...
    assert not [r for r in visible_reds(page) if r.startswith(("broken widget", "error output"))]
    statics = page.locator(".lk-pair .lk-step")
    assert sum(statics.nth(i).is_visible() for i in range(statics.count())) == checks
    # ... and the quiz's saved copy shows the answer given in the widget, not the quiz as first shown.
    expect(page.locator(".lk-pair .lk-quiz").first).to_contain_text("← your answer")
    shot(page, cells(page).nth(index_of(nb, "vending-check-1")), "first-hour-after-restart.png")

    check = index_of(nb, "vending-check-1")  # a check before the setup cell: says what to do
    run_cell(page, check)
    expect(cells(page).nth(check)).to_contain_text("Run the setup cell at the top of this notebook first",
                                                   timeout=60_000)
    assert "NameError" not in cells(page).nth(check).inner_text()

    run_cell(page, index_of(nb, "vending-setup-1"))
    live_bar = page.locator(".lk-progress-live:not(.jupyter-widgets-disconnected)")
    live_bar.wait_for(timeout=60_000)
    expect(live_bar).to_contain_text("0 of 8 steps passed")

    run_cell(page, index_of(nb, next(c.id for c in nb.cells if c.metadata.get("labkit", {}).get("quiz"))))
    live_quiz = page.locator(".lk-live.lk-quiz:not(.jupyter-widgets-disconnected)")
    live_quiz.wait_for(timeout=60_000)
    expect(live_quiz.locator(".lk-quiz-why").first).to_contain_text("your answer")  # the saved click
    live_quiz.locator(".lk-option").nth(6).click()  # question 2, option c
    live_quiz.locator(".lk-quiz-why").nth(1).get_by_text("your answer").wait_for(timeout=30_000)
    saved = json.loads(answers.read_text())
    assert saved["answered"] == 2 and saved["answers"]["one-transaction"]["choice"] == 2
    assert not [r for r in visible_reds(page) if r.startswith(("broken widget", "error output"))]
    shot(page, live_quiz, "first-hour-quiz-after-restart.png")


def test_a_course_update_keeps_the_students_step_code(course, page):
    """Last in this file: it restarts the course, as a student does after `git pull`."""
    clone = course.clone
    nb = course_notebook(clone, "01-outbox.ipynb")
    step3 = index_of(nb, "outbox-step-3")
    mine = "%%step 3\ndef accept(con, event):\n    return 'my own accept, before the update'\n"
    open_fresh(page, course.server, "01-outbox.ipynb")
    editor = cells(page).nth(step3).locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(mine)
    page.keyboard.press("Escape")
    menu(page, "File", "Save Notebook")
    page.wait_for_function("!document.querySelector('.jp-mod-dirty')", timeout=30_000)

    # The course changes lab 01 (as a `git pull` would bring it), and the student starts again.
    updated = course_notebook(clone, "01-outbox.ipynb")
    updated.cells[0].source += "\n\n*Updated: the story has a new paragraph.*"
    nbformat.write(updated, clone / "notebooks" / "01-outbox.ipynb")
    subprocess.run(["git", "-C", str(clone), "-c", "user.name=course", "-c", "user.email=course@example.org",
                    "commit", "-q", "-am", "a course update"], check=True, timeout=60)
    course.restart()

    open_fresh(page, course.server, "01-outbox.ipynb")
    expect(cells(page).nth(0)).to_contain_text("Updated: the story has a new paragraph.")
    step = cells(page).nth(step3)
    step.scroll_into_view_if_needed()
    expect(step).to_contain_text("my own accept, before the update")
    assert list((clone / "workspace" / "work" / "backups").glob("01-outbox-*.ipynb"))
    shot(page, step, "first-hour-after-update.png")


def test_what_the_check_tries_opens_above_the_step_and_reads_as_plain_words(course, page):
    """Step 1's rules, unfolded in JupyterLab: each rule's name in code, the contract's own
    characters ('_', '*', '\\t', '$') shown as written, never as emphasis, escapes or LaTeX."""
    nb = course_notebook(course.clone, "01-outbox.ipynb")
    open_fresh(page, course.server, "01-outbox.ipynb")
    rules = cells(page).nth(index_of(nb, "outbox-rules-1"))
    rules.scroll_into_view_if_needed()
    summary = rules.locator("summary")
    expect(summary).to_contain_text("What the check tries")
    expect(rules.locator("li").first).to_be_hidden()  # folded until asked
    summary.click()
    expect(rules.locator("li code", has_text="1.id-rest")).to_be_visible()
    text = rules.inner_text()
    assert "'_'" in text and "'*'" in text and "\\t" in text, text
    assert "\\_" not in text and "\\*" not in text, text
    assert rules.locator("em, .MathJax, mjx-container").count() == 0
    shot(page, rules, "first-hour-what-the-check-tries.png")
