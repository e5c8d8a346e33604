"""`lab.reveal(3)`: one step's reference solution, on purpose, after the student tried.

It asks first (a button, or `lab.reveal(3, confirm=True)` without widgets), then records the
reveal in `work/revealed-<lab>.json` beside the notebook, and tags the output it shows with
`metadata.labkit.revealed`, so the grader can report the step as "revealed" from either.
The reference comes from the lesson source, which a student distribution
(`python -m labkit release`) does not contain: there, the reveal says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.notebook.module_export import write_atomic

if TYPE_CHECKING:
    from labkit.notebook.lab import Lab

ASK = ("Step {step}'s reference solution: try first, the hints under each ✗ usually get you there. "
       "Reading it is recorded in work/revealed-{lab}.json, and your grader sees that you revealed it.")


def path(workdir: Path, lab: str) -> Path:
    return Path(workdir) / f"revealed-{lab}.json"


def revealed(workdir: Path, lab: str) -> dict[str, dict]:
    """The steps revealed so far: {"3": {"at": "...", "passed_before": False}}. The grader reads
    this file from the `work/` folder beside a submitted notebook."""
    try:
        data = json.loads(path(workdir, lab).read_text(encoding="utf-8"))
        steps = data.get("steps", {})
        return {str(k): v for k, v in steps.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def revealed_in_notebook(nb) -> set[str]:
    """The steps whose reference a notebook's saved outputs show (`metadata.labkit.revealed`)."""
    found = set()
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            step = (output.get("metadata") or {}).get("labkit", {}).get("revealed")
            if step is not None:
                found.add(str(step))
    return found


def record(workdir: Path, lab: str, step: str, passed_before: bool) -> dict:
    steps = revealed(workdir, lab)
    entry = steps.get(step) or {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "passed_before": passed_before}
    steps[step] = entry
    write_atomic(path(workdir, lab), json.dumps({"lab": lab, "steps": steps}, indent=1) + "\n")
    return entry


def reference(lab: str, step: str) -> str | None:
    """Step `step`'s cell as the lesson source's reference has it (`helpers`), or None without the sources."""
    from labkit.notebook import build, helpers

    for source in sorted(build.SOURCES.glob("*.md")) if build.SOURCES.is_dir() else []:
        lesson = build.parse(source)
        if lesson.lab != lab:
            continue
        cells = [block for block in lesson.blocks if block.kind == "step"]
        if step not in {block.arg for block in cells}:
            return None
        # With the helpers it calls from other steps' cells: the student's own may lack them.
        code = helpers.with_helpers(step, {b.arg: build.solution(b.text) for b in cells},
                                    {b.arg: build.skeleton(b.text) for b in cells})
        return f"%%step {step}\n{code}"
    return None


def _show(lab: Lab, step: str, code: str) -> None:
    from labkit.views import display

    title = f"Step {step}'s reference solution (revealed: your grader sees this)"
    display.show(f"{title}\n\n{code}", display.code_html(title, code),
                 metadata={"labkit": {"revealed": step, "lab": lab.name}})


def offer(lab: Lab, step: str, confirm: bool) -> None:
    from labkit.notebook import progress
    from labkit.views import display, render_html

    if step not in lab.parts or step == "header":
        numbers = sorted((p for p in lab.parts if p.isdigit()), key=int)
        display.show_next(f"Lab {lab.name} has steps {', '.join(numbers)}: `lab.reveal(3)` shows step 3's reference.")
        return
    code = reference(lab.name, step)
    if code is None:
        display.show_next("This copy of the course has no reference solutions (a student release): "
                          "ask your instructor, or compare with a classmate after you both tried.")
        return
    passed = any(s.step == step and s.passed for s in progress.load(lab.workdir, lab.name).steps)

    def go(*_) -> None:
        record(lab.workdir, lab.name, step, passed)
        _show(lab, step, code)

    if confirm or step in revealed(lab.workdir, lab.name):
        go()
        return
    ask = ASK.format(step=step, lab=lab.name)
    try:
        import ipywidgets as W
    except ImportError:
        W = None
    if W is None:
        display.show_next(f"{ask} To see it, run `lab.reveal({step}, confirm=True)`.")
        return
    out = W.Output()
    button = W.Button(description=f"Yes, show step {step}'s reference", icon="eye", button_style="warning",
                      layout=W.Layout(width="auto"))

    def clicked(_) -> None:
        button.disabled = True
        with out:
            go()

    button.on_click(clicked)
    live = W.VBox([W.HTML(render_html.STYLE + render_html.render_next(ask)), button, out])
    live.add_class("lk-live")
    display.show(f"{ask} To see it, press the button or run `lab.reveal({step}, confirm=True)`.",
                 f'<div class="lk-step not_implemented">{render_html.render_next(ask)}</div>', live)
