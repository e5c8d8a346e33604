"""No case passes a function that never does its work.

A case that compares what two calls returned, or faults each SQL statement a call runs, can
pass for nothing when the call raised first: no result to compare, no statement to fault. (Outbox
step 4's identity case did, and the fault sweeps of outbox steps 3, 5, 6 and vending step 3.)
Here every public function of each reference raises RuntimeError as its first statement; every
case that calls one must then fail. Only cases that call nothing (they read a signature) may pass.
"""

from __future__ import annotations

import ast

import parse_python
import pytest

from labkit import labs
from labkit.judge import coverage
from labkit.judge.run import run_lab

LABS = [lab for lab in labs.available() if coverage.reference(lab).is_file()]
FIRST_LINE = "raise RuntimeError('every call raises before doing anything')"


def raising_first(source: str) -> str:
    """`source` with FIRST_LINE as the first statement (after the docstring) of each public function."""
    lines = source.splitlines()
    places = []
    for node in parse_python.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            body = node.body
            docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            first = body[1] if docstring and len(body) > 1 else body[0]
            places.append((first.lineno - 1, first.col_offset))
    for line, col in sorted(places, reverse=True):
        lines.insert(line, " " * col + FIRST_LINE)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("lab", LABS)
def test_no_case_passes_when_every_function_raises_first(lab, tmp_path):
    module = tmp_path / labs.manifest(lab).module_file
    module.write_text(raising_first(coverage.reference(lab).read_text()))
    verdict = run_lab(labs.load(lab), module, seed=1, explain=False)
    passed = [f"step {step.step}: {case.name}" for step in verdict.steps for case in step.cases
              if case.passed and not case.called.startswith("inspect.signature")]
    assert not passed, "these cases passed although every call raised:\n" + "\n".join(passed)
    assert verdict.score == 0
