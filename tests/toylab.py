"""A tiny lab, registered only inside tests, to prove that the generic rules can fail.

Contract of `half(n)`: `n` is an int (never a bool) from 0 to 10, else ValueError; returns
`n // 2`. `install(monkeypatch, folder)` registers it as lab "toy" with a reference
`folder/solutions/toy.py` and a catalogue `folder/wrong_solutions/toy/`, the way the real labs
are found (`labkit.labs`, `labkit.judge.coverage`).
"""

from __future__ import annotations

from pathlib import Path

from labkit import labs
from labkit.judge import coverage
from labkit.judge.contract import Clause, contract
from labkit.judge.expect import Plan, raises, returns
from labkit.judge.run import LabSpec, StepContext, StepSpec
from labkit.judge.verdict import Case
from labkit.values import encode, show

CLAUSES = contract(
    Clause("1.type", "n is an int, never a bool; anything else is ValueError"),
    Clause("1.range", "n is from 0 to 10; outside is ValueError"),
    Clause("1.result", "returns n // 2"),
)

REFERENCE = '''\
def half(n):
    if type(n) is not int:
        raise ValueError("an int")
    if not 0 <= n <= 10:
        raise ValueError("0 to 10")
    return n // 2
'''

# (label, argument, plan's check, clauses)
CASES = [
    ("a plain int", 4, returns(2), ("1.result",)),
    ("an odd int, 7", 7, returns(3), ("1.result",)),
    ("the top of the range, 10", 10, returns(5), ("1.range", "1.result")),
    ("11, just outside", 11, raises("ValueError", "0 to 10."), ("1.range",)),
    ("a bool", True, raises("ValueError", "True is an int."), ("1.type",)),
    ("a float", 4.0, raises("ValueError", "An int."), ("1.type",)),
    ("a str of 2 characters", "42", raises("ValueError", "An int."), ("1.type",)),
]


def check_half(ctx: StepContext) -> list[Case]:
    return check_cases(ctx, CASES)


def check_cases(ctx: StepContext, cases: list) -> list[Case]:
    plans = [Plan(label, f"half({show(arg)})", "?", check, clauses=clauses) for label, arg, check, clauses in cases]
    specs = [{"name": label, "fn": "half", "args": [encode(arg)]} for label, arg, _, _ in cases]
    return ctx.cases("calls", plans, {"calls": specs}, probes="labkit.probe")


LAB = LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "half", 1, check_half)], contract=CLAUSES)


def wrong(mistake: str, clause: str, old: str, new: str, step: str = "1") -> str:
    """A catalogue file: the reference with `old` replaced by `new`, and its docstring."""
    assert old in REFERENCE
    return (f'"""Wrong: {mistake}. Fails step {step}. Clause: {clause}. Message: {mistake}"""\n'
            + REFERENCE.replace(old, new))


def install(monkeypatch, folder: Path, catalogue: dict[str, str] | None = None) -> Path:
    """Register the toy lab with its reference and `catalogue` (file name → source) under `folder`."""
    (folder / "solutions").mkdir(parents=True)
    (folder / "solutions" / "toy.py").write_text(REFERENCE)
    wrong_dir = folder / "wrong_solutions" / "toy"
    wrong_dir.mkdir(parents=True)
    for name, source in (catalogue or {}).items():
        (wrong_dir / name).write_text(source)
    monkeypatch.setitem(labs.LABS, "toy", "toylab")
    monkeypatch.setitem(labs.MODULE_FILES, "toy", "toy.py")
    monkeypatch.setattr(coverage, "ROOT", folder)
    monkeypatch.setattr(coverage, "CATALOGUE", folder / "wrong_solutions")
    # The toy course is the toy lab alone: the course's own labs have no reference under `folder`.
    monkeypatch.setattr(coverage, "contract_labs", lambda: ["toy"])
    return wrong_dir
