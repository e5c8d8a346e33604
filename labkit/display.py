"""Show a verdict in the kernel: HTML for JupyterLab and exports, plain text for nbclient."""

from __future__ import annotations

from labkit import render_html, render_text
from labkit.verdict import LabVerdict


class _Rich:
    def __init__(self, text: str, html: str) -> None:
        self.text, self.html = text, html

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html


def show_verdict(lab, verdict: LabVerdict) -> None:
    from IPython.display import display

    for step in verdict.steps:
        display(_Rich(render_text.render_step(step) + f"\n(seed {verdict.seed})", render_html.render_step(step)))


def show_problem(message: str) -> None:
    from IPython.display import display

    display(_Rich(message, f"<pre style='color:#c62828'>{message}</pre>"))
