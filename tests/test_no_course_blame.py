"""The checker never blames the course for a student's bug (issue 8 item 7).

The phrases the judge uses when the fault is its own are `labkit.judge.verdict.COURSE_FAULT`,
gathered from what labkit/judge/run.py says when a check raises ("the checker itself failed",
"bug in the course", "please report it"), what the checks say when their own server
misbehaves (lab 02's final check: "a bug in the course's feed (labkit/feed.py)"), and what
labkit/servers/warehouse.py's WarehouseStartError says ("warehouse failed", "warehouse process
exited", "was not ready within"). No verdict of any catalogue file — on the steps and seeds the
seed test judges (tests/catalogue.py: SEEDS, steps_to_run; the same cached runs) — nor of a
sample of cosmic-ray mutants of each reference, may contain one. (The catalogue's runs leave
out the note on the steps a failing step builds on, `catalogue.EXPLAIN`: a fixed sentence that
names only steps.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from catalogue import (
    SEEDS,
    every_wrong_file,
    labs_with_wrong_solutions,
    step_verdicts,
    steps_to_run,
)

from labkit import labs
from labkit.judge import coverage
from labkit.judge.run import LabSpec, StepSpec, run_lab
from labkit.judge.verdict import course_faults

ROOT = Path(__file__).resolve().parents[1]
LABS = labs_with_wrong_solutions()
WRONG = every_wrong_file()
MUTANTS_PER_LAB = 6


def mutation_score():
    spec = importlib.util.spec_from_file_location("mutation_score", ROOT / "benchmarks" / "mutation_score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("lab", "path"), WRONG, ids=[f"{lab}:{path.stem}" for lab, path in WRONG])
def test_no_wrong_solution_is_told_the_course_failed(lab, path):
    found = {seed: course_faults(list(step_verdicts(lab, path, steps_to_run(lab, path), seed).values()))
             for seed in SEEDS}
    assert not any(found.values()), f"{path.name}: {found}"


@pytest.mark.parametrize("lab", LABS)
def test_no_sampled_mutant_is_told_the_course_failed(lab, tmp_path):
    pytest.importorskip("cosmic_ray", reason="pip install -e '.[test]' brings cosmic-ray")
    mutants = mutation_score().sample(lab, tmp_path, MUTANTS_PER_LAB)
    assert len(mutants) == MUTANTS_PER_LAB
    found = {}
    for n, (step, operator, line, source) in enumerate(mutants):
        folder = tmp_path / f"mutant-{n}"
        folder.mkdir()
        module = folder / labs.manifest(lab).module_file
        module.write_text(source)
        faults = course_faults(run_lab(labs.load(lab), module, steps=[step], seed=SEEDS[0]).steps)
        if faults:
            found[f"{operator} at line {line}"] = faults
    assert not found, found


def test_a_check_that_raises_is_found_as_a_course_fault(tmp_path):
    """The phrases are the ones the judge really uses: a check that raises produces one."""
    def broken(ctx):
        raise RuntimeError("a bug in a check")

    module = tmp_path / "toy.py"
    module.write_text("x = 1\n")
    verdict = run_lab(LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "broken", 1, broken)]), module, seed=1)
    assert course_faults(verdict.steps) == ["1: check: 'the checker itself failed'", "1: check: 'bug in the course'",
                                            "1: check: 'please report it'"]


# The function that opens the lab's connection, and its step: what the student does to the
# connection before returning it is theirs; the judge must still read it, or say what it found.
OPENERS = {"outbox": ("2", ["open_source", "open_sink"]), "vending": ("2", ["open_store"]),
           "relay": ("1", ["open_outbox"])}
DICT_ROWS = "lambda cur, row: {d[0]: v for d, v in zip(cur.description, row)}"


@pytest.mark.parametrize("lab", sorted(OPENERS))
@pytest.mark.parametrize("change", ["dict rows", "closed"])
def test_what_a_student_does_to_the_returned_connection_gets_a_verdict_about_it(lab, change, tmp_path):
    step, names = OPENERS[lab]
    module = tmp_path / labs.manifest(lab).module_file
    wrapped = "".join(
        f"\n_real_{n} = {n}\ndef {n}(*a, **kw):\n    con = _real_{n}(*a, **kw)\n"
        + (f"    con.row_factory = {DICT_ROWS}\n" if change == "dict rows" else "    con.close()\n")
        + "    return con\n" for n in names)
    module.write_text(coverage.reference(lab).read_text() + wrapped)
    result = run_lab(labs.load(lab), module, steps=[step], seed=SEEDS[0], explain=False)
    cases = result.steps[0].cases
    ended = [f"{c.name}: {c.got}" for c in cases if "ended the process" in c.got]
    assert not ended and course_faults(result.steps) == []
    if change == "closed":
        assert any("already closed" in c.got for c in cases), [c.got for c in cases if not c.passed]
