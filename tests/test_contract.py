"""Every clause of every lab's contract has a case, and a wrong solution that the case catches.

For each lab that declares its contract (`LabSpec.contract`):
(a) every case in the reference's verdict (seed `coverage.SEED`) is tagged with at least one
    clause, and only with declared clauses;
(b) every declared clause has at least one case in that verdict;
(c) every declared clause has a wrong solution in tests/wrong_solutions/<lab>.toml that names
    it and whose verdict, on the step it names, has a failing case tagged with it;
and docs/coverage.md is what `python -m labkit.judge.coverage` writes today.
The toy lab (tests/toylab.py) proves that each rule fails when it is broken.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import toylab.lab
from catalogue import promise, step_verdicts, verdict, wrong_file

from labkit import labs
from labkit.judge import catalogue as wrong_solutions
from labkit.judge import coverage

LABS = coverage.contract_labs()
CLAUSES = [(lab, clause.id) for lab in LABS for clause in labs.load(lab).contract]
# Labs that need no contract, and why.
NO_CONTRACT = {"start-here": "the warm-up teaches how cells and checks work; it has no contract to cover"}
# ENABLE AT MERGE: empty this set once the issue8-outbox and issue8-vending branches (which add
# checks/<lab>/contract.py) are merged; from then on a lab without a contract fails here.
AWAITING_CONTRACT: set[str] = set()


def reference_verdict(lab: str):
    return verdict(lab, coverage.reference(lab), coverage.SEED)


def caught_by(lab: str, clause: str) -> tuple[list[str], list[str]]:
    """(files whose entry names `clause`, those among them whose promised step fails a case tagged with it)."""
    naming = [name for name, said in coverage.catalogue(lab).items() if said and said["clause"] == clause]
    caught = []
    for name in naming:
        path = wrong_file(lab, Path(name).stem)
        step = promise(path)["step"]
        failing = [c for c in step_verdicts(lab, path, [step], coverage.SEED)[step].cases if not c.passed]
        if any(clause in case.clauses for case in failing):
            caught.append(name)
    return naming, caught


@pytest.mark.parametrize("lab", sorted(set(labs.available()) - set(NO_CONTRACT)))
def test_every_course_lab_declares_its_contract(lab):
    if lab in AWAITING_CONTRACT and not labs.load(lab).contract:
        pytest.skip(f"{lab}'s contract comes with its issue-8 branch: empty AWAITING_CONTRACT when merged")
    assert labs.load(lab).contract, f"lab {lab} declares no contract clauses (checks/{lab}_contract.py)"


@pytest.mark.parametrize("lab", LABS)
def test_every_case_of_the_reference_is_tagged_with_declared_clauses(lab):
    problems = coverage.tag_problems(labs.load(lab), reference_verdict(lab))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_every_clause_has_a_case(lab):
    missing = coverage.clauses_without_case(labs.load(lab), reference_verdict(lab))
    assert not missing, f"lab {lab}: no case exercises {missing}"


@pytest.mark.parametrize(("lab", "clause"), CLAUSES, ids=[f"{lab}:{clause}" for lab, clause in CLAUSES])
def test_every_clause_is_caught_by_a_wrong_solution(lab, clause):
    naming, caught = caught_by(lab, clause)
    assert naming, f"no wrong solution in tests/wrong_solutions/{lab}.toml names clause {clause}"
    assert caught, f"{naming} name clause {clause}, but none fails a case tagged with it on the step it names"


def test_coverage_document_is_up_to_date():
    fresh = coverage.document({lab: reference_verdict(lab) for lab in LABS})
    assert coverage.DOCUMENT.read_text() == fresh, \
        "docs/coverage.md is out of date: run python -m labkit.judge.coverage --write docs/coverage.md"


# --- the rules fail when broken (the toy lab) ---------------------------------------------


@pytest.fixture
def toy(monkeypatch, tmp_path) -> Path:
    catalogue = {
        "bool_accepted": toylab.wrong("accepts True", "1.type", "type(n) is not int", "not isinstance(n, int)"),
        "eleven_accepted": toylab.wrong("accepts 11", "1.range", "0 <= n <= 10", "0 <= n <= 11"),
        "rounds_up": toylab.wrong("rounds up", "1.result", "return n // 2", "return (n + 1) // 2"),
    }
    toylab.install(monkeypatch, tmp_path, catalogue)
    return tmp_path


def test_the_toy_lab_meets_every_rule(toy):
    spec, reference = labs.load("toy"), reference_verdict("toy")
    assert reference.passed
    assert coverage.tag_problems(spec, reference) == []
    assert coverage.clauses_without_case(spec, reference) == []
    assert [caught_by("toy", c.id)[1] for c in spec.contract] == [["bool_accepted.py"], ["eleven_accepted.py"],
                                                                   ["rounds_up.py"]]


def test_an_untagged_or_undeclared_tag_is_a_problem(toy, monkeypatch):
    cases = list(toylab.lab.CASES)
    cases[0] = (*cases[0][:3], ())
    cases[2] = (*cases[2][:3], ("1.rnage",))
    monkeypatch.setattr(toylab.lab, "CASES", cases)
    problems = coverage.tag_problems(labs.load("toy"), verdict("toy", coverage.reference("toy"), seed=7))
    assert problems == ["step 1, case 'a plain int': tagged with no clause",
                        "step 1, case 'the top of the range, 10': tagged 1.rnage, which the contract does not declare"]


def test_a_clause_without_a_case_is_reported(toy, monkeypatch):
    monkeypatch.setattr(toylab.lab, "CASES", [c for c in toylab.lab.CASES if "1.type" not in c[3]])
    reference = verdict("toy", coverage.reference("toy"), seed=8)
    assert coverage.clauses_without_case(labs.load("toy"), reference) == ["1.type"]
    assert "| `1.type` | n is an int, never a bool; anything else is ValueError | **none** |" in \
        coverage.lab_table(labs.load("toy"), reference, coverage.catalogue("toy"))


def test_a_clause_whose_wrong_solution_is_caught_under_another_clause_is_not_covered(toy, monkeypatch):
    """rounds_up names 1.result; if the only failing case were tagged 1.range, it would prove nothing."""
    monkeypatch.setattr(toylab.lab, "CASES", [(*c[:3], ("1.range",)) if "1.result" in c[3] else c for c in toylab.lab.CASES])
    assert caught_by("toy", "1.result") == (["rounds_up.py"], [])


def test_a_clause_no_wrong_solution_names_is_not_covered(toy):
    toy_wrong = wrong_solutions.read(coverage.CATALOGUE, "toy")
    kept = [entry for entry in toy_wrong.entries if entry.name != "rounds_up"]
    wrong_solutions.data_file(coverage.CATALOGUE, "toy").write_text(wrong_solutions.dumps(replace(toy_wrong, entries=kept)))
    assert caught_by("toy", "1.result") == ([], [])
    table = coverage.lab_table(labs.load("toy"), reference_verdict("toy"), coverage.catalogue("toy"))
    assert "| `1.result` | returns n // 2 | 1: a plain int<br>1: an odd int, 7<br>1: the top of the range, 10 | **none** |" in table
    assert "Clauses without a wrong solution: 1. Wrong solutions: 2 (0 name no clause)." in table


def test_the_coverage_command_writes_and_checks_the_document(toy, tmp_path):
    out = tmp_path / "coverage.md"
    assert coverage.main(["--write", str(out)]) == 0
    text = out.read_text()
    assert "## Lab `toy`" in text and "Clauses without a case: 0." in text
    assert coverage.main(["--check", str(out)]) == 0
    out.write_text(text.replace("1: a plain int", "1: something else"))
    assert coverage.main(["--check", str(out)]) == 1


def _lesson_cells(lab: str) -> dict[str, str]:
    """Cell id → source, in the lab's student notebook as the build writes it."""
    import nbformat

    [path] = (coverage.ROOT / "notebooks").glob(f"[0-9][0-9]-{lab}.ipynb")
    return {cell.id: cell.source for cell in nbformat.read(path, as_version=4).cells}


