"""The live views in JupyterLab (ipywidgets): a verdict panel, the progress bar, the quiz.

Each view carries the class `lk-live`; `display` shows it next to a static text/HTML copy of
the same view, which the page hides while the live view is rendered (see `render_html.STYLE`).
The pieces of HTML inside the widgets come from `render_html`, so both copies say the same.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

import ipywidgets as W

from labkit.judge.verdict import Case, StepVerdict
from labkit.views import grouping, render_html
from labkit.views.render_quiz import LETTERS, why_html
from labkit.views.standing import is_calm, standing

if TYPE_CHECKING:  # rendered here, made in the kernel: views never import the notebook
    from labkit.notebook.progress import Progress

WIDGET_STYLE = """
<style>
.lk-live.lk-step{display:flex}
.lk-live .widget-html-content{line-height:1.45}
.lk-live .widget-html{margin-top:1px;margin-bottom:1px}
.lk-toggle.jupyter-button{background:transparent;border:0;box-shadow:none;padding:0 2px;margin:0;height:auto;
  line-height:1.7;font-size:13px;justify-content:flex-start;text-align:left;white-space:normal;max-width:100%}
.lk-toggle.jupyter-button:hover{box-shadow:none;text-decoration:underline}
.lk-more-toggle.jupyter-button{font-size:12px;margin-left:1.6em}
.lk-toggle.jupyter-button:focus{outline:1px dotted #90a4ae}
.lk-morebtn.jupyter-button{background:#e3f2fd;color:#1565c0;border:1px solid #90caf9;height:24px;font-size:12px;
  margin:2px 0 4px 1.6em;width:auto;padding:0 10px}
.lk-option.jupyter-button{height:auto;white-space:normal;text-align:left;justify-content:flex-start;
  line-height:1.4;padding:4px 10px;margin:2px 0;width:100%;max-width:56em;font-size:13px}
.lk-live.lk-quiz{max-width:62em}
.lk-progress-live .widget-progress{max-width:28em}
</style>
"""


def _html(value: str, *classes: str, **layout) -> W.HTML:
    widget = W.HTML(value, layout=W.Layout(**layout) if layout else W.Layout())
    for name in classes:
        widget.add_class(name)
    return widget


def _toggle_display(widget: W.Widget, shown: bool) -> None:
    widget.layout.display = "" if shown else "none"


def case_row(case: Case, expanded: bool, rest: list[Case] | None = None) -> W.VBox:
    """A failing cause: a row that expands to called / expected / got and the case's specific
    hint; then, for the other cases with the same cause, "N more fail the same way" (a toggle)."""
    calm = is_calm(case)
    mark = "·" if calm else "✗"
    label = grouping.title(case)
    toggle = W.Button(description=f"{'▾' if expanded else '▸'} {mark} {label}", tooltip="show / hide details",
                      layout=W.Layout(width="auto", align_self="flex-start"))
    toggle.add_class("lk-toggle")
    toggle.style.text_color = "#757575" if calm else "#c62828"
    parts: list[W.Widget] = [_html(render_html.render_facts(case) + render_html.render_hint(case))]
    detail = W.VBox(parts, layout=W.Layout(display="" if expanded else "none"))
    detail.add_class("lk-case-detail")

    def flip(_):
        shown = detail.layout.display == "none"
        _toggle_display(detail, shown)
        toggle.description = f"{'▾' if shown else '▸'} {mark} {label}"

    toggle.on_click(flip)
    children: list[W.Widget] = [toggle, detail]
    if rest:
        group = grouping.Group([case, *rest], 0)
        listing = render_html.render_same(group)
        inner = listing[listing.index("<ul>"):listing.rindex("</details>")]
        same = _html(f'<div class="lk-same">{inner}</div>', "lk-same-list", display="none")
        more = W.Button(description=f"▸ {group.more_text()}", tooltip="show the other cases with this cause",
                        layout=W.Layout(width="auto", align_self="flex-start"))
        more.add_class("lk-toggle")
        more.add_class("lk-more-toggle")
        more.style.text_color = "#546e7a"

        def show_same(_):
            shown = same.layout.display == "none"
            _toggle_display(same, shown)
            more.description = f"{'▾' if shown else '▸'} {group.more_text()}"

        more.on_click(show_same)
        children += [more, same]
    row = W.VBox(children)
    row.add_class("lk-case-row")
    return row


def verdict_panel(step: StepVerdict, seed: int | None = None, saved: dict[str, str] | None = None) -> W.VBox:
    """One compact panel per checked step; the final check also shows its timeline and ladder."""
    place = standing(step, saved)
    children: list[W.Widget] = [_html(render_html.STYLE + WIDGET_STYLE + render_html.render_head(step, place)
                                      + render_html.judged_html(step))]
    if place.calm:
        children.append(_html(render_html.render_cases(step, place)))
    else:
        for i, group in enumerate(grouping.groups(step)):
            children.append(case_row(group.lead, i == 0, group.rest))
        oks = [c for c in step.cases if c.passed]
        if oks:
            children.append(_html(render_html.render_oks(oks, folded=True)))
        key = render_html.legend("".join(render_html.render_group(g, False) for g in grouping.groups(step)))
        if key:
            children.append(_html(key))
    if step.note:
        children.append(_html(f'<div class="lk-note">{escape(step.note)}</div>'))
    evidence = render_html.render_evidence(step.evidence)
    if evidence:
        children.append(_html(evidence))
    if seed is not None:
        children.append(_html(render_html.render_foot(seed, step.seconds)))
    panel = W.VBox(children)
    for name in ("lk-live", "lk-step", place.status):
        panel.add_class(name)
    return panel


class ProgressBar:
    """The notebook's progress: a bar that fills as steps pass, updated in place by each check."""

    def __init__(self, progress: Progress) -> None:
        self.title = W.HTML()
        self.bar = W.IntProgress(min=0, max=max(len(progress.steps), 1), bar_style="success",
                                 layout=W.Layout(width="28em"))
        self.marks = W.HTML()
        self.view = W.VBox([_html(render_html.STYLE + WIDGET_STYLE), self.title, self.bar, self.marks])
        for name in ("lk-live", "lk-progress-live"):
            self.view.add_class(name)
        self.update(progress)

    def update(self, progress: Progress) -> None:
        self.bar.max = max(len(progress.steps), 1)
        self.bar.value = progress.passed
        self.title.value = (f'<div class="lk-progress"><b>Your progress in lab {escape(progress.lab)}</b> — '
                            f'<span class="lk-progress-summary">{escape(progress.summary())}</span></div>')
        self.marks.value = progress.marks_html() + progress.next_html()


def quiz_panel(lab: str, questions: list[dict], saved: dict[str, dict],
               answer: Callable[[str, int], dict]) -> W.VBox:
    """Multiple choice; once answered, every option shows why it is right or wrong."""
    children: list[W.Widget] = [_html(render_html.STYLE + WIDGET_STYLE + f"<b>Quiz — lab {escape(lab)}</b>")]
    for number, question in enumerate(questions, 1):
        children.append(_html(f'<div class="lk-q">{number}. {escape(question["question"])}</div>', "lk-quiz"))
        buttons = []
        explanation = _html("", "lk-quiz-why")

        def show(chosen: int, buttons=buttons, question=question, explanation=explanation) -> None:
            for i, (button, option) in enumerate(zip(buttons, question["options"], strict=True)):
                # only the option clicked is coloured: a wrong click must not light up the right one
                button.button_style = ("success" if option["correct"] else "danger") if i == chosen else ""
            explanation.value = f'<div class="lk-quiz" style="margin:2px 0 8px">{why_html(question, chosen)}</div>'

        for index, option in enumerate(question["options"]):
            button = W.Button(description=f"{LETTERS[index]}) {option['text']}", layout=W.Layout(width="auto"))
            button.add_class("lk-option")

            def choose(_, qid=question["id"], index=index, show=show) -> None:
                answer(qid, index)
                show(index)

            button.on_click(choose)
            buttons.append(button)
        children += buttons + [explanation]
        if question["id"] in saved and saved[question["id"]].get("choice") is not None:
            show(int(saved[question["id"]]["choice"]))
    panel = W.VBox(children)
    for name in ("lk-live", "lk-quiz"):
        panel.add_class(name)
    return panel
