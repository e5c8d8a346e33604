"""A step's first child starts with the step (`StepContext.start_early`), before the check has
made its files, servers and databases: the interpreter and the lab's `preload` load meanwhile.

What must hold: the child sees what the judge made after it started (and may write it, as a
box's folder is the box's uid's), the student's module finds the preloaded modules already
there, a child nobody took is ended with the step, and a check that asks for a child with an
environment of its own still gets one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import toylab.lab

from labkit.judge.expect import Plan
from labkit.judge.run import LabSpec, StepSpec, run_lab
from labkit.judge.verdict import Outcome
from labkit.values import encode

# The toy's half(), and at import: what was loaded before the student's module, and whether
# a file the judge wrote after the child started is there and writable.
# (The judge's import check loads it too, in a folder of its own: there it finds nothing.)
SOLUTION = '''\
import os, sys
try:
    SEEN = {"preloaded": "decimal" in sys.modules, "made": open("made-later.txt").read()}
    with open("made-later.txt", "a") as fh:
        fh.write(" and written by the child")
except (OSError, KeyError):
    pass


def half(n):
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError("n must be an int")
    if not 0 <= n <= 10:
        raise ValueError("n must be from 0 to 10")
    return n // 2
'''


def _lab(check, preload=()) -> LabSpec:
    return LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "half", 1, check)], contract=toylab.lab.CLAUSES,
                   preload=preload)


def _made_after_start(seen: dict, env=None):
    def check(ctx):
        assert ctx.early is not None, "the step's first child starts with the step"
        seen["early_pid"] = ctx.early.proc.pid
        (ctx.workdir / "made-later.txt").write_text("made by the judge")
        cases = ctx.cases("calls", *_plans(), env=env)
        seen["after"] = (ctx.workdir / "made-later.txt").read_text()
        return cases
    return check


def _plans():
    plans, specs = [], []
    for label, arg, check, clauses in toylab.lab.CASES[:2]:
        plans.append(Plan(label, f"half({arg!r})", "?", check, clauses=clauses))
        specs.append({"name": label, "fn": "half", "args": [encode(arg)]})
    return plans, {"calls": specs}


def test_the_early_child_sees_and_owns_what_the_judge_made_after_it_started(tmp_path, nothing_left):
    solution = tmp_path / "toy.py"
    solution.write_text(SOLUTION)
    seen: dict = {}
    with nothing_left():
        verdict = run_lab(_lab(_made_after_start(seen), preload=("decimal",)), solution, seed=1)
    assert verdict.passed, [c.got for s in verdict.steps for c in s.cases if c.outcome != Outcome.PASSED]
    assert seen["after"] == "made by the judge and written by the child"


def _preloaded(preload) -> bool:
    """Whether the student's module found `decimal` loaded (its import notes it in a file)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="labkit-test-preload-"))
    solution = folder / "toy.py"
    solution.write_text(SOLUTION.replace('open("made-later.txt").read()', '""').replace(
        'with open("made-later.txt", "a") as fh:\n        fh.write(" and written by the child")',
        'open("preloaded.txt", "w").write(str(SEEN["preloaded"]))'))
    got = {}

    def check(ctx):
        cases = ctx.cases("calls", *_plans())
        got["preloaded"] = (ctx.workdir / "preloaded.txt").read_text()
        return cases

    try:
        assert run_lab(_lab(check, preload), solution, seed=1).passed
        return got["preloaded"] == "True"
    finally:
        solution.unlink()
        folder.rmdir()


def test_preload_imports_the_manifests_modules_before_the_students_module():
    assert _preloaded(("decimal",)) is True
    assert _preloaded(()) is False


def test_a_preloaded_module_that_fails_leaves_the_error_to_the_students_import(tmp_path):
    solution = tmp_path / "toy.py"
    solution.write_text("import no_such_module_here\n")
    verdict = run_lab(_lab(lambda ctx: ctx.cases("calls", *_plans()), ("no_such_module_here",)), solution, seed=1)
    case = verdict.steps[0].cases[0]
    assert case.outcome is Outcome.IMPORT_FAILED and "no_such_module_here" in case.got


def test_a_child_with_its_own_environment_is_started_fresh_and_the_early_one_ended(tmp_path, nothing_left):
    solution = tmp_path / "toy.py"
    solution.write_text(SOLUTION.replace('open("made-later.txt").read()', 'os.environ.get("TOY_SAYS", "nothing")')
                        .replace('fh.write(" and written by the child")', 'fh.write(" " + SEEN["made"])'))
    seen: dict = {}
    with nothing_left():
        verdict = run_lab(_lab(_made_after_start(seen, env={"TOY_SAYS": "hello"})), solution, seed=1)
    assert verdict.passed, [c.got for s in verdict.steps for c in s.cases if c.outcome != Outcome.PASSED]
    assert seen["after"] == "made by the judge hello", "the child that ran had the environment it was given"


def test_an_early_child_nobody_takes_is_ended_with_the_step(tmp_path, nothing_left):
    solution = tmp_path / "toy.py"
    solution.write_text(toylab.REFERENCE)
    seen: dict = {}

    def no_child(ctx):
        seen["early"] = ctx.early
        return toylab.lab.check_cases(dataclasses.replace(ctx, early=None), toylab.lab.CASES[:1])

    with nothing_left():
        verdict = run_lab(_lab(no_child), solution, seed=1)
    assert verdict.passed
    assert seen["early"].closed and seen["early"].proc.poll() is not None
