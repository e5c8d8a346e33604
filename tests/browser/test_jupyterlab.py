"""The student's view in a real JupyterLab, driven by headless Chromium.

JupyterLab runs on an ephemeral port with a token, its config/data/runtime dirs in a temp dir,
and serves a temp root holding COPIES of the notebooks (never the repository's). Readiness and
Run All follow docs in /work/shared/FIELD-NOTES.md: wait for the debugger button to be enabled,
then for "Idle"; run all cells from the Run menu. Screenshots go to `artifacts/`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_display import ORDER_BY_ID, OUTBOX, START, execute, solved_notebook  # noqa: E402

from labkit.notebook import build  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
             "@jupyterlab/docmanager-extension:plugin": {"autosave": False}}
ARTIFACTS = ROOT / "artifacts"
RUN_TIMEOUT_MS = 180_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no Chromium at {CHROMIUM}: apt-get install chromium (never `playwright install`)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """One JupyterLab server in its own process group, stopped on every path."""

    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.root.mkdir()
        self.port, self.token = _free_port(), secrets.token_hex(16)
        env = dict(os.environ)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
            path = base / name.lower()
            path.mkdir()
            env[name] = str(path)
        settings = base / "share" / "jupyter" / "lab" / "settings"
        settings.mkdir(parents=True)
        (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.log = (base / "jupyter.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             f"--LabApp.app_settings_dir={settings}", "--ServerApp.port_retries=0"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/api/status?token={self.token}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}")
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("jupyter lab did not answer /api/status")

    def url(self, notebook: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}?token={self.token}"

    def stop(self) -> None:
        import psutil

        # Kernels run in sessions of their own: note every descendant before the server goes.
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        for child in descendants:
            try:
                child.kill()  # anything that outlived the server's own shutdown
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(descendants, timeout=5)
        self.log.close()


@pytest.fixture
def lab(tmp_path_factory):
    """A fresh server per test: no tab, workspace or kernel carried over from another test."""
    server = JupyterLab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    # Tall enough that a whole final-check panel fits for its screenshot.
    context = browser.new_context(viewport={"width": 1200, "height": 2000})
    try:
        yield context.new_page()
    finally:
        context.close()


def shot(page, locator, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))
    return path


def menu(page, top: str, item: str) -> None:
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


def wait_for_kernel(page) -> None:
    page.locator('.jp-NotebookPanel .jp-DebuggerBugButton[aria-disabled="false"]').wait_for(timeout=60_000)
    page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)


def open_and_run_all(page, server: JupyterLab, notebook: str) -> None:
    page.goto(server.url(notebook))
    wait_for_kernel(page)
    menu(page, "Run", "Run All Cells")


def wait_for_panels(page, count: int) -> None:
    """Run All is done when every check cell shows its live panel and the quiz is there."""
    page.locator(".lk-live.lk-quiz").wait_for(timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(f"document.querySelectorAll('.lk-live.lk-step').length >= {count}",
                           timeout=RUN_TIMEOUT_MS)


def place(server: JupyterLab, nb, name: str) -> int:
    """Write a copy into the server's root; returns the number of check cells."""
    nbformat.write(nb, server.root / name)
    return sum(1 for c in nb.cells if "check" in c.metadata.get("labkit", {}))


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
    first = step4.locator(".lk-case-row").first
    expect(first.locator(".lk-toggle")).to_contain_text("✗ every pending row, in outbox order")
    expect(first.locator(".lk-detail")).to_be_visible()  # the first failing case is open
    expect(first.locator(".lk-detail")).to_contain_text("pending(con, 16)")
    expect(first.locator(".lk-nudge")).to_be_visible()
    specific = first.locator(".lk-hint-more")
    expect(specific).to_be_hidden()
    shot(page, step4, "step-failed-nudge.png")
    first.get_by_role("button", name="more help").click()
    expect(specific).to_be_visible()
    expect(specific).to_contain_text("ORDER BY seq")
    shot(page, step4, "step-failed-with-hint.png")

    # Other failing cases start closed and open on a click.
    second = step4.locator(".lk-case-row").nth(1)
    expect(second.locator(".lk-detail")).to_be_hidden()
    second.locator(".lk-toggle").click()
    expect(second.locator(".lk-detail")).to_be_visible()

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
