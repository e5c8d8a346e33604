"""The class report, from grader-written records made here by hand (no kernel, no sandbox).

Each test writes result files the way the grader does (`record.finish`), with verdicts whose
cases carry clause IDs, then reads back what `report.build` counted and what the page shows.
The counts expected are written out from the records made, never computed by the report's code.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from labkit import labs
from labkit.grading import answers, gradebook, record, report
from labkit.judge.verdict import Case, LabVerdict, Outcome, StepVerdict
from labkit.notebook import quiz

LAB = "outbox"
SPEC = labs.load(LAB)
STEPS = [str(s.step) for s in SPEC.steps]
POINTS = {str(s.step): s.points for s in SPEC.steps}
SEED = 11


def passing(step: str) -> StepVerdict:
    return StepVerdict(step if step == "final" else int(step), f"step {step}", POINTS[step],
                       [Case("fine", Outcome.PASSED)])


def failing(step: str, *cases: Case) -> StepVerdict:
    return StepVerdict(step if step == "final" else int(step), f"step {step}", POINTS[step], list(cases))


def verdict(**broken: list[Case]) -> LabVerdict:
    """Every step passes except the ones given (step name with `s` in front: s3=[...])."""
    steps = []
    for step in STEPS:
        cases = broken.get(f"s{step}")
        steps.append(failing(step, *cases) if cases else passing(step))
    return LabVerdict(LAB, SEED, steps)


def grade(out: Path, student: str, lab_verdict: LabVerdict | None, *, quiz_answers: dict | None = None,
          revealed: list[str] | None = None, status: str = "ok") -> None:
    job = {"student": student, "lab": LAB, "notebook": f"{student}/01-outbox.ipynb", "path": f"/x/{student}/nb.ipynb",
           "key": f"{student}--{LAB}", "sha256": "0" * 64, "seed": SEED, "out": str(out), "sandbox": "test",
           "revealed": revealed or []}
    scored = answers.score(LAB, quiz_answers) if quiz_answers is not None else None
    record.finish(job, status=status, message="", flags=[], verdict=lab_verdict, seconds=1.0, quiz=scored)


def build(out: Path) -> report.ClassReport:
    gradebook.write_gradebook(out)
    return report.build(out)


def step_stats(rep: report.ClassReport, step: str) -> report.StepStats:
    return next(s for s in rep.labs[0].steps if s.step == step)


def test_failing_clauses_are_ranked_by_students_each_counted_once(tmp_path):
    qty = Case("qty True", Outcome.WRONG, got="returned the event", hint="bool is an int", clauses=("1.qty-bool",))
    qty2 = Case("qty False", Outcome.WRONG, got="returned the event", hint="bool is an int", clauses=("1.qty-bool",))
    sku = Case("sku", Outcome.RAISED, got="KeyError: 'sku'", hint="check the sku", clauses=("1.sku-ascii",))
    conflict = Case("same id", Outcome.WRONG, got="returned False", hint="raise Conflict", clauses=("3.conflict",))
    grade(tmp_path, "ada", verdict(s1=[qty, qty2]))  # two cases, one clause: counts once
    grade(tmp_path, "bob", verdict(s1=[qty, sku]))
    grade(tmp_path, "cyd", verdict(s1=[sku], s3=[conflict]))
    grade(tmp_path, "dee", verdict(s1=[qty]))
    grade(tmp_path, "eve", verdict())
    rep = build(tmp_path)
    one = step_stats(rep, "1")
    assert [(c.key, c.students) for c in one.clauses] == [("1.qty-bool", 3), ("1.sku-ascii", 2)]
    assert (one.passed, one.failed, one.not_started) == (1, 4, 0)
    assert one.clauses[0].hint == "bool is an int" and one.clauses[0].examples == ["returned the event"]
    assert [(c.key, c.students) for c in step_stats(rep, "3").clauses] == [("3.conflict", 1)]
    lab = rep.labs[0]
    full = sum(POINTS.values())
    assert lab.scores[full] == 1 and lab.scores[full - POINTS["1"]] == 3
    assert lab.scores[full - POINTS["1"] - POINTS["3"]] == 1


def test_a_skeleton_step_is_not_started_and_breaks_no_rule(tmp_path):
    skeleton = Case("todo", Outcome.NOT_IMPLEMENTED, got="NotImplementedError", clauses=("2.open",))
    grade(tmp_path, "ada", verdict(s2=[skeleton]))
    rep = build(tmp_path)
    two = step_stats(rep, "2")
    assert (two.passed, two.failed, two.not_started, two.clauses) == (0, 0, 1, [])


def test_example_lines_name_no_student_path_or_address(tmp_path):
    leak = Case("qty", Outcome.WRONG, clauses=("1.qty-bool",), hint="Zelda, look at /home/zelda/x.py",
                got="zelda wrote /home/zelda/outbox.py for zelda@uni.example.org; ~/secret/notes.txt")
    grade(tmp_path, "zelda", verdict(s1=[leak]))
    rep = build(tmp_path)
    clause = step_stats(rep, "1").clauses[0]
    shown = clause.hint + " " + " ".join(clause.examples)
    for secret in ("zelda", "Zelda", "/home", "uni.example.org", "secret"):
        assert secret not in shown, shown
    assert "<student>" in shown and "<path>" in shown and "<email>" in shown
    report.write(tmp_path)
    page = (tmp_path / report.REPORT).read_text()
    assert "zelda@" not in page and "/home/zelda" not in page


class _Active(HTMLParser):
    """Tags and attributes that run code or load something from elsewhere (text is never looked at)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "iframe", "object", "embed", "link", "base"):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on"):
                self.found.append(f"{tag} {name}=")
            if name in ("src", "href", "xlink:href", "action") and (
                    value.startswith(("javascript:", "http:", "https:", "//"))):
                self.found.append(f"{tag} {name}={value[:30]}")

    def handle_data(self, data: str) -> None:
        if "@import" in data or "url(" in data:
            self.found.append("a CSS import or url()")


