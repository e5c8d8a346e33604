"""A student's quiz answers: read from the submitted folder, scored against the answer key.

The answers file (`work/quiz-<lab>.json`, written by the quiz widget in the student's own
JupyterLab) is the student's data: which option they chose, first and last. Whether a choice
is right is never taken from it — a file that says `"correct": true` proves nothing — but
recomputed from the lab's questions (`labkit.notebook.quiz.load`). Unknown questions and
choices that name no option are dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit.grading.settings import MAX_QUIZ_BYTES
from labkit.grading.submissions import read_capped

LETTERS = "abcdefgh"


def read(notebook: Path, lab: str) -> dict | None:
    """`work/quiz-<lab>.json` beside the notebook: a regular file, no link, capped; else None."""
    folder = notebook.parent / "work"
    try:
        if folder.is_symlink() or not folder.is_dir():
            return None
        data = json.loads(read_capped(folder / f"quiz-{lab}.json", MAX_QUIZ_BYTES).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _choice(value, options: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < options:
        return value
    return None


def score(lab: str, raw: dict | None) -> dict | None:
    """The answers as the grader records them, every `correct` from the key."""
    if raw is None:
        return None
    from labkit.notebook import quiz

    try:
        questions = quiz.load(lab)
    except Exception:  # a lab without a usable quiz: nothing to score
        return None
    given = raw.get("answers") if isinstance(raw.get("answers"), dict) else {}
    scored: dict[str, dict] = {}
    for question in questions:
        entry = given.get(question["id"])
        if not isinstance(entry, dict):
            continue
        options = question["options"]
        choice = _choice(entry.get("choice"), len(options))
        if choice is None:
            continue
        first = _choice(entry.get("first_choice"), len(options))
        first = choice if first is None else first
        attempts = entry.get("attempts")
        scored[question["id"]] = {
            "choice": choice, "option": options[choice]["text"], "correct": bool(options[choice]["correct"]),
            "first_choice": first, "first_correct": bool(options[first]["correct"]),
            "attempts": attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0 else 1,
        }
    return {"lab": lab, "questions": len(questions), "answered": len(scored),
            "correct_first_time": sum(1 for a in scored.values() if a["first_correct"]), "answers": scored}
