"""A verdict as plain text: for terminals, nbclient output and the gradebook."""

from __future__ import annotations

import textwrap

from labkit.verdict import Case, LabVerdict, Outcome, StepVerdict

MARK = {True: "✓", False: "✗"}
CALM = {Outcome.NOT_IMPLEMENTED: "·", Outcome.MISSING: "·", Outcome.NOT_REACHED: "·"}


def step_heading(step: StepVerdict) -> str:
    label = f"Step {step.step}" if step.step != "final" else "Final check"
    status = {"passed": "passed", "failed": "FAILED", "not_implemented": "not implemented yet"}[step.status]
    return f"{label} — {step.title}: {status} ({step.points}/{step.max_points} points)"


def case_lines(case: Case) -> list[str]:
    mark = MARK[True] if case.passed else CALM.get(case.outcome, MARK[False])
    lines = [f"  {mark} {case.name}"]
    if not case.passed:
        lines += [textwrap.indent(case.message, "      ")]
    return lines


def render_step(step: StepVerdict, brief_not_implemented: bool = True) -> str:
    lines = [step_heading(step)]
    if step.status == "not_implemented" and brief_not_implemented:
        lines.append("  · not implemented yet: replace `raise NotImplementedError` in the step's cell, run it, check again.")
    else:
        for case in step.cases:
            lines += case_lines(case)
    if step.note:
        lines.append("  note: " + step.note)
    if step.evidence and step.evidence.faults:
        lines.append("  faults injected and seen to take effect:")
        lines += [f"    - {fault}" for fault in step.evidence.faults]
    return "\n".join(lines)


def render_lab(verdict: LabVerdict) -> str:
    head = (f"lab {verdict.lab} — seed {verdict.seed} — {verdict.score}/{verdict.max_score} points"
            f" — {'all passed' if verdict.passed else 'not all passed'} ({verdict.seconds:.1f} s)")
    return "\n\n".join([head] + [render_step(s) for s in verdict.steps])
