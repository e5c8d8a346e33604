"""The kernel's warm judge (`labkit.notebook.warm_judge`): one judge process reused by a
kernel's checks, with the same verdicts as `python -m labkit check`, started afresh when what
it started with changed, and never left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from labkit import scratch
from labkit.notebook import warm_judge

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "warmup.py"


@pytest.fixture
def judge(tmp_path, judge_tmp):
    """A folder to judge in; the judge's own temp folders go to a private TMPDIR, removed after
    the test (a judge these tests SIGKILL on purpose cannot remove its step's folders itself)."""
    warm_judge.stop()
    yield tmp_path
    warm_judge.stop()


def _ask(cwd: Path, seed: int = 7, steps=("1",), solution: Path = REFERENCE, timeout: float = 120):
    return warm_judge.run({"lab": "start-here", "solution": str(solution), "steps": list(steps), "seed": seed},
                          cwd, timeout)


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _cases(verdict: dict) -> list:
    return [(s["step"], s["passed"], [(c["name"], c["outcome"]) for c in s["cases"]]) for s in verdict["steps"]]


def test_one_process_answers_every_check_as_the_command_would(judge):
    first = _ask(judge)
    pid = warm_judge._judge.proc.pid
    second = _ask(judge, steps=())
    assert warm_judge._judge.proc.pid == pid, "the second check started another judge"
    command = subprocess.run([sys.executable, "-m", "labkit", "check", "start-here", "--solution", str(REFERENCE),
                              "--json", "--seed", "7"], capture_output=True, text=True, timeout=120, cwd=judge)
    assert _cases(second) == _cases(json.loads(command.stdout))
    assert _cases(first) == [c for c in _cases(second) if c[0] == 1]


def test_a_changed_course_or_environment_starts_a_fresh_judge(judge, monkeypatch):
    _ask(judge)
    pid = warm_judge._judge.proc.pid
    monkeypatch.setattr(warm_judge, "_course_code", lambda: (1, 1))  # as if a course update landed
    _ask(judge)
    assert warm_judge._judge.proc.pid != pid and _gone(pid)
    pid = warm_judge._judge.proc.pid
    monkeypatch.setenv("LABKIT_SOMETHING_NEW", "1")
    _ask(judge)
    assert warm_judge._judge.proc.pid != pid and _gone(pid)


def test_a_judge_that_died_between_checks_is_replaced(judge):
    _ask(judge)
    os.kill(warm_judge._judge.proc.pid, signal.SIGKILL)
    warm_judge._judge.proc.wait()
    assert _ask(judge)["steps"][0]["passed"]


def test_a_judge_that_dies_during_a_check_is_a_readable_message(judge, monkeypatch):
    _ask(judge)
    proc = warm_judge._judge.proc
    real = warm_judge._reply

    def dying(p, timeout):
        p.kill()
        return real(p, timeout)

    monkeypatch.setattr(warm_judge, "_reply", dying)
    said = _ask(judge)
    assert isinstance(said, str) and said.startswith("The check could not run (exit -9)")
    assert warm_judge._judge is None and proc.poll() is not None


def test_a_request_it_cannot_run_is_answered_and_the_judge_keeps_serving(judge):
    pid = None
    for bad in ({"lab": "no-such-lab", "solution": str(REFERENCE)}, {"lab": "start-here"},
                {"lab": "start-here", "solution": str(judge / "missing.py")},
                {"lab": "start-here", "solution": str(REFERENCE), "steps": ["99"]}):
        reply = warm_judge.run(bad, judge, 60)
        assert set(reply) == {"error"}, reply
        pid = pid or warm_judge._judge.proc.pid
    assert _ask(judge)["steps"][0]["passed"] and warm_judge._judge.proc.pid == pid


def test_a_check_over_its_time_stops_the_judge_and_its_children(judge):
    slow = judge / "warmup.py"
    slow.write_text("import time\ntime.sleep(60)\n" + REFERENCE.read_text())
    seen: list[psutil.Process] = []

    def watch():  # what the judge started while the check ran: its children, sleeping in the import
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 2:
            judge_now = warm_judge._judge
            if judge_now is not None:
                try:
                    seen[:] = [psutil.Process(judge_now.proc.pid), *psutil.Process(judge_now.proc.pid).children(True)]
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with pytest.raises(subprocess.TimeoutExpired):
        _ask(judge, solution=slow, timeout=4)
    watcher.join()
    assert warm_judge._judge is None
    assert len(seen) >= 2, "the judge had started no child: this test would not see one left behind"
    assert [p.pid for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def test_stop_leaves_nothing(judge):
    _ask(judge)
    pid = warm_judge._judge.proc.pid
    warm_judge.stop()
    assert warm_judge._judge is None and _gone(pid)


def _servers(judge_pid: int) -> tuple[list, set]:
    """Every PostgreSQL postmaster and Valkey the warm judge runs now, and their folders."""
    # the servers' folder (in the judge's place for folders, `labkit.scratch`: its TMPDIR here),
    # and where PostgreSQL's data goes when that place is a disk
    roots = (Path(scratch.place()), Path("/tmp"), scratch.FAST_PLACE)
    servers, folders = [], set()
    for p in psutil.Process(judge_pid).children(recursive=True):  # backends come and go
        with contextlib.suppress(psutil.Error):
            if p.name() in ("postgres", "valkey-server") and p.parent().name() != "postgres":
                cwd = Path(p.cwd())
                folders.add(next((f for f in [cwd, *cwd.parents] if f.parent in roots), cwd))
                servers.append(p)
    return servers, folders


def _alive(procs: list) -> list[int]:
    return [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_lab_04s_servers_made_ahead_are_stopped_with_the_judge(judge):
    """After a lab 04 check the judge starts the next check's servers (`labkit.judge.ahead`: that
    the next run uses them is tests/test_sessions_ahead.py's); stopping the judge stops every
    server it runs, made ahead or finishing a check, and removes their folders."""
    pipeline = ROOT / "solutions" / "pipeline.py"
    for seed in (1, 2):
        verdict = warm_judge.run({"lab": "pipeline", "solution": str(pipeline), "steps": ["5"], "seed": seed},
                                 judge, 120)
        assert isinstance(verdict, dict) and verdict["steps"][0]["passed"], verdict
    pid = warm_judge._judge.proc.pid
    deadline, servers, folders = time.monotonic() + 30, [], set()
    while time.monotonic() < deadline and {s.name() for s in servers} != {"postgres", "valkey-server"}:
        time.sleep(0.1)
        servers, folders = _servers(pid)
    assert {s.name() for s in servers} == {"postgres", "valkey-server"}, "the next check's servers run ahead"
    assert any(f.name.startswith("labkit-pipeline-") for f in folders), folders
    warm_judge.stop()
    assert _alive(servers) == [] and not any(f.exists() for f in folders)
    places = tuple(str(f) for f in folders)
    assert [p.pid for p in psutil.process_iter(["cwd"]) if str(p.info["cwd"] or "").startswith(places)] == []
