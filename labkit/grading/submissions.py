"""Find the submitted notebooks, read them, and tell which lab each one is.

A PATH is a notebook (its folder names the student) or a folder: `FOLDER/STUDENT/...ipynb`
(the first folder below it names the student) or notebooks directly inside it (the folder
names the student). The lab comes from the notebook's `metadata.labkit.lab` — never from the
file name — or, when a student's copy lost its metadata, from the released cells it holds.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.restore import grade_id


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


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def find(paths: list[Path], exclude: Path | None = None) -> list[Submission]:
    """Every notebook under the given paths; raises FileNotFoundError for a missing PATH."""
    found: dict[Path, Submission] = {}
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(path)
        if path.is_file():
            resolved = path.resolve()
            found.setdefault(resolved, Submission(resolved.parent.name or "student", resolved))
            continue
        for nb_path in sorted(path.rglob("*.ipynb")):
            rel = nb_path.relative_to(path)
            resolved = nb_path.resolve()
            if _hidden(rel) or (exclude is not None and resolved.is_relative_to(exclude)):
                continue
            student = rel.parts[0] if len(rel.parts) > 1 else (path.resolve().name or "student")
            found.setdefault(resolved, Submission(student, resolved))
    return list(found.values())


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
        data = sub.path.read_bytes()
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
    """One submission per student and lab: the one named like the release, else the newest."""
    groups: dict[str, list[Submission]] = {}
    for sub in subs:
        groups.setdefault(sub.key, []).append(sub)
    chosen = []
    for group in groups.values():
        if len(group) == 1:
            chosen.append(group[0])
            continue
        release = known.get(group[0].lab or "")
        group.sort(key=lambda s: (release is not None and s.path.name == release.path.name,
                                  s.path.stat().st_mtime, s.path.name), reverse=True)
        winner = group[0]
        winner.flags += [f"ignored:{other.path.name}" for other in group[1:]]
        chosen.append(winner)
    return chosen
