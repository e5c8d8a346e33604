"""A student's quiz answers: read from the submitted folder, scored against the answer key.

The answers file (`work/quiz-<lab>.json`, written by the quiz widget in the student's own
JupyterLab; read bounded, `bounded.side_file`) is the student's data: which option they chose, first and last. Whether a choice
is right is never taken from it — a file that says `"correct": true` proves nothing — but
recomputed from the lab's questions (`labkit.notebook.quiz.load`). Unknown questions and
choices that name no option are dropped.
"""

from __future__ import annotations

from pathlib import Path

from labkit.grading import bounded

LETTERS = "abcdefgh"


def read(notebook: Path, lab: str) -> dict | None:
    """`work/quiz-<lab>.json` beside the notebook, or None when there is none (no file, or a link).

    Read bounded (`bounded.side_file`): a file that is there but is not bounded JSON holding an
    object whose `answers` (if any) is an object raises `bounded.Refused`, naming the file; the
    batch makes that the student's `malformed` row. Inside `answers`, what is not an answer is
    dropped by `score`."""
    name = f"quiz-{lab}.json"
    data = bounded.side_file(notebook, name)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("answers", {}), dict):
        raise bounded.Refused(f"work/{name} is not the quiz's answers: it is not an object with an "
                              "`answers` object.")
    return data


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
