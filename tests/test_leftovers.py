"""A judge run leaves nothing behind, whatever the student's code does.

Before and after each run we take a snapshot of what a run could leave: processes carrying
this run's marker (found as the reaper finds them, through /proc/*/environ), child processes
of this test process, zombies among them, listening TCP sockets of this process and its
children, and the judge's `labkit-*` temp dirs. Both snapshots must be equal
(`tests/leftovers.py`; the `tag` and `judge_tmp` fixtures are in `conftest.py`).

Other runs may share the machine, so the markers get a prefix of our own and the temp dir is
private to the test: what we count is ours alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest

from labkit import labs
from labkit.judge.run import run_lab

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "worker.py"


def with_code(tmp_path: Path, function: str, *lines: str) -> Path:
    """The reference solution with `lines` run first in `function`."""
    source = REFERENCE.read_text()
    head = re.compile(rf"^def {function}\(.*\):\n", re.M)
    assert len(head.findall(source)) == 1, function
    path = tmp_path / "worker.py"
    path.write_text(head.sub(lambda m: m.group(0) + "".join(f"    {line}\n" for line in lines), source))
    return path


@pytest.fixture
def judged(nothing_left):
    """Run the judge and prove that the world afterwards is the world before."""

    def run(solution: Path, steps=None, timeout=None):
        with nothing_left():
            return run_lab(labs.load("outbox"), solution, steps=steps, seed=1, timeout=timeout)

    return run


def test_full_reference_run(judged):
    assert judged(REFERENCE).passed


def test_hanging_step(judged, tmp_path):
    verdict = judged(with_code(tmp_path, "validate_event", "while True:", "    pass"), steps=[1], timeout=2)
    assert verdict.steps[0].cases[0].outcome == "timed_out"


def test_step_that_kills_itself(judged, tmp_path):
    verdict = judged(with_code(tmp_path, "validate_event", "import os", "os._exit(9)"), steps=[1])
    assert not verdict.passed


@pytest.mark.parametrize("close_fds", [False, True], ids=["keeps its fds", "closes its fds"])
def test_grandchild_that_escapes_with_setsid(judged, tmp_path, close_fds):
    pids = tmp_path / "grandchildren.txt"
    path = with_code(
        tmp_path, "validate_event",
        "import os, time",
        "ready, written = os.pipe()",
        "if os.fork() == 0:",
        "    os.setsid()",
        f"    with open({str(pids)!r}, 'a') as fh:",
        "        fh.write(f'{os.getpid()}\\n')",
        "    os.write(written, b'x')",
        "    if " + repr(close_fds) + ":",
        "        os.closerange(0, 65536)",
        "    time.sleep(60)",
        "    os._exit(0)",
        # wait (bounded) until the grandchild has written its pid: under load the judge could
        # otherwise kill it first, and the count below would race
        "os.close(written)",
        "import select",
        "select.select([ready], [], [], 5)",
        "os.close(ready)",
    )
    verdict = judged(path, steps=[1])
    assert verdict.passed  # the parent's answers are right; only its grandchildren misbehave
    escaped = [int(line) for line in pids.read_text().split()]
    assert len(escaped) == len(verdict.steps[0].cases)
    assert not [pid for pid in escaped if psutil.pid_exists(pid)]
