"""A lab's quiz: questions from `checks/<lab>_quiz.py`, answers recorded in the work folder.

`QUIZ = [{"id", "question", "options": [{"text", "correct": bool, "why"}]}]`. Every answer is
written to `work/quiz-<lab>.json` at once (the grader reads that file): the latest choice, the
first choice, and how many tries it took. Text and static HTML renderings live here; the
widget is in `widgets`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
from html import escape
from pathlib import Path

from labkit.labs import LABS
from labkit.notebook.module_export import write_atomic

LETTERS = "abcdefgh"


class QuizError(ValueError):
    """An answer that names no question or no option."""


def load(lab: str) -> list[dict]:
    """The lab's questions, or [] when the lab has no quiz module."""
    name = f"{LABS[lab]}_quiz"
    if importlib.util.find_spec(name) is None:
        return []
    questions = importlib.import_module(name).QUIZ
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
    lines = []
    for i, option in enumerate(question["options"]):
        mark = "✓" if option["correct"] else "✗"
        you = "  ← your answer" if i == chosen else ""
        lines.append(f"  {mark} {LETTERS[i]}) {option['text']}{you}\n      {option['why']}")
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
    """Once answered: for each option, lettered as in the widget, whether it is right and why."""
    rows = []
    for i, o in enumerate(question["options"]):
        mark, color = ("✓", "#1b5e20") if o["correct"] else ("✗", "#b71c1c")
        you = " <b>← your answer</b>" if i == chosen else ""
        rows.append(f'<div class="lk-opt"><span style="color:{color}">{mark}</span> {LETTERS[i]}) '
                    f'{escape(o["text"])}{you}<div class="lk-why">{escape(o["why"])}</div></div>')
    return "".join(rows)


def render_html(lab: str, questions: list[dict], saved: dict[str, dict]) -> str:
    """Static, readable without a kernel: options lettered as in the widget, the answers as saved
    now; an answered question shows why each option is right or wrong, an open one hides that."""
    if not questions:
        return f"<p>Lab {escape(lab)} has no quiz.</p>"
    answered = sum(1 for q in questions if q["id"] in saved)
    items = []
    for number, q in enumerate(questions, 1):
        chosen = saved.get(q["id"], {}).get("choice")
        if chosen is None:
            rows = "".join(f'<div class="lk-opt">{LETTERS[i]}) {escape(o["text"])}</div>'
                           for i, o in enumerate(q["options"]))
        else:
            rows = why_html(q, chosen)
        why = "" if chosen is not None else (
            '<details class="lk-more"><summary>why each option is right or wrong</summary><div>'
            + "".join(f"<p>{LETTERS[i]}) {escape(o['why'])}</p>" for i, o in enumerate(q["options"]))
            + "</div></details>")
        items.append(f'<div class="lk-q">{number}. {escape(q["question"])}</div>{rows}{why}')
    return (f'<div class="lk-quiz"><b>Quiz — lab {escape(lab)}</b> '
            f'<span class="lk-points">{answered} of {len(questions)} answered</span>{"".join(items)}</div>')
