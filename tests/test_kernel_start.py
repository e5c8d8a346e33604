"""A kernel started from the workspace knows `%%step` before any setup cell; an interrupted step
cell is not saved and shows none of the course's frames; every run of a step cell is recorded,
so a check can say which saved version it judged (issue "first two hours, part two", item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import kernels
import nbformat
import pytest

from labkit.notebook import attempts, module_export, workspace


def _notebook(cells: list[str], lab: str = "outbox"):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                    metadata={"labkit": {"lab": lab}})


def _text(cell) -> str:
    import re

    out = []
    for o in cell.outputs:
        out.append(o.get("text", "") + "".join(o.get("traceback", [])) + o.get("ename", "") + o.get("evalue", ""))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out))


def _run(nb, folder: Path, kernel_name: str = "python3"):
    return kernels.execute(nb, folder, kernel_name=kernel_name)


@pytest.mark.slow
def test_a_workspace_kernel_knows_step_before_the_setup_cell(tmp_path, jupyter_env, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    env = workspace.jupyter_env(ws, {})
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])
    nb = _notebook(['%%step 3\ndef accept(con, event):\n    return "first"\n',
                    'print(accept(None, None))'])
    nbformat.write(nb, ws / "01-outbox.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", str(ws / "01-outbox.ipynb"))  # what jupyter_server sets
    _run(nb, ws)
    assert "not found" not in _text(nb.cells[0]) and not nb.cells[0].outputs, _text(nb.cells[0])
    assert "first" in _text(nb.cells[1])
    assert module_export.saved_parts(ws / "work", "outbox") == {"3": 'def accept(con, event):\n    return "first"\n'}
    spec = json.loads((ws / ".labkit/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"][-1] == "--IPKernelApp.extra_extensions=labkit.notebook.kernel"


@pytest.mark.slow
def test_without_the_notebook_known_a_step_cell_says_run_the_setup_cell(tmp_path, jupyter_env, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("JUPYTER_PATH", workspace.jupyter_env(ws, {})["JUPYTER_PATH"])
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    nb = _run(_notebook(['%%step 3\ndef accept(con, event):\n    return 1\n']), ws)
    text = _text(nb.cells[0])
    assert "run the setup cell at the top of this notebook first" in text
    assert "Traceback" not in text and "labkit/" not in text


@pytest.mark.slow
def test_an_interrupted_step_cell_is_not_saved_and_shows_only_the_students_frames(tmp_path, jupyter_env):
    setup = 'from labkit.notebook import Lab\nlab = Lab("outbox")'
    first = '%%step 3\ndef accept(con, event):\n    return "first"\n'
    # KeyboardInterrupt is what Kernel → Interrupt raises in the loop; raised here, it is deterministic.
    looping = '%%step 3\ndef accept(con, event):\n    return "second"\n\nn = 0\nwhile n >= 0:\n    n += 1\n    if n > 1000:\n        raise KeyboardInterrupt\n'
    nb = _run(_notebook([setup, first, looping, 'print(accept(None, None))']), tmp_path)
    text = _text(nb.cells[2])
    assert "Step 3 was NOT saved: interrupted." in text
    assert "Cell In[3], line 9" in text and "----> 9         raise KeyboardInterrupt" in text  # the student's line
    assert "labkit" not in text and "site-packages" not in text and "File " not in text
    assert module_export.saved_parts(tmp_path / "work", "outbox")["3"] == 'def accept(con, event):\n    return "first"\n'
    assert '"second"' not in (tmp_path / "work" / "worker.py").read_text()
    runs = attempts.load(tmp_path / "work", "outbox")
    assert runs["3"]["attempt"] == attempts.INTERRUPTED and runs["3"]["saved_hash"] == attempts.digest(first[9:])


def test_a_check_says_which_version_it_judged_and_warns_when_the_cell_did_not_save(tmp_path):
    work = tmp_path / "work"
    module_export.save_part(work, "outbox", "worker.py", "3", "def accept():\n    return 1\n")
    attempts.record(work, "outbox", "3", "def accept():\n    return 1\n", attempts.SAVED)
    judged, warning = attempts.provenance(work, "outbox", "3", module_export.saved_parts(work, "outbox"))
    assert judged.startswith("judged: step 3 as saved at ") and warning == ""
    attempts.record(work, "outbox", "3", "def accept(:\n", attempts.SYNTAX_ERROR)
    judged, warning = attempts.provenance(work, "outbox", "3", module_export.saved_parts(work, "outbox"))
    assert warning.startswith("Your last run of step 3 did not save (syntax error): this verdict is for "
                              "the version saved at ")
    judged, warning = attempts.provenance(work, "outbox", "final", module_export.saved_parts(work, "outbox"))
    assert judged.startswith("judged: your module as saved at ") and "step 3 did not save" in warning


def test_a_notebook_edited_after_the_save_is_flagged_but_not_one_saved_before(tmp_path):
    import os
    import time

    work = tmp_path / "work"
    module_export.save_part(work, "outbox", "worker.py", "3", "def accept():\n    return 1\n")
    attempts.record(work, "outbox", "3", "def accept():\n    return 1\n", attempts.SAVED)
    path = tmp_path / "01-outbox.ipynb"
    nbformat.write(_notebook(["%%step 3\ndef accept():\n    return 2\n"]), path)
    saved = module_export.saved_parts(work, "outbox")
    old = time.time() - 60  # the notebook file was written before the run: the disk is behind
    os.utime(path, (old, old))
    assert attempts.provenance(work, "outbox", "3", saved, path)[1] == ""
    os.utime(path, (time.time() + 5, time.time() + 5))  # written after the save, and different
    warning = attempts.provenance(work, "outbox", "3", saved, path)[1]
    assert "`%%step 3` cell has changed since you last ran it" in warning


def test_an_import_that_never_finishes_names_the_step_cell_and_line(tmp_path, judge_tmp):
    from labkit.judge import child, expect
    from labkit.sandbox import reaper

    parts = {"header": "import time\n", "4": "def ready():\n    return True\n\nwhile True:\n    time.sleep(0.05)\n"}
    module = tmp_path / "worker.py"
    module.write_text(module_export.assemble(parts))
    marker = reaper.new_marker()
    try:
        run = child.run_child(module, "labkit.probe:noop", {}, workdir=tmp_path, timeout=3.0, marker=marker,
                              module_name="worker")
    finally:
        reaper.kill_marked(marker)
    assert run.timed_out
    got, hint, _ = expect.import_problem(run, 3.0)
    assert got.startswith("importing your module did not finish within 3 s: it was running line ")
    assert got.endswith(" of worker.py: `time.sleep(0.05)`") or got.endswith(" of worker.py: `while True:`"), got
    shown = module_export.in_cell_terms(got, "worker.py", parts)
    assert "it was running your `%%step 4` cell, line 6: `time.sleep(0.05)`" in shown \
        or "it was running your `%%step 4` cell, line 5: `while True:`" in shown, shown
