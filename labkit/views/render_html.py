"""A verdict as static HTML: for exported notebooks and feedback pages (no kernel, no JavaScript).

Everything interactive is plain HTML. Failing cases are folded by cause (`labkit.views.grouping`):
one `<details>` per cause (the first one open) shows its leading case in full with its specific
hint, then "N more fail the same way" as a `<details>` of its own. The live widget
(`labkit.views.widgets`) shows the same parts; the two are kept apart so a page without a kernel
still reads well. Hints render `code` spans; values show spaces that matter (`visible`).
"""

from __future__ import annotations

import re
from html import escape

from labkit.judge.verdict import Case, Evidence, LabVerdict, Outcome, StepVerdict
from labkit.views import grouping, timeline_svg
from labkit.views.standing import NOTEBOOK, Standing, is_calm, standing

# The first nudge when a hint is a single sentence: what kind of problem this is, per outcome.
NUDGE = {
    Outcome.WRONG: "Your code ran, but the result is not what the contract says: compare expected with got.",
    Outcome.RAISED: "Your code raised an exception the contract does not call for: read the last line of your traceback first.",
    Outcome.TIMED_OUT: "Your code did not answer in time: something waits or loops without an end.",
    Outcome.DIED: "The process running your code ended before it could report.",
    Outcome.MEMORY_LIMIT: "The process running your code used more memory than a check may, and was killed.",
    Outcome.IMPORT_FAILED: "Your module does not load, so no case could run.",
    Outcome.MISSING: "The check could not find this function in your module.",
    Outcome.NOT_IMPLEMENTED: "This step is still the skeleton.",
    Outcome.NOT_REACHED: "This case did not run: fix the failing cases above first, then check again.",
}
HUNG_EARLIER = "An earlier case in this step hung, so this one did not run."
ENDED_EARLIER = "An earlier case in this step ended the process, so this one did not run."
_RAISED = re.compile(r"\braised (\w+)")
_EXCEPTION = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Exit|Conflict|Required|Interrupt)\b|\bConflict\b")


def nudge(case: Case) -> str:
    """The generic first nudge for how this case ended, never contradicting it: "hung" only
    after a hang, "an exception the contract does not call for" only when the contract called
    for another outcome than the exception raised."""
    if case.outcome is Outcome.NOT_REACHED:
        got = case.got.lower()
        if "hung" in got:
            return HUNG_EARLIER
        if "ended the process" in got or "died" in got:
            return ENDED_EARLIER
        return NUDGE[Outcome.NOT_REACHED]
    if case.outcome is Outcome.RAISED:
        raised = _RAISED.search(case.got)
        wanted = _EXCEPTION.findall(case.expected)
        if raised and raised.group(1) in wanted:
            return (f"Your code raised {raised.group(1)}, the exception the contract calls for here, but not as "
                    "it says: compare expected with got.")
        if raised and wanted:
            return (f"Your code raised {raised.group(1)} where the contract calls for {wanted[0]}: "
                    "read the last line of your traceback first.")
    return NUDGE.get(case.outcome, "")

