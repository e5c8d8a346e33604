"""The student's own workspace: fresh copies of the course notebooks, outside git's files.

`python -m labkit start` opens JupyterLab on it. The first start creates it (by default the
git-ignored `workspace/` folder of the clone) with a copy of each student notebook and nothing
else: no lesson sources, no solutions. Later starts bring in what a course update changed:

- a notebook the course added is copied in;
- a notebook the course changed and the student never edited is replaced by the new version;
- a notebook the course changed and the student edited is rebuilt from the new version with the
  student's own cells put back (their step cells and scratch cells, matched by cell id); the
  student's copy before the update is kept in `work/backups/`.

To tell "edited" from "changed by the course", the workspace keeps the course version each
notebook was copied from in the hidden folder `.labkit/course/` (JupyterLab does not list
hidden files). Quiz answers, progress and the student's module live in `work/`, which an
update never touches.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from labkit.notebook.module_export import write_atomic

COURSE_ROOT = Path(__file__).resolve().parents[2]
WORKSPACE_ENV = "LABKIT_WORKSPACE"
HIDDEN = ".labkit"
PRISTINE = f"{HIDDEN}/course"  # the course version of each notebook, as last copied in
BACKUPS = "work/backups"


@dataclass(frozen=True)
class Change:
    notebook: str
    action: str  # "created", "kept", "updated" (untouched, replaced), "merged" (edited, cells kept)
    backup: Path | None = None

    def describe(self) -> str:
        words = {"created": "new, copied in", "kept": "up to date",
                 "updated": "updated to the new course version (you had not edited it)",
                 "merged": "updated to the new course version, with your own cells put back"}[self.action]
        tail = f"; your copy before the update: {self.backup}" if self.backup else ""
        return f"{self.notebook}: {words}{tail}"


def course_notebooks(root: Path = COURSE_ROOT) -> list[Path]:
    """The student notebooks of a course checkout (or a student release)."""
    return sorted((root / "notebooks").glob("*.ipynb"))


def default_workspace(root: Path = COURSE_ROOT) -> Path:
    return Path(os.environ.get(WORKSPACE_ENV) or root / "workspace")


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.get("id", ""), c.get("source", "")) for c in nb.cells]


def _editable(cell) -> bool:
    """Cells the student writes in: step cells and ordinary code cells (never locked ones)."""
    return cell.get("cell_type") == "code" and cell.get("metadata", {}).get("editable", True) is not False


def merge(student, old, new, lab: str):
    """The new course notebook with the student's own work in it.

    A course cell the student edited (its source differs from the version it was copied from)
    keeps the student's source and outputs, if it is still a cell they may edit; cells the
    student added are put back after the course cell they followed. Everything else is new.
    """
    original = {c.get("id"): c.get("source", "") for c in old.cells} if old is not None else {}
    mine = {c.get("id"): c for c in student.cells}
    merged = copy.deepcopy(new)
    for index, cell in enumerate(merged.cells):
        theirs = mine.get(cell.get("id"))
        if theirs is None or not _editable(cell):
            continue
        if theirs.get("source", "") != original.get(cell.get("id"), cell.get("source", "")):
            kept = copy.deepcopy(theirs)
            kept["metadata"] = copy.deepcopy(cell.get("metadata", {}))  # the course's metadata wins
            merged.cells[index] = kept
    course_ids = {c.get("id") for c in new.cells} | set(original)
    position = {c.get("id"): i for i, c in enumerate(merged.cells)}
    inserted = 0
    anchor = -1
    for cell in student.cells:
        cid = cell.get("id")
        if cid in position:
            anchor = position[cid] + inserted
            continue
        if cid in course_ids or str(cid).startswith(f"{lab}-"):
            continue  # a course cell the update removed
        anchor += 1
        merged.cells.insert(anchor, copy.deepcopy(cell))
        inserted += 1
    return merged


def sync(workspace: Path, root: Path = COURSE_ROOT) -> list[Change]:
    """Create or update the workspace from the course's notebooks; never loses the student's work."""
    notebooks = course_notebooks(root)
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {root / 'notebooks'}: run this from a clone of the course")
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "work").mkdir(exist_ok=True)
    changes = []
    for course in notebooks:
        name = course.name
        target, pristine = workspace / name, workspace / PRISTINE / name
        text = course.read_text(encoding="utf-8")
        if not target.exists():
            write_atomic(target, text)
            write_atomic(pristine, text)
            changes.append(Change(name, "created"))
            continue
        if pristine.exists() and pristine.read_text(encoding="utf-8") == text:
            changes.append(Change(name, "kept"))
            continue
        new = nbformat.reads(text, as_version=4)
        old = nbformat.read(pristine, as_version=4) if pristine.exists() else None
        student = nbformat.read(target, as_version=4)
        if old is not None and _sources(student) == _sources(old):
            write_atomic(target, text)
            changes.append(Change(name, "updated"))
        else:
            backup = workspace / BACKUPS / f"{course.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            write_atomic(backup, target.read_text(encoding="utf-8"))
            lab = new.metadata.get("labkit", {}).get("lab", "")
            write_atomic(target, nbformat.writes(merge(student, old, new, lab)) + "\n")
            changes.append(Change(name, "merged", backup.relative_to(workspace)))
        write_atomic(pristine, text)
    return changes


def lab_settings(workspace: Path) -> dict[str, Path]:
    """JupyterLab's settings and layouts kept in the workspace (hidden): no news pop-up, no update
    check; autosave stays on, and whatever the student changes in Settings is kept here."""
    import json

    base = workspace / HIDDEN
    overrides = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
    app = base / "lab-app-settings"
    write_atomic(app / "overrides.json", json.dumps(overrides, indent=1) + "\n")
    return {"app_settings_dir": app, "user_settings_dir": base / "lab-user-settings",
            "workspaces_dir": base / "lab-layouts"}


KERNEL_EXTENSION = "labkit.notebook.kernel"


def kernel_spec(workspace: Path) -> Path:
    """The course's own `python3` kernel spec, in the workspace (hidden): ipykernel with the
    course's extension, so `%%step` works in every kernel from its start, also after Kernel →
    Restart and before the setup cell. Returns the folder to put first on JUPYTER_PATH."""
    import json
    import sys

    from ipykernel.kernelspec import get_kernel_dict

    base = workspace / HIDDEN / "jupyter"
    spec = get_kernel_dict()
    spec["argv"] = [sys.executable, *spec["argv"][1:], f"--IPKernelApp.extra_extensions={KERNEL_EXTENSION}"]
    write_atomic(base / "kernels" / "python3" / "kernel.json", json.dumps(spec, indent=1) + "\n")
    return base


def jupyter_env(workspace: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment JupyterLab starts with: the course's kernel spec found first."""
    env = dict(os.environ if environ is None else environ)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(kernel_spec(workspace)), env.get("JUPYTER_PATH")]))
    return env


def jupyter_command(workspace: Path, first_start: bool, extra: list[str]) -> list[str]:
    """The JupyterLab command line for this workspace; `extra` arguments go to JupyterLab."""
    import sys

    settings = lab_settings(workspace)
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}",
           *(f"--LabApp.{key}={value}" for key, value in settings.items())]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        cmd.append("--allow-root")  # JupyterLab refuses to start as root without it
    cmd += extra
    first = sorted(workspace.glob("[0-9][0-9]-*.ipynb"))
    if first_start and first:
        cmd.append(str(first[0]))  # the first start opens the course's first notebook, the warm-up
    return cmd
