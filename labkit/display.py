"""Show a view in the kernel so it reads well everywhere.

Every view is displayed as two outputs: a static copy (`text/plain` + `text/html`) and, when
ipywidgets is there, the live widget. nbclient, terminals and exported HTML read the static
copy (a widget output saves no HTML, and nbconvert renders a saved widget only with JavaScript
from the network); in JupyterLab the page hides the static copy while the widget is rendered
(CSS in `render_html.STYLE`), and shows it again if the widget cannot be, e.g. in a notebook
reopened without its kernel.
"""

from __future__ import annotations

import dataclasses

from labkit import progress as progress_mod
from labkit import render_html, render_text
from labkit.timeline_svg import is_duplicate, is_kill, lanes, rows
from labkit.verdict import Evidence, LabVerdict, StepVerdict

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

_progress_bars: dict[str, object] = {}  # lab → widgets.ProgressBar shown by the setup cell


def _widgets():
    """The widgets module, or None where ipywidgets is missing (then only static copies show)."""
    try:
        from labkit import widgets
    except ImportError:
        return None
    return widgets


def _static_bundle(text: str, html: str, paired: bool) -> dict:
    css = "lk-static lk-pair" if paired else "lk-static"
    return {"text/plain": text, "text/html": f'{render_html.STYLE}<div class="{css}">{html}</div>'}


def show(text: str, html: str, live=None, display_id: str | None = None) -> None:
    """Display a static copy, then the live widget `live` (if any) as its own output."""
    from IPython.display import display

    display(_static_bundle(text, html, live is not None), raw=True, display_id=display_id)
    if live is not None:
        view = {"version_major": 2, "version_minor": 0, "model_id": live.model_id}
        display({"text/plain": "", WIDGET_VIEW: view}, raw=True)


# --- verdicts ---------------------------------------------------------------------------


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


def step_text(step: StepVerdict, seed: int | None = None) -> str:
    """render_text's verdict, with the evidence (timeline, ladder, then faults) at the end."""
    text = render_text.render_step(dataclasses.replace(step, evidence=None))
    extra = evidence_text(step.evidence)
    tail = f"(seed {seed})" if seed is not None else ""
    return "\n".join(p for p in (text, extra, tail) if p)


def show_step(step: StepVerdict, seed: int | None = None) -> None:
    widgets = _widgets()
    live = widgets.verdict_panel(step, seed) if widgets else None
    show(step_text(step, seed), render_html.render_step(step, with_style=False, seed=seed), live)


def show_verdict(lab, verdict: LabVerdict) -> None:
    for step in verdict.steps:
        show_step(step, verdict.seed)


def show_problem(message: str) -> None:
    from html import escape

    show(message, f"<pre style='color:#c62828;white-space:pre-wrap'>{escape(message)}</pre>")


def show_ladder(ladder: list[dict], seed: int | None = None) -> None:
    text = ladder_text(ladder) + (f"\n(from the final check with seed {seed})" if seed is not None else "")
    html = render_html.render_ladder(ladder)
    if seed is not None:
        html += f'<div class="lk-foot">from the final check with seed {seed}</div>'
    show(text, f'<div class="lk-step">{html}</div>')


def show_message(text: str) -> None:
    from html import escape

    show(text, f'<div class="lk-progress">{escape(text)}</div>')


# --- progress ---------------------------------------------------------------------------


def _progress_id(lab: str) -> str:
    return f"labkit-progress-{lab}"


def show_progress(progress: progress_mod.Progress) -> None:
    """The setup cell's progress bar; later checks update this very output in place."""
    widgets = _widgets()
    live = None
    if widgets:
        bar = widgets.ProgressBar(progress)
        _progress_bars[progress.lab] = bar
        live = bar.view
    show(progress.text(), progress.html(), live, display_id=_progress_id(progress.lab))


def update_progress(progress: progress_mod.Progress) -> None:
    from IPython.display import update_display

    bar = _progress_bars.get(progress.lab)
    if bar is not None:
        bar.update(progress)
    update_display(_static_bundle(progress.text(), progress.html(), bar is not None), raw=True,
                   display_id=_progress_id(progress.lab))


# --- quiz -------------------------------------------------------------------------------


def show_quiz(lab: str, questions: list[dict], saved: dict[str, dict], answer) -> None:
    from labkit import quiz

    widgets = _widgets()
    live = widgets.quiz_panel(lab, questions, saved, answer) if widgets and questions else None
    show(quiz.render_text(lab, questions, saved), quiz.render_html(lab, questions, saved), live)