def active(html: str) -> list[str]:
    finder = _Active()
    finder.feed(html)
    return finder.found


def test_active_finder_finds_scripts_handlers_and_remote_loads():
    found = active('<script>x</script><img src="https://e.org/a.png" onerror="x"><link rel=x>'
                   '<p>&lt;script&gt; onerror= as text</p>')
    assert len(found) == 4, found


def test_the_page_is_offline_and_student_html_stays_text(tmp_path):
    hostile = Case("qty", Outcome.WRONG, clauses=("1.qty-bool",), hint="<img src=x onerror=alert(1)>",
                   got="<script>alert(1)</script><a href=\"javascript:alert(2)\">x</a> "
                       "<link rel=stylesheet href=https://evil.example/x.css>")
    grade(tmp_path, "ada", verdict(s1=[hostile]))
    gradebook.write_gradebook(tmp_path)
    report.write(tmp_path)
    page = (tmp_path / report.REPORT).read_text()
    assert active(page) == []
    assert "&lt;script&gt;" in page  # the student's text is still there, as text
    assert "<svg" in page and "<table" in page  # charts, and tables beside them


def test_quiz_questions_are_ranked_by_first_try_correctness(tmp_path):
    questions = quiz.load(LAB)
    right = {q["id"]: next(i for i, o in enumerate(q["options"]) if o["correct"]) for q in questions}
    wrong = {q["id"]: next(i for i, o in enumerate(q["options"]) if not o["correct"]) for q in questions}
    hard, easy = questions[0]["id"], questions[1]["id"]

    def saved(first: dict, last: dict) -> dict:
        return {"lab": LAB, "answers": {qid: {"first_choice": first[qid], "choice": last[qid], "attempts": 2}
                                        for qid in first}}

    # hard: nobody right at the first try, everyone right now; easy: two of three at once
    grade(tmp_path, "ada", verdict(), quiz_answers=saved({hard: wrong[hard], easy: right[easy]},
                                                         {hard: right[hard], easy: right[easy]}))
    grade(tmp_path, "bob", verdict(), quiz_answers=saved({hard: wrong[hard], easy: right[easy]},
                                                         {hard: right[hard], easy: right[easy]}))
    grade(tmp_path, "cyd", verdict(), quiz_answers=saved({hard: wrong[hard], easy: wrong[easy]},
                                                         {hard: right[hard], easy: right[easy]}))
    rep = build(tmp_path)
    answered = [(q.id, q.answered, q.first_try, q.correct_now) for q in rep.labs[0].questions if q.answered]
    assert answered == [(hard, 3, 0, 3), (easy, 3, 2, 3)]


def test_reveals_are_counted_per_step(tmp_path):
    grade(tmp_path, "ada", verdict(), revealed=["3"])
    grade(tmp_path, "bob", verdict(), revealed=["3", "final"])
    rep = build(tmp_path)
    assert {s.step: s.revealed for s in rep.labs[0].steps if s.revealed} == {"3": 2, "final": 1}


def test_only_the_graders_records_count(tmp_path):
    grade(tmp_path, "ada", verdict())
    results = gradebook.results_dir(tmp_path)
    forged = json.loads((results / f"ada--{LAB}.json").read_text())
    forged["row"]["student"] = "mallory"
    (results / "someone-else.json").write_text(json.dumps(forged))  # its key is not its name
    (results / "junk.json").write_text("{not json")
    rep = build(tmp_path)
    assert rep.labs[0].students == 1 and rep.unreadable == 2


def test_report_command_writes_the_page_and_prints_the_summary(tmp_path, capsys):
    from labkit.cli import main

    grade(tmp_path, "ada", verdict(s1=[Case("qty", Outcome.WRONG, clauses=("1.qty-bool",))]))
    gradebook.write_gradebook(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert (tmp_path / report.REPORT).is_file()
    assert f"{LAB}: 1 student(s)" in text and "1.qty-bool (1)" in text
    assert main(["report", str(tmp_path / "nowhere")]) == 2
