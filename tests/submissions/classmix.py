"""A synthetic class: correct, partial and wrong notebooks across every lab, and what each deserves.

`build(n, seed)` makes `n` notebooks, as students of a real class would leave them: each
student submits the labs in turn (`s000/01-outbox.ipynb`, `s000/02-vending.ipynb`, …), some
with quiz answers (`work/quiz-<lab>.json`, as the quiz widget writes them) and some with a
step's reference revealed (`work/revealed-<lab>.json`, or only the tagged output the reveal
cell leaves in the notebook). Labs are discovered, not listed: every lab that has a released
notebook, a labelled reference module and a catalogue of wrong solutions
(`tests/wrong_solutions/<lab>.toml`) takes part, so lab 03 joins when it lands.

Each notebook is one of:

- **reference**: every step's cell is the reference's;
- **partial**: a random set of steps closed under "builds on" (`StepSpec.requires`, and a
  helper another step's cell defines: `code_requires`), the other cells left as the skeleton;
- **skeleton**: the release, untouched;
- **wrong**: one wrong solution of the catalogue. Its step N (the one its entry names)
  comes from the wrong code (the reference with the entry's patch); every step that builds on N is left as the skeleton (so what
  it would do with the broken step N is not a question; the final check, which has no cell,
  gets one more of its bases left as the skeleton, so it cannot pass: `beyond_doubt`; whether
  it then fails or is not started depends on which it meets first, so `Known.unsure` says
  "one or the other"); every other step is the reference's.

`Known` says, from this construction alone and without running anything, what each notebook
must get: which steps pass, which fail with a mistake, which are not started, which clause
the mistake breaks (the wrong solution's entry), the quiz answers and the revealed steps. The
report test and `benchmarks/class_run.py` count from these, never from the report's code.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.notebook import helpers
from tests.submissions import corpus

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "tests" / "wrong_solutions"
KINDS = ("reference", "partial", "skeleton", "wrong")
WEIGHTS = (0.2, 0.25, 0.1, 0.45)


@dataclass(frozen=True)
class Known:
    """What a notebook of the mix must get, known from how it was made."""

    lab: str
    kind: str
    passes: frozenset[str]
    fails: frozenset[str]  # a mistake (wrong, raised, hung, died): the wrong file's step
    not_started: frozenset[str]  # the skeleton's NotImplementedError
    wrong_file: str = ""
    clause: str = ""  # the clause the wrong file's docstring names ("" before clauses existed)
    quiz: dict = field(default_factory=dict)  # question id → (first choice, last choice, attempts)
    revealed: frozenset[str] = frozenset()
    # Steps that do not pass, but whether they fail or are not started is not known from the
    # file: the final check running a wrong step and a skeleton meets whichever comes first.
    unsure: frozenset[str] = frozenset()


@dataclass
class Lab:
    name: str
    release: nbformat.NotebookNode
    filename: str
    parts: dict[str, str]  # the reference's parts
    steps: list[str]
    requires: dict[str, set[str]]
    wrong: list[tuple[str, str, str, str]]  # (file name, step, clause, that step's wrong part)


def labs(root: Path = ROOT) -> list[Lab]:
    """Every lab with a release, a labelled reference and a catalogue of wrong solutions."""
    from labkit import labs as known
    from labkit.judge import catalogue

    found = []
    for name in known.available():
        sources = corpus.default_sources(root, name)
        if sources is None or not catalogue.data_file(CATALOGUE, name).is_file():
            continue
        release, reference = sources
        parts = corpus.reference_parts(reference)
        spec = known.load(name)
        wrong = []
        mistakes = catalogue.read(CATALOGUE, name)
        for entry in mistakes.entries:
            theirs = corpus.reference_parts(mistakes.body(entry, reference))
            # Only a mistake confined to its own step's cell can be put into a notebook alone.
            if {p for p in parts.keys() | theirs.keys() if parts.get(p) != theirs.get(p)} == {entry.step}:
                wrong.append((f"{entry.name}.py", entry.step, entry.clause, theirs[entry.step]))
        filename = next(p.name for p in sorted((root / "notebooks").glob("*.ipynb"))
                        if nbformat.read(p, as_version=4).metadata.get("labkit", {}).get("lab") == name)
        requires = {str(s.step): {str(r) for r in s.requires} for s in spec.steps}
        for step, defining in code_requires(parts).items():  # a helper another step's cell defines
            requires.setdefault(step, set()).update(defining)
        lab = Lab(name, release, filename, parts, [str(s.step) for s in spec.steps], requires, wrong)
        lab.wrong = [w for w in wrong if _knowable(lab, w[1])]
        found.append(lab)
    return found


def code_requires(parts: dict[str, str]) -> dict[str, set[str]]:
    """Step → the other steps whose cells define a name its cell uses (the reference's helpers).

    `StepSpec.requires` says which steps a step's *check* builds on; the reference's cells can
    share more than that (relay's `_finite`, defined with step 3 and called by steps 5-7). A
    notebook that leaves the defining cell as the skeleton breaks those steps too, so for the
    mix they build on it as well. Unlike a reveal's helpers (`labkit.notebook.helpers`), a step
    function the skeleton defines counts too: the skeleton's raises NotImplementedError."""
    defined = {step: set(helpers.defined(code)) for step, code in parts.items()}
    used = {step: helpers.globals_used(code) for step, code in parts.items()}
    shared = defined.get("header", set())
    return {step: {other for other in parts if other not in (step, "header")
                   and (used[step] - defined[step] - shared) & defined[other]}
            for step in parts if step != "header"}


def dependents(lab: Lab, step: str) -> set[str]:
    found, changed = set(), True
    while changed:
        changed = False
        for other, needs in lab.requires.items():
            if other not in found and (step in needs or needs & found):
                found.add(other)
                changed = True
    return found


def cellless(lab: Lab) -> set[str]:
    """Steps with no cell of their own (the final check): they run the other steps' code."""
    return {s for s in lab.steps if s not in lab.parts}


def bases(lab: Lab, step: str) -> set[str]:
    """Every step `step` builds on, directly or not."""
    found, todo = set(), list(lab.requires[step])
    while todo:
        base = todo.pop()
        if base not in found:
            found.add(base)
            todo += lab.requires[base]
    return found


def beyond_doubt(lab: Lab, wrong: str) -> set[str]:
    """The steps that do not pass when step `wrong` is wrong, chosen so that each one's outcome
    is known: `wrong` fails, every step with a cell that builds on it stays the skeleton (not
    started). A step with no cell (the final check) that builds on `wrong` would run the wrong
    code, and whether its scenario meets the mistake is not known from the file; so one more
    step it builds on is left as the skeleton too, and it is "not started" for sure (as the
    judge reports a step whose code raises NotImplementedError)."""
    off = {wrong} | dependents(lab, wrong)
    for step in sorted(cellless(lab) & off):
        skeletons = off - {wrong} - cellless(lab)
        if bases(lab, step) & skeletons:
            continue
        spare = sorted(s for s in bases(lab, step) - bases(lab, wrong) if s in lab.parts and s not in off)
        if not spare:
            raise ValueError(f"{lab.name}: step {step} builds on step {wrong} alone: its outcome is unknown")
        off |= {spare[-1]} | dependents(lab, spare[-1])
    return off


def _knowable(lab: Lab, step: str) -> bool:
    try:
        beyond_doubt(lab, step)
    except ValueError:
        return False
    return True


def closed(lab: Lab, chosen: set[str]) -> set[str]:
    """`chosen` without every step whose requirements are not all in it (repeated until stable)."""
    chosen = set(chosen)
    while True:
        drop = {s for s in chosen if not lab.requires[s] <= chosen}
        if not drop:
            return chosen
        chosen -= drop


def notebook(lab: Lab, parts: dict[str, str], solved: set[str]) -> nbformat.NotebookNode:
    """The release with the `solved` steps' cells taken from `parts` (the header always)."""
    nb = copy.deepcopy(lab.release)
    for cell in nb.cells:
        part = corpus._part(cell)
        if part is not None and part in parts and (part in solved or part == "header"):
            cell.source = f"%%step {part}\n{parts[part]}"
    return nb


def _quiz(lab: str, rng: random.Random) -> tuple[dict, dict | None]:
    """Answers to a random subset of the quiz, as `labkit.notebook.quiz.record` writes them."""
    questions = corpus.quiz_key(lab)
    if not questions or rng.random() < 0.3:
        return {}, None
    known, saved = {}, {}
    for q in questions:
        if rng.random() < 0.2:
            continue
        first = rng.randrange(len(q["options"]))
        right = next(i for i, o in enumerate(q["options"]) if o["correct"])
        last = first if q["options"][first]["correct"] or rng.random() < 0.4 else right
        attempts = 1 if last == first else rng.randint(2, 3)
        known[q["id"]] = (first, last, attempts)
        saved[q["id"]] = {"first_choice": first, "first_correct": q["options"][first]["correct"],
                          "attempts": attempts, "choice": last, "option": q["options"][last]["text"],
                          "correct": q["options"][last]["correct"], "answered_at": "2026-01-05T10:00:00"}
    data = {"lab": lab, "questions": len(questions), "answered": len(saved),
            "correct_first_time": sum(1 for a in saved.values() if a["first_correct"]), "answers": saved}
    return known, data


def _reveal_output(lab: str, step: str) -> nbformat.NotebookNode:
    """The code cell `lab.reveal(step)` leaves behind: its output tagged as a reveal."""
    cell = nbformat.v4.new_code_cell(f"lab.reveal({step})")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": f"Step {step}'s reference"},
                                           metadata={"labkit": {"revealed": step, "lab": lab}})]
    return cell