STYLE = """
<style>
.lk-step{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px;color:#263238;border:1px solid #cfd8dc;border-radius:6px;margin:6px 0;padding:6px 10px;max-width:62em;background:#fff}
.lk-step.passed{border-left:6px solid #2e7d32}.lk-step.failed{border-left:6px solid #c62828}
.lk-step.not_implemented{border-left:6px solid #9e9e9e;background:#fafafa}
.lk-head{font-weight:600;margin-bottom:2px}.lk-badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;margin-left:4px}
.lk-badge.passed{background:#e8f5e9;color:#1b5e20}.lk-badge.failed{background:#ffebee;color:#b71c1c}.lk-badge.not_implemented{background:#eeeeee;color:#616161}
.lk-points{color:#607d8b;font-weight:normal;margin-left:6px}
.lk-oks{display:grid;grid-template-columns:repeat(auto-fill,minmax(22em,1fr));gap:0 12px}
.lk-case{margin:1px 0}.lk-case>summary{cursor:pointer}.lk-ok{color:#2e7d32}.lk-bad{color:#c62828}.lk-calm{color:#757575}
.lk-detail{margin:2px 0 4px 1.6em;line-height:1.4}.lk-kv{display:grid;grid-template-columns:5.5em 1fr;gap:0 8px;margin:1px 0}
.lk-k{font-weight:600;color:#546e7a}.lk-v{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.lk-nudge{margin:2px 0 2px 1.6em;padding:4px 8px;background:#fffde7;border-left:3px solid #f9a825}
.lk-more{margin:2px 0 6px 1.6em}.lk-more>summary{cursor:pointer;color:#1565c0}.lk-more div{padding:4px 8px;background:#e3f2fd;border-left:3px solid #1565c0}
.lk-trace{margin:2px 0 6px 1.6em;font-size:12px;background:#f5f5f5;padding:4px 8px;white-space:pre-wrap}
.lk-case>summary,.lk-nudge,.lk-same li{white-space:pre-wrap}
.lk-nudge code,.lk-next code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;background:#fff3c4;padding:0 2px;border-radius:2px;white-space:pre-wrap}
.lk-ws{color:#90a4ae;font-weight:normal;cursor:help}
.lk-same{margin:0 0 6px 1.6em}.lk-same>summary{cursor:pointer;color:#546e7a}
.lk-same ul{margin:2px 0;padding-left:1.4em;font-size:12px}.lk-same li{margin:1px 0}.lk-same .lk-got{color:#607d8b}
.lk-passed>summary{cursor:pointer;color:#546e7a}
.lk-legend{color:#90a4ae;font-size:11px;margin-top:2px}
.lk-note{color:#5d4037;margin-top:4px}.lk-section{font-weight:600;margin:8px 0 2px;color:#37474f}
.lk-faults{color:#37474f}.lk-faults ul{margin:2px 0 2px 0;padding-left:1.6em}
.lk-ladder{border-collapse:collapse;margin:2px 0;font-size:12px}
.lk-ladder th,.lk-ladder td{border:1px solid #cfd8dc;padding:2px 8px!important;text-align:left!important;vertical-align:top!important}
.lk-ladder th{background:#eceff1}.lk-foot{color:#90a4ae;font-size:11px;margin-top:4px}
.lk-next{margin:2px 0 2px 0;padding:4px 8px;background:#f5f5f5;border-left:3px solid #9e9e9e;color:#37474f}
.lk-progress .lk-next{font-size:12px}
.lk-restart-note{display:none;color:#616161;font-size:12px;font-style:italic;margin:2px 0}
.lk-progress{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px;color:#263238;max-width:40em;margin:4px 0}
.lk-bar{height:12px;background:#eceff1;border-radius:6px;overflow:hidden;margin:3px 0}.lk-bar>div{height:100%;background:#43a047}
.lk-quiz{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px;color:#263238;max-width:62em}
.lk-quiz ol{padding-left:1.6em}.lk-quiz .lk-q{font-weight:600;margin-top:8px}
.lk-quiz .lk-opt{margin:2px 0 2px 1em}.lk-quiz .lk-why{margin:0 0 4px 1.6em;color:#455a64;font-size:12px}
/* Live in JupyterLab, the widget (.lk-live) replaces this static copy of the same view; without a
   live widget (nbclient, exported HTML, a notebook reopened without its kernel, or a widget whose
   kernel restarted: ipywidgets marks it .jupyter-widgets-disconnected) the static copy stays,
   and after a restart it says how to get the live view back. */
.jp-OutputArea-child:has(.lk-pair):has(+ .jp-OutputArea-child .lk-live:not(.jupyter-widgets-disconnected)){display:none}
.jp-OutputArea-child:has(.lk-pair) + .jp-OutputArea-child:not(:has(.lk-live:not(.jupyter-widgets-disconnected))){display:none}
.jp-OutputArea-child:has(.lk-pair):has(+ .jp-OutputArea-child .lk-live.jupyter-widgets-disconnected) .lk-restart-note{display:block}
</style>
"""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


