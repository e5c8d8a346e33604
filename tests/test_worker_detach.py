"""A grading worker dies with its forkserver (PR_SET_PDEATHSIG), also when the forkserver died
between forking it and the worker's asking for that signal: the grader was killed just as it
started a job (seen in CI: the orphan graded on into --out while the rerun did, and its kernel
outlived the test). `worker._detach` then ends the worker instead of letting it grade."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
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


# The grader's part: a real multiprocessing forkserver, one worker that detaches and then
# "grades" for a minute; the grader reports the two pids and waits to be killed.
GRADER = """
import multiprocessing, os, sys, time
from multiprocessing import forkserver
from pathlib import Path

def job(out):
    from labkit.grading import worker
    worker._detach(Path(out) / "log")
    (Path(out) / "worker").write_text(str(os.getpid()))
    time.sleep(60)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("forkserver")
    ctx.Process(target=job, args=(sys.argv[1],)).start()
    while not (Path(sys.argv[1]) / "worker").exists():
        time.sleep(0.01)
    print(forkserver._forkserver._forkserver_pid, flush=True)
    time.sleep(60)
"""


def test_a_killed_graders_forkserver_and_workers_end_with_it(tmp_path, request):
    """multiprocessing gives each forked child the forkserver's "alive" pipe, and the forkserver
    waits for that pipe's EOF: a worker that kept it kept the forkserver (and so itself) alive
    after its grader was SIGKILLed (CI: an orphan graded on beside the rerun)."""
    script = tmp_path / "grader.py"
    script.write_text(GRADER)
    # A SIGKILLed grader cannot remove multiprocessing's folder (pymp-*, the forkserver's socket):
    # it goes in one of the test's, short enough for a socket's path.
    own_tmp = tempfile.mkdtemp(prefix="lk-detach-")
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    grader = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": own_tmp})
    try:
        forkserver_pid = int(grader.stdout.readline())
        worker_pid = int((tmp_path / "worker").read_text())
        assert psutil.Process(worker_pid).ppid() == forkserver_pid
    finally:
        grader.kill()
        grader.wait(timeout=10)
        grader.stdout.close()
    try:
        assert gone(forkserver_pid), "the forkserver outlived its grader"
        assert gone(worker_pid), "the worker outlived its grader"
    finally:
        for pid in (worker_pid, forkserver_pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
