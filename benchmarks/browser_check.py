"""How long a student waits in JupyterLab for a check's verdict, next to the command's time.

For three steps of lab 01 (default 1, 4 and 8: the dearest, the cheapest and a middle one by
their checks' own time), in headless Chromium on a real JupyterLab server: the time from
pressing Shift+Enter on the step's check cell (`Lab.of("outbox").check(N)`, selected and in
command mode, as `tests/browser/driver.run_cell` does) to that cell's live verdict panel,
`.lk-live.lk-step` in the `passed` state, being visible. Printed per step: the median, min and
max over `--runs` re-runs of the check cell, and beside it the same check through
`python -m labkit check outbox --solution solutions/worker.py --step N`, run right after each
browser run (same load), with the ratio of the medians.

How it is measured: in the page, with `performance.now()`. A capture-phase `keydown` listener on
`window` stamps the Shift+Enter that Playwright's `page.keyboard` sends (before JupyterLab's
own handlers see it); a MutationObserver on the check cell (child lists, `class` and `style`
changes) stamps the first mutation after which a new `.lk-live.lk-step` in that cell has a
layout box and is not `visibility: hidden` (it then checks the `passed` class). Panels already
there before the key press are marked and ignored. The stamp is taken when the DOM says the
panel is laid out, before the frame that paints it (at most one frame later). Python only waits
for the stamps (`wait_for_function`, bounded); its polling adds nothing. "First seen" is the
same stamp for the first new verdict of either form: each view is displayed as a static HTML
copy and then the live widget, and the static copy shows until the widget replaces it.

The procedure: JupyterLab on a temp copy of `notebooks/01-outbox.ipynb` whose chosen `%%step N`
cells hold the reference, exactly the text `lab.reveal(N)` shows
(`labkit.notebook.reveal.reference`, with the helpers it calls from other steps); open it on a
fresh kernel, run the setup cell, the provided-code cell (`%%step header`) and the chosen step
cells, one by one with Shift+Enter; then one first check, printed on its own line (it starts
the kernel's warm judge, `labkit.notebook.warm_judge`), then the timed runs. Each run waits
until the server reports the kernel idle (the check saves progress after its panel) before the
next key press. The server, its kernels and their judges, the browser, the command's processes
and the temp folder are removed on every path, Ctrl-C and SIGTERM included (a second Ctrl-C
waits for the clean-up, itself bounded); every wait is bounded.

    .venv/bin/python benchmarks/browser_check.py [--runs 5] [--step 1 --step 4 --step 8]

Needs Chromium at /usr/bin/chromium (`apt-get install chromium`; never `playwright install`) and
the test extras (`pip install -e ".[test]"`: playwright, psutil).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import nbformat  # noqa: E402
import psutil  # noqa: E402
from driver import (  # noqa: E402
    ACTIVE,
    CHROMIUM,
    CHROMIUM_ARGS,
    JupyterLab,
    cells,
    collect_descendants,
    place,
    run_cell,
    stop_session,
    wait_cell_done,
    wait_for_kernel,
)

from labkit import labs  # noqa: E402
from labkit.notebook import reveal  # noqa: E402

LAB = "outbox"
NOTEBOOK = "01-outbox.ipynb"
DEFAULT_STEPS = ["1", "4", "8"]
CHECK_WAIT_MS = 180_000  # one check in the browser (the warm judge's own guard is 180 s)
COMMAND_TIMEOUT = 300.0  # one `python -m labkit check` run
CLOSE_TIMEOUT = 30.0  # closing the browser and Playwright's driver
STOP_GRACE = 10.0  # a command's processes after SIGINT, before SIGKILL
DEFERRED = {signal.SIGINT, signal.SIGTERM}  # held while the clean-up runs (itself bounded)

# Installed in the page before each key press; `window.__lkBench` holds the stamps.
ARM = """([active, index]) => {
    const cell = document.querySelectorAll(active + ' .jp-Notebook .jp-Cell')[index];
    if (!cell) throw new Error('no cell ' + index);
    if (window.__lkBench) window.__lkBench.stop();
    for (const el of cell.querySelectorAll('.lk-step')) el.setAttribute('data-lk-bench-old', '');
    const state = {pressed: null, first: null, panel: null, status: null, text: null};
    const shown = (el) => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
    const look = () => {
        if (state.pressed === null || state.panel !== null) return;
        const now = performance.now();
        for (const el of cell.querySelectorAll('.lk-step:not([data-lk-bench-old])')) {
            if (!shown(el)) continue;
            if (state.first === null) state.first = now;
            if (el.classList.contains('lk-live')) {
                state.panel = now;
                state.status = ['passed', 'failed', 'not_implemented'].find(c => el.classList.contains(c)) || el.className;
                state.text = (el.innerText || '').slice(0, 600);
                state.stop();
                return;
            }
        }
    };
    const observer = new MutationObserver(look);
    const onKey = (event) => {
        if (event.key === 'Enter' && event.shiftKey && state.pressed === null) state.pressed = performance.now();
    };
    state.stop = () => { observer.disconnect(); window.removeEventListener('keydown', onKey, true); };
    observer.observe(cell, {subtree: true, childList: true, attributes: true, attributeFilter: ['class', 'style']});
    window.addEventListener('keydown', onKey, true);
    window.__lkBench = state;
}"""


class Interrupted(Exception):
    """SIGTERM: unwind through every `finally`, as Ctrl-C does."""


def _on_sigterm(signum, frame) -> None:
    raise Interrupted(f"signal {signum}")


def reference_notebook(steps: list[str]):
    """The lab's notebook with each chosen `%%step N` cell holding the reference `lab.reveal(N)` shows."""
    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    found = set()
    for cell in nb.cells:
        part = str(cell.metadata.get("labkit", {}).get("part", ""))
        if part in steps:
            code = reveal.reference(LAB, part)
            if code is None:
                raise SystemExit(f"no reference for step {part}: notebooks/source/ is missing")
            cell.source = code
            found.add(part)
    if found != set(steps):
        raise SystemExit(f"{NOTEBOOK} has no step cell for {sorted(set(steps) - found)}")
    return nb


