"""Put the released locked cells back into a submission, as nbgrader's OverwriteCells does.

Every locked cell of the release that carries an nbgrader `grade_id` (setup, checks, quiz,
the prose) is restored from the release by that id: an edited one is overwritten, a deleted
one is put back where it was, a copy is removed. Edits to code cells are tampering and are
flagged (`edited:<grade_id>`, `deleted:<grade_id>`, `duplicated:<grade_id>`); the prose is
restored silently. The student's step cells and any extra cells stay as they are.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbformat import NotebookNode


@dataclass
class Restored:
    nb: NotebookNode
    flags: list[str] = field(default_factory=list)
    released_ids: set[str] = field(default_factory=set)  # cell ids that come from the release


def _meta(cell: dict, key: str) -> dict:
    meta = cell.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


def grade_id(cell: dict) -> str | None:
    gid = _meta(cell, "nbgrader").get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def is_locked(cell: dict) -> bool:
    return bool(_meta(cell, "nbgrader").get("locked")) and grade_id(cell) is not None


def check_step(cell: dict) -> str | None:
    """The step a released check cell shows (`metadata.labkit.check`), or None."""
    value = _meta(cell, "labkit").get("check")
    return None if value is None else str(value)


def _source(cell: NotebookNode) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _fresh(cell: NotebookNode) -> NotebookNode:
    new = copy.deepcopy(cell)
    if new.get("cell_type") == "code":
        new["outputs"] = []
        new["execution_count"] = None
    return new


def restore(submitted: NotebookNode, release: NotebookNode) -> Restored:
    locked = {grade_id(c): c for c in release.cells if is_locked(c)}
    order = {gid: i for i, c in enumerate(release.cells) if (gid := grade_id(c))}
    flags: list[str] = []

    def flag(kind: str, cell: NotebookNode, gid: str) -> None:
        if cell.get("cell_type") == "code":
            flags.append(f"{kind}:{gid}")

    cells: list[NotebookNode] = []
    seen: set[str] = set()
    restored: set[int] = set()

    def fresh(original: NotebookNode) -> NotebookNode:
        new = _fresh(original)
        restored.add(id(new))
        return new

    for cell in submitted.cells:
        gid = grade_id(cell)
        if gid not in locked:
            cells.append(cell)
            continue
        original = locked[gid]
        if gid in seen:
            flag("duplicated", original, gid)
            continue
        seen.add(gid)
        if cell.get("cell_type") != original.get("cell_type") or _source(cell) != _source(original):
            flag("edited", original, gid)
        cells.append(fresh(original))

    for gid, original in locked.items():  # release order: earlier insertions anchor later ones
        if gid in seen:
            continue
        flag("deleted", original, gid)
        at = 0
        for index, cell in enumerate(cells):
            known = grade_id(cell)
            if known in order and order[known] < order[gid]:
                at = index + 1
        cells.insert(at, fresh(original))
        seen.add(gid)

    nb = copy.copy(submitted)
    nb.cells = cells
    nb.metadata = copy.deepcopy(submitted.get("metadata", {}))
    nb.nbformat_minor = max(submitted.get("nbformat_minor", 0), release.get("nbformat_minor", 0))
    for key in ("kernelspec", "labkit", "language_info"):  # the kernel and lab are the release's
        if key in release.metadata:
            nb.metadata[key] = copy.deepcopy(release.metadata[key])
    released_ids = {c["id"] for c in cells if id(c) in restored and c.get("id")}
    taken: set[str] = set()
    for cell in cells:  # nbformat wants unique ids; a student's cell never takes a released id
        cid = cell.get("id")
        if id(cell) not in restored and (not cid or cid in taken or cid in released_ids):
            cid = cell["id"] = uuid.uuid4().hex[:8]
        taken.add(cid)
    return Restored(nb, list(dict.fromkeys(flags)), released_ids)
