"""The quiz widget gives nothing away: a wrong click colours only that option and explains
only it; the right option shows green only once it is the one clicked."""

from __future__ import annotations

import ipywidgets as W

from labkit.views.widgets import quiz_panel

QUESTION = {"id": "q1", "question": "Which is right?", "options": [
    {"text": "the wrong one", "correct": False, "why": "WHY-WRONG"},
    {"text": "the right one", "correct": True, "why": "WHY-RIGHT"},
    {"text": "another wrong one", "correct": False, "why": "WHY-OTHER"}]}


def _buttons(panel: W.VBox) -> list[W.Button]:
    return [child for child in panel.children if isinstance(child, W.Button)]


def test_a_wrong_click_colours_and_explains_only_the_option_clicked():
    chosen = []
    panel = quiz_panel("outbox", [QUESTION], {}, lambda qid, index: chosen.append(index) or {})
    buttons = _buttons(panel)
    buttons[0].click()
    assert chosen == [0]
    assert [b.button_style for b in buttons] == ["danger", "", ""]
    shown = " ".join(child.value for child in panel.children if isinstance(child, W.HTML))
    assert "WHY-RIGHT" not in shown and "WHY-OTHER" not in shown
    buttons[1].click()
    assert [b.button_style for b in buttons] == ["", "success", ""]
