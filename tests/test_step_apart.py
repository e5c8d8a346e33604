"""`StepContext.apart`: children run side by side get their own folder and random stream.

Two children of one step once shared a work folder: a submission that replaced the files in
its folder broke the other child's database, and which case showed its mistake depended on
which child ran first. Two threads also drew from one random stream, so a seed did not fix
the inputs.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import toylab.lab

from labkit.judge.run import LabSpec, StepSpec, run_lab
from labkit.judge.verdict import Case, Outcome


def _two_children(ctx, seen: list) -> list[Case]:
    """The toy's calls in two children side by side, one in a folder apart; records what each saw."""
    beside = ctx.apart("beside")
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(toylab.lab.check_cases, beside, toylab.lab.CASES[:1])
        mine = toylab.lab.check_cases(ctx, toylab.lab.CASES[1:2])
        seen.append({"main": ctx.workdir, "beside": beside.workdir, "draws": [beside.rng.random() for _ in range(3)],
                     "main_draw": ctx.rng.random(), "beside_exists": beside.workdir.is_dir()})
        return mine + other.result()


def _lab(seen: list) -> LabSpec:
    return LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "half", 1, lambda ctx: _two_children(ctx, seen))],
                   contract=toylab.lab.CLAUSES)


def test_a_child_apart_has_its_own_folder_and_stream_and_both_are_cleaned_up(tmp_path, nothing_left):
    solution = tmp_path / "toy.py"
    solution.write_text(toylab.REFERENCE)
    seen: list = []
    with nothing_left():
        first = run_lab(_lab(seen), solution, seed=7)
        second = run_lab(_lab(seen), solution, seed=7)
    assert first.passed and second.passed, [c.got for s in first.steps for c in s.cases if c.outcome != Outcome.PASSED]
    a, b = seen
    assert a["beside_exists"] and a["main"] != a["beside"]
    assert not Path(a["beside"]).is_relative_to(a["main"]) and not Path(a["main"]).is_relative_to(a["beside"])
    assert a["draws"] == b["draws"], "the same seed must give the child apart the same draws"
    assert a["draws"][0] != random.Random("7:1").random(), "the child apart must not share the step's stream"
    assert not Path(a["beside"]).exists() and not Path(a["main"]).exists()