def index_of(nb, key: str, value) -> int:
    for i, cell in enumerate(nb.cells):
        if str(cell.metadata.get("labkit", {}).get(key, "")) == str(value):
            return i
    raise SystemExit(f"{NOTEBOOK} has no cell with labkit.{key} = {value!r}")


def run_and_wait(page, index: int, timeout_ms: int = CHECK_WAIT_MS) -> None:
    run_cell(page, index)
    wait_cell_done(page, index, timeout=timeout_ms)


def wait_idle(server: JupyterLab, timeout: float = CHECK_WAIT_MS / 1000) -> None:
    """Until the server sees every kernel idle. A check cell's prompt is not in the DOM (its source
    is hidden), so `wait_cell_done` cannot tell when it finished; called once its panel is there,
    the kernel was busy with it, and the server had the busy status before it sent the output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(k.get("execution_state") == "idle" for k in server.api("GET", "/api/kernels") or []):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the kernel was still busy after {timeout:.0f} s")


def timed_check(page, server: JupyterLab, index: int, step: str) -> tuple[float, float]:
    """Shift+Enter on the check cell; (seconds to the live panel, seconds to the first verdict seen)."""
    page.evaluate(ARM, [ACTIVE, index])
    run_cell(page, index)
    page.wait_for_function("() => window.__lkBench && window.__lkBench.panel !== null", timeout=CHECK_WAIT_MS)
    state = page.evaluate("() => { const s = window.__lkBench; s.stop(); return "
                          "{pressed: s.pressed, first: s.first, panel: s.panel, status: s.status, text: s.text}; }")
    if state["pressed"] is None:
        raise RuntimeError("the page never saw the Shift+Enter key press")
    if state["status"] != "passed":
        raise RuntimeError(f"step {step}'s check did not pass with the reference ({state['status']}):\n{state['text']}")
    # The check goes on after its panel (progress saved, bar updated): the next run starts after it.
    wait_idle(server)
    return (state["panel"] - state["pressed"]) / 1000, (state["first"] - state["pressed"]) / 1000


def timed_command(step: str, cwd: Path) -> float:
    """Wall time of `python -m labkit check outbox --solution solutions/worker.py --step N`."""
    solution = ROOT / "solutions" / labs.manifest(LAB).module_file
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "labkit", "check", LAB, "--solution", str(solution), "--step", step]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own session: stopped below, whatever happens here
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT)
        wall = time.perf_counter() - started
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
        try:
            # SIGINT first, so the judge cleans up after itself
            stop_session(proc, signal.SIGINT, STOP_GRACE, kill_group=True)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(command[1:])}` exited with {proc.returncode}:\n{out.decode()[-1500:]}")
    return wall


def kill_descendants() -> None:
    """Whatever this process started that is still alive (Playwright's driver, Chromium's helpers)."""
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def bounded(what: str, action, seconds: float = CLOSE_TIMEOUT) -> None:
    """Run a clean-up `action`; past `seconds`, kill what it waits for. A failure is reported, not raised."""
    watchdog = threading.Timer(seconds, kill_descendants)
    watchdog.daemon = True
    watchdog.start()
    try:
        action()
    except Exception as exc:  # noqa: BLE001 — clean-up goes on; the figures (if any) are printed already
        print(f"note: {what}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    finally:
        watchdog.cancel()


def measure(base: Path, steps: list[str], runs: int) -> dict:
    from playwright.sync_api import sync_playwright

    nb = reference_notebook(steps)
    setup, header = index_of(nb, "setup", True), index_of(nb, "part", "header")
    step_cells = {s: index_of(nb, "part", s) for s in steps}
    check_cells = {s: index_of(nb, "check", s) for s in steps}
    command_dir = base / "command"
    command_dir.mkdir()
    figures: dict = {"browser": {s: [] for s in steps}, "first_seen": {s: [] for s in steps},
                     "command": {s: [] for s in steps}}

    playwright = browser = None
    try:
        # Playwright's driver makes Chromium's profile in its TMPDIR: in `base`, so that a driver
        # killed by Ctrl-C leaves none behind in /tmp. The driver alone gets it; it keeps its env.
        (base / "tmp").mkdir()
        saved_tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(base / "tmp")
        try:
            playwright = sync_playwright().start()
        finally:
            if saved_tmpdir is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = saved_tmpdir
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        figures["chromium"] = browser.version
        (base / "jupyterlab").mkdir()
        server = JupyterLab(base / "jupyterlab")
        try:
            place(server, nb, NOTEBOOK)
            context = browser.new_context(viewport={"width": 1200, "height": 2000})
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto(server.url(NOTEBOOK, reset=True), timeout=60_000)
            wait_for_kernel(page)
            for index in (setup, header, *step_cells.values()):
                run_and_wait(page, index)
            first = steps[0]
            figures["first"] = (first, *timed_check(page, server, check_cells[first], first))
            for run in range(1, runs + 1):
                for step in steps:
                    panel, seen = timed_check(page, server, check_cells[step], step)
                    command = timed_command(step, command_dir)
                    figures["browser"][step].append(panel)
                    figures["first_seen"][step].append(seen)
                    figures["command"][step].append(command)
                    print(f"run {run}/{runs} step {step}: browser {panel:.3f} s (first seen {seen:.3f} s), "
                          f"command {command:.3f} s", file=sys.stderr, flush=True)
            assert cells(page).count() == len(nb.cells)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
            server.stop()  # its kernels and their warm judges too (driver.JupyterLab.stop)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)  # a second Ctrl-C waits for the clean-up
        descendants = psutil.Process().children(recursive=True)
        if browser is not None:
            bounded("closing the browser", browser.close)
        if playwright is not None:
            bounded("stopping Playwright", playwright.stop)
        kill_descendants()
        psutil.wait_procs(descendants, timeout=5)
        collect_descendants(descendants)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED)  # one that came meanwhile is raised here
    return figures


def report(figures: dict, steps: list[str], runs: int) -> None:
    import jupyterlab

    manifest = labs.manifest(LAB)
    print(f"\nlab {LAB} (notebooks/{NOTEBOOK}), reference solutions/{manifest.module_file}; JupyterLab "
          f"{jupyterlab.__version__}, Chromium {figures['chromium']}; {runs} runs per step, seconds")
    step, panel, seen = figures["first"]
    print(f"first check of the kernel (step {step}, starts the kernel's judge): panel {panel:.3f}, "
          f"first seen {seen:.3f}")
    print(f"{'step':<6}{'title':<25}{'browser':>9}{'min':>8}{'max':>8}{'first seen':>12}"
          f"{'command':>10}{'min':>8}{'max':>8}{'browser/command':>17}")
    for step in steps:
        b, f, c = figures["browser"][step], figures["first_seen"][step], figures["command"][step]
        mb, mc = statistics.median(b), statistics.median(c)
        print(f"{step:<6}{manifest.step(step).title[:24]:<25}{mb:>9.3f}{min(b):>8.3f}{max(b):>8.3f}"
              f"{statistics.median(f):>12.3f}{mc:>10.3f}{min(c):>8.3f}{max(c):>8.3f}{mb / mc:>16.2f}×")
    print("browser: Shift+Enter on the check cell to its live panel (passed) visible, in the page "
          "(performance.now(), keydown to MutationObserver); first seen: to the first verdict copy visible; "
          "command: wall time of `python -m labkit check outbox --solution solutions/worker.py --step N`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per step (default 5)")
    known = [str(s.step) for s in labs.manifest(LAB).steps if str(s.step).isdigit()]
    parser.add_argument("--step", action="append", choices=known,
                        help=f"a step of lab 01 to time; repeatable (default {' '.join(DEFAULT_STEPS)})")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not Path(CHROMIUM).exists():
        parser.error(f"no Chromium at {CHROMIUM}: apt-get install chromium (never `playwright install`)")
    steps = list(dict.fromkeys(args.step or DEFAULT_STEPS))
    signal.signal(signal.SIGTERM, _on_sigterm)
    base = Path(tempfile.mkdtemp(prefix="browser-bench-"))
    try:
        try:
            figures = measure(base, steps, args.runs)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        report(figures, steps, args.runs)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted: everything it started is stopped, its temp folder removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
