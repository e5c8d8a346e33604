"""A verdict does not depend on how busy the machine is (issue 19 item 3).

While one spinning process per core competes for the CPU, a sample of every lab's catalogue
is judged again, outside the session cache, and must get the verdict it gets on a machine
that only runs the suite: per step, passed and the set of (failing case, clause). The sample
is one wrong solution per promised step and lab (the first by name), so every step's check
runs loaded; `benchmarks/stability.py --busy 2` runs a whole lab that way, many times.

No second run here: a case that times out only under load is exactly what this test exists
to catch. A wrong solution whose own behaviour follows the clock (`TIMING_DEPENDENT`) keeps
only its promise: the failing step, its clause and its message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from catalogue import labs_with_wrong_solutions, promise, run_steps, step_verdicts, wrong_files
from test_catalogue_seeds import file_fingerprint

SPIN = "while True:\n    pass\n"
MAX_IDLE = 0.1  # of the machine's CPU time, while the spinners run
THREADS = 2  # as the seed test runs its seeds: the judge's own concurrency stays in the picture


def sample(lab: str) -> list[tuple[Path, str]]:
    """(file, promised step): the first wrong solution, by name, of each step that has one."""
    chosen: dict[str, Path] = {}
    for path in sorted(wrong_files(lab), key=lambda p: p.stem):
        chosen.setdefault(promise(path)["step"], path)
    return [(path, step) for step, path in chosen.items()]


@pytest.fixture
def busy():
    """One spinning interpreter per core, for the test's length. Proven afterwards: each spinner
    ran, and the machine had (almost) no idle CPU meanwhile. (Not "each spinner got a core":
    beside other xdist workers the machine is busier still, and the spinners get less of it.)"""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 2)]
    before = psutil.cpu_times()
    try:
        yield spinners
        after = psutil.cpu_times()
        used = [psutil.Process(p.pid).cpu_times().user for p in spinners]
        assert all(seconds > 0.2 for seconds in used), f"a competing process never ran: {used}"
        assert idle_share(before, after) < MAX_IDLE, \
            f"the cores were not kept busy: {idle_share(before, after):.0%} of the CPU time was idle"
    finally:
        for proc in spinners:
            proc.kill()
        for proc in spinners:
            proc.wait(timeout=10)


def idle_share(before, after) -> float:
    """The machine's idle (and I/O wait) share of its CPU time between two `psutil.cpu_times()`."""
    def spent(times, names):
        return sum(getattr(times, name, 0.0) for name in names)

    names = [n for n in after._fields if not n.startswith("guest")]  # guest time is already in user
    idle = spent(after, ("idle", "iowait")) - spent(before, ("idle", "iowait"))
    total = spent(after, names) - spent(before, names)
    return idle / total if total > 0 else 1.0


@pytest.mark.parametrize("lab", labs_with_wrong_solutions())
def test_the_catalogue_gets_the_same_verdicts_with_every_core_busy(lab, request):
    chosen = sample(lab)
    assert len(chosen) >= 5, chosen
    quiet = {path: file_fingerprint(path, step_verdicts(lab, path, [step], 1)) for path, step in chosen}
    request.getfixturevalue("busy")  # from here on, every core has a competitor

    def loaded(item):
        path, step = item
        return file_fingerprint(path, {str(v.step): v for v in run_steps(lab, path, [step], 1)})

    with ThreadPoolExecutor(THREADS) as pool:
        loud = dict(zip((path for path, _ in chosen), pool.map(loaded, chosen), strict=True))
    differ = {path.stem: (quiet[path], loud[path]) for path, _ in chosen if quiet[path] != loud[path]}
    assert not differ, "\n".join(f"{name}:\n  quiet {a}\n  busy  {b}" for name, (a, b) in differ.items())