def hint_levels(case: Case) -> tuple[str, str]:
    """(first nudge, the rest). A hint of several sentences gives its first sentence as the
    nudge; a one-sentence hint comes after a generic nudge for how the case ended (`nudge`)."""
    hint = case.hint.strip()
    sentences = [s for s in _SENTENCE_END.split(hint) if s]
    if len(sentences) > 1:
        return sentences[0], " ".join(sentences[1:])
    return nudge(case), hint


def step_label(step: StepVerdict) -> str:
    return f"Step {step.step}" if step.step != "final" else "Final check"


RESTART_NOTE = ("The kernel restarted, so this is a saved copy. Run the setup cell at the top, "
                "then this cell again, for the live view.")


def seconds_text(seconds: float) -> str:
    """"0.04 s" would print as "0.0 s", which reads as "nothing ran": small times in ms."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def render_foot(seed: int | None, seconds: float) -> str:
    return f'<div class="lk-foot">seed {seed} · {seconds_text(seconds)}</div>' if seed is not None else ""


def _case(case: Case, first_failing: bool) -> str:
    """A passing case (one short line), or a failing one alone (its own group)."""
    if case.passed:
        return f'<div class="lk-case"><span class="lk-ok">✓</span> {visible(case.name)}</div>'
    return render_group(grouping.Group([case], 0), first_failing)


def _mark(case: Case) -> str:
    return '<span class="lk-calm">·</span>' if is_calm(case) else '<span class="lk-bad">✗</span>'


def render_hint(case: Case) -> str:
    """The case's specific hint, inline (or the generic nudge for its outcome when it has none)."""
    text = case.hint.strip() or nudge(case)
    return render_nudge(text) if text else ""


def render_group(group: grouping.Group, open_: bool) -> str:
    """One cause: its leading case in full (facts, hint, traceback), then "N more fail the same way"."""
    lead = group.lead
    body = render_facts(lead) + render_hint(lead)
    html = (f'<details class="lk-case"{" open" if open_ else ""}><summary>{_mark(lead)} {rich(grouping.title(lead))}'
            f'</summary>{body}</details>')
    return html + render_same(group)


def render_same(group: grouping.Group) -> str:
    """The other cases of a cause: one line each (title, what happened, and a hint where it
    differs from the one above it)."""
    if not group.rest:
        return ""
    items, said = [], group.lead.hint
    for case in group.rest:
        got = (case.got or "").strip().splitlines()[:1]
        hint = f'<div class="lk-got">{rich(case.hint)}</div>' if case.hint and case.hint != said else ""
        said = case.hint or said  # a hint once, for the run of cases it applies to
        items.append(f'<li>{_mark(case)} {rich(grouping.title(case))}'
                     f'{f"""<span class="lk-got"> — {visible(got[0][:200])}</span>""" if got else ""}{hint}</li>')
    return (f'<details class="lk-same"><summary>{escape(group.more_text())}</summary>'
            f'<ul>{"".join(items)}</ul></details>')


# Whitespace that matters in a value, shown: inside a quoted literal, leading and trailing spaces
# and runs of two or more; tabs, CR and LF wherever they are literal characters.
WHITESPACE = {" ": ("␣", "a space"), "\t": ("⇥", "a tab"), "\r": ("␍", "a carriage return (CR)"),
              "\n": ("␊", "a line feed (LF)")}
