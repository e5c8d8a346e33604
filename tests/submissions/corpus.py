"""A corpus of submissions, built from a released notebook and its reference module.

Nothing executed is committed: `build(release, reference)` makes each submission as a
student (or an attacker) would leave it, and says which grade it deserves. The reference
module is the one `labkit.notebook.build` writes (`solutions/<module>.py`), whose parts are labelled
`# --- provided code ---` and `# --- step N ---`.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

LABEL = re.compile(r"^# --- (provided code|step (\S+)) -*$", re.M)
ALL, NONE = "all", "none"
ESCAPE_FILE = "labkit-corpus-escape.txt"  # a hostile cell writes this into $TMPDIR and $HOME
PWNED_FILE = "labkit-corpus-pwned.txt"  # ... and this into the labkit package, and a forged result
FORGED_RESULT = "eve--forged.json"  # into the grader's --out/.results (found from its cwd)


@dataclass
class Entry:
    student: str
    filename: str
    nb: NotebookNode | None  # None: `data` holds the raw bytes
    deserves: str | frozenset[str]  # ALL / NONE / the steps that earn the reference's points
    status: str = "ok"
    flags: tuple[str, ...] = ()
    quiz: dict | None = None
    why: str = ""
    data: bytes = b""
    files: dict[str, bytes] = field(default_factory=dict)  # beside the notebook, e.g. work/quiz-*.json
    lab: str = "outbox"
    earns: str | None = None  # deserves what this module earns from `labkit check` (same seed)
    known_gap: str = ""  # graded wrong today, for the reason given: its own (strict xfail) test
    kind: str = "notebook"  # notebook | symlink (to link_to's notebook) | dirlink | fifo | huge
    link_to: str = ""
    known: object = None  # a synthetic class's `classmix.Known`: what the notebook must get

    def bytes(self) -> bytes:
        return self.data if self.nb is None else nbformat.writes(self.nb).encode()


def reference_parts(reference: str) -> dict[str, str]:
    """`solutions/worker.py` → {"header": ..., "1": ..., ...}."""
    matches = list(LABEL.finditer(reference))
    if not matches:
        raise ValueError("the reference module has no `# --- step N ---` labels")
    parts = {}
    for match, nxt in zip(matches, matches[1:] + [None], strict=True):
        part = "header" if match.group(1) == "provided code" else match.group(2)
        parts[part] = reference[match.end():nxt.start() if nxt else None].strip("\n") + "\n"
    return parts


def _part(cell: NotebookNode) -> str | None:
    first = cell.source.split("\n", 1)[0].split()
    return first[1] if cell.cell_type == "code" and len(first) == 2 and first[0] == "%%step" else None


def _gid(cell: NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def solved(release: NotebookNode, parts: dict[str, str], steps: set[str] | str) -> NotebookNode:
    """The release with the given steps' cells replaced by the reference code."""
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        part = _part(cell)
        if part is not None and part in parts and (steps == ALL or part in steps or part == "header"):
            cell.source = f"%%step {part}\n{parts[part]}"
    return nb


def _after(nb: NotebookNode, gid: str, *cells: NotebookNode) -> None:
    index = next(i for i, c in enumerate(nb.cells) if _gid(c) == gid)
    nb.cells[index + 1:index + 1] = list(cells)


def _append_to_step(nb: NotebookNode, part: str, code: str) -> None:
    cell = next(c for c in nb.cells if _part(c) == part)
    cell.source = cell.source.rstrip("\n") + "\n\n" + code


def _code(source: str) -> NotebookNode:
    return nbformat.v4.new_code_cell(source)


