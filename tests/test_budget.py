"""A child's time budget follows the child, not the machine (`labkit.judge.processes.Budget`):
the time its processes spend runnable but waiting for a CPU is added to its deadline, up to
WALL_FACTOR budgets; a child that sleeps (a hang) gets its plain budget."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from labkit.judge.processes import Budget, waited_for_cpu
from labkit.limits import WALL_FACTOR

SPIN = "import time\nwhile True:\n    sum(i * i for i in range(10_000))\n"


def _spawn(code: str, cpu: int | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code])
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    return proc


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def test_a_sleeping_child_gets_its_plain_budget(procs):
    """Counted from when the child is asleep: its start-up may wait for a CPU on a busy machine
    (CI: 0.23 s), and that wait is rightly added (the next test shows how)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n"],
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout.readline() == "sleeping\n"
    deadline = time.monotonic() + 30
    while _state(proc.pid) != "S":  # past the print, inside the sleep
        assert time.monotonic() < deadline, "the child never went to sleep"
        time.sleep(0.01)
    budget = Budget(proc.pid, 0.5)
    time.sleep(1.0)
    assert budget.deadline() - budget.started == pytest.approx(0.5, abs=0.01)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_a_child_crowded_off_its_cpu_gets_the_time_it_waited_up_to_the_cap(procs):
    cpu = min(os.sched_getaffinity(0))
    procs.append(_spawn(SPIN, cpu))
    budget = Budget(procs[0].pid, 0.2)
    procs.extend(_spawn(SPIN, cpu) for _ in range(3))  # three rivals on the same CPU
    time.sleep(1.5)
    waited = waited_for_cpu(procs[0].pid) - budget.base
    assert waited > 0.3, "three rivals on one CPU left the child running most of the time"
    assert budget.deadline() == pytest.approx(budget.started + WALL_FACTOR * 0.2)


def test_a_process_that_is_gone_adds_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    budget = Budget(proc.pid, 1.0)
    assert budget.deadline() == budget.first


def test_cpu_seconds_counts_the_whole_tree_as_psutil_does(procs):
    import signal

    import psutil

    from labkit.judge.processes import cpu_seconds

    # A process named with spaces and a ")" (/proc's stat quotes nothing), and a child it forked.
    procs.append(subprocess.Popen([sys.executable, "-c", "import ctypes, os\n"
                                   "ctypes.CDLL(None).prctl(15, b'a) b c', 0, 0, 0)\n"
                                   f"os.fork()\n{SPIN}"]))
    root = psutil.Process(procs[0].pid)
    deadline = time.monotonic() + 30
    while len(root.children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = [root, *root.children(recursive=True)]
    try:
        assert len(tree) == 2
        while sum(t.user for t in (p.cpu_times() for p in tree)) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in tree:  # stopped: both counts read the same totals, however busy the machine
            proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        ours = cpu_seconds(procs[0].pid)
        theirs = sum(t.user + t.system for t in (p.cpu_times() for p in tree))
        assert ours > 0 and abs(ours - theirs) < 1e-6, (ours, theirs)
    finally:  # the fork too, which the fixture does not know: gone once its parent is
        for proc in tree:
            proc.kill()
        procs[0].wait(timeout=10)
        assert not psutil.wait_procs(tree[1:], timeout=10)[1]
