"""Driving JupyterLab in headless Chromium: one server in its own process group, the page helpers.

Readiness and Run All follow /work/shared/FIELD-NOTES.md: wait for the debugger button to be
enabled, then for "Idle"; run all cells from the Run menu. Screenshots go to `artifacts/`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
             "@jupyterlab/docmanager-extension:plugin": {"autosave": False}}
ARTIFACTS = ROOT / "artifacts"
RUN_TIMEOUT_MS = 180_000
class JupyterLab:
    """One JupyterLab server in its own process group, on an ephemeral port with a token, its
    Jupyter config/data/runtime dirs in `base`; stopped on every path.

    By default it serves `base/root`, a temp folder the test fills with copies of notebooks.
    Given `command` (e.g. the README's `python -m labkit start`) and `cwd`, it runs that instead;
    either way the port is read from the server's own runtime file, so no port is guessed.
    """

    def __init__(self, base: Path, command: list[str] | None = None, cwd: Path | None = None,
                 pythonpath: Path = ROOT) -> None:
        self.base = base
        self.token = secrets.token_hex(16)
        env = dict(os.environ)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
            path = base / name.lower()
            path.mkdir(exist_ok=True)
            env[name] = str(path)
        # The kernels import labkit and checks from this checkout (or the clone under test).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
        if command is None:
            self.root = base / "root"
            self.root.mkdir()
            settings = base / "share" / "jupyter" / "lab" / "settings"
            settings.mkdir(parents=True)
            (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
            command = [sys.executable, "-m", "jupyter", "lab", "--allow-root", f"--ServerApp.root_dir={self.root}",
                       f"--LabApp.app_settings_dir={settings}"]
        command = [*command, "--no-browser", "--ip=127.0.0.1", "--port=0", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}"]
        self.log_path = base / "jupyter.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        runtime = self.base / "jupyter_runtime_dir" / f"jpserver-{self.proc.pid}.json"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                self.port = json.loads(runtime.read_text())["port"]
                with opener.open(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
        raise TimeoutError(f"jupyter lab did not answer /api/status: {self.log_path.read_text()[-2000:]}")

    def api(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}?token={self.token}", method=method)
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """Every notebook's kernel goes: the next test opens its notebook on a fresh kernel."""
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def url(self, notebook: str = "", reset: bool = False) -> str:
        """A notebook's page (or the file browser); `reset` opens it alone, not in the saved layout."""
        path = f"/lab/tree/{notebook}" if notebook else "/lab"
        return f"http://127.0.0.1:{self.port}{path}?token={self.token}{'&reset' if reset else ''}"

    def stop(self) -> None:
        # Kernels run in sessions of their own; the server shuts them down on SIGTERM.
        stop_session(self.proc, signal.SIGTERM, grace=15)
        self.log.close()


def stop_session(proc: subprocess.Popen, polite: int, grace: float, kill_group: bool = False) -> None:
    """Stop `proc`, the leader of a session of its own, if it still runs: `polite` to its group and
    up to `grace` s, then SIGKILL to the group (always with `kill_group`, else only if the leader
    outlived the grace); then SIGKILL to every descendant noted first, and collect them."""
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    if proc.poll() is None:
        late = False
        try:
            os.killpg(proc.pid, polite)
            proc.wait(timeout=grace)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            late = True
        if late or kill_group:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)
    for child in descendants:
        try:
            child.kill()  # anything that outlived the leader's own shutdown
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(descendants, timeout=5)
    collect_descendants(descendants, proc.pid)


def collect_descendants(descendants: list, parent: int | None = None) -> None:
    """Collect `descendants` (psutil processes) that re-parented to this process.

    Once a test made this process a subreaper (any in-process judge run does), what outlives its
    parent comes here: uncollected, it stays a zombie that a later test counting zombies finds
    (a CI run did)."""
    from labkit.sandbox import reaper

    pids = {p.pid for p in descendants}
    reaper.collect(pids, time.monotonic() + 5, frozenset({*pids, *([parent] if parent else [])}))


def shot(page, locator, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))
    return path


def menu(page, top: str, item: str) -> None:
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


ACTIVE = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook tab on show


def wait_for_kernel(page) -> None:
    page.locator(f'{ACTIVE} .jp-DebuggerBugButton[aria-disabled="false"]').wait_for(timeout=90_000)
    page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=90_000)


def open_and_run_all(page, server: JupyterLab, notebook: str) -> None:
    page.goto(server.url(notebook))
    try:
        wait_for_kernel(page)
    except Exception as exc:  # Playwright's timeout says nothing of why: the server's log does
        raise AssertionError(f"the kernel of {notebook} was not ready: {exc}\n"
                             f"jupyter's log ends:\n{server.log_path.read_text(errors='replace')[-3000:]}") from exc
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




BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no Chromium at {CHROMIUM}: apt-get install chromium (never `playwright install`)"),
]


def cells(page):
    """The cells of the notebook on show, in notebook order (JupyterLab keeps them all in the DOM)."""
    return page.locator(f"{ACTIVE} .jp-Notebook .jp-Cell")


def run_cell(page, index: int) -> None:
    """Run one cell, as a student does: select it, Shift+Enter. The cell is selected by a mousedown
    on the cell itself: a click on a check cell's hidden-source placeholder would reveal its
    source, and `j` skips such cells."""
    cell = cells(page).nth(index)
    cell.scroll_into_view_if_needed(timeout=30_000)
    cell.dispatch_event("mousedown", {"button": 0})
    page.locator(f"{ACTIVE} .jp-Notebook").focus()
    page.keyboard.press("Escape")  # command mode: the keys go to the notebook, not an editor
    page.keyboard.press("Shift+Enter")


def wait_cell_done(page, index: int, timeout: int = 60_000) -> None:
    """Until this cell's prompt shows its execution number: "Idle" in the status bar can be read
    before a queued cell has even started (right after a restart, the first run imports slowly)."""
    from playwright.sync_api import expect

    prompt = cells(page).nth(index).locator(".jp-InputArea-prompt")
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout)


def restart_kernel(page) -> None:
    menu(page, "Kernel", "Restart Kernel…")
    page.locator(".jp-Dialog-button.jp-mod-accept").click()
    page.locator("#jp-main-statusbar").get_by_text(re.compile("Restarting|Starting|Busy|Idle")).wait_for(timeout=30_000)
    wait_for_kernel(page)


def visible_reds(page) -> list[str]:
    """What the notebook on show paints red (the course's red, #c62828/#b71c1c), and error outputs."""
    return page.evaluate("""(active) => {
        const reds = new Set(['rgb(198, 40, 40)', 'rgb(183, 28, 28)']);
        const seen = [];
        for (const el of document.querySelectorAll(active + ' .jp-OutputArea-output, ' + active + ' .jp-OutputArea-output *')) {
            if (!el.getClientRects().length) continue;  // not rendered (display:none here or above)
            const s = getComputedStyle(el);
            if (s.visibility === 'hidden') continue;
            const text = (el.textContent || '').trim().slice(0, 80);
            if (reds.has(s.color) && text) seen.push('red text: ' + text);
            if (reds.has(s.borderLeftColor) && parseFloat(s.borderLeftWidth) >= 3) seen.push('red border: ' + text);
            if (el.matches('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')) seen.push('error output: ' + text);
            if (el.matches('.jupyter-widgets-disconnected')) seen.push('broken widget');
        }
        return seen;
    }""", ACTIVE)
