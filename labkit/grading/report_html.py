"""The class report as one self-contained HTML page: no script, no external CSS, font or image
(the feedback pages' Content-Security-Policy says so to the browser too).

Charts are inline SVG (`charts`), each with a table of the same numbers beside it. Text a
student's code could choose (example got lines, hints) was anonymised by `report` and is
escaped here; the whole body then goes through the feedback pages' sanitizer (nh3) as well,
so a mistake in escaping cannot become a script. Only the page's frame and stylesheet are
written outside it.
"""

from __future__ import annotations

import re
from html import escape

from labkit.grading import charts
from labkit.grading.feedback import ALLOWED_ATTRIBUTES, ALLOWED_TAGS, CSP, clean_with
from labkit.grading.report import ClassReport, ClauseStats, LabStats, StepStats

STYLE = """
<style>
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#263238;margin:1.5em auto;
  max-width:72em;padding:0 1em;line-height:1.45;font-size:14px}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-top:2px solid #cfd8dc;padding-top:.8em;margin-top:1.6em}
h3{margin:1.2em 0 .3em}.lede{color:#546e7a;margin-top:0}
.pair{display:flex;flex-wrap:wrap;gap:1.2em 2em;align-items:flex-start;margin:.6em 0}
.pair figure{margin:0}.pair figcaption{font-weight:600;margin-bottom:.3em}
table{border-collapse:collapse;font-size:13px}caption{text-align:left;font-weight:600;padding:.2em 0}
th,td{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}td.n{text-align:right;font-variant-numeric:tabular-nums}
.clauses td{max-width:28em}.got{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;
  white-space:pre-wrap;word-break:break-word;display:block;margin:1px 0}
.id{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap}
.note{color:#5d4037;background:#fff8e1;border-left:3px solid #f9a825;padding:4px 10px}
.muted{color:#78909c}.ok{color:#2e7d32}
</style>
"""

# A step lists at most this many rules; the rest are counted in a line below the table.
MAX_RULES = 6
CODE = re.compile(r"`([^`<>]+)`")
# The report's tables and figures, on top of what the feedback pages allow.
REPORT_TAGS = ALLOWED_TAGS | {"figure", "figcaption", "caption"}
REPORT_ATTRIBUTES = {**ALLOWED_ATTRIBUTES, "th": {"colspan", "rowspan", "scope"},
                     "svg": ALLOWED_ATTRIBUTES["svg"] | {"aria-hidden"}}


def _n(value: int | float | str) -> str:
    return f'<td class="n">{escape(str(value))}</td>'


def _rate(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.0%}"


def _scores(lab: LabStats) -> str:
    values = [(str(total), n) for total, n in lab.scores.items()]
    svg = charts.columns(values, f"Lab {lab.lab}: students by total score, 0 to {lab.max_score}",
                         "total points", "students")
    # Transposed (points across, students below): one short table beside the chart, not a column of 14 rows.
    points = "".join(f'<th scope="col">{total}</th>' for total in lab.scores)
    counts = "".join(_n(n) for n in lab.scores.values())
    return (f'<div class="pair"><figure><figcaption>Scores</figcaption>{svg}</figure>'
            f'<table><caption>Students by total score</caption><thead><tr><th scope="row">points</th>'
            f'{points}</tr></thead><tbody><tr><th scope="row">students</th>{counts}</tr></tbody></table></div>')


