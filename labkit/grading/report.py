"""What the class got wrong: counts per lab and step, from the grader's own records only.

`build(out)` reads `DIR/.results/*.json` — the result files the grader wrote where no sandbox
can reach (the same records a resumed run and `merge` trust) — and counts, per lab:

- the distribution of total scores, and per step how many passed, failed, or had not started
  (the skeleton's `NotImplementedError`), and how many revealed the reference;
- per step, the contract clauses the failing cases name (`Case.clauses`, stable IDs from
  `checks/<lab>/contract.py`), ranked by how many students hit each, with the clause's rule,
  the most common hint and two anonymised example "got" lines. A student counts once per
  clause. Only real mistakes count (wrong, raised, timed out, died): a skeleton, a missing
  function or a module that does not import is not a rule broken. Nothing is parsed out of a
  message; a lab whose cases carry no clause yet is counted by case name, and says so;
- the quiz, question by question, ranked by first-try correctness. The quiz widget records
  each answer's first choice (`labkit.notebook.quiz.record`: `first_choice`), and the grader
  rescores it against the key (`answers.score`), so first tries are real data; a hand-made
  answers file without a first choice counts its only choice as the first.

Everything a student's code could choose (got lines, hints that quote values) is anonymised
here (no student names, no paths, no e-mail addresses) and escaped and sanitised by the page
(`report_html`). `summary_text` is what `grade` prints at the end.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from labkit import labs
from labkit.grading import gradebook
from labkit.judge.verdict import LabVerdict, Outcome, from_json

REPORT = "report.html"
# Outcomes that mean "a rule of the contract was broken"; the others mean "not there yet".
MISTAKES = {Outcome.WRONG, Outcome.RAISED, Outcome.TIMED_OUT, Outcome.DIED, Outcome.MEMORY_LIMIT}
EXAMPLES = 2
LINE_CHARS = 160
HINT_CHARS = 400  # hints are the course's own sentences, longer than a got line

# Absolute paths (/a/b, ~/a), e-mail addresses: they can name a student or a machine.
PATH = re.compile(r"(?<![\w.~/-])~?/(?:[^\s/'\"<>,;:()\[\]{}]+/)+[^\s/'\"<>,;:()\[\]{}]*")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
SPACES = re.compile(r"\s+")


def anonymise(text: str, names: list[str], limit: int = LINE_CHARS) -> str:
    """One line with no student name, path or e-mail address left in it, cut to a readable length."""
    text = EMAIL.sub("<email>", text)
    text = PATH.sub("<path>", text)
    for name in sorted(names, key=len, reverse=True):
        if name.strip():
            flags = re.IGNORECASE if len(name) >= 3 else 0
            text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", "<student>", text, flags=flags)
    text = SPACES.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class ClauseStats:
    key: str  # the clause ID, or "case:<name>" where the lab declares no clauses
    rule: str  # the clause's text from the lab's contract ("" when unknown)
    students: int
    hint: str
    examples: list[str]

    @property
    def declared(self) -> bool:
        return bool(self.rule)

    @property
    def label(self) -> str:
        return f"case “{self.key[5:]}”" if self.key.startswith("case:") else self.key


@dataclass
class StepStats:
    step: str
    title: str
    points: int
    judged: int = 0
    passed: int = 0
    failed: int = 0
    not_started: int = 0
    revealed: int = 0
    clauses: list[ClauseStats] = field(default_factory=list)

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.judged if self.judged else None


@dataclass
class QuestionStats:
    id: str
    question: str
    answered: int
    first_try: int  # correct at the first try
    correct_now: int
    attempts: float  # mean tries

    @property
    def first_try_rate(self) -> float | None:
        return self.first_try / self.answered if self.answered else None


@dataclass
class LabStats:
    lab: str
    max_score: int
    students: int  # rows of this lab
    statuses: dict[str, int]
    scores: dict[int, int]  # total → students
    steps: list[StepStats]
    questions: list[QuestionStats]
    no_verdict: int = 0  # rows whose judge never gave a verdict
    import_failed: int = 0
    tagged: bool = True  # the lab's cases carry clause IDs

    @property
    def all_passed(self) -> int:
        return self.scores.get(self.max_score, 0) if self.max_score else 0

    @property
    def median(self) -> float | None:
        totals = [total for total, n in self.scores.items() for _ in range(n)]
        return statistics.median(totals) if totals else None


@dataclass
class ClassReport:
    labs: list[LabStats]
    rows: int
    skipped: int
    malformed: int
    unreadable: int  # result files that could not be read as the grader's records
    seeds: list[int]
    sandbox: list[str]


def _records(out: Path) -> tuple[list[dict], int]:
    """The grader's result files; files that are not its records are counted, not read."""
    folder = gradebook.results_dir(out)
    records, unreadable = [], 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = gradebook.read_result(path)
        row = data.get("row") if data else None
        if not isinstance(row, dict) or data.get("key") != path.stem or not isinstance(row.get("student"), str) \
                or not isinstance(row.get("lab"), str):
            unreadable += 1
            continue
        records.append(data)
    return records, unreadable


