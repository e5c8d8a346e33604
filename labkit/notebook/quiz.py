"""A lab's quiz: questions from `checks/<lab>_quiz.py`, answers recorded in the work folder.

`QUIZ = [{"id", "question", "options": [{"text", "correct": bool, "why"}]}]`. Every answer is
written to `work/quiz-<lab>.json` at once (the grader reads that file): the latest choice, the
first choice, and how many tries it took. Text and static HTML renderings live here; the
widget is in `widgets`. Every view explains the chosen option only: a wrong click does not
name the right one, so a second try is still a question.
"""

from __future__ import annotations

import importlib
import json
import time
from html import escape
from pathlib import Path

from labkit import labs
from labkit.notebook.module_export import write_atomic

LETTERS = "abcdefgh"


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


def explain_text(question: dict, chosen: int | None) -> str:
    """The options, lettered; only the chosen one is marked and explained. A wrong choice does
    not give the right one away: the student may try again (the grader counts the tries)."""
    lines = []
    for i, option in enumerate(question["options"]):
        if i != chosen:
            lines.append(f"    {LETTERS[i]}) {option['text']}")
            continue
        mark, again = ("✓", "") if option["correct"] else ("✗", "\n      Not this one: try another option.")
        lines.append(f"  {mark} {LETTERS[i]}) {option['text']}  ← your answer\n      {option['why']}{again}")
    return "\n".join(lines)


def render_text(lab: str, questions: list[dict], saved: dict[str, dict]) -> str:
    if not questions:
        return f"Lab {lab} has no quiz."
    out = [f"Quiz — lab {lab} ({sum(1 for q in questions if q['id'] in saved)} of {len(questions)} answered)"]
    for number, q in enumerate(questions, 1):
        out.append(f"\n{number}. [{q['id']}] {q['question']}")
        if q["id"] in saved:
            out.append(explain_text(q, saved[q["id"]].get("choice")))
        else:
            out += [f"  {LETTERS[i]}) {o['text']}" for i, o in enumerate(q["options"])]
    out.append("\nAnswer in the widget in JupyterLab, or here: lab.answer(\"<id>\", \"b\").")
    return "\n".join(out)


def why_html(question: dict, chosen: int | None) -> str:
    """Once answered: the chosen option, lettered as in the widget, whether it is right and why.
    Only that one: the other options' explanations would name the right answer before the
    student found it."""
    if chosen is None or not 0 <= chosen < len(question["options"]):
        return ""
    o = question["options"][chosen]
    mark, color = ("✓", "#1b5e20") if o["correct"] else ("✗", "#b71c1c")
    again = "" if o["correct"] else '<div class="lk-why">Not this one: try another option.</div>'
    return (f'<div class="lk-opt" data-option="{LETTERS[chosen]}"><span style="color:{color}">{mark}</span> '
            f'{LETTERS[chosen]}) {escape(o["text"])} <b>← your answer</b>'
            f'<div class="lk-why">{escape(o["why"])}</div>{again}</div>')


def render_html(lab: str, questions: list[dict], saved: dict[str, dict]) -> str:
    """Static, readable without a kernel: options lettered as in the widget, the answers as saved
    now; an answered question explains the chosen option only, an open one explains nothing."""
    if not questions:
        return f"<p>Lab {escape(lab)} has no quiz.</p>"
    answered = sum(1 for q in questions if q["id"] in saved)
    items = []
    for number, q in enumerate(questions, 1):
        chosen = saved.get(q["id"], {}).get("choice")
        rows = "".join(why_html(q, i) if i == chosen else f'<div class="lk-opt">{LETTERS[i]}) {escape(o["text"])}</div>'
                       for i, o in enumerate(q["options"]))
        items.append(f'<div class="lk-q">{number}. {escape(q["question"])}</div>{rows}')
    return (f'<div class="lk-quiz"><b>Quiz — lab {escape(lab)}</b> '
            f'<span class="lk-points">{answered} of {len(questions)} answered</span>{"".join(items)}</div>')
