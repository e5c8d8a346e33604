"""The toy lab's one check: `half(n)` called with each case, through labkit's generic probes."""

from __future__ import annotations

from labkit.judge.contract import Clause, contract
from labkit.judge.expect import Plan, raises, returns
from labkit.judge.run import StepContext, lab_spec
from labkit.judge.verdict import Case
from labkit.values import encode, show

CLAUSES = contract(
    Clause("1.type", "n is an int, never a bool; anything else is ValueError"),
    Clause("1.range", "n is from 0 to 10; outside is ValueError"),
    Clause("1.result", "returns n // 2"),
)

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
    return ctx.cases("calls", plans, {"calls": specs})


LAB = lab_spec(__package__, {1: check_half}, contract=CLAUSES)