def _verdict(record: dict) -> LabVerdict | None:
    data = record.get("verdict")
    if not isinstance(data, dict):
        return None
    try:
        return from_json(data)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class _Tally:
    students: set[str] = field(default_factory=set)
    hints: Counter = field(default_factory=Counter)
    gots: dict[str, set[str]] = field(default_factory=dict)  # got line → students


def _most_common(counter: Counter) -> list[str]:
    return [text for text, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]


def _lab_stats(lab: str, records: list[dict], names: list[str]) -> LabStats:
    spec = labs.load(lab)
    rules = {clause.id: clause.text for clause in spec.contract}
    steps = {str(s.step): StepStats(str(s.step), s.title, s.points) for s in spec.steps}
    tallies: dict[tuple[str, str], _Tally] = {}
    statuses: Counter = Counter()
    scores: Counter = Counter()
    no_verdict = import_failed = 0
    tagged = bool(spec.contract)
    for record in records:
        row = record["row"]
        student = row["student"]
        statuses[row.get("status", "")] += 1
        scores[int(row.get("total") or 0)] += 1
        for step in row.get("revealed") or []:
            if str(step) in steps:
                steps[str(step)].revealed += 1
        verdict = _verdict(record)
        if verdict is None:
            no_verdict += 1
            continue
        if any(c.outcome is Outcome.IMPORT_FAILED for s in verdict.steps for c in s.cases):
            import_failed += 1
        for step_verdict in verdict.steps:
            stats = steps.get(str(step_verdict.step))
            if stats is None:
                continue
            stats.judged += 1
            if step_verdict.passed:
                stats.passed += 1
                continue
            if step_verdict.not_implemented:
                stats.not_started += 1
                continue
            stats.failed += 1
            for case in step_verdict.cases:
                if case.passed or case.outcome not in MISTAKES:
                    continue
                for key in case.clauses or (f"case:{case.name}",):
                    tally = tallies.setdefault((stats.step, key), _Tally())
                    tally.students.add(student)
                    if case.hint:
                        tally.hints[anonymise(case.hint, names, HINT_CHARS)] += 1
                    got = anonymise(case.got, names) if case.got else ""
                    if got:
                        tally.gots.setdefault(got, set()).add(student)
    for (step, key), tally in tallies.items():
        examples = Counter({got: len(who) for got, who in tally.gots.items()})
        steps[step].clauses.append(ClauseStats(key, rules.get(key, ""), len(tally.students),
                                               next(iter(_most_common(tally.hints)), ""),
                                               _most_common(examples)[:EXAMPLES]))
    for stats in steps.values():
        stats.clauses.sort(key=lambda c: (-c.students, c.key))
    max_score = sum(s.points for s in spec.steps)
    return LabStats(lab, max_score, len(records), dict(sorted(statuses.items())),
                    {total: scores.get(total, 0) for total in range(max_score + 1)} | dict(scores),
                    list(steps.values()), _questions(lab, [r["row"] for r in records]), no_verdict,
                    import_failed, tagged)


