"""Every lab's quiz data: no giveaway in the options' shape, every option explained, and the
lesson's prose announcing as many questions as the widget asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.labs import LABS
from labkit.notebook import build, quiz

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
QUIZZED = [lab for lab in LABS if quiz.load(lab)]


def test_the_labs_with_a_quiz_are_found():
    assert {"outbox", "vending"} <= set(QUIZZED)


@pytest.fixture(params=QUIZZED)
def questions(request) -> tuple[str, list[dict]]:
    return request.param, quiz.load(request.param)


def test_questions_are_well_formed_and_every_option_explains_itself(questions):
    lab, qs = questions
    assert 3 <= len(qs) <= 7 and len({q["id"] for q in qs}) == len(qs)
    for q in qs:
        assert re.fullmatch(r"[a-z0-9-]+", q["id"]) and q["question"].endswith("?"), q["id"]
        assert 3 <= len(q["options"]) <= 5 and sum(o["correct"] is True for o in q["options"]) == 1, q["id"]
        assert len({o["text"] for o in q["options"]}) == len(q["options"]), q["id"]
        for option in q["options"]:
            assert len(option["why"]) >= 60, (q["id"], option["text"])
            assert option["why"].startswith("Right.") == option["correct"], (q["id"], option["text"])


def test_the_right_answer_is_not_given_away_by_its_length(questions):
    lab, qs = questions
    longest = 0
    for q in qs:
        lengths = [len(o["text"]) for o in q["options"]]
        assert max(lengths) <= 1.35 * min(lengths), (q["id"], lengths)
        right = next(len(o["text"]) for o in q["options"] if o["correct"])
        wrong = [len(o["text"]) for o in q["options"] if not o["correct"]]
        assert right <= 1.15 * sum(wrong) / len(wrong), (q["id"], right, wrong)
        longest += right == max(lengths)
    assert longest <= len(qs) // 2, f"{lab}: the right answer is the longest option in {longest} of {len(qs)}"


def test_the_right_answer_moves_around(questions):
    lab, qs = questions
    positions = [next(i for i, o in enumerate(q["options"]) if o["correct"]) for q in qs]
    assert len(set(positions)) >= 3, positions
    assert positions.count(0) <= len(qs) // 2, positions


@pytest.mark.parametrize("source", sorted((ROOT / "notebooks" / "source").glob("*.md")), ids=lambda p: p.stem)
def test_the_lesson_announces_as_many_questions_as_the_quiz_asks(source):
    lesson = build.parse(source)
    qs = quiz.load(lesson.lab)
    kinds = [b.kind for b in lesson.blocks]
    if "quiz" not in kinds:
        assert not qs or lesson.lab == "start-here"
        return
    at = kinds.index("quiz")
    prose = lesson.blocks[at - 1].text if at and lesson.blocks[at - 1].kind == "markdown" else ""
    items = re.findall(r"^\d+\. ", prose, re.M)
    assert len(items) in (0, len(qs)), f"the prose lists {len(items)} questions, the quiz asks {len(qs)}"
    counted = re.findall(r"\b(three|four|five|six|seven)\b questions", prose, re.I)
    assert all(word.lower() == NUMBERS[len(qs)] for word in counted), counted
    assert items or counted, "say how many questions the quiz asks"
