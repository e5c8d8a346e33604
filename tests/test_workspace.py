"""The student's workspace (`python -m labkit start`) and the student release (`labkit release`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.notebook import release, workspace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def course(tmp_path) -> Path:
    """A course checkout of our own: its notebooks folder is what an update changes."""
    root = tmp_path / "course"
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns("source", "work"))
    return root


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def step_cell(nb, part: str):
    return next(c for c in nb.cells if c.metadata.get("labkit", {}).get("part") == part)


def test_the_first_start_copies_the_student_notebooks_and_nothing_else(course, tmp_path):
    ws = tmp_path / "ws"
    changes = workspace.sync(ws, course)
    notebooks = sorted(p.name for p in (course / "notebooks").glob("*.ipynb"))
    assert {"00-start-here.ipynb", "01-outbox.ipynb", "02-vending.ipynb"} <= set(notebooks)
    assert [c.action for c in changes] == ["created"] * len(notebooks)
    visible = [f for f in files_in(ws) if not f.startswith(".")]
    assert visible == notebooks
    assert (ws / "work").is_dir()
    assert release.leaks(ws, release.solution_blocks()) == []  # hidden files included


def test_a_later_start_keeps_what_the_student_wrote(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(ws, course)
    nb = nbformat.read(ws / "01-outbox.ipynb", as_version=4)
    step_cell(nb, "3").source = "%%step 3\ndef accept(con, event):\n    return 'mine'"
    nbformat.write(nb, ws / "01-outbox.ipynb")
    assert {c.action for c in workspace.sync(ws, course)} == {"kept"}
    assert "'mine'" in step_cell(nbformat.read(ws / "01-outbox.ipynb", as_version=4), "3").source


def _course_update(course: Path) -> None:
    """The course changes lab 01's prose and its step 5 skeleton, and adds a notebook."""
    path = course / "notebooks" / "01-outbox.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source += "\n\nUPDATED PROSE"
    step_cell(nb, "5").source += "\n# a better skeleton"
    nbformat.write(nb, path)
    shutil.copy(course / "notebooks" / "00-start-here.ipynb", course / "notebooks" / "09-new.ipynb")


def test_a_course_update_merges_into_an_edited_notebook_and_keeps_a_backup(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(ws, course)
    nb = nbformat.read(ws / "01-outbox.ipynb", as_version=4)
    step_cell(nb, "3").source = "%%step 3\ndef accept(con, event):\n    return 'mine'"
    index = nb.cells.index(step_cell(nb, "3"))
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell("print('my scratch')"))
    nbformat.write(nb, ws / "01-outbox.ipynb")
    (ws / "work" / "quiz-outbox.json").write_text('{"answers": {"inbox": {"choice": 1}}}')

    _course_update(course)
    changes = {c.notebook: c for c in workspace.sync(ws, course)}
    assert changes["01-outbox.ipynb"].action == "merged" and changes["09-new.ipynb"].action == "created"
    assert changes["00-start-here.ipynb"].action == "kept"
    merged = nbformat.read(ws / "01-outbox.ipynb", as_version=4)
    assert "UPDATED PROSE" in merged.cells[0].source  # the course's new text
    assert "'mine'" in step_cell(merged, "3").source  # the student's step
    assert "a better skeleton" in step_cell(merged, "5").source  # a step the student never touched
    scratch = merged.cells.index(step_cell(merged, "3")) + 1
    assert merged.cells[scratch].source == "print('my scratch')"  # back where it was
    backup = ws / changes["01-outbox.ipynb"].backup
    assert "'mine'" in backup.read_text() and "UPDATED PROSE" not in backup.read_text()
    assert json.loads((ws / "work" / "quiz-outbox.json").read_text())["answers"]["inbox"]["choice"] == 1


def test_a_course_update_replaces_an_untouched_notebook(course, tmp_path):
    ws = tmp_path / "ws"
    workspace.sync(ws, course)
    _course_update(course)
    changes = {c.notebook: c.action for c in workspace.sync(ws, course)}
    assert changes["01-outbox.ipynb"] == "updated"
    assert (ws / "01-outbox.ipynb").read_text() == (course / "notebooks" / "01-outbox.ipynb").read_text()
    assert not (ws / "work" / "backups").exists()


def test_jupyterlab_starts_on_the_workspace_without_the_news_popup(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    workspace.sync(ws)
    monkeypatch.setattr(workspace.os, "geteuid", lambda: 0)
    command = workspace.jupyter_command(ws, True, ["--no-browser"])
    assert command[1:3] == ["-m", "jupyterlab"] and f"--ServerApp.root_dir={ws}" in command
    assert "--allow-root" in command and "--no-browser" in command
    assert command[-1] == str(ws / "00-start-here.ipynb")  # the first start opens the warm-up
    overrides = json.loads((ws / ".labkit" / "lab-app-settings" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert "@jupyterlab/docmanager-extension:plugin" not in overrides  # autosave: the student's choice
    monkeypatch.setattr(workspace.os, "geteuid", lambda: 1000)
    assert "--allow-root" not in workspace.jupyter_command(ws, False, [])


def test_the_start_command_prepares_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    out = subprocess.run([sys.executable, "-m", "labkit", "start", "--workspace", str(ws), "--prepare-only"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "01-outbox.ipynb: new, copied in" in out.stdout and (ws / "01-outbox.ipynb").exists()


# --- the student release -----------------------------------------------------------------


def test_the_release_holds_no_reference_code(tmp_path):
    out = tmp_path / "release"
    proc = subprocess.run([sys.executable, "-m", "labkit", "release", str(out)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    names = files_in(out)
    assert not [n for n in names if n.startswith(("solutions/", "notebooks/source/", "tests/"))]
    assert {"notebooks/01-outbox.ipynb", "notebooks/02-vending.ipynb", "labkit/cli.py", "pyproject.toml"} <= set(names)
    blocks = release.solution_blocks()
    assert len(blocks) >= 15 and all(lines for lab, step, lines in blocks if step != "header")
    assert release.leaks(out, blocks) == []
    # The comparison can fail: a reference solution dropped into the release is found.
    shutil.copy(ROOT / "solutions" / "client.py", out / "checks" / "helper.py")
    found = {(leak.path, leak.lab) for leak in release.leaks(out, blocks)}
    assert ("checks/helper.py", "vending") in found
    again = subprocess.run([sys.executable, "-m", "labkit", "release", str(out)], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 2 and "exists" in again.stderr


def test_a_reveal_in_a_release_says_there_is_no_reference(tmp_path, monkeypatch):
    from labkit.notebook import build, reveal

    monkeypatch.setattr(build, "SOURCES", tmp_path / "no-sources")
    assert reveal.reference("outbox", "3") is None
    monkeypatch.undo()
    assert "def accept" in reveal.reference("outbox", "3")
