"""A grading worker dies with its forkserver (PR_SET_PDEATHSIG), also when the forkserver died
between forking it and the worker's asking for that signal: the grader was killed just as it
started a job (seen in CI: the orphan graded on into --out while the rerun did, and its kernel
outlived the test). `worker._detach` then ends the worker instead of letting it grade."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The forkserver's part: import the worker's module, fork, and (or not) die at once.
FORKSERVER = """
import os, sys, time
from pathlib import Path
from labkit.grading import worker
out, dies = Path(sys.argv[1]), sys.argv[2] == "dies"
forkserver = os.getpid()
pid = os.fork()
if pid:
    (out / "child").write_text(str(pid))
    if dies:
        os._exit(0)
    os.waitpid(pid, 0)
    sys.exit(0)
while dies and os.getppid() == forkserver:  # the worker starts after its parent is gone
    time.sleep(0.01)
worker._detach(out / "log")
(out / "graded").write_text("on")
os._exit(0)
"""


def gone(pid: int, wait: float = 10.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("forkserver", ["dies", "lives"])
def test_a_worker_whose_forkserver_died_before_it_detached_does_not_grade(tmp_path, forkserver):
    subprocess.run([sys.executable, "-c", FORKSERVER, str(tmp_path), forkserver], cwd=ROOT, check=True,
                   timeout=60)
    child = int((tmp_path / "child").read_text())
    assert gone(child), "the worker is still running"
    assert (tmp_path / "graded").exists() == (forkserver == "lives")
