"""A lab's quiz: questions from `checks/<lab>/quiz.py`, answers recorded in the work folder.

`QUIZ = [{"id", "question", "options": [{"text", "correct": bool, "why"}]}]`. Every answer is
written to `work/quiz-<lab>.json` at once (the grader reads that file): the latest choice, the
first choice, and how many tries it took. Its text and static HTML renderings are
`labkit.views.render_quiz`, the widget `labkit.views.widgets`. Every view explains the chosen
option only: a wrong click does not name the right one, so a second try is still a question.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

from labkit import labs
from labkit.notebook.module_export import write_atomic
from labkit.views.render_quiz import LETTERS


class QuizError(ValueError):
    """An answer that names no question or no option."""


def load(lab: str) -> list[dict]:
    """The lab's questions, or [] when the lab has no quiz module."""
    manifest = labs.manifest(lab)
    if manifest.quiz is None:
        return []
    questions = importlib.import_module(manifest.module(manifest.quiz)).QUIZ
    for q in questions:
        assert q["id"] and q["question"] and q["options"], q
        assert sum(1 for o in q["options"] if o["correct"]) == 1, f"{q['id']}: exactly one correct option"
    return questions


def path(workdir: Path, lab: str) -> Path:
    return Path(workdir) / f"quiz-{lab}.json"


def answers(workdir: Path, lab: str) -> dict[str, dict]:
    try:
        data = json.loads(path(workdir, lab).read_text(encoding="utf-8"))
        return dict(data.get("answers", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def option_index(question: dict, choice: int | str) -> int:
    """An option by index (0-based) or by letter ("b")."""
    if isinstance(choice, str) and len(choice) == 1 and choice.lower() in LETTERS:
        index = LETTERS.index(choice.lower())
    elif isinstance(choice, int) and not isinstance(choice, bool):
        index = choice
    else:
        raise QuizError(f"choose an option by letter (a, b, …) or index, not {choice!r}")
    if not 0 <= index < len(question["options"]):
        raise QuizError(f"question {question['id']!r} has options a–{LETTERS[len(question['options']) - 1]}")
    return index


def find(questions: list[dict], qid: str) -> dict:
    for q in questions:
        if q["id"] == qid:
            return q
    raise QuizError(f"no question {qid!r}; the questions are {', '.join(q['id'] for q in questions)}")


def record(workdir: Path, lab: str, questions: list[dict], qid: str, choice: int | str) -> dict:
    """Save one answer; returns its entry."""
    question = find(questions, qid)
    index = option_index(question, choice)
    correct = bool(question["options"][index]["correct"])
    saved = answers(workdir, lab)
    entry = saved.get(qid) or {"first_choice": index, "first_correct": correct, "attempts": 0}
    entry.update(choice=index, option=question["options"][index]["text"], correct=correct,
                 attempts=int(entry.get("attempts", 0)) + 1, answered_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    saved[qid] = entry
    data = {"lab": lab, "questions": len(questions),
            "answered": sum(1 for q in questions if q["id"] in saved),
            "correct_first_time": sum(1 for q in questions if saved.get(q["id"], {}).get("first_correct")),
            "answers": saved}
    write_atomic(path(workdir, lab), json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return entry