def _steps(lab: LabStats) -> str:
    bars = [(f"step {s.step}" if s.step != "final" else "final",
             [(s.passed, charts.PASSED), (s.failed, charts.FAILED), (s.not_started, charts.NOT_STARTED)])
            for s in lab.steps]
    legend = [("passed", charts.PASSED), ("failed", charts.FAILED), ("not started", charts.NOT_STARTED)]
    svg = charts.stacked(bars, f"Lab {lab.lab}: per step, students who passed, failed or had not started",
                         legend)
    head = "".join(f'<th scope="col">{h}</th>' for h in
                   ("step", "title", "points", "passed", "failed", "not started", "pass rate", "revealed"))
    rows = "".join(
        f"<tr><td>{escape(s.step)}</td><td>{escape(s.title)}</td>{_n(s.points)}{_n(s.passed)}{_n(s.failed)}"
        f"{_n(s.not_started)}{_n(_rate(s.pass_rate))}{_n(s.revealed)}</tr>" for s in lab.steps)
    return (f'<div class="pair"><figure><figcaption>Steps</figcaption>{svg}</figure>'
            f'<table><caption>Per step (pass rate among students judged; revealed: '
            f'<code>lab.reveal(step)</code> used)</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def _inline_code(text: str) -> str:
    """Escaped text with the hints' `backticks` shown as code."""
    return CODE.sub(r"<code>\1</code>", escape(text))


def _clause_row(rank: int, clause: ClauseStats, most: int) -> str:
    if clause.key.startswith("case:"):
        rule = ""  # the lab's note says its cases carry no clause IDs yet
    elif clause.rule:
        rule = "<br>" + escape(clause.rule)
    else:
        rule = '<br><span class="muted">not a clause of the lab\'s contract</span>'
    examples = "".join(f'<span class="got">{escape(got)}</span>' for got in clause.examples) or \
        '<span class="muted">—</span>'
    return (f"<tr>{_n(rank)}<td><span class=\"id\">{escape(clause.label)}</span>{rule}</td>"
            f"{_n(clause.students)}<td>{charts.meter(clause.students, most)}</td>"
            f"<td>{_inline_code(clause.hint) or '—'}</td><td>{examples}</td></tr>")


def _mistakes(step: StepStats) -> str:
    if not step.clauses:
        return ""
    most = step.clauses[0].students
    head = "".join(f'<th scope="col">{h}</th>' for h in
                   ("#", "clause and rule", "students", "", "hint they got", "what their code did (examples)"))
    shown = step.clauses[:MAX_RULES]
    rows = "".join(_clause_row(i, c, most) for i, c in enumerate(shown, 1))
    more = step.clauses[MAX_RULES:]
    rest = (f'<p class="muted">… and {len(more)} more, each hit by {max(c.students for c in more)} student(s) '
            "or fewer (their feedback pages name them).</p>") if more else ""
    name = f"Step {step.step}" if step.step != "final" else "The final check"
    return (f"<h4>{escape(name)} — {escape(step.title)}: {step.failed} failed</h4>"
            f'<table class="clauses"><caption>Broken rules, most students first</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{rest}")


def _quiz(lab: LabStats) -> str:
    answered = [q for q in lab.questions if q.answered]
    if not lab.questions:
        return ""
    if not answered:
        return '<h3>Quiz</h3><p class="muted">No answers recorded (work/quiz-&lt;lab&gt;.json) in this class.</p>'
    bars = [(q.id[:16], [(q.first_try, charts.PASSED), (q.answered - q.first_try, charts.FAILED)])
            for q in answered]
    svg = charts.stacked(bars, f"Lab {lab.lab}: quiz questions by first-try correctness, hardest first",
                         [("right at the first try", charts.PASSED), ("not", charts.FAILED)])
    head = "".join(f'<th scope="col">{h}</th>' for h in
                   ("question", "answered", "right at first try", "right now", "tries (mean)"))
    rows = "".join(f"<tr><td><span class=\"id\">{escape(q.id)}</span><br>{escape(q.question)}</td>"
                   f"{_n(q.answered)}{_n(_rate(q.first_try_rate))}{_n(q.correct_now)}{_n(f'{q.attempts:.1f}' if q.answered else '—')}</tr>"
                   for q in lab.questions)
    return (f'<h3>Quiz</h3><div class="pair"><figure><figcaption>First tries</figcaption>{svg}</figure>'
            f"<table><caption>Questions, hardest at the first try first</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def _lab(lab: LabStats) -> str:
    statuses = ", ".join(f"{n} {escape(status)}" for status, n in lab.statuses.items())
    median = "—" if lab.median is None else f"{lab.median:g}"
    parts = [f'<h2 id="lab-{escape(lab.lab)}">Lab {escape(lab.lab)}</h2>',
             f'<p class="lede">{lab.students} student(s) ({statuses}); median {median} of {lab.max_score} '
             f"points; {lab.all_passed} with every point.</p>"]
    notes = []
    if lab.import_failed:
        notes.append(f"{lab.import_failed} module(s) did not import: every step failed for them, and no rule "
                     "is counted (see their feedback pages).")
    if lab.no_verdict:
        notes.append(f"{lab.no_verdict} notebook(s) have no verdict (the judge could not run): counted in the "
                     "scores, not in the steps.")
    if not lab.tagged:
        notes.append("This lab's checks do not tag their cases with contract clauses yet: mistakes are counted "
                     "by the name of the case that caught them.")
    parts += [f'<p class="note">{escape(n)}</p>' for n in notes]
    parts += [_scores(lab), _steps(lab)]
    mistakes = "".join(_mistakes(step) for step in lab.steps)
    parts.append("<h3>What went wrong, per step</h3>" + (mistakes or '<p class="ok">No rule was broken.</p>'))
    parts.append(_quiz(lab))
    return "".join(parts)


def page(report: ClassReport) -> str:
    labs = ", ".join(f'<a href="#lab-{escape(lab.lab)}">{escape(lab.lab)}</a>' for lab in report.labs)
    head = [f"<h1>Class report</h1><p class=\"lede\">{report.rows} row(s) in the gradebook"
            + (f"; labs: {labs}" if labs else "") + "</p>"]
    facts = []
    if report.seeds:
        facts.append("hidden cases drawn with seed " + ", ".join(map(str, report.seeds)))
    if report.sandbox:
        facts.append("sandbox: " + "; ".join(report.sandbox))
    if report.skipped or report.malformed:
        facts.append(f"{report.skipped} path(s) skipped and {report.malformed} file(s) not gradable "
                     "(listed in grades.csv)")
    if report.unreadable:
        facts.append(f"{report.unreadable} result file(s) that are not the grader's records were ignored")
    if facts:
        head.append(f'<p class="muted">{escape("; ".join(facts))}.</p>')
    head.append('<p class="muted">Counted from the grader\'s own result files. A student counts once per '
                "broken rule; only real mistakes count (a wrong value, an exception, a hang, a death), not "
                "a step still in its skeleton. Example lines are anonymised: no names, paths or addresses.</p>")
    body = "".join(head) + "".join(_lab(lab) for lab in report.labs)
    if not report.labs:
        body += "<p>No lab notebook was graded in this folder.</p>"
    safe = clean_with(body, REPORT_TAGS, REPORT_ATTRIBUTES)
    return "\n".join(["<!DOCTYPE html>", f'<html lang="en"><head>{CSP}<meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      "<title>Class report</title>", STYLE, "</head><body>", safe, "</body></html>", ""])
