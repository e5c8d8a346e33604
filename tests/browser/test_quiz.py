"""The quiz widget in a real JupyterLab: a click explains the option clicked, and only that one.

Explaining every option on the first click named the right answer before the student found it
(labkit.views.render_quiz.why_html). A wrong click shows that option's explanation and "try another
option"; the other options' explanations, the right one's included, stay unshown.
"""

from __future__ import annotations

import json

import nbformat
import pytest

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

from driver import BROWSER_MARKS, menu, place, shot, wait_for_kernel  # noqa: E402

from labkit.notebook import quiz  # noqa: E402

pytestmark = BROWSER_MARKS


def quiz_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('from labkit.notebook import Lab\n\nlab = Lab("outbox")'),
                nbformat.v4.new_code_cell("lab.quiz()")]
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    return nb


def test_a_wrong_click_explains_only_the_option_clicked(lab, page):
    questions = quiz.load("outbox")
    first = questions[0]
    wrong = next(i for i, o in enumerate(first["options"]) if not o["correct"])
    right = next(i for i, o in enumerate(first["options"]) if o["correct"])
    place(lab, quiz_notebook(), "quiz.ipynb")
    page.goto(lab.url("quiz.ipynb"))
    wait_for_kernel(page)
    menu(page, "Run", "Run All Cells")
    live = page.locator(".lk-live.lk-quiz")
    live.wait_for(timeout=120_000)
    why = live.locator(".lk-quiz-why").first
    expect(why).to_have_text("")  # nothing is explained before a click

    live.locator(".lk-option").nth(wrong).click()
    why.get_by_text("your answer").wait_for(timeout=30_000)
    shown = why.inner_text()
    assert first["options"][wrong]["why"] in shown and "try another option" in shown
    others = [o["why"] for i, o in enumerate(first["options"]) if i != wrong]
    assert not [text for text in others if text in shown], shown
    assert "Right." not in shown
    for other in live.locator(".lk-quiz-why").all()[1:]:  # the other questions: still unexplained
        assert other.inner_text().strip() == ""
    saved = json.loads((lab.root / "work" / "quiz-outbox.json").read_text())
    assert saved["answers"][first["id"]]["choice"] == wrong
    shot(page, live, "quiz-wrong-click.png")

    live.locator(".lk-option").nth(right).click()  # the second try: now the right one, and only it
    expect(why).to_contain_text(first["options"][right]["why"], timeout=30_000)
    shown = why.inner_text()
    assert first["options"][wrong]["why"] not in shown and "try another option" not in shown
    saved = json.loads((lab.root / "work" / "quiz-outbox.json").read_text())
    entry = saved["answers"][first["id"]]
    assert (entry["choice"], entry["first_correct"], entry["attempts"]) == (right, False, 2)
