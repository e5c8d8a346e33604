"""The judge observes and acts from outside the child (issue "Grading an adversary, part two", item 2).

Real children (sandboxed where this machine sandboxes): a crash at a hook is the judge's SIGKILL
of the whole sandbox, whatever the module did to os._exit, atexit, signals, or a setsid helper;
a report the judge cannot read is that child's failure, never the judge's exception.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from labkit import sandbox
from labkit.judge.child import MAX_RECORD_DEPTH, _parse, run_child
from labkit.judge.hooks import KILLED_AT_HOOK, run_to_hook

HOSTILE = textwrap.dedent('''
    import atexit, os, signal, subprocess, sys, time

    HELPER = """
    import os, time
    while True:
        with open("helper.log", "a") as fh:
            fh.write("x\\\\n")
        time.sleep(0.01)
    """

    def open_source(path):
        return None

    def dispatch(con, send, limit, after_delivery=None):
        os._exit = lambda code: None            # the crash is no longer the probe's own
        atexit.register(lambda: open("atexit.log", "w").write("ran"))
        signal.signal(signal.SIGTERM, lambda *a: open("sigterm.log", "w").write("ran"))
        subprocess.Popen([sys.executable, "-c", HELPER], start_new_session=True, env={},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 5
        while not os.path.exists("helper.log") and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            after_delivery("snack-7")
        except BaseException:
            pass
        open("after-hook.log", "w").write("ran")
        return 1
''')


@pytest.mark.skipif(not sandbox.enabled(), reason="without a sandbox a setsid helper with a cleared environment "
                    "escapes the process group and the marker (the NullBox gap)")
def test_a_crash_at_the_hook_is_the_judges_kill_whatever_the_module_did(tmp_path):
    module = tmp_path / "worker.py"
    module.write_text(HOSTILE)
    run, hook = run_to_hook(module, "checks.outbox.probes:crash_dispatch",
                            {"source": str(tmp_path / "none.db"), "url": "http://127.0.0.1:9/events", "kill": True},
                            workdir=tmp_path, timeout=20.0, marker="observe-outside-test", module_name="worker",
                            at_hook=lambda r: r.get("kind") == "hook")
    assert hook is not None and hook["kind"] == "hook"
    assert run.exit_code == KILLED_AT_HOOK and not run.timed_out
    helper = tmp_path / "helper.log"
    assert helper.exists() and helper.stat().st_size > 0  # the helper really ran before the kill
    seen = helper.stat().st_size
    time.sleep(0.3)
    assert helper.stat().st_size == seen  # and nothing of the sandbox writes after it
    for name in ("atexit.log", "sigterm.log", "after-hook.log"):
        assert not (tmp_path / name).exists(), name


def test_a_report_nested_100000_deep_or_20_mb_large_is_the_childs_failure(tmp_path):
    module = tmp_path / "worker.py"
    module.write_text(textwrap.dedent('''
        import os
        fd = int(os.environ["LABKIT_RESULT_FD"])
        os.write(fd, b"[" * 100000 + b"]" * 100000 + b"\\n")
        os.write(fd, b'{"event": "note", "pad": "' + b"x" * 20_000_000 + b'"}\\n')
    '''))
    run = run_child(module, "labkit.probe:noop", {}, workdir=tmp_path, timeout=20.0, module_name="worker")
    dropped = [r for r in run.records if r.get("malformed")]
    assert dropped and "deeper than" in dropped[0]["error"]["message"]
    assert run.aborted is not None and "dropped a report" in run.aborted["message"]


def test_the_parser_never_raises():
    deep = b"[" * 100000 + b"]" * 100000
    records = _parse(deep + b"\n" + b'{"a": "[[[[' + b"[" * 100 + b'"}\n' + b"not json\n" + b"[1]\n" + b'{"ok": 1}\n'
                     + b'{"torn')
    assert records[0]["malformed"] and str(MAX_RECORD_DEPTH) in records[0]["error"]["message"]
    assert records[1] == {"a": "[[[[" + "[" * 100}  # brackets inside strings do not count
    assert records[2]["malformed"] and records[3]["malformed"]
    assert records[4] == {"ok": 1}
    assert len(records) == 5  # the torn tail of a killed child is dropped silently
