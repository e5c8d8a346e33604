"""Entry point of a child process: import the student's module, run one probe, report.

`python -m labkit.probe.main` reads a JSON request on stdin:
{"module": "/path/worker.py", "module_name": "worker", "probe": "checks.outbox_probes:step_1",
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


def main() -> int:
    from labkit.limits import limit_resources

    limit_resources()
    request = json.loads(sys.stdin.read())
    probe.attach(int(os.environ["LABKIT_RESULT_FD"]), request["module"])
    target_module, _, target_name = request["probe"].partition(":")
    runner = getattr(importlib.import_module(target_module), target_name)
    probe.emit({"event": "importing"})
    try:
        module = load_module(request["module"], request["module_name"])
    except BaseException as exc:  # SyntaxError, SystemExit, KeyboardInterrupt: all are verdicts
        probe.emit({"event": "import_failed", "error": probe.describe_exception(exc)})
        return 3
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
