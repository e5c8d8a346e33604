"""Show a view in the kernel so it reads well everywhere.

Every view is displayed as two outputs: a static copy (`text/plain` + `text/html`) and, when
ipywidgets is there, the live widget. nbclient, terminals and exported HTML read the static
copy (a widget output saves no HTML, and nbconvert renders a saved widget only with JavaScript
from the network); in JupyterLab the page hides the static copy while the widget is rendered
(CSS in `render_html.STYLE`), and shows it again if the widget cannot be, e.g. in a notebook
reopened without its kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from labkit.judge.verdict import LabVerdict, StepVerdict
from labkit.views import render_html, render_quiz, render_text

if TYPE_CHECKING:  # the kernel-side data this module renders; views never import the notebook
    from labkit.notebook.progress import Progress

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

_progress_bars: dict[str, object] = {}  # lab → widgets.ProgressBar shown by the setup cell


def _widgets():
    """The widgets module, or None where ipywidgets is missing (then only static copies show)."""
    try:
        from labkit.views import widgets
    except ImportError:
        return None
    return widgets


def _static_bundle(text: str, html: str, paired: bool) -> dict:
    css = "lk-static lk-pair" if paired else "lk-static"
    note = f'<div class="lk-restart-note">{render_html.RESTART_NOTE}</div>' if paired else ""
    return {"text/plain": text, "text/html": f'{render_html.STYLE}<div class="{css}">{note}{html}</div>'}


def show(text: str, html: str, live=None, display_id: str | None = None, metadata: dict | None = None) -> None:
    """Display a static copy (with output `metadata`, if any), then the live widget `live` (if any)
    as its own output."""
    from IPython.display import display

    display(_static_bundle(text, html, live is not None), raw=True, display_id=display_id, metadata=metadata)
    if live is not None:
        view = {"version_major": 2, "version_minor": 0, "model_id": live.model_id}
        display({"text/plain": "", WIDGET_VIEW: view}, raw=True)


# --- verdicts ---------------------------------------------------------------------------


def step_text(step: StepVerdict, seed: int | None = None, saved: dict[str, str] | None = None) -> str:
    tail = f"(seed {seed})" if seed is not None else ""
    return "\n".join(p for p in (render_text.render_step(step, saved=saved), tail) if p)


def show_step(step: StepVerdict, seed: int | None = None, saved: dict[str, str] | None = None) -> None:
    """`saved`: the parts the kernel has saved, so a grey step names the cell to run."""
    widgets = _widgets()
    live = widgets.verdict_panel(step, seed, saved) if widgets else None
    show(step_text(step, seed, saved), render_html.render_step(step, with_style=False, seed=seed, saved=saved), live)


def show_verdict(verdict: LabVerdict, saved: dict[str, str] | None = None) -> None:
    for step in verdict.steps:
        show_step(step, verdict.seed, saved)


def show_problem(message: str) -> None:
    from html import escape

    show(message, f"<pre style='color:#c62828;white-space:pre-wrap'>{escape(message)}</pre>")


def show_next(message: str) -> None:
    """A grey note with one next action (`code` spans kept), e.g. "run the setup cell first"."""
    show(message, f'<div class="lk-step not_implemented">{render_html.render_next(message)}</div>')


def code_html(title: str, code: str) -> str:
    """A block of Python under a heading, readable with or without a kernel. Its lines scroll
    sideways rather than wrap: a wrapped line of code reads as two."""
    from html import escape

    return (f'<div class="lk-step"><div class="lk-head">{escape(title)}</div>'
            f'<pre class="lk-trace" style="margin-left:0;white-space:pre;overflow-x:auto">{escape(code)}</pre></div>')


def show_ladder(ladder: list[dict], seed: int | None = None) -> None:
    text = render_text.ladder_text(ladder) + (f"\n(from the final check with seed {seed})" if seed is not None else "")
    html = render_html.render_ladder(ladder)
    if seed is not None:
        html += f'<div class="lk-foot">from the final check with seed {seed}</div>'
    show(text, f'<div class="lk-step">{html}</div>')


# --- progress ---------------------------------------------------------------------------


def _progress_id(lab: str) -> str:
    return f"labkit-progress-{lab}"


def show_progress(progress: Progress) -> None:
    """The setup cell's progress bar; later checks update this very output in place."""
    widgets = _widgets()
    live = None
    if widgets:
        bar = widgets.ProgressBar(progress)
        _progress_bars[progress.lab] = bar
        live = bar.view
    show(progress.text(), progress.html(), live, display_id=_progress_id(progress.lab))


def update_progress(progress: Progress) -> None:
    from IPython.display import update_display

    bar = _progress_bars.get(progress.lab)
    if bar is not None:
        bar.update(progress)
    update_display(_static_bundle(progress.text(), progress.html(), bar is not None), raw=True,
                   display_id=_progress_id(progress.lab))


# --- quiz -------------------------------------------------------------------------------


def _quiz_id(lab: str) -> str:
    return f"labkit-quiz-{lab}"


def show_quiz(lab: str, questions: list[dict], answers: Callable[[], dict[str, dict]],
              answer: Callable[[str, int], dict]) -> None:
    """The quiz widget; every answer also refreshes the static copy, so a saved or exported
    notebook shows the answers as they are now, not as they were when the cell ran.
    `answers()` reads the saved answers, `answer(qid, index)` saves one."""
    widgets = _widgets()
    live = None
    if widgets and questions:
        def answer_and_refresh(qid: str, index: int) -> dict:
            entry = answer(qid, index)
            update_quiz(lab, questions, answers(), paired=True)
            return entry

        live = widgets.quiz_panel(lab, questions, answers(), answer_and_refresh)
    saved = answers()
    show(render_quiz.render_text(lab, questions, saved), render_quiz.render_html(lab, questions, saved), live,
         display_id=_quiz_id(lab))


def update_quiz(lab: str, questions: list[dict], saved: dict[str, dict], paired: bool = True) -> None:
    from IPython.display import update_display

    update_display(_static_bundle(render_quiz.render_text(lab, questions, saved), render_quiz.render_html(lab, questions, saved),
                                  paired), raw=True, display_id=_quiz_id(lab))