def build(release: NotebookNode, reference: str) -> list[Entry]:
    parts = reference_parts(reference)
    lab = release.metadata["labkit"]["lab"]
    steps = [p for p in parts if p != "header"]
    checks = [c for c in release.cells if c.metadata.get("labkit", {}).get("check") is not None]
    setup = next(_gid(c) for c in release.cells if c.metadata.get("labkit", {}).get("setup"))
    first, second = steps[0], steps[1]
    gid_check = {str(c.metadata["labkit"]["check"]): _gid(c) for c in checks}
    entries: list[Entry] = []

    entries.append(Entry("ada", "01-lab.ipynb", solved(release, parts, ALL), ALL,
                         why="the reference solution"))

    untouched = copy.deepcopy(release)
    untouched.metadata.pop("labkit")  # recognised by its cells, not by its name
    entries.append(Entry("ben", "Copy of notebook.ipynb", untouched, NONE, why="the release, untouched"))

    some = set(steps[:len(steps) // 2]) - {"final"}  # later steps build on earlier ones
    partial = solved(release, parts, some)
    dup = copy.deepcopy(next(c for c in release.cells if _gid(c) == gid_check[second]))
    dup.source = 'print("PASS")'
    dup.id = "copied-check"
    _after(partial, gid_check[steps[2]], dup)
    first_question = quiz_key(lab)[0]
    right = next(i for i, o in enumerate(first_question["options"]) if o["correct"])
    answered = {"lab": lab, "questions": 5, "answered": 1, "correct_first_time": 1,
                "answers": {first_question["id"]: {"choice": right, "option": "B", "correct": True,
                                                   "first_choice": right, "first_correct": True, "attempts": 1}}}
    entries.append(Entry("cleo", "Untitled3.ipynb", partial, frozenset(some),
                         flags=(f"duplicated:{gid_check[second]}",), quiz=expected_quiz(lab, {first_question["id"]: right}),
                         files={f"work/quiz-{lab}.json": json.dumps(answered).encode()},
                         why="the first half of the steps solved, a check cell copied and edited, "
                             "the quiz answered in the student's JupyterLab"))

    edited = solved(release, parts, {first})
    cell = next(c for c in edited.cells if _gid(c) == gid_check[second])
    cell.source = 'print("PASS")\nprint("✓ all cases passed")'
    entries.append(Entry("dan", "01-lab.ipynb", edited, frozenset({first}),
                         flags=(f"edited:{gid_check[second]}",), why="a check cell edited to print PASS"))

    patched = copy.deepcopy(release)
    _after(patched, setup, _code(
        "import labkit.judge.run, labkit.notebook, labkit.judge.verdict\n"
        "def fake(*args, **kwargs):\n"
        "    raise SystemExit('everything passed')\n"
        "labkit.judge.run.run_lab = fake\n"
        "labkit.notebook.Lab.check = lambda self, step: print(f'step {step}: passed')\n"
        "labkit.judge.verdict.StepVerdict.passed = property(lambda self: True)\n"
        "import pathlib\n"
        f"for target in (pathlib.Path(labkit.__file__).parent / {PWNED_FILE!r},\n"
        f"               pathlib.Path.cwd().parents[2] / '.results' / {FORGED_RESULT!r}):\n"
        "    try:\n"
        "        target.write_text('{\"row\": {\"total\": 99}}')\n"
        "    except OSError as exc:\n"
        "        print('refused:', exc)"))
    entries.append(Entry("eve", "01-lab.ipynb", patched, NONE, why="labkit monkeypatched in the kernel"))

    forged = copy.deepcopy(release)
    fake = {"lab": lab, "passed": True, "score": 99, "max_score": 99, "seed": 1,
            "steps": [{"step": s, "passed": True, "points": 9} for s in steps]}
    _after(forged, setup, _code(f"print({json.dumps(json.dumps(fake))})\nprint('all passed: 99/99 points')"))
    entries.append(Entry("fay", "01-lab.ipynb", forged, NONE, why="a forged verdict printed to stdout"))

    exits = solved(release, parts, ALL)
    _append_to_step(exits, steps[-2] if steps[-1] == "final" else steps[-1],
                    'if __name__ == "__main__":  # only in the kernel, not when imported\n'
                    "    import os\n    os._exit(1)")
    entries.append(Entry("gus", "01-lab.ipynb", exits, ALL, status="crashed",
                         why="os._exit in a step cell kills the kernel, not the code"))

    loops = solved(release, parts, ALL)
    _append_to_step(loops, first,
                    'if __name__ == "__main__":  # only in the kernel\n'
                    "    import signal\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "    while True:\n        pass")
    entries.append(Entry("hal", "01-lab.ipynb", loops, ALL, status="timeout",
                         why="an infinite loop that ignores the interrupt"))

    hog = solved(release, parts, ALL)
    # Big chunks: the limit is hit at once, not after seconds of zero-filling pages under load.
    _after(hog, setup, _code("hog = []\nwhile True:\n    hog.append(bytearray(2**30))"))
    entries.append(Entry("ivy", "01-lab.ipynb", hog, ALL, why="a memory hog (MemoryError under the limit)"))

    linger = solved(release, parts, ALL)
    _after(linger, setup, _code(
        "import os, pathlib, tempfile, time\n"
        f"pathlib.Path(tempfile.gettempdir(), {ESCAPE_FILE!r}).write_text('escaped')\n"
        f"pathlib.Path.home().joinpath({ESCAPE_FILE!r}).write_text('escaped')\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(600)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)"))
    entries.append(Entry("jay", "01-lab.ipynb", linger, ALL, why="a setsid'd grandchild that lingers"))

    loud = solved(release, parts, ALL)
    _after(loud, setup, _code("print('x' * 50_000_000)"))
    entries.append(Entry("kim", "01-lab.ipynb", loud, ALL, why="50 MB of output"))

    entries.append(Entry("lou", "01-lab.ipynb", None, NONE, status="malformed",
                         why="a file that is not JSON", data=b"{this is not a notebook\n"))

    gone = solved(release, parts, ALL)
    gone.cells = [c for c in gone.cells if c.metadata.get("labkit", {}).get("check") is None]
    entries.append(Entry("max", "01-lab.ipynb", gone, ALL,
                         flags=tuple(f"deleted:{gid_check[s]}" for s in gid_check),
                         why="every check cell deleted"))
    return entries


def quiz_key(lab: str) -> list[dict]:
    """The lab's questions with their answer key (`checks/<lab>/quiz.py`)."""
    from labkit.notebook import quiz

    return quiz.load(lab)


def expected_quiz(lab: str, chosen: dict[str, int]) -> dict:
    """What the gradebook must record for these choices: each `correct` straight from the key."""
    questions = {q["id"]: q for q in quiz_key(lab)}
    answers = {}
    for qid, i in chosen.items():
        option = questions[qid]["options"][i]
        answers[qid] = {"choice": i, "option": option["text"], "correct": option["correct"],
                        "first_choice": i, "first_correct": option["correct"], "attempts": 1}
    return {"lab": lab, "questions": len(questions), "answered": len(answers),
            "correct_first_time": sum(1 for a in answers.values() if a["first_correct"]), "answers": answers}


def write(entries: list[Entry], dest: Path, outside: Path | None = None) -> Path:
    """Write the entries as submitted folders; `outside` is a folder beyond `dest` (for links)."""
    import os

    by_student = {e.student: e for e in entries}
    for entry in entries:
        path = dest / entry.student / entry.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.kind == "symlink":
            victim = by_student[entry.link_to]
            path.symlink_to(dest / victim.student / victim.filename)
            continue
        if entry.kind == "dirlink":
            assert outside is not None
            (outside / "foreign").mkdir(parents=True, exist_ok=True)
            (outside / "foreign" / "01-lab.ipynb").write_bytes(by_student["ada"].bytes())
            path.symlink_to(outside / "foreign", target_is_directory=True)
            continue
        if entry.kind == "fifo":
            os.mkfifo(path)
            continue
        if entry.kind == "huge":
            path.write_bytes(b" " * (25 * 1024 * 1024))
            continue
        path.write_bytes(entry.bytes())
        for name, data in entry.files.items():
            (path.parent / name).parent.mkdir(parents=True, exist_ok=True)
            (path.parent / name).write_bytes(data)
    return dest


def deserved(entry: Entry, reference_points: dict[str, int]) -> dict[str, int]:
    """Points per step this entry deserves, given what the reference earns with the same seed."""
    if entry.deserves == ALL:
        return dict(reference_points)
    keep = set() if entry.deserves == NONE else set(entry.deserves)
    return {step: points if step in keep else 0 for step, points in reference_points.items()}


def default_sources(root: Path, lab: str = "outbox") -> tuple[NotebookNode, str] | None:
    """The real release of `lab` and its reference module, if they exist."""
    from labkit.labs import manifest

    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if nb.metadata.get("labkit", {}).get("lab") == lab:
            reference = root / "solutions" / manifest(lab).module_file
            if reference.exists() and LABEL.search(reference.read_text()):
                return nb, reference.read_text()
    return None


@dataclass
class Corpus:
    entries: list[Entry] = field(default_factory=list)

    def by_student(self) -> dict[str, Entry]:
        return {e.student: e for e in self.entries}
