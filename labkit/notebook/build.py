"""Lesson source → student notebook + reference module (one source of truth per lab).

`python -m labkit.notebook.build` writes them; `python -m labkit.notebook.build --check` exits 1 if the
committed files differ from what the sources produce.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit import labs
from labkit.notebook import rules
from labkit.notebook.module_export import HEADER, MAGIC, assemble

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "notebooks" / "source"
FENCE = re.compile(r"^```cell:(\w+)(?:[ \t]+(\S+))?[ \t]*$")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# The course's own cells reach the lab through `Lab.of`, which says "run the setup cell first"
# in a kernel where it has not run, instead of a NameError for `lab`. Whatever a lesson writes
# in a check or quiz fence (`lab.check(3)` reads best there), the notebook gets these.
CHECK_SOURCE = 'from labkit.notebook import Lab\n\nLab.of("{lab}").check({step})'
QUIZ_SOURCE = 'from labkit.notebook import Lab\n\nLab.of("{lab}").quiz()'


@dataclass
class Block:
    kind: str  # markdown, setup, step, check, quiz, code
    arg: str = ""
    text: str = ""


@dataclass
class Lesson:
    lab: str
    blocks: list[Block] = field(default_factory=list)


def parse(path: Path) -> Lesson:
    lab = re.sub(r"^\d+-", "", path.stem)
    lesson = Lesson(lab)
    prose: list[str] = []
    code: list[str] | None = None
    current: Block | None = None

    def flush_prose():
        text = "\n".join(prose).strip("\n")
        if text.strip():
            lesson.blocks.append(Block("markdown", text=text))
        prose.clear()

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if code is not None:
            if line.strip() == "```":
                current.text = "\n".join(code)
                lesson.blocks.append(current)
                code, current = None, None
            else:
                code.append(line)
            continue
        match = FENCE.match(line)
        if match:
            flush_prose()
            kind, arg = match.group(1), match.group(2) or ""
            if kind not in ("setup", "step", "check", "quiz", "code"):
                raise SystemExit(f"{path}:{number}: unknown cell kind {kind!r}")
            current, code = Block(kind, arg), []
        elif line.strip() == "+++":
            flush_prose()
        else:
            prose.append(line)
    if code is not None:
        raise SystemExit(f"{path}: a cell fence is not closed")
    flush_prose()
    return lesson


def solution(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.strip() not in (BEGIN, END))


def skeleton(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == BEGIN:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            # At module level a raise would break the import: leave room for helpers instead.
            out.append(f"{indent}raise NotImplementedError  # your code here" if indent else "")
        elif line.strip() == END:
            inside = False
        elif not inside:
            out.append(line)
    return re.sub(r"\n{3,}", "\n\n\n", "\n".join(out)).strip("\n")


def _locked(extra: dict | None = None) -> dict:
    meta = {"editable": False, "deletable": False}
    meta.update(extra or {})
    return meta


def _nbgrader(grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    data = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        data["points"] = points
    return data


def student_notebook(lesson: Lesson) -> nbformat.NotebookNode:
    from labkit.labs import load

    spec = load(lesson.lab)
    points = {str(s.step): s.points for s in spec.steps}
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"},
                   "labkit": {"lab": lesson.lab, "module": labs.manifest(lesson.lab).module_file, "format": 1}}
    for index, block in enumerate(lesson.blocks):
        gid = f"{lesson.lab}-{block.kind}-{block.arg or index}"
        if (block.kind == "step" or block.kind == "check" and block.arg == "final") and \
                (text := rules.markdown(spec.contract, block.arg)):
            cell = nbformat.v4.new_markdown_cell(text)
            cell.metadata = {"nbgrader": _nbgrader(rules.cell_id(lesson.lab, block.arg), locked=True), **_locked()}
            cell.id = rules.cell_id(lesson.lab, block.arg)
            nb.cells.append(cell)
        if block.kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(block.text)
            cell.metadata = {"nbgrader": _nbgrader(f"{lesson.lab}-md-{index}", locked=True), **_locked()}
        elif block.kind == "step":
            cell = nbformat.v4.new_code_cell(f"{MAGIC} {block.arg}\n{skeleton(block.text)}")
            cell.metadata = {"nbgrader": _nbgrader(f"{lesson.lab}-code-{block.arg}", solution=True),
                             "labkit": {"part": block.arg}}
        elif block.kind == "check":
            step = block.arg if block.arg.isdigit() else f'"{block.arg}"'
            cell = nbformat.v4.new_code_cell(CHECK_SOURCE.format(lab=lesson.lab, step=step))
            cell.metadata = _locked({
                "jupyter": {"source_hidden": True},
                "nbgrader": _nbgrader(f"{lesson.lab}-check-{block.arg}", grade=True, locked=True,
                                      points=points[block.arg]),
                "labkit": {"check": block.arg},
            })
        elif block.kind in ("setup", "quiz"):
            cell = nbformat.v4.new_code_cell(QUIZ_SOURCE.format(lab=lesson.lab) if block.kind == "quiz" else block.text)
            cell.metadata = _locked({"nbgrader": _nbgrader(gid, locked=True), "labkit": {block.kind: True}})
        else:
            cell = nbformat.v4.new_code_cell(block.text)
        cell.id = re.sub(r"[^A-Za-z0-9-]", "-", gid)[:64]
        nb.cells.append(cell)
    return nb


def reference_module(lesson: Lesson) -> str:
    parts = {b.arg: solution(b.text) for b in lesson.blocks if b.kind == "step"}
    if HEADER not in parts:
        raise SystemExit(f"lesson {lesson.lab} has no `cell:step header`")
    return assemble(parts)


def outputs() -> dict[Path, str]:
    """Every generated file and its content."""
    files = {}
    for source in sorted(SOURCES.glob("*.md")):
        lesson = parse(source)
        files[ROOT / "notebooks" / f"{source.stem}.ipynb"] = nbformat.writes(student_notebook(lesson)) + "\n"
        files[ROOT / "solutions" / labs.manifest(lesson.lab).module_file] = reference_module(lesson)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.notebook.build", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if generated files are out of date")
    args = ap.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("out of date (run `python -m labkit.notebook.build`): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
