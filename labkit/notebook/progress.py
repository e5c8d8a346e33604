"""A notebook's progress: which steps passed at their latest check, kept in the work folder.

`work/progress-<lab>.json` survives a kernel restart; each check records its steps' latest
verdicts there. Rendering as text and static HTML lives here too (the widget is in `widgets`).
A step's mark is green ✓ (passed), red ✗ (code that ran and is wrong) or grey · (not checked,
or nothing wrong has run yet); the bar also names the one next thing to do.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path

from labkit.judge.verdict import LabVerdict
from labkit.notebook.module_export import write_atomic


@dataclass
class StepState:
    step: str
    title: str
    max_points: int
    passed: bool = False
    points: int = 0
    checked_at: str = ""  # empty: never checked
    status: str = ""  # the latest check's standing: passed, failed (red), not_implemented (grey)
    next: str = ""  # what its latest check said to do next

    @property
    def red(self) -> bool:
        return self.status == "failed" and not self.passed

    @property
    def mark(self) -> str:
        return "✓" if self.passed else "✗" if self.red else "·"

    @property
    def color(self) -> str:
        return "#2e7d32" if self.passed else "#c62828" if self.red else "#9e9e9e"


@dataclass
class Progress:
    lab: str
    steps: list[StepState] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(1 for s in self.steps if s.passed)

    @property
    def points(self) -> int:
        return sum(s.points for s in self.steps)

    @property
    def max_points(self) -> int:
        return sum(s.max_points for s in self.steps)

    @property
    def complete(self) -> bool:
        return bool(self.steps) and self.passed == len(self.steps)

    def record(self, verdict: LabVerdict, saved: dict[str, str] | None = None) -> None:
        """Each checked step takes its latest verdict: a step that passed and now fails is open again."""
        from labkit.views.standing import standing

        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        by_step = {s.step: s for s in self.steps}
        for result in verdict.steps:
            state = by_step.get(str(result.step))
            if state is None:
                state = StepState(str(result.step), result.title, result.max_points)
                self.steps.append(state)
            place = standing(result, saved)
            state.passed, state.points, state.checked_at = result.passed, result.points, now
            state.status, state.next = place.status, place.next

    def summary(self) -> str:
        return (f"{self.passed} of {len(self.steps)} steps passed · {self.points}/{self.max_points} points")

    def next_action(self) -> str:
        """The first step not passed yet, and what to do about it."""
        for s in self.steps:
            if s.passed:
                continue
            label = "the final check" if s.step == "final" else f"step {s.step} ({s.title})"
            if s.red:
                return f"Next: {label}. Its check failed: open the first ✗ case under it."
            if s.next:
                return f"Next: {label}. {s.next}"
            if s.step == "final":
                return "Next: the final check. Run its cell: it kills your code at the worst moment."
            return (f"Next: {label}. Write it in the `%%step {s.step}` cell, run that cell, "
                    "then the check cell below it.")
        if not self.steps:
            return ""
        from labkit import labs
        from labkit.notebook import quiz

        try:
            has_quiz = bool(quiz.load(self.lab))
            when_done = labs.manifest(self.lab).when_done
        except (KeyError, ImportError, AssertionError):  # a lab the course does not know: no quiz to offer
            has_quiz, when_done = False, labs.Manifest.when_done
        if has_quiz:
            return "Every step passed. Try the quiz at the end of the notebook."
        return when_done

    def text(self) -> str:
        width = 30
        filled = round(width * self.passed / len(self.steps)) if self.steps else 0
        marks = " ".join(f"{s.step}{s.mark}" for s in self.steps)
        out = f"progress [{'#' * filled}{'-' * (width - filled)}] {self.summary()}\n  steps: {marks}"
        return out + (f"\n  {self.next_action()}" if self.steps else "")

    def marks_html(self) -> str:
        """One mark per step: ✓ passed, ✗ failed at its latest check, · not checked yet (or grey)."""
        marks = "".join(
            f'<span class="lk-mark" title="{escape(s.title)}" style="margin-right:8px;color:{s.color}">'
            f'{escape(s.step)}{s.mark}</span>'
            for s in self.steps)
        return f'<div class="lk-progress" style="font-size:12px">steps: {marks}</div>'

    def next_html(self) -> str:
        from labkit.views.render_html import render_next

        return f'<div class="lk-progress">{render_next(self.next_action())}</div>'

    def html(self) -> str:
        share = 100 * self.passed / len(self.steps) if self.steps else 0
        return (f'<div class="lk-progress"><b>Your progress in lab {escape(self.lab)}</b> — {escape(self.summary())}'
                f'<div class="lk-bar"><div style="width:{share:.0f}%"></div></div></div>{self.marks_html()}'
                f'{self.next_html()}')


def path(workdir: Path, lab: str) -> Path:
    return Path(workdir) / f"progress-{lab}.json"


def blank(lab: str) -> Progress:
    """Every step of the lab, none passed yet."""
    from labkit.labs import manifest

    return Progress(lab, [StepState(str(s.step), s.title, s.points) for s in manifest(lab).steps])


def load(workdir: Path, lab: str) -> Progress:
    """The saved progress merged into the lab's current list of steps (a damaged file counts as none)."""
    progress = blank(lab)
    try:
        saved = json.loads(path(workdir, lab).read_text(encoding="utf-8"))
        by_step = {str(s["step"]): s for s in saved.get("steps", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return progress
    for state in progress.steps:
        old = by_step.get(state.step)
        if isinstance(old, dict):
            state.passed = bool(old.get("passed"))
            state.points = int(old.get("points", 0)) if state.passed else 0
            state.checked_at = str(old.get("checked_at", ""))
            # Files from before `status` existed: a checked step that did not pass was red.
            default = "passed" if state.passed else "failed" if state.checked_at else ""
            state.status = str(old.get("status", default))
            state.next = str(old.get("next", ""))
    return progress


def save(workdir: Path, progress: Progress) -> Path:
    target = path(workdir, progress.lab)
    data = {"lab": progress.lab, "passed": progress.passed, "total": len(progress.steps),
            "points": progress.points, "max_points": progress.max_points,
            "steps": [asdict(s) for s in progress.steps]}
    write_atomic(target, json.dumps(data, indent=1) + "\n")
    return target
