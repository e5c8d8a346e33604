"""Find the submitted notebooks, read them, and tell which lab each one is.

A PATH is a notebook (its folder names the student) or a folder: `FOLDER/STUDENT/...ipynb`
(the first folder below it names the student) or notebooks directly inside it (the folder
names the student). nbgrader's `submitted/STUDENT/ASSIGNMENT/` is that layout already (its
`timestamp.txt` is recorded); nbgrader's exchange `inbound/` is read as nbgrader collects it
(`nbgrader_layout`). The lab comes from the notebook's `metadata.labkit.lab` — never from the
file name — or, when a student's copy lost its metadata, from the released cells it holds.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading import nbgrader_layout
from labkit.grading.restore import grade_id
from labkit.grading.settings import MAX_NOTEBOOK_BYTES


class NotANotebook(Exception):
    """The file cannot be graded; the message says why, in words a student understands."""


@dataclass
class Submission:
    student: str
    path: Path
    sha256: str = ""
    lab: str | None = None
    problem: str = ""  # why it is malformed
    flags: list[str] = field(default_factory=list)
    inode: tuple[int, int] = (0, 0)  # (device, inode): the same file found twice is one file
    submitted_at: str | None = None  # nbgrader's timestamp of this submission (ISO, UTC), if any
    revealed: list[str] = field(default_factory=list)  # steps whose reference the student revealed

    @property
    def key(self) -> str:
        """Names this submission's result file: one per student and lab."""
        what = self.lab if self.lab else f"file-{self.path.name}"
        return f"{slug(self.student)}--{slug(what)}"

    @property
    def page_name(self) -> str:
        return self.lab or slug(self.path.stem)


