"""A judge run leaves nothing behind, whatever the student's code does.

Before and after each run we take a snapshot of what a run could leave: processes carrying
this run's marker (found as the reaper finds them, through /proc/*/environ), child processes
of this test process, zombies among them, listening TCP sockets of this process and its
children, and the judge's `labkit-*` temp dirs. Nothing may be in the second that was not in
the first (`tests/leftovers.py`; the `tag` and `judge_tmp` fixtures are in `conftest.py`).

Every test runs for each lab (lab 01's outbox, lab 02's vending machine).

Other runs may share the machine, so the markers get a prefix of our own and the temp dir is
private to the test: what we count is ours alone.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit import labs
from labkit.judge.run import run_lab

ROOT = Path(__file__).resolve().parents[1]


def _step_one(reference: Path) -> str:
    """The first plain (not async) function of step 1 in a reference module: a test puts its lines there."""
    text = reference.read_text()
    step = text.split("# --- step 1 ", 1)[1].split("# --- step ", 1)[0]
    return re.search(r"^def (\w+)\(", step, re.M).group(1)


# Every lab (lab 03 too once it lands; not the warm-up), its reference, and where its step 1 code lives.
LABS = {lab: (ROOT / "solutions" / module, _step_one(ROOT / "solutions" / module))
        for lab, module in ((m.name, m.module_file) for m in labs.manifests().values())
        if lab != "start-here" and lab in labs.available() and (ROOT / "solutions" / module).exists()}


def with_code(tmp_path: Path, lab: str, *lines: str) -> Path:
    """The lab's reference solution with `lines` run first in its chosen function."""
    reference, function = LABS[lab]
    source = reference.read_text()
    head = re.compile(rf"^def {function}\(.*\):\n", re.M)
    assert len(head.findall(source)) == 1, function
    path = tmp_path / reference.name
    path.write_text(head.sub(lambda m: m.group(0) + "".join(f"    {line}\n" for line in lines), source))
    return path


@pytest.fixture(params=sorted(LABS))
def lab(request) -> str:
    return request.param


@pytest.fixture
def judged(nothing_left, lab):
    """Run the judge and prove that the world afterwards is the world before."""

    def run(solution: Path, steps=None, timeout=None):
        with nothing_left():
            return run_lab(labs.load(lab), solution, steps=steps, seed=1, timeout=timeout)

    return run


def test_full_reference_run(judged, lab):
    assert judged(LABS[lab][0]).passed


def test_hanging_step(judged, tmp_path, lab):
    verdict = judged(with_code(tmp_path, lab, "while True:", "    pass"), steps=[1], timeout=2)
    assert verdict.steps[0].cases[0].outcome == "timed_out"


def test_step_that_kills_itself(judged, tmp_path, lab):
    verdict = judged(with_code(tmp_path, lab, "import os", "os._exit(9)"), steps=[1])
    assert not verdict.passed


@pytest.mark.parametrize("close_fds", [False, True], ids=["keeps its fds", "closes its fds"])
def test_grandchild_that_escapes_with_setsid(judged, tmp_path, close_fds, lab, monkeypatch):
    # The reaper's own path (no sandbox: a student's unprivileged check). Sandboxed, the child
    # could not write its grandchildren's pids into tmp_path, and they die with its pid
    # namespace: tests/test_sandbox.py proves that.
    # The parent records each grandchild's pid itself, after the grandchild has said (through a
    # pipe) that its setsid is done: every escapee is on the list before the reaper can act.
    # (A grandchild writing its own pid raced the reaper: 4 of 12 runs failed under load.)
    monkeypatch.setenv("LABKIT_SANDBOX", "off")
    pids = tmp_path / "grandchildren.txt"
    path = with_code(
        tmp_path, lab,
        "import os, time",
        "ready, tell = os.pipe()",
        "child = os.fork()",
        "if child == 0:",
        "    os.setsid()",
        "    os.write(tell, b'x')",
        "    if " + repr(close_fds) + ":",
        "        os.closerange(0, 65536)",
        "    time.sleep(60)",
        "    os._exit(0)",
        "os.close(tell)",
        "os.read(ready, 1)",
        "os.close(ready)",
        f"with open({str(pids)!r}, 'a') as fh:",
        "    fh.write(f'{child}\\n')",
    )
    verdict = judged(path, steps=[1])
    assert verdict.passed  # the parent's answers are right; only its grandchildren misbehave
    escaped = [int(line) for line in pids.read_text().split()]
    assert len(escaped) >= len(verdict.steps[0].cases)  # a case may make many calls, each forks
    assert not [pid for pid in escaped if psutil.pid_exists(pid)]


def test_a_leftover_is_caught_and_what_ended_during_the_run_is_not(nothing_left):
    """The snapshot's own proof: a child started in the block and left running fails it; one
    from before that ended during the block (an orphan the subreaper reaped) does not."""
    before = subprocess.Popen(["sleep", "60"])
    try:
        with nothing_left():
            Path(tempfile.mkdtemp(prefix="labkit-")).rmdir()  # the judge's part, cleaned up
            before.kill()
            before.wait()
        left = []
        try:
            with pytest.raises(AssertionError, match="children"), nothing_left():
                Path(tempfile.mkdtemp(prefix="labkit-")).rmdir()
                left.append(subprocess.Popen(["sleep", "60"]))
        finally:
            for proc in left:
                proc.kill()
                proc.wait()
    finally:
        before.kill()
        before.wait()
