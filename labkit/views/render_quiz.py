"""The quiz as the student reads it: text for a terminal, static HTML for a saved notebook.

Options are lettered (`LETTERS`) the same way in the widget, the text and the HTML; an answered
question explains the chosen option only.
"""

from __future__ import annotations

from html import escape

LETTERS = "abcdefgh"


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
