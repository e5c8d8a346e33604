"""Step cells → one importable module file, read the same way by the kernel and the grader.

In the kernel, `%%step N` saves the cell as part N and rewrites the module from all parts,
so re-running a cell replaces its earlier version instead of appending. When grading, the
same assembly runs on the step cells of a notebook file, without any kernel.

One reader decides what a step cell is, for both: `read_step_cell`. It sees a cell's first
line the way IPython does (leading blank lines dropped, common indentation removed), accepts
`%%step 3`, `%%step  3`, `%%step\\t3` and `%%step 3  # a comment`, and refuses `%%step 3 extra`,
`%%step` alone and parts the lab does not have. A part is saved only when it compiles: a step
cell with a syntax error is neither saved by the kernel nor graded, and the version before it
stays in both.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

MAGIC = "%%step"
HEADER = "header"
# `%%step` followed by whitespace (or nothing): IPython itself splits a cell magic's name at the
# first space only, so the kernel rewrites a tab there (`step_line_transform`) to match this.
STEP_LINE = re.compile(r"%%step(?:[ \t]+(?P<arg>.*))?\Z")


@dataclass(frozen=True)
class StepCell:
    """What a code cell is: step `part` with `body` below its magic line, or not a step cell."""

    part: str | None  # "header", "3", … or None
    body: str  # the code IPython hands the magic (the whole source when not a step cell)
    problem: str = ""  # why a `%%step` line was refused (then `part` is None)

    @property
    def is_step(self) -> bool:
        return self.part is not None


def _ipython_lines(source: str) -> list[str]:
    """The cell's lines after IPython's clean-up: leading blank lines go, common indentation goes."""
    lines = source.splitlines(keepends=True)
    while lines and not lines[0].strip():
        lines.pop(0)
    return dedent("".join(lines)).splitlines(keepends=True)


def parse_step_arg(arg: str, parts: Collection[str] | None = None) -> tuple[str | None, str]:
    """The text after `%%step` → (part, "") or (None, why it is refused)."""
    words = arg.split("#", 1)[0].split()
    if not words:
        return None, "Which step is this cell? Write its number after the magic, e.g. `%%step 3`."
    if len(words) > 1:
        return None, (f"`%%step {arg.strip()}`: one step per cell, written as `%%step {words[0]}` "
                      "(a comment after `#` is fine).")
    word = words[0]
    part = word if word == HEADER else str(int(word)) if word.isdigit() and word.isascii() else None
    known = sorted(parts or (), key=part_key)
    if part is None or (parts is not None and part not in parts):
        listing = ", ".join(f"`%%step {p}`" for p in known) if known else "`%%step header` or a step number"
        return None, f"`%%step {word}` is not a step of this lab. Its step cells are {listing}."
    return part, ""


def read_step_cell(source: str, parts: Collection[str] | None = None) -> StepCell:
    """How the kernel sees a code cell: a step cell (its part and body), a refused one, or neither."""
    lines = _ipython_lines(source)
    first = lines[0].rstrip("\r\n").rstrip() if lines else ""
    match = STEP_LINE.fullmatch(first)
    if match is None:  # not a `%%step` cell magic (ordinary code, another magic, `%%stepx`)
        return StepCell(None, source)
    part, problem = parse_step_arg(match.group("arg") or "", parts)
    return StepCell(part, "".join(lines[1:]), problem)


def step_line_transform(lines: list[str]) -> list[str]:
    """An IPython clean-up transform: `%%step<tab>3` becomes `%%step 3`, so the magic is found."""
    if lines and STEP_LINE.fullmatch(lines[0].rstrip()) and lines[0][len(MAGIC):len(MAGIC) + 1] == "\t":
        rest = lines[0][len(MAGIC):].lstrip(" \t")
        return [f"{MAGIC} {rest}", *lines[1:]]
    return lines


def split_magic(source: str) -> tuple[str | None, str]:
    """`%%step 3\\ncode` → ("3", "code"); any other cell, or a refused `%%step` line → (None, source)."""
    cell = read_step_cell(source)
    return (cell.part, cell.body) if cell.is_step else (None, source)


def compile_step(body: str, filename: str = "<step>"):
    """Compile a step's body with the cell's own line numbers (line 1 is the `%%step` line)."""
    return compile("\n" + body, filename, "exec")


def compiles(body: str) -> bool:
    try:
        compile_step(body)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return False
    return True


def part_key(part: str) -> tuple[int, str]:
    """The header first, then steps by number."""
    return (-1, "") if part == HEADER else (int(part) if part.isdigit() else 10_000, part)


def lab_parts(lab: str) -> set[str]:
    """The parts a lab's step cells may name: `header` and its numbered steps (from the lab's
    manifest: the kernel never imports a lab's checks, and a grading kernel cannot)."""
    from labkit.labs import manifest

    return {HEADER} | {str(s.step) for s in manifest(lab).steps if str(s.step).isdigit()}


