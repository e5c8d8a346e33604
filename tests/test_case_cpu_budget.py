"""A case that only a too-slow solution can hang on (`Plan.hang_clause`) has a CPU budget
(`limits.HANG_CASE_CPU_SECONDS`, set by `probe.started` as a CPU-time timer, SIGPROF): a
solution that computes forever there is ended after seconds of CPU time, not held
for the step's whole time limit, and the verdict is the one the clock would have given (timed
out, on the case's clause). Every other case runs without a CPU limit; a hang that sleeps is
still ended by the clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import labs
from labkit.judge.run import run_lab
from labkit.judge.verdict import Outcome
from labkit.limits import HANG_CASE_CPU_SECONDS, TIMEOUT_ENV

ROOT = Path(__file__).resolve().parents[1]
HUGE = "attempt 10**9"  # relay's backoff case with a hang clause (checks/relay/backoff.py)


def backoff_that_hangs(tmp_path: Path, how: str) -> Path:
    """The reference, whose backoff `how`s (a statement) at attempt 10**9 only."""
    source = (ROOT / "solutions" / labs.manifest("relay").module_file).read_text()
    head = "def backoff("
    start = source.index(head)
    body = source.index(":\n", start) + 2
    hang = f"    if type(attempt) is int and attempt >= 10**9:\n        {how}\n"
    path = tmp_path / "relay.py"
    path.write_text(source[:body] + hang + source[body:])
    return path


def step_5(path: Path):
    return run_lab(labs.load("relay"), path, steps=["5"], seed=1).steps[0]


def test_a_computing_hang_is_ended_by_its_cpu_budget_with_the_clocks_verdict(tmp_path):
    step = step_5(backoff_that_hangs(tmp_path, "while True: pass"))
    cases = {c.name: c for c in step.cases}
    huge = cases[HUGE]
    assert huge.outcome is Outcome.TIMED_OUT, huge
    assert huge.got == f"still computing after {HANG_CASE_CPU_SECONDS:g} s of CPU time; the process was killed"
    assert huge.clauses == ("5.large-attempt",)
    # The cases before it ran in the same child, unlimited, and passed.
    assert all(c.passed for c in step.cases[: step.cases.index(huge)]), [c for c in step.cases if not c.passed]


def test_a_sleeping_hang_is_still_ended_by_the_clock(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    step = step_5(backoff_that_hangs(tmp_path, "__import__('time').sleep(60)"))
    huge = {c.name: c for c in step.cases}[HUGE]
    assert huge.outcome is Outcome.TIMED_OUT, huge
    assert huge.got.startswith("no answer within 3 s"), huge.got
    assert huge.clauses == ("5.large-attempt",)


PROBE = """
import json, os, signal, sys
from labkit import probe
r, w = os.pipe()
probe.attach(w, "module.py")
probe.budget_cpu({"budgeted": %r})
signal.setitimer = lambda *a: (0.0, 0.0)  # a student's patch, after the probe was imported
seen = {}
for case in ("budgeted", "free"):
    probe.started(case)
    seen[case] = signal.getitimer(signal.ITIMER_PROF)[0]
print(json.dumps(seen))
"""


def test_only_a_budgeted_case_runs_under_a_cpu_timer_which_a_patch_cannot_lift():
    out = subprocess.run([sys.executable, "-c", PROBE % HANG_CASE_CPU_SECONDS], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert HANG_CASE_CPU_SECONDS * 0.5 < seen["budgeted"] <= HANG_CASE_CPU_SECONDS + 0.05, seen  # + a tick
    assert seen["free"] == 0, seen


@pytest.mark.parametrize("code", [-27, 155, -24, 152])
def test_only_a_cpu_signal_in_an_unfinished_case_counts_as_out_of_cpu(code):
    from labkit.judge.child import ChildRun, _out_of_cpu

    stuck = ChildRun(records=[{"event": "start", "case": "a"}], exit_code=code)
    _out_of_cpu(stuck)
    assert stuck.timed_out and stuck.cpu_limit
    done = ChildRun(records=[{"event": "start", "case": "a"}, {"event": "case", "case": "a", "outcome": {}}],
                    exit_code=code)
    _out_of_cpu(done)
    assert not done.timed_out and not done.cpu_limit
    other = ChildRun(records=[{"event": "start", "case": "a"}], exit_code=-9)
    _out_of_cpu(other)
    assert not other.timed_out
