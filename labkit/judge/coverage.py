"""Which contract clause each case tries, and which wrong solution proves each clause is caught.

For every lab that declares a contract (`LabSpec.contract`, `labkit.judge.contract`), the
reference's verdict at a fixed seed says which cases exercise which clause; the catalogue's
data file `tests/wrong_solutions/<lab>.toml` (`labkit.judge.catalogue`) says which clause each
mistake breaks. This module finds what breaks the rules on the reference's verdict, and writes
the table published as docs/coverage.md (reference runs and data-file reads only: no catalogue
runs).
tests/test_contract.py holds the rules: every case tagged with declared clauses
(`tag_problems`), every clause exercised (`clauses_without_case`), every clause broken by a
wrong solution whose run fails a case tagged with it.

    python -m labkit.judge.coverage --write docs/coverage.md   # regenerate
    python -m labkit.judge.coverage --check docs/coverage.md   # exit 1 if it drifted
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from labkit import labs
from labkit.judge import catalogue as wrong_solutions
from labkit.judge.run import LabSpec, run_lab
from labkit.judge.verdict import LabVerdict

ROOT = Path(__file__).resolve().parents[2]
SEED = 1  # the reference's verdict at this seed names the cases in the table
CATALOGUE = ROOT / "tests" / "wrong_solutions"  # <lab>.toml and <lab>/<name>.patch
DOCUMENT = ROOT / "docs" / "coverage.md"


def contract_labs() -> list[str]:
    """The registered labs that declare a non-empty contract."""
    return [name for name in labs.available() if labs.load(name).contract]


def reference(lab: str) -> Path:
    return ROOT / "solutions" / labs.manifest(lab).module_file


def catalogue(lab: str) -> dict[str, dict[str, str]]:
    """File name (<name>.py, as tests/catalogue.py builds it) → what its entry promises."""
    if not wrong_solutions.data_file(CATALOGUE, lab).is_file():
        return {}
    return {f"{entry.name}.py": entry.promise() for entry in wrong_solutions.read(CATALOGUE, lab).entries}


def cases_by_clause(spec: LabSpec, verdict: LabVerdict) -> dict[str, list[str]]:
    """Clause ID → "step: case name" of every case in `verdict` tagged with it (declared order)."""
    found: dict[str, list[str]] = {clause.id: [] for clause in spec.contract}
    for step in verdict.steps:
        for case in step.cases:
            for clause in case.clauses:
                found.setdefault(clause, []).append(f"{step.step}: {case.name}")
    return found


def tag_problems(spec: LabSpec, verdict: LabVerdict) -> list[str]:
    """Cases of `verdict` tagged with no clause, or with a clause the contract does not declare."""
    declared = {clause.id for clause in spec.contract}
    found = []
    for step in verdict.steps:
        for case in step.cases:
            if not case.clauses:
                found.append(f"step {step.step}, case {case.name!r}: tagged with no clause")
            found += [f"step {step.step}, case {case.name!r}: tagged {clause}, which the contract does not declare"
                      for clause in case.clauses if clause not in declared]
    return found


def clauses_without_case(spec: LabSpec, verdict: LabVerdict) -> list[str]:
    """Declared clauses that no case of `verdict` exercises."""
    by_clause = cases_by_clause(spec, verdict)
    return [clause.id for clause in spec.contract if not by_clause[clause.id]]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def lab_table(spec: LabSpec, verdict: LabVerdict, wrong: Mapping[str, dict[str, str] | None]) -> str:
    by_clause = cases_by_clause(spec, verdict)
    naming: dict[str, list[str]] = {}
    for name, said in wrong.items():
        if said and said.get("clause"):
            naming.setdefault(said["clause"], []).append(name)
    lines = [f"## Lab `{spec.name}`", "",
             "| clause | rule | cases that exercise it | wrong solutions that break it |",
             "|---|---|---|---|"]
    for clause in spec.contract:
        cases = "<br>".join(_cell(c) for c in by_clause[clause.id]) or "**none**"
        files = "<br>".join(f"`{n}`" for n in naming.get(clause.id, [])) or "**none**"
        lines.append(f"| `{clause.id}` | {_cell(clause.text)} | {cases} | {files} |")
    cases = sum(len(step.cases) for step in verdict.steps)
    lines += ["",
              f"Clauses: {len(spec.contract)}. Cases in the reference's verdict (seed {SEED}): {cases}. "
              f"Clauses without a case: {len(clauses_without_case(spec, verdict))}. "
              f"Clauses without a wrong solution: {sum(1 for c in spec.contract if not naming.get(c.id))}. "
              f"Wrong solutions: {len(wrong)} "
              f"({sum(1 for said in wrong.values() if not (said and said.get('clause')))} name no clause).",
              ""]
    return "\n".join(lines)


def document(verdicts: Mapping[str, LabVerdict]) -> str:
    """docs/coverage.md for the given reference verdicts (lab name → verdict at `SEED`)."""
    head = ["# Contract coverage", "",
            "Generated by `python -m labkit.judge.coverage --write docs/coverage.md`; a test fails when "
            "this file drifts from what the checks and the catalogue say.",
            "",
            "Each clause is one rule of the lab's contract. *Cases* are the reference's verdict at "
            f"seed {SEED} (a seed adds random cases, never removes one); *wrong solutions* are the "
            "entries of `tests/wrong_solutions/<lab>.toml` that name the clause, each the reference with "
            "one mistake (`<lab>/<name>.patch`; a test runs each and checks that a case tagged with that "
            "clause fails).",
            ""]
    if not verdicts:
        return "\n".join([*head, "No lab declares its contract clauses yet.", ""])
    body = [lab_table(labs.load(lab), verdict, catalogue(lab)) for lab, verdict in verdicts.items()]
    return "\n".join(head + body)


def reference_verdicts() -> dict[str, LabVerdict]:
    return {lab: run_lab(labs.load(lab), reference(lab), seed=SEED) for lab in contract_labs()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.judge.coverage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="FILE", help="write the table to FILE")
    mode.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if FILE differs from a fresh table")
    args = parser.parse_args(argv)
    text = document(reference_verdicts())
    if args.write:
        args.write.write_text(text)
        return 0
    if not args.check.is_file() or args.check.read_text() != text:
        print(f"{args.check} is out of date: run python -m labkit.judge.coverage --write {args.check}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