# --- the module ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """Where one part sits in the assembled module: module lines first..last ↔ its cell's lines."""

    part: str
    first: int  # first module line of the part's code
    last: int
    cell_line: int  # the cell line that module line `first` comes from (the `%%step` line is 1)


def layout(parts: dict[str, str]) -> tuple[str, list[Span]]:
    """The module text and, for each part, which of its lines came from which cell line."""
    chunks, spans, line = [], [], 1
    for part in sorted(parts, key=part_key):
        label = "provided code" if part == HEADER else f"step {part}"
        body = parts[part]
        code = body.strip("\n")
        skipped = len(body) - len(body.lstrip("\n"))
        lines = code.count("\n") + 1
        spans.append(Span(part, line + 1, line + lines, 2 + skipped))
        chunks.append(f"# --- {label} " + "-" * (60 - len(label)) + "\n" + code + "\n")
        line += 1 + lines + 2  # the label, the code, then the blank line between chunks
    return "\n\n".join(chunks), spans


def assemble(parts: dict[str, str]) -> str:
    return layout(parts)[0]


def where(parts: dict[str, str], lineno: int) -> tuple[str, int] | None:
    """A line of the assembled module → (part, line in that part's cell), or None."""
    for span in layout(parts)[1]:
        if span.first <= lineno <= span.last:
            return span.part, span.cell_line + lineno - span.first
    return None


def cell_name(part: str) -> str:
    return "the provided-code cell (`%%step header`)" if part == HEADER else f"your `%%step {part}` cell"


def in_cell_terms(trace: str, module_file: str, parts: dict[str, str]) -> str:
    """Point each traceback line in the assembled module at the student's own cell and line."""
    pattern = re.compile(r'File "([^"]*?)' + re.escape(module_file) + r'", line (\d+)')

    def point(match: re.Match) -> str:
        found = where(parts, int(match.group(2)))
        if found is None:
            return match.group(0)
        part, line = found
        return f"{cell_name(part)}, line {line}"

    # `expect.import_problem`'s "line N of worker.py" (an import that never finished) too
    of_module = re.compile(r"\bline (\d+) of " + re.escape(module_file) + r"\b")

    def point_of(match: re.Match) -> str:
        found = where(parts, int(match.group(1)))
        return match.group(0) if found is None else f"{cell_name(found[0])}, line {found[1]}"

    return of_module.sub(point_of, pattern.sub(point, trace))


# --- the work folder ----------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def parts_dir(workdir: Path, lab: str) -> Path:
    return workdir / lab / "parts"


def saved_parts(workdir: Path, lab: str) -> dict[str, str]:
    folder = parts_dir(workdir, lab)
    return {p.stem: p.read_text(encoding="utf-8") for p in folder.glob("*.py")} if folder.is_dir() else {}


def save_part(workdir: Path, lab: str, module_file: str, part: str, code: str) -> Path:
    """Save one step's code and rebuild the module from every saved part."""
    write_atomic(parts_dir(workdir, lab) / f"{part}.py", code)
    return rebuild(workdir, lab, module_file)


def rebuild(workdir: Path, lab: str, module_file: str) -> Path:
    target = workdir / module_file
    write_atomic(target, assemble(saved_parts(workdir, lab)))
    return target


def parts_from_notebook(nb, parts: Collection[str] | None = None) -> dict[str, str]:
    """The step cells of a notebook (an nbformat node), by part, as a kernel running it top to
    bottom would have saved them: later cells win, and a cell that does not compile (or names no
    part of the lab) is skipped, so the version before it stays."""
    if parts is None:
        lab = nb.get("metadata", {}).get("labkit", {}).get("lab")
        try:
            parts = lab_parts(lab) if lab else None
        except KeyError:
            parts = None
    found = {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        step = read_step_cell("".join(source) if isinstance(source, list) else source, parts)
        if step.is_step and compiles(step.body):
            found[step.part] = step.body
    return found