def build(n: int, seed: int = 1, root: Path = ROOT, first_student: int = 0) -> list[corpus.Entry]:
    """`n` notebooks, one per lab in turn for each student (s000, s001, ... from `first_student`)."""
    rng = random.Random(seed)
    course = labs(root)
    if not course:
        raise RuntimeError("no lab has a release, a labelled reference and wrong solutions")
    turn = {lab.name: 0 for lab in course}
    entries = []
    for i in range(n):
        lab = course[i % len(course)]
        student = f"s{first_student + i // len(course):03d}"
        kind = rng.choices(KINDS, WEIGHTS)[0] if lab.wrong else rng.choices(KINDS[:3], WEIGHTS[:3])[0]
        all_steps = set(lab.steps)
        wrong_file = clause = ""
        if kind == "reference":
            nb, passes, fails = notebook(lab, lab.parts, all_steps), all_steps, set()
        elif kind == "skeleton":
            nb, passes, fails = copy.deepcopy(lab.release), set(), set()
        elif kind == "partial":
            passes = set()
            while not passes or passes == all_steps:
                chosen = {s for s in lab.steps if s in lab.parts and rng.random() < 0.6}
                passes = closed(lab, chosen | cellless(lab))  # a step with no cell passes when its bases do
            nb, fails = notebook(lab, lab.parts, passes), set()
        else:
            off = None
            while off is None:  # the catalogue in turn, leaving out files whose outcome is not known
                wrong_file, step, clause, code = lab.wrong[turn[lab.name] % len(lab.wrong)]
                turn[lab.name] += 1
                try:
                    off = beyond_doubt(lab, step)
                except ValueError:
                    continue
            passes = all_steps - off
            nb, fails = notebook(lab, {**lab.parts, step: code}, passes | {step}), {step}
        files = {}
        quiz, answers = _quiz(lab.name, rng)
        if answers is not None:
            files[f"work/quiz-{lab.name}.json"] = json.dumps(answers, indent=1).encode()
        revealed = set()
        if rng.random() < 0.15:
            revealed = {rng.choice(lab.steps)}
            if rng.random() < 0.5:
                steps = {s: {"at": "2026-01-05T09:00:00", "passed_before": False} for s in revealed}
                files[f"work/revealed-{lab.name}.json"] = json.dumps({"lab": lab.name, "steps": steps}).encode()
            else:
                nb.cells.append(_reveal_output(lab.name, next(iter(revealed))))
        unsure = (cellless(lab) - passes) if kind == "wrong" else set()
        known = Known(lab.name, kind, frozenset(passes), frozenset(fails),
                      frozenset(all_steps - passes - fails - unsure), wrong_file, clause, quiz, frozenset(revealed),
                      frozenset(unsure))
        entries.append(corpus.Entry(student, lab.filename, nb, frozenset(passes), lab=lab.name, files=files,
                                    why=f"{kind}" + (f" ({wrong_file})" if wrong_file else ""), known=known))
    return entries


