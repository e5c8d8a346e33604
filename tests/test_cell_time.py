"""A cell's time limit counts the student's time, not the machine's (issue 19 item 3).

The grader's kernel and three competing processes share one CPU (all pinned to it), so every
cell runs at about a quarter of its speed. A cell that needs 0.8 s of CPU then takes over 2 s on
the clock: over a 2 s limit on the clock, within it once the time the kernel waited for the CPU
is added (`execute.GradingClient._over_time`). A cell that sleeps is stopped at its limit all the
same (asleep is not waiting for a CPU), and one that spins forever is stopped too.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import uuid

import nbformat
import pytest

from labkit import sandbox
from labkit.grading import execute
from labkit.grading.kernel_box import KernelBox
from labkit.grading.settings import Limits
from labkit.limits import WALL_FACTOR

LIMIT = 2.0
RIVALS = 3
SPIN = """
import time
started, cpu = time.monotonic(), time.process_time()
while time.process_time() - cpu < {cpu}:
    pass
print(f"WALL {{time.monotonic() - started:.3f}}", flush=True)
"""
STAMP = "import time\nprint(f'STAMP {time.time():.3f}', flush=True)"


@pytest.fixture
def one_busy_cpu():
    """This process (and the kernel it starts) and three spinning rivals on the same CPU.

    Every thread is pinned (affinity is a thread's; nbclient may start the kernel from a thread
    of its own, which then inherits it). Each rival has a session of its own: with the kernel's
    autogroup scheduling, a session's processes share one fair share (one rival in this
    process's session left a cell 76 % of the CPU in CI)."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    pin({cpu})
    rivals = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                               preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) for _ in range(RIVALS)]
    try:
        yield
    finally:
        pin(before)
        for rival in rivals:
            rival.kill()
            rival.wait(timeout=10)


def pin(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # that thread has just ended
            pass


def run(tmp_path, *sources: str) -> tuple[execute.Execution, nbformat.NotebookNode]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    limits = dataclasses.replace(Limits(), cell_timeout=LIMIT, notebook_timeout=300.0)
    uid = sandbox.uid() + 30_000 + os.getpid() % 50_000 if sandbox.support().ok else None
    kernel = KernelBox(tmp_path / "kernel", "outbox", limits, f"test-{uuid.uuid4().hex}", uid)
    executed = execute.prepare(nb, set())
    try:
        return execute.execute(executed, kernel, limits), executed
    finally:
        kernel.close()


def printed(cell, word: str) -> float:
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert word in text, f"the cell did not print {word}: {cell.outputs}"
    return float(text.split(word, 1)[1].split()[0])


def test_a_cell_slowed_by_a_busy_machine_is_not_stopped(tmp_path, one_busy_cpu):
    result, nb = run(tmp_path, SPIN.format(cpu=0.4 * LIMIT), "print('after')")
    assert result.status == execute.OK and not result.timed_out_cells, \
        f"a cell needing {0.4 * LIMIT:g} s of CPU was stopped at {LIMIT:g} s on the clock: {result}"
    wall = printed(nb.cells[0], "WALL")
    assert wall > LIMIT, f"the competitor did not slow the cell ({wall:.2f} s on the clock): this test proves nothing"
    assert "after" in "".join(o.get("text", "") for o in nb.cells[1].outputs)


def test_a_cell_that_spins_forever_on_a_busy_machine_is_still_stopped(tmp_path, one_busy_cpu):
    result, _ = run(tmp_path, "while True:\n    pass", "print('after')")
    assert result.status == execute.TIMEOUT and result.timed_out_cells == [0], result


def test_a_sleeping_cell_is_stopped_at_its_limit_not_later(tmp_path):
    """Asleep is not waiting for a CPU: nothing is added, so the interrupt comes at the limit,
    far before the backstop (`WALL_FACTOR` times it)."""
    result, nb = run(tmp_path, STAMP, "import time\ntime.sleep(60)")
    stopped_after = time.time() - printed(nb.cells[0], "STAMP")
    assert result.status == execute.TIMEOUT and result.timed_out_cells == [1], result
    assert stopped_after < (1 + WALL_FACTOR) / 2 * LIMIT, f"a sleeping cell ran {stopped_after:.1f} s"
