"""`python -m labkit release OUT`: the course as students get it, without any reference code.

OUT holds the course's tracked files minus the lesson sources, the reference solutions and
everything built from them (the tests' wrong solutions, benchmarks, CI), with the student
notebooks freshly built from the sources. Before it reports success, every text file in OUT is
compared with every `### BEGIN SOLUTION` … `### END SOLUTION` block of the lessons: a release
that would leak one is refused.

Given `OUT.zip`, the same folder is written as one zip file whose top folder is named after it
(`delivered-twice-student.zip` → `delivered-twice-student/`): the student edition a course
hands out. It is checked twice, as a folder before zipping and as the zip's own entries after.
Students install it in place (`pip install -e .` in the unzipped folder, as a clone is), so the
course's notebooks and the workspace live beside each other exactly as in a clone.

What the student edition holds, honestly: the judge runs on the student's laptop, so its code
ships (`checks/`, with the quiz's answer key and each lab's `oracle.py`, the judge's own independent
re-implementations of a few pure functions it compares the student's with). `lab.reveal(N)`
shows nothing there: a reference shipped in any form (obfuscated, encrypted with a key in the
same folder) could be read without the reveal being recorded, so none ships.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from labkit.notebook import build

LEFT_OUT = ("solutions/", "notebooks/source/", "tests/", "benchmarks/", ".ci/")
DISTINCTIVE = 24  # shorter lines ("return True", "raise") are everyone's, not the reference's


@dataclass(frozen=True)
class Leak:
    path: str
    lab: str
    step: str
    lines: int


def tracked_files(root: Path) -> list[str]:
    """The files git tracks in the course checkout (never a student's workspace, venv or caches)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise FileNotFoundError(f"{root} is not a git clone of the course (git ls-files failed: {exc})") from None
    return [p for p in out.stdout.decode().split("\0") if p]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def solution_blocks(sources: Path = build.SOURCES) -> list[tuple[str, str, list[str]]]:
    """(lab, step, distinctive lines) of each step's BEGIN/END SOLUTION blocks in the lesson sources.
    A line counts only if it is long enough and appears nowhere in the lessons outside a block."""
    steps: dict[tuple[str, str], list[str]] = {}
    public: set[str] = set()
    for source in sorted(sources.glob("*.md")):
        lesson = build.parse(source)
        public |= set(_lines("\n".join(b.text for b in lesson.blocks if b.kind != "step")))
        for block in lesson.blocks:
            if block.kind == "step":
                public |= set(_lines(build.skeleton(block.text)))
                body = re.findall(rf"{re.escape(build.BEGIN)}\n(.*?)\n[ \t]*{re.escape(build.END)}", block.text, re.S)
                steps.setdefault((lesson.lab, block.arg), []).extend(line for chunk in body for line in _lines(chunk))
    return [(lab, step, [line for line in lines if len(line) >= DISTINCTIVE and line not in public])
            for (lab, step), lines in steps.items()]


def leaks(folder: Path, blocks: list[tuple[str, str, list[str]]]) -> list[Leak]:
    """Files under `folder` holding at least half of a step's distinctive reference lines. (The
    judge itself may share a line with a reference, e.g. the query that reads the checkpoint.)"""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        present = set(_lines(text))
        if path.suffix == ".ipynb":  # a notebook's JSON escapes quotes: read its cells' sources too
            import nbformat

            try:
                nb = nbformat.reads(text, as_version=4)
                present |= set(_lines("\n".join(c.get("source", "") for c in nb.cells)))
            except Exception:  # not a notebook after all: its raw text was read above
                pass
        for lab, step, lines in blocks:
            if not lines:
                continue
            hits = sum(1 for line in lines if line in present)
            if hits >= max(1, (len(lines) + 1) // 2):
                found.append(Leak(str(path.relative_to(folder)), lab, step, hits))
    return found


def release(out: Path, root: Path = build.ROOT) -> list[str]:
    """Write the student distribution into `out` (which must not exist): a folder, or one zip
    file when `out` ends in `.zip`. Returns the files written (the notebooks not counted)."""
    if out.exists():
        raise FileExistsError(f"{out} exists: give a new folder")
    if out.suffix == ".zip":
        return _release_zip(out, root)
    files = [f for f in tracked_files(root) if not f.startswith(LEFT_OUT)]
    written = []
    for name in files:
        source = root / name
        if not source.is_file():
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        written.append(name)
    for path, text in build.outputs().items():  # the notebooks as the sources make them now
        if path.suffix == ".ipynb":
            target = out / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    found = leaks(out, solution_blocks(root / "notebooks" / "source"))
    if found:
        shutil.rmtree(out, ignore_errors=True)
        names = ", ".join(f"{leak.path} (lab {leak.lab} step {leak.step})" for leak in found)
        raise RuntimeError(f"refused: these files would give away reference code: {names}")
    return written


def _release_zip(out: Path, root: Path) -> list[str]:
    top = out.stem
    with tempfile.TemporaryDirectory(prefix="labkit-release-") as tmp:
        folder = Path(tmp) / top
        written = release(folder, root)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                archive.write(path, f"{top}/{path.relative_to(folder).as_posix()}")
        # The zip's own entries, unpacked again, checked again: what students get is what was checked.
        check = Path(tmp) / "unzipped"
        with zipfile.ZipFile(partial) as archive:
            names = archive.namelist()
            archive.extractall(check)
        bad = [n for n in names if not n.startswith(f"{top}/") or n.removeprefix(f"{top}/").startswith(LEFT_OUT)]
        found = leaks(check, solution_blocks(root / "notebooks" / "source"))
        if bad or found:
            partial.unlink()
            raise RuntimeError(f"refused: the zip holds {bad or [leak.path for leak in found]}")
        partial.rename(out)
    return written
