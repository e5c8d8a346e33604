"""A child that ends before it reaches the student's module ran only the course's code
(`labkit.judge.child.run_child`): it is started once more, and if it fails again the verdict
says the checker failed, never that the student's module did."""

from __future__ import annotations

from pathlib import Path

from labkit.judge import child, expect
from labkit.judge.expect import Plan, returns
from labkit.judge.verdict import Outcome, StepVerdict, course_faults
from labkit.values import encode

MODULE = "def double(x):\n    return 2 * x\n"
PLAN = Plan("double 2", "double(2)", "4", returns(4))
ARGS = {"calls": [{"name": "double 2", "fn": "double", "args": [encode(2)]}], "cases": ["double 2"]}


def _module(tmp_path: Path) -> Path:
    path = tmp_path / "toy.py"
    path.write_text(MODULE)
    return path


def test_a_child_whose_probe_cannot_load_is_the_courses_fault_after_a_second_start(tmp_path, nothing_left):
    starts = []
    real = child._run_child_once

    def counted(*args, **kwargs):
        starts.append(1)
        return real(*args, **kwargs)

    with nothing_left():
        child._run_child_once, saved = counted, child._run_child_once
        try:
            run = child.run_child(_module(tmp_path), "labkit.no_such_probe:calls", ARGS, workdir=tmp_path,
                                  timeout=20, module_name="toy")
        finally:
            child._run_child_once = saved
    assert len(starts) == 2 and run.failed_to_start and run.restarted.startswith("exit code 1")
    [case] = expect.judge(run, [PLAN], 20)
    assert case.outcome is Outcome.IMPORT_FAILED
    assert "ended before it loaded your module" in case.got and "No module named 'labkit.no_such_probe'" in case.got
    assert "Not your code" in case.hint
    step = StepVerdict(1, "toy", 1)
    step.cases = [case]
    assert course_faults([step]), "a start failure must read as the course's fault"


def test_a_child_that_failed_to_start_once_is_judged_on_its_second_start(tmp_path, monkeypatch):
    real = child._run_child_once
    starts = []

    def first_fails(*args, **kwargs):
        starts.append(kwargs["timeout"])
        if len(starts) == 1:  # what CI saw once: the child ended with exit code 1 before the module
            return child.ChildRun(exit_code=1, stderr="bwrap: something transient\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(child, "_run_child_once", first_fails)
    run = child.run_child(_module(tmp_path), "labkit.probe:calls", ARGS, workdir=tmp_path, timeout=20,
                          module_name="toy")
    assert len(starts) == 2 and starts[1] <= 20
    assert run.restarted == "exit code 1: bwrap: something transient"
    assert [c.outcome for c in expect.judge(run, [PLAN], 20)] == [Outcome.PASSED]


def test_a_students_module_that_exits_on_import_is_not_started_twice(tmp_path, monkeypatch):
    real = child._run_child_once
    starts = []
    monkeypatch.setattr(child, "_run_child_once", lambda *a, **k: starts.append(1) or real(*a, **k))
    module = tmp_path / "toy.py"
    module.write_text("import os\nos._exit(1)\n")
    run = child.run_child(module, "labkit.probe:calls", ARGS, workdir=tmp_path, timeout=20, module_name="toy")
    assert len(starts) == 1 and run.reached_module and not run.failed_to_start
    [case] = expect.judge(run, [PLAN], 20)
    assert "the process died while importing your module (exit code 1)" in case.got
