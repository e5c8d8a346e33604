"""A notebook's progress: which steps passed at their latest check, kept in the work folder.

`work/progress-<lab>.json` survives a kernel restart; each check records its steps' latest
verdicts there. Rendering as text and static HTML lives here too (the widget is in `widgets`).
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

    def record(self, verdict: LabVerdict) -> None:
        """Each checked step takes its latest verdict: a step that passed and now fails is open again."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        by_step = {s.step: s for s in self.steps}
        for result in verdict.steps:
            state = by_step.get(str(result.step))
            if state is None:
                state = StepState(str(result.step), result.title, result.max_points)
                self.steps.append(state)
            state.passed, state.points, state.checked_at = result.passed, result.points, now

    def summary(self) -> str:
        return (f"{self.passed} of {len(self.steps)} steps passed · {self.points}/{self.max_points} points")

    def text(self) -> str:
        width = 30
        filled = round(width * self.passed / len(self.steps)) if self.steps else 0
        marks = " ".join(f"{s.step}{'✓' if s.passed else ('✗' if s.checked_at else '·')}" for s in self.steps)
        return f"progress [{'#' * filled}{'-' * (width - filled)}] {self.summary()}\n  steps: {marks}"

    def marks_html(self) -> str:
        """One mark per step: ✓ passed, ✗ failed at its latest check, · not checked yet."""
        marks = "".join(
            f'<span title="{escape(s.title)}" style="margin-right:8px;color:'
            f'{"#2e7d32" if s.passed else ("#c62828" if s.checked_at else "#9e9e9e")}">'
            f'{escape(s.step)}{"✓" if s.passed else ("✗" if s.checked_at else "·")}</span>'
            for s in self.steps)
        return f'<div class="lk-progress" style="font-size:12px">steps: {marks}</div>'

    def html(self) -> str:
        share = 100 * self.passed / len(self.steps) if self.steps else 0
        return (f'<div class="lk-progress"><b>Your progress in lab {escape(self.lab)}</b> — {escape(self.summary())}'
                f'<div class="lk-bar"><div style="width:{share:.0f}%"></div></div></div>{self.marks_html()}')


def path(workdir: Path, lab: str) -> Path:
    return Path(workdir) / f"progress-{lab}.json"


def blank(lab: str) -> Progress:
    """Every step of the lab, none passed yet."""
    from labkit.labs import load

    spec = load(lab)
    return Progress(lab, [StepState(str(s.step), s.title, s.points) for s in spec.steps])


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
    return progress


def save(workdir: Path, progress: Progress) -> Path:
    target = path(workdir, progress.lab)
    data = {"lab": progress.lab, "passed": progress.passed, "total": len(progress.steps),
            "points": progress.points, "max_points": progress.max_points,
            "steps": [asdict(s) for s in progress.steps]}
    write_atomic(target, json.dumps(data, indent=1) + "\n")
    return target