# --- what the class report must say, counted from the mix alone --------------------------------


def expected(entries: list[corpus.Entry]) -> dict[str, dict]:
    """Per lab: students, the score distribution, per step (passed, failed, not started, revealed),
    students per (step, clause) named by wrong files, and per quiz question (answered, right at
    the first try, right now) — from `Known` and the answer key only."""
    from labkit import labs as known_labs

    found: dict[str, dict] = {}
    for entry in entries:
        known = entry.known
        lab = found.setdefault(known.lab, {"students": 0, "scores": {}, "steps": {}, "clauses": {}, "quiz": {}})
        spec = known_labs.load(known.lab)
        points = {str(s.step): s.points for s in spec.steps}
        lab["students"] += 1
        total = sum(points[s] for s in known.passes)
        lab["scores"][total] = lab["scores"].get(total, 0) + 1
        for step in points:
            counts = lab["steps"].setdefault(step, [0, 0, 0, 0, 0])
            counts[0] += step in known.passes
            counts[1] += step in known.fails
            counts[2] += step in known.not_started
            counts[3] += step in known.revealed
            counts[4] += step in known.unsure
        if known.clause:
            key = (next(iter(known.fails)), known.clause)
            lab["clauses"][key] = lab["clauses"].get(key, 0) + 1
        key_of = {q["id"]: q for q in corpus.quiz_key(known.lab)}
        for qid, (first, last, _attempts) in known.quiz.items():
            options = key_of[qid]["options"]
            counts = lab["quiz"].setdefault(qid, [0, 0, 0])
            counts[0] += 1
            counts[1] += bool(options[first]["correct"])
            counts[2] += bool(options[last]["correct"])
    for lab in found.values():
        lab["steps"] = {step: tuple(c) for step, c in lab["steps"].items()}
        lab["quiz"] = {qid: tuple(c) for qid, c in lab["quiz"].items()}
    return found


