"""Lab `vending`, step 1: parse_line on every refused and accepted frame, then a property test against the oracle."""

from __future__ import annotations

from checks.vending import oracle
from checks.vending.hints import CLAUSE_HINTS, RESULT_HINT
from checks.vending.inputs import REFUSED_LINES, accepted_lines
from labkit.judge.differential import after_fixed, differential
from labkit.judge.expect import Plan, raises, returns
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def check_parse(ctx: StepContext) -> list[Case]:
    plans, values = [], []
    for label, line, expected, clauses in accepted_lines(ctx.rng):
        plans.append(Plan(label, f"parse_line({show(line)})", show(expected),
                         returns(expected, CLAUSE_HINTS[clauses[0]] if clauses[0] != "1.result" else RESULT_HINT),
                         clauses=clauses))
        values.append(line)
    for label, line, clauses in REFUSED_LINES:
        hint = CLAUSE_HINTS[clauses[0]]
        plans.append(Plan(label, f"parse_line({show(line)})", "ValueError", raises("ValueError", hint), hint,
                         clauses=clauses))
        values.append(line)
    specs = [{"name": p.name, "fn": "parse_line", "args": [encode(v)]} for p, v in zip(plans, values, strict=True)]
    name = "parse_line agrees with the contract on generated lines"
    return after_fixed(lambda: ctx.cases("calls", plans, {"calls": specs}, probes="labkit.probe"), name,
                      "parse_line on generated lines", lambda: differential(
        ctx, "parse_line", oracle.frames(), oracle.parse_line,
        lambda line: (oracle.line_clause(line), CLAUSE_HINTS[oracle.line_clause(line)]),
        clauses=tuple(CLAUSE_HINTS), name=name))
