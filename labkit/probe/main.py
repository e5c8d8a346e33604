"""Entry point of a child process: import the student's module, run one probe, report.

`python -m labkit.probe.main` reads a JSON request on stdin:
{"module": "/path/worker.py", "module_name": "worker", "probe": "checks.outbox.probes:step_1",
 "args": {...}} and writes JSON lines to the fd named by LABKIT_RESULT_FD. Its stdout and
stderr belong to the student; the judge never parses them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys

from labkit import probe


def load_module(path: str, name: str):
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def watch_import(module_path: str, every: float = 0.5):
    """While the student's module imports, note where its top-level code is (a daemon thread
    sampling the main thread's stack every `every` s): if the import never finishes, the judge
    names the line it was running (`expect.import_problem`). Returns a function that stops it.
    A module that holds the GIL in C code the whole time simply leaves no note."""
    import linecache
    import threading

    target = os.path.realpath(module_path)
    main_id = threading.get_ident()
    stop = threading.Event()

    def where() -> tuple[int, str] | None:
        frame = sys._current_frames().get(main_id)
        found = None
        while frame is not None:  # the innermost frame of the student's file
            if found is None and os.path.realpath(frame.f_code.co_filename) == target:
                found = (frame.f_lineno, linecache.getline(target, frame.f_lineno).strip()[:200])
            frame = frame.f_back
        return found

    def sample() -> None:
        last = None
        while not stop.wait(every):
            spot = where()
            if spot is not None and spot != last and not stop.is_set():
                last = spot
                probe.emit({"event": "importing_at", "line": spot[0], "code": spot[1],
                            "file": os.path.basename(module_path)})

    thread = threading.Thread(target=sample, name="labkit-import-watch", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no thread to spare under the process limit: no note, nothing else lost
        return lambda: None

    def done() -> None:
        stop.set()
        thread.join(timeout=2 * every)

    return done


def preload() -> None:
    """Import what the lab's manifest lists under `preload` while the judge still prepares the
    request (a child may be started early): the student's module then finds them loaded. One
    that fails to import is left for the student's own import to report."""
    for name in filter(None, os.environ.get("LABKIT_PRELOAD", "").split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the student's import says it, as a verdict
            pass


def add_site_packages() -> None:
    """What `site` would add for the student's imports, in a child started with -S: `exit` and
    `quit`, and the judge's package folders (`child.site_packages`: a venv's, not the base
    Python's, which a child without `site` cannot tell apart).

    Their .pth files are not run: they are install hooks, and the course's own is the
    editable install's finder, ~10 ms of imports in every child for labkit, which the child
    finds on PYTHONPATH anyway."""
    import site

    site.setquit()
    user = site.getusersitepackages() if sys.flags.no_user_site else None
    folders = os.environ.get("LABKIT_SITE_PACKAGES", "").split(os.pathsep)
    sys.path += [f for f in folders if f and f != user and f not in sys.path]


def main() -> int:
    from labkit.limits import CPU_BUDGET_KEY, limit_resources

    limit_resources()
    if sys.flags.no_site:
        add_site_packages()
    preload()
    request = json.loads(sys.stdin.read())
    probe.attach(int(os.environ["LABKIT_RESULT_FD"]), request["module"])
    target_module, _, target_name = request["probe"].partition(":")
    runner = getattr(importlib.import_module(target_module), target_name)
    probe.budget_cpu(request.get("args", {}).get(CPU_BUDGET_KEY, {}))
    probe.emit({"event": "importing"})
    stop_watching = watch_import(request["module"])
    probe.budget_import(True)
    try:
        module = load_module(request["module"], request["module_name"])
    except BaseException as exc:  # SyntaxError, SystemExit, KeyboardInterrupt: all are verdicts
        probe.budget_import(False)
        stop_watching()
        probe.emit({"event": "import_failed", "error": probe.describe_exception(exc)})
        return 3
    probe.budget_import(False)
    stop_watching()
    probe.emit({"event": "imported"})
    try:
        runner(module, request.get("args", {}))
    except BaseException as exc:  # sys.exit() or an error the probe did not expect
        probe.emit({"event": "aborted", "error": probe.describe_exception(exc)})
        return 4
    probe.emit({"event": "done"})
    return 0


if __name__ == "__main__":
    # os._exit skips interpreter teardown: a student's atexit or thread cannot hold us up.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