LEGEND = "␣ a space · ⇥ a tab · ␍ CR · ␊ LF: shown where the spaces in a value matter"
_LITERAL = re.compile(r"""(?<![\w'"])b?'(?:[^'\\\n]|\\.)*'(?![\w'])|(?<![\w'"])b?"(?:[^"\\\n]|\\.)*"(?![\w"])""")
_RUN = re.compile(r"\A +| +\Z| {2,}|[\t\r\n]")


def _ws(text: str) -> str:
    return "".join(f'<span class="lk-ws" title="{WHITESPACE[c][1]}">{WHITESPACE[c][0]}</span>' for c in text)


def _inside(literal: str) -> str:
    """A quoted literal: its quotes kept, the whitespace that matters inside marked."""
    start = literal.index(literal[-1])
    head, inner, tail = literal[:start + 1], literal[start + 1:-1], literal[-1]
    out, pos = [], 0
    for m in _RUN.finditer(inner):
        out += [escape(inner[pos:m.start()]), _ws(m.group())]
        pos = m.end()
    return escape(head) + "".join(out) + escape(inner[pos:]) + escape(tail)


def visible(text: str) -> str:
    """`text` as HTML with its meaningful whitespace shown (`'   '` → '␣␣␣', never one space)."""
    out, pos = [], 0
    for m in _LITERAL.finditer(text):
        out += [_plain(text[pos:m.start()]), _inside(m.group())]
        pos = m.end()
    out.append(_plain(text[pos:]))
    return "".join(out)


def _plain(text: str) -> str:
    return re.sub(r"[\t\r]", lambda m: _ws(m.group()), escape(text))


def rich(text: str) -> str:
    """A hint or a name as HTML: Markdown `code` spans → <code>, whitespace shown as in `visible`."""
    parts = re.split(r"`([^`\n]+)`", text)
    return "".join(f"<code>{visible(p)}</code>" if i % 2 else visible(p) for i, p in enumerate(parts))


def legend(html: str) -> str:
    """The key to the whitespace marks, when a view uses any."""
    return f'<div class="lk-legend">{LEGEND}</div>' if 'class="lk-ws"' in html else ""


def render_facts(case: Case) -> str:
    """What was called, what was expected, what happened (and the student's own traceback)."""
    rows = "".join(f'<div class="lk-kv"><span class="lk-k">{label}</span><span class="lk-v">{visible(text)}</span></div>'
                   for label, text in (("called", case.called), ("expected", case.expected), ("got", case.got),
                                       ("rule", grouping.rule(case)))
                   if text)
    trace = f'<pre class="lk-trace">{escape(case.trace.rstrip())}</pre>' if case.trace else ""
    return f'<div class="lk-detail">{rows}</div>{trace}'


def render_nudge(text: str) -> str:
    return f'<div class="lk-nudge">{rich(text)}</div>'


def render_ladder(ladder: list[dict]) -> str:
    if not ladder:
        return ""
    rows = "".join(f"<tr><td>{escape(str(r.get('rung', '')))}</td><td>{escape(str(r.get('observed', '')))}</td>"
                   f"<td>{escape(str(r.get('when', '')))}</td></tr>" for r in ladder)
    return ('<div class="lk-section">The evidence ladder, as the judge observed it</div>'
            f'<table class="lk-ladder"><tr><th>rung</th><th>observed</th><th>when</th></tr>{rows}</table>')


def render_faults(faults: list[str]) -> str:
    if not faults:
        return ""
    items = "".join(f"<li>{escape(f)}</li>" for f in faults)
    return f'<div class="lk-faults"><div class="lk-section">Faults injected and seen to take effect</div><ul>{items}</ul></div>'


def render_timeline(evidence: Evidence | None) -> str:
    if evidence is None or not evidence.timeline:
        return ""
    return ('<div class="lk-section">The crash timeline</div>'
            f'<div class="lk-timeline-box" style="overflow-x:auto">{timeline_svg.render(evidence.timeline)}</div>')


