"""A verdict as plain text: for terminals, nbclient output and the gradebook."""

from __future__ import annotations

import textwrap

from labkit.judge.verdict import Case, Evidence, LabVerdict, StepVerdict
from labkit.views import grouping
from labkit.views.standing import NOTEBOOK, Standing, is_calm, standing
from labkit.views.timeline_svg import is_duplicate, is_kill, lanes, rows

MARK = {True: "✓", False: "✗"}


def step_heading(step: StepVerdict, where: Standing | None = None) -> str:
    where = where or standing(step)
    label = f"Step {step.step}" if step.step != "final" else "Final check"
    status = "FAILED" if where.status == "failed" else where.label
    return f"{label} — {step.title}: {status} ({step.points}/{step.max_points} points)"


def case_lines(case: Case, more: int = 0) -> list[str]:
    """A case; a failing one in full (called / expected / got / hint), then how many more cases
    fail the same way (`labkit.views.grouping`: they are folded into this one)."""
    mark = MARK[True] if case.passed else "·" if is_calm(case) else MARK[False]
    lines = [f"  {mark} {case.name if case.passed else grouping.title(case)}"]
    if not case.passed:
        lines += [textwrap.indent(case.message, "      ")]
        if rule := grouping.rule(case):
            lines.append(f"      rule: {rule}")
    if more:
        lines.append(f"      + {more} more fail{'s' if more == 1 else ''} the same way")
    return lines


def render_step(step: StepVerdict, brief_not_implemented: bool = True, saved: dict[str, str] | None = None,
                where: str = NOTEBOOK) -> str:
    """A step as text; a grey step (nothing wrong has run yet) is its heading and the next action."""
    place = standing(step, saved, where)
    lines = [step_heading(step, place), *judged_text(step)]
    if place.calm and brief_not_implemented:
        lines.append(f"  · next: {place.next}")
    else:
        for group in grouping.groups(step):
            lines += case_lines(group.lead, len(group.rest))
        for case in step.cases:
            if case.passed:
                lines += case_lines(case)
    if step.note:
        lines.append("  note: " + step.note)
    evidence = evidence_text(step.evidence)
    if evidence:
        lines.append(evidence)
    return "\n".join(lines)


def timeline_text(timeline: list[dict]) -> str:
    if not timeline:
        return ""
    events = rows(timeline)
    width = max(len(a) for a in lanes(timeline))
    t0 = events[0].t
    lines = ["  crash timeline (time runs down):"]
    for e in events:
        mark = "✕ KILLED " if is_kill(e.kind) else ("◆ DUPLICATE RECOGNISED " if is_duplicate(e.kind, e.text) else "")
        offset = f"+{e.t - t0:.3f}"
        lines.append(f"    {offset:>8} s  {e.actor:<{width}}  {mark}{e.text}")
    return "\n".join(lines)


def ladder_text(ladder: list[dict]) -> str:
    if not ladder:
        return ""
    width = max(len(str(r.get("rung", ""))) for r in ladder)
    lines = ["  evidence ladder (as the judge observed it):"]
    lines += [f"    {str(r.get('rung', '')):<{width}}  {r.get('observed', '')}  [{r.get('when', '')}]" for r in ladder]
    return "\n".join(lines)


def faults_text(faults: list[str]) -> str:
    if not faults:
        return ""
    return "\n".join(["  faults injected and seen to take effect:"] + [f"    - {f}" for f in faults])


def evidence_text(evidence: Evidence | None) -> str:
    if evidence is None:
        return ""
    parts = [timeline_text(evidence.timeline), ladder_text(evidence.ladder), faults_text(evidence.faults)]
    return "\n".join(p for p in parts if p)


def render_lab(verdict: LabVerdict, where: str = NOTEBOOK) -> str:
    head = (f"lab {verdict.lab} — seed {verdict.seed} — {verdict.score}/{verdict.max_score} points"
            f" — {'all passed' if verdict.passed else 'not all passed'} ({verdict.seconds:.1f} s)")
    return "\n\n".join([head] + [render_step(s, where=where) for s in verdict.steps])


def judged_text(step) -> list[str]:
    lines = []
    if getattr(step, "warning", ""):
        lines.append(f"  ⚠ {step.warning}")
    if getattr(step, "judged", ""):
        lines.append(f"  ({step.judged})")
    return lines