def _questions(lab: str, rows: list[dict]) -> list[QuestionStats]:
    from labkit.notebook import quiz

    try:
        questions = quiz.load(lab)
    except Exception:  # a lab without a usable quiz
        return []
    found = []
    for question in questions:
        given = []
        for row in rows:
            answers = (row.get("quiz") or {}).get("answers") if isinstance(row.get("quiz"), dict) else None
            answer = answers.get(question["id"]) if isinstance(answers, dict) else None
            if isinstance(answer, dict):
                given.append(answer)
        tries = [a.get("attempts") for a in given if isinstance(a.get("attempts"), int)]
        found.append(QuestionStats(question["id"], question["question"], len(given),
                                   sum(1 for a in given if a.get("first_correct") is True),
                                   sum(1 for a in given if a.get("correct") is True),
                                   statistics.fmean(tries) if tries else 0.0))
    # Hardest first: the lowest first-try rate; unanswered questions last.
    found.sort(key=lambda q: (q.first_try_rate is None, q.first_try_rate or 0.0, q.id))
    return found


def build(out: Path) -> ClassReport:
    records, unreadable = _records(out)
    rows = gradebook.load_rows(out)
    names = sorted({r["student"] for r in rows if isinstance(r.get("student"), str)})
    by_lab: dict[str, list[dict]] = {}
    known = set(labs.available())
    for record in records:
        lab = record["row"]["lab"]
        if lab in known and record["row"].get("status") != "malformed":
            by_lab.setdefault(lab, []).append(record)
    order = {lab: i for i, lab in enumerate(labs.available())}
    return ClassReport(
        labs=[_lab_stats(lab, by_lab[lab], names) for lab in sorted(by_lab, key=lambda lab: order.get(lab, 99))],
        rows=len(rows),
        skipped=sum(1 for r in rows if r.get("status") == "skipped"),
        malformed=sum(1 for r in rows if r.get("status") == "malformed"),
        unreadable=unreadable,
        seeds=sorted({r["seed"] for r in rows if isinstance(r.get("seed"), int)}),
        sandbox=sorted({r.get("sandbox", "") for r in rows if r.get("sandbox")}),
    )


def _percent(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.0%}"


def summary_text(report: ClassReport, page: Path) -> str:
    """The terminal summary at the end of `grade` (and of `report`)."""
    lines = [f"Class report: {page}"]
    if not report.labs:
        lines.append("  no lab was graded: nothing to count")
    for lab in report.labs:
        median = "—" if lab.median is None else f"{lab.median:g}"
        lines.append(f"  {lab.lab}: {lab.students} student(s), median {median}/{lab.max_score}, "
                     f"{lab.all_passed} with every point"
                     + (f", {lab.import_failed} whose module did not import" if lab.import_failed else "")
                     + (f", {lab.no_verdict} without a verdict" if lab.no_verdict else ""))
        lines.append(f"    {'step':<6}{'passed':>8}{'failed':>8}{'not started':>13}{'revealed':>10}  most hit")
        for step in lab.steps:
            top = step.clauses[0] if step.clauses else None
            hit = f"{top.label} ({top.students})" if top else ""
            lines.append(f"    {step.step:<6}{step.passed:>8}{step.failed:>8}{step.not_started:>13}"
                         f"{step.revealed:>10}  {hit}")
        answered = [q for q in lab.questions if q.answered]
        if answered:
            hardest = answered[0]
            lines.append(f"    quiz: hardest at the first try: {hardest.id} "
                         f"({_percent(hardest.first_try_rate)} of {hardest.answered})")
    return "\n".join(lines)


def write(out: Path) -> str:
    """Write `DIR/report.html` from DIR's records; return the text summary."""
    from labkit.grading import report_html

    report = build(out)
    page = out / REPORT
    gradebook.write_atomic(page, report_html.page(report))
    return summary_text(report, page)