def report_problems(report, entries: list[corpus.Entry]) -> list[str]:
    """Where the class report (`labkit.grading.report.build`) disagrees with the mix's own counts."""
    want = expected(entries)
    got = {lab.lab: lab for lab in report.labs}
    problems = []
    if sorted(got) != sorted(want):
        problems.append(f"labs: report has {sorted(got)}, the mix has {sorted(want)}")
    for name, lab_want in want.items():
        lab = got.get(name)
        if lab is None:
            continue
        if lab.students != lab_want["students"]:
            problems.append(f"{name}: {lab.students} students, the mix has {lab_want['students']}")
        scores = {total: n for total, n in lab.scores.items() if n}
        if scores != lab_want["scores"]:
            problems.append(f"{name}: scores {scores}, the mix gives {lab_want['scores']}")
        steps = {s.step: (s.passed, s.failed, s.not_started, s.revealed) for s in lab.steps}
        for step, (passed, failed, not_started, revealed, unsure) in lab_want["steps"].items():
            seen = steps.get(step)
            # `unsure` notebooks fail or are not started: each of those counts may be that much higher.
            if seen is None or seen[0] != passed or seen[3] != revealed or seen[1] + seen[2] != failed + not_started + unsure \
                    or seen[1] < failed or seen[2] < not_started:
                problems.append(f"{name} step {step}: (passed, failed, not started, revealed) = {seen}, the mix "
                                f"gives {(passed, failed, not_started, revealed)} with {unsure} failed or not started")
        hits = {(s.step, c.key): c.students for s in lab.steps for c in s.clauses}
        for (step, clause), n in lab_want["clauses"].items():
            # At least every student whose wrong file names the clause (a wrong file may break
            # another file's clause too, so more is possible; fewer is a miss).
            if hits.get((step, clause), 0) < n:
                problems.append(f"{name} step {step}: clause {clause} hit by {hits.get((step, clause))} "
                                f"student(s), the mix has {n} wrong file(s) naming it")
        for step in lab.steps:
            if any(c.students > step.failed for c in step.clauses):
                problems.append(f"{name} step {step.step}: a rule is counted for more students than failed")
        quiz = {q.id: (q.answered, q.first_try, q.correct_now) for q in lab.questions if q.answered}
        if quiz != lab_want["quiz"]:
            problems.append(f"{name} quiz: {quiz}, the mix gives {lab_want['quiz']}")
    return problems
