"""Every lab's quiz data: no giveaway in the options' shape, every option explained, and the
lesson's prose announcing as many questions as the widget asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.labs import available
from labkit.notebook import build, quiz

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
QUIZZED = [lab for lab in available() if quiz.load(lab)]


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


# Thresholds, and why. A student who cannot answer guesses from the options' shape: the longest
# (the most careful-sounding) one, or the slot that was right last time. With four options a
# guess is right one time in four, so in a lab of five questions the right option may be the
# longest at most twice (40 %: once or twice happens by chance, three times is a pattern) and
# may sit in one slot at most half the time. Length: no option may be more than twice as long
# as the shortest (2×, what the issue asks), and the options of one question stay within
# LENGTH_SPREAD of each other, which our own data meets and which keeps the right one from
# standing out by its length even when it is not the longest.
LONGEST_SHARE = 0.40
SAME_SLOT_SHARE = 0.50
LONGEST_TO_SHORTEST = 2.0
LENGTH_SPREAD = 1.35


def shape_problems(qs: list[dict]) -> list[str]:
    """What gives the right answer away in one lab's questions (empty when nothing does)."""
    problems = []
    longest, positions = 0, []
    for q in qs:
        lengths = [len(o["text"]) for o in q["options"]]
        if max(lengths) > LONGEST_TO_SHORTEST * min(lengths):
            problems.append(f"{q['id']}: an option is more than {LONGEST_TO_SHORTEST}× the shortest: {lengths}")
        elif max(lengths) > LENGTH_SPREAD * min(lengths):
            problems.append(f"{q['id']}: options differ by more than {LENGTH_SPREAD}×: {lengths}")
        right = next(i for i, o in enumerate(q["options"]) if o["correct"])
        positions.append(right)
        longest += lengths[right] == max(lengths)
    if longest > LONGEST_SHARE * len(qs):
        problems.append(f"the right option is the longest in {longest} of {len(qs)} questions")
    slot, count = max(((p, positions.count(p)) for p in set(positions)), key=lambda pc: pc[1], default=(0, 0))
    if count > SAME_SLOT_SHARE * len(qs):
        problems.append(f"the right option is {'abcdefgh'[slot]}) in {count} of {len(qs)} questions: {positions}")
    return problems


def test_the_right_answer_is_not_given_away_by_the_options_shape(questions):
    lab, qs = questions
    assert shape_problems(qs) == [], lab


def _question(qid: str, texts: list[str], right: int) -> dict:
    return {"id": qid, "question": f"{qid}?",
            "options": [{"text": t, "correct": i == right, "why": "x" * 60} for i, t in enumerate(texts)]}


def test_the_shape_rules_can_fail():
    even = ["a" * 40, "b" * 41, "c" * 42, "d" * 43]
    fine = [_question(f"q{n}", even, n % 4) for n in range(5)]
    assert shape_problems(fine) == []
    longest = [_question(f"q{n}", even, 3 if n < 3 else n % 3) for n in range(5)]  # d) is also a slot
    assert any("longest in 3 of 5" in p for p in shape_problems(longest))
    slot = [_question(f"q{n}", even, 1 if n < 3 else 0) for n in range(5)]
    assert any("b) in 3 of 5" in p for p in shape_problems(slot))
    wide = [_question("q0", ["a" * 20, "b" * 41, "c" * 30, "d" * 30], 2)] + fine[1:]
    assert any("more than 2.0×" in p for p in shape_problems(wide))


def test_the_right_answer_moves_around(questions):
    lab, qs = questions
    positions = [next(i for i, o in enumerate(q["options"]) if o["correct"]) for q in qs]
    assert len(set(positions)) >= 3, positions


def _plain(markdown: str) -> str:
    return re.sub(r"[*`_]", "", " ".join(markdown.split()))


def test_the_prose_words_each_question_as_the_widget_does():
    """The lesson's numbered list before the quiz cell is the quiz's questions, verbatim (markdown
    emphasis aside): the student reads one wording, in both places."""
    for source in sorted((ROOT / "notebooks" / "source").glob("*.md")):
        lesson = build.parse(source)
        qs = quiz.load(lesson.lab)
        kinds = [b.kind for b in lesson.blocks]
        if "quiz" not in kinds or not qs:
            continue
        prose = lesson.blocks[kinds.index("quiz") - 1].text
        items = [_plain(m) for m in re.findall(r"^\d+\. (.*(?:\n(?!\d+\. |\n).*)*)", prose, re.M)]
        assert items == [_plain(q["question"]) for q in qs], source.name


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
