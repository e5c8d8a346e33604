"""A verdict as static HTML: for exported notebooks and feedback pages (no kernel needed)."""

from __future__ import annotations

from html import escape

from labkit.verdict import Case, LabVerdict, StepVerdict

STYLE = """
<style>
.lk-step{font-family:system-ui,sans-serif;border:1px solid #ccd;border-radius:6px;margin:6px 0;padding:6px 10px;max-width:60em}
.lk-step.passed{border-left:6px solid #2e7d32}.lk-step.failed{border-left:6px solid #c62828}
.lk-step.not_implemented{border-left:6px solid #9e9e9e}
.lk-head{font-weight:600}.lk-case{margin:2px 0}.lk-ok{color:#2e7d32}.lk-bad{color:#c62828}.lk-calm{color:#757575}
.lk-detail{margin:2px 0 6px 1.6em;font-size:90%}.lk-detail dt{font-weight:600;float:left;width:6em}
.lk-detail dd{margin-left:6.5em;white-space:pre-wrap;font-family:monospace}
.lk-note{color:#5d4037;margin-top:4px}.lk-faults{font-size:90%;color:#37474f}
</style>
"""


def _case(case: Case) -> str:
    if case.passed:
        return f'<div class="lk-case"><span class="lk-ok">✓</span> {escape(case.name)}</div>'
    calm = case.outcome in ("not_implemented", "missing", "not_reached")
    mark = '<span class="lk-calm">·</span>' if calm else '<span class="lk-bad">✗</span>'
    rows = "".join(
        f"<dt>{label}</dt><dd>{escape(text)}</dd>"
        for label, text in (("called", case.called), ("expected", case.expected), ("got", case.got),
                            ("hint", case.hint), ("traceback", case.trace))
        if text
    )
    return (f'<details class="lk-case" {"" if calm else "open"}><summary>{mark} {escape(case.name)}</summary>'
            f'<dl class="lk-detail">{rows}</dl></details>')


def render_step(step: StepVerdict, with_style: bool = True) -> str:
    label = f"Step {step.step}" if step.step != "final" else "Final check"
    status = {"passed": "passed", "failed": "failed", "not_implemented": "not implemented yet"}[step.status]
    body = [f'<div class="lk-head">{escape(label)} — {escape(step.title)}: {status} '
            f"({step.points}/{step.max_points})</div>"]
    if step.status == "not_implemented":
        body.append('<div class="lk-calm">Not implemented yet: replace <code>raise NotImplementedError</code> '
                    "in the step's cell, run it, then run this check again.</div>")
    else:
        body += [_case(c) for c in step.cases]
    if step.note:
        body.append(f'<div class="lk-note">{escape(step.note)}</div>')
    if step.evidence and step.evidence.faults:
        items = "".join(f"<li>{escape(f)}</li>" for f in step.evidence.faults)
        body.append(f'<div class="lk-faults">Faults injected and seen to take effect:<ul>{items}</ul></div>')
    html = f'<div class="lk-step {step.status}">{"".join(body)}</div>'
    return (STYLE + html) if with_style else html


def render_lab(verdict: LabVerdict) -> str:
    head = (f"<h3>lab {escape(verdict.lab)} — {verdict.score}/{verdict.max_score} points "
            f"<small>(seed {verdict.seed})</small></h3>")
    return STYLE + head + "".join(render_step(s, with_style=False) for s in verdict.steps)