def slug(text: str) -> str:
    """A safe file-name part; a hash keeps distinct names distinct after cleaning."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", text).strip(".") or "_"
    if clean == text:
        return text
    return f"{clean[:60]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


@dataclass
class Skipped:
    """A path that was found but is not graded, and why (listed in the gradebook)."""

    student: str
    path: Path
    reason: str


CHECKPOINTS = ".ipynb_checkpoints"


def read_capped(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never following a link, never blocking, never past `limit`.

    Raises OSError (with a reason a student understands) for a link, a FIFO, a device, a
    folder, or a file larger than `limit` (checked before reading, and again while reading).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "it is a symbolic link; links are never followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"it is larger than {limit:,} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"it is larger than {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _why_not(path: Path, info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link: links are never followed (a notebook counts only where it really is)"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a FIFO, socket or device is never opened)"
    if info.st_size > MAX_NOTEBOOK_BYTES:
        return f"larger than {MAX_NOTEBOOK_BYTES:,} bytes: not read"
    return None


def _walk(top: Path, exclude: Path | None, skipped: list[Skipped], student_of) -> list[Path]:
    """Every *.ipynb below `top`, never through a link; what is left out goes to `skipped`."""
    found: list[Path] = []
    for root, dirs, files in os.walk(top, followlinks=False):
        here = Path(root)
        for name in sorted(dirs):
            sub = here / name
            if name == CHECKPOINTS:
                skipped.append(Skipped(student_of(sub), sub, "Jupyter's autosave copies, not a submission"))
                dirs.remove(name)
            elif exclude is not None and sub.absolute() == exclude:
                dirs.remove(name)  # the grader's own output
            elif sub.is_symlink():
                skipped.append(Skipped(student_of(sub), sub, "a symbolic link to a folder: links are never followed"))
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".ipynb"):
                found.append(here / name)
    return found


def find(paths: list[Path], exclude: Path | None = None) -> tuple[list[Submission], list[Skipped]]:
    """Every notebook under the given paths, and every path left out with its reason.

    Raises FileNotFoundError for a missing PATH. A notebook is credited to the folder it lives
    in (the first folder below PATH), never to where a link points; links, FIFOs, devices and
    oversized files are listed, not read; dotted folders are searched like any other (only
    Jupyter's `.ipynb_checkpoints` is left out, and listed). An nbgrader `inbound/` folder
    credits each submission to the student its name gives, and only the latest counts.
    """
    subs: list[Submission] = []
    skipped: list[Skipped] = []
    exclude = exclude.absolute() if exclude is not None else None
    for path in paths:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        top = Path(os.path.abspath(path))
        if nbgrader_layout.is_inbound(top):
            subs += _inbound(top, exclude, skipped)
            continue
        if top.is_dir() and not top.is_symlink():
            def student_of(p: Path, top=top) -> str:
                rel = p.relative_to(top)
                return rel.parts[0] if len(rel.parts) > 1 else (top.name or "student")

            candidates = _walk(top, exclude, skipped, student_of)
        else:
            def student_of(p: Path) -> str:
                return p.parent.name or "student"

            candidates = [top]
        for nb_path in candidates:
            sub = _candidate(nb_path, student_of(nb_path), skipped)
            if sub is not None:
                sub.submitted_at = nbgrader_layout.submitted_at(nb_path, top)
                subs.append(sub)
    return _one_per_path(subs), skipped


def _candidate(nb_path: Path, student: str, skipped: list[Skipped]) -> Submission | None:
    try:
        info = os.lstat(nb_path)
    except OSError:
        return None
    reason = _why_not(nb_path, info)
    if reason is not None:
        skipped.append(Skipped(student, nb_path, reason))
        return None
    return Submission(student, nb_path, inode=(info.st_dev, info.st_ino))


def _inbound(top: Path, exclude: Path | None, skipped: list[Skipped]) -> list[Submission]:
    """nbgrader's exchange inbound/: the latest submission of each student and assignment."""
    inbound = nbgrader_layout.choose(top)
    for entry in sorted(top.iterdir()):
        if entry.is_symlink() or (entry.is_file() and entry.name.endswith(".ipynb")):
            skipped.append(Skipped(entry.name, entry, "not an nbgrader submission folder (inbound/ holds "
                                   "only student+assignment+timestamp folders; links are never followed)"))
    for folder in inbound.unnamed:
        skipped.append(Skipped(folder.name, folder, "not named like an nbgrader submission "
                               "(student+assignment+timestamp)"))
    subs = []
    for entry in inbound.latest:
        earlier = [f"superseded:{nbgrader_layout.iso(e.when)}" for e in inbound.superseded[entry.path]]
        for nb_path in _walk(entry.path, exclude, skipped, lambda p, s=entry.student: s):
            sub = _candidate(nb_path, entry.student, skipped)
            if sub is not None:
                sub.submitted_at = nbgrader_layout.iso(entry.when)
                sub.flags += earlier
                subs.append(sub)
    return subs


def _one_per_path(subs: list[Submission]) -> list[Submission]:
    """The same file named twice (PATHs that overlap) is graded once; the same file under
    two students (a hard link) is graded for both, and both are flagged."""
    unique: dict[Path, Submission] = {}
    for sub in subs:
        unique.setdefault(sub.path, sub)
    by_inode: dict[tuple[int, int], list[Submission]] = {}
    for sub in unique.values():
        by_inode.setdefault(sub.inode, []).append(sub)
    for group in by_inode.values():
        students = sorted({s.student for s in group})
        if len(students) > 1:
            for sub in group:
                sub.flags += [f"same-file:{other}" for other in students if other != sub.student]
    return list(unique.values())


def read_notebook(data: bytes) -> dict:
    """The notebook as plain JSON data, checked and normalised (no nbformat import: it is slow)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise NotANotebook("The file is not a notebook: it is not text (not UTF-8).") from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if hasattr(exc, "lineno") else ""
        hint = " It is empty." if not text.strip() else ""
        raise NotANotebook(f"The file is not a notebook: it is not valid JSON{where}.{hint}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) or not isinstance(raw.get("nbformat"), int):
        raise NotANotebook("The file is JSON but not a notebook: it has no `cells` list and `nbformat` version.")
    if raw["nbformat"] < 4:
        raise NotANotebook(f"The notebook uses the old format version {raw['nbformat']}; save it again "
                           "with a current Jupyter (format 4).")
    try:
        nb = raw
        for cell in nb["cells"]:
            if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
                raise ValueError("a cell without a known cell_type")
            source = cell.get("source", "")
            cell["source"] = "".join(source) if isinstance(source, list) else str(source)
            if not isinstance(cell.get("metadata"), dict):
                cell["metadata"] = {}
            if cell["cell_type"] == "code":
                if not isinstance(cell.get("outputs"), list):
                    cell["outputs"] = []
                cell.setdefault("execution_count", None)
        if not isinstance(nb.get("metadata"), dict):
            nb["metadata"] = {}
    except (ValueError, TypeError, AttributeError) as exc:
        raise NotANotebook(f"The notebook's cells are damaged ({exc}).") from None
    return nb


@dataclass
class Release:
    lab: str
    path: Path
    nb: dict

    @property
    def grade_ids(self) -> set[str]:
        return {gid for c in self.nb["cells"] if (gid := grade_id(c))}


def releases(folder: Path) -> dict[str, Release]:
    """The released notebooks (`NN-lab.ipynb`), by the lab their metadata names."""
    found: dict[str, Release] = {}
    for path in sorted(folder.glob("*.ipynb")):
        try:
            nb = read_notebook(path.read_bytes())
        except (OSError, NotANotebook):
            continue
        meta = nb["metadata"].get("labkit")
        lab = meta.get("lab") if isinstance(meta, dict) else None
        if isinstance(lab, str) and lab not in found:
            found[lab] = Release(lab, path, nb)
    return found


def identify(nb: dict, known: dict[str, Release]) -> str | None:
    meta = nb.get("metadata", {}).get("labkit", {})
    lab = meta.get("lab") if isinstance(meta, dict) else None
    if isinstance(lab, str) and lab:
        return lab
    ids = {gid for c in nb["cells"] if (gid := grade_id(c))}
    best = max(known.values(), key=lambda r: len(ids & r.grade_ids), default=None)
    if best is not None and ids & best.grade_ids:
        return best.lab
    return None


def examine(sub: Submission, known: dict[str, Release], labs: list[str]) -> dict | None:
    """Fill in hash, lab and problem; return the parsed notebook when it is gradable."""
    try:
        data = read_capped(sub.path, MAX_NOTEBOOK_BYTES)
    except OSError as exc:
        sub.problem = f"The file could not be read: {exc.strerror}."
        return None
    sub.sha256 = hashlib.sha256(data).hexdigest()
    try:
        nb = read_notebook(data)
    except NotANotebook as exc:
        sub.problem = str(exc)
        return None
    lab = identify(nb, known)
    if lab is None:
        sub.problem = ("This notebook is not one of the course's labs: it has no `labkit.lab` metadata "
                       "and none of a lab's cells. Submit the lab notebook you worked in.")
        return None
    if lab not in labs:
        sub.problem = f"The notebook names the lab {lab!r}, which the grader does not know."
        return None
    sub.lab = lab
    return nb


def one_per_lab(subs: list[Submission], known: dict[str, Release]) -> list[Submission]:
    """One submission per student and lab: the latest nbgrader submission, then the one named like
    the release, then the newest file."""
    groups: dict[str, list[Submission]] = {}
    for sub in subs:
        groups.setdefault(sub.key, []).append(sub)
    chosen = []
    for group in groups.values():
        if len(group) == 1:
            chosen.append(group[0])
            continue
        release = known.get(group[0].lab or "")
        group.sort(key=lambda s: (s.submitted_at or "", release is not None and s.path.name == release.path.name,
                                  s.path.lstat().st_mtime, s.path.name), reverse=True)
        winner = group[0]
        winner.flags += [f"ignored:{other.path.name}" for other in group[1:]]
        chosen.append(winner)
    return chosen