@pytest.mark.parametrize("lab", LABS)
def test_every_rule_a_steps_check_tries_is_stated_in_that_steps_lesson(lab):
    """A student never meets a rule first as a red case: every clause a case of step N is tagged
    with, in the reference's verdict, is listed (id and wording) in the "What the check tries" of
    step N or of an earlier step (step 8 of relay calls step 6's function, so it tries 6's rules)."""
    from labkit.notebook import rules

    contract = {clause.id: rules.item(clause) for clause in labs.load(lab).contract}
    cells = _lesson_cells(lab)
    order = list(cells)
    unstated = []
    for step in reference_verdict(lab).steps:
        here = order.index(rules.cell_id(lab, str(step.step))) if rules.cell_id(lab, str(step.step)) in cells else -1
        for clause in sorted({c for case in step.cases for c in case.clauses}):
            where = rules.cell_id(lab, clause.partition(".")[0])
            stated = clause in contract and contract[clause] in cells.get(where, "")
            if not stated or order.index(where) > here:
                unstated.append(f"step {step.step} tries {clause}, which no lesson text at or above it states")
    assert not unstated, "\n".join(unstated)


@pytest.mark.parametrize("lab", LABS)
def test_the_rules_cell_sits_just_above_the_code_it_is_about(lab):
    from labkit.notebook import rules

    ids = list(_lesson_cells(lab))
    steps = {clause.step for clause in labs.load(lab).contract}
    for step in steps:
        below = f"{lab}-check-final" if step == "final" else f"{lab}-step-{step}"
        assert rules.cell_id(lab, step) in ids and below in ids, (lab, step)
        assert ids.index(below) == ids.index(rules.cell_id(lab, step)) + 1, (lab, step)