def render_evidence(evidence: Evidence | None) -> str:
    """Timeline, ladder, then the faults: a verdict ends with what was really done to the code."""
    if evidence is None:
        return ""
    return render_timeline(evidence) + render_ladder(evidence.ladder) + render_faults(evidence.faults)


def render_head(step: StepVerdict, where: Standing | None = None) -> str:
    where = where or standing(step)
    return (f'<div class="lk-head">{escape(step_label(step))} — {escape(step.title)} '
            f'<span class="lk-badge {where.status}">{escape(where.label)}</span>'
            f'<span class="lk-points">{step.points}/{step.max_points} points</span></div>')


def render_next(text: str) -> str:
    """The one next action, `code` spans kept."""
    return f'<div class="lk-next">{_code_spans(text)}</div>' if text else ""


def _code_spans(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def render_cases(step: StepVerdict, where: Standing | None = None) -> str:
    where = where or standing(step)
    if where.calm:
        return render_next(where.next)
    found = grouping.groups(step)
    out = [render_group(group, i == 0) for i, group in enumerate(found)]
    oks = [c for c in step.cases if c.passed]
    if oks:
        out.append(render_oks(oks, folded=bool(found)))
    html = "".join(out)
    return html + legend(html)


FOLD_PASSING = 8  # beside failing cases, more passing ones than this sit behind one line


def render_oks(cases: list[Case], folded: bool = False) -> str:
    """Passing cases: one short row each, in a compact grid; beside failing cases, a long grid
    is one line ("✓ 84 more cases pass") that opens on a click, so the causes stay in view."""
    grid = '<div class="lk-oks">' + "".join(_case(c, False) for c in cases) + "</div>"
    if not folded or len(cases) <= FOLD_PASSING:
        return grid
    return (f'<details class="lk-passed"><summary><span class="lk-ok">✓</span> {len(cases)} other cases pass'
            f'</summary>{grid}</details>')


def case_groups(cases: list[Case]) -> list[list[tuple[int, Case]]]:
    """Runs of passing cases and runs of failing ones, in order (the views fold failing cases by
    cause with `grouping.groups` instead; kept for callers that want the check's own order)."""
    groups: list[list[tuple[int, Case]]] = []
    for index, case in enumerate(cases):
        if groups and groups[-1][0][1].passed == case.passed:
            groups[-1].append((index, case))
        else:
            groups.append([(index, case)])
    return groups


def render_step(step: StepVerdict, with_style: bool = True, seed: int | None = None,
                saved: dict[str, str] | None = None, where: str = NOTEBOOK) -> str:
    """One step's panel. `saved`: the parts the kernel saved, for the next action (None: unknown)."""
    place = standing(step, saved, where)
    body = [render_head(step, place), judged_html(step), render_cases(step, place)]
    if step.note:
        body.append(f'<div class="lk-note">{escape(step.note)}</div>')
    body.append(render_evidence(step.evidence))
    body.append(render_foot(seed, step.seconds))
    html = f'<div class="lk-step {place.status}">{"".join(body)}</div>'
    return (STYLE + html) if with_style else html


def render_lab(verdict: LabVerdict, where: str = NOTEBOOK) -> str:
    head = (f"<h3>lab {escape(verdict.lab)} — {verdict.score}/{verdict.max_score} points "
            f"<small>(seed {verdict.seed})</small></h3>")
    return STYLE + head + "".join(render_step(s, with_style=False, where=where) for s in verdict.steps)


def judged_html(step) -> str:
    html = ""
    if getattr(step, "warning", ""):
        html += ('<div class="lk-stale" style="margin:3px 0;padding:4px 8px;background:#fff3e0;'
                 f'border-left:3px solid #ef6c00;color:#4e342e">⚠ {escape(step.warning)}</div>')
    if getattr(step, "judged", ""):
        html += f'<div class="lk-judged" style="color:#607d8b;font-size:12px">{escape(step.judged)}</div>'
    return html
