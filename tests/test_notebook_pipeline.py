"""The lesson sources, the generated notebooks, and the student's module written by `%%step`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from labkit.notebook import build, module_export

ROOT = Path(__file__).resolve().parents[1]


def test_generated_files_match_their_sources():
    stale = [str(p) for p, text in build.outputs().items() if not p.exists() or p.read_text() != text]
    assert stale == [], "run `python -m labkit.notebook.build` and commit: " + ", ".join(stale)


def test_skeleton_replaces_solutions_and_keeps_signatures():
    text = "def f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    assert build.skeleton(text) == 'def f(x):\n    """Doc."""\n    raise NotImplementedError  # your code here'
    assert "return x" in build.solution(text) and "BEGIN" not in build.solution(text)


def test_module_level_solution_regions_leave_an_importable_skeleton():
    text = "### BEGIN SOLUTION\nHELPER = 1\n### END SOLUTION\n\ndef f():\n    ### BEGIN SOLUTION\n    return HELPER\n    ### END SOLUTION\n"
    code = build.skeleton(text)
    namespace: dict = {}
    exec(code, namespace)  # must not raise at import time
    with pytest.raises(NotImplementedError):
        namespace["f"]()


@pytest.mark.parametrize("source", sorted((ROOT / "notebooks" / "source").glob("*.md")), ids=lambda p: p.stem)
def test_check_cells_are_locked_hidden_and_carry_nbgrader_metadata(source):
    nb = build.student_notebook(build.parse(source))
    nbformat.validate(nb)
    checks = [c for c in nb.cells if "check" in c.metadata.get("labkit", {})]
    assert checks, "a lesson without check cells"
    for cell in checks:
        assert cell.metadata["editable"] is False and cell.metadata["deletable"] is False
        assert cell.metadata["jupyter"]["source_hidden"] is True
        nbg = cell.metadata["nbgrader"]
        assert nbg["grade"] is True and nbg["locked"] is True and nbg["points"] > 0 and nbg["grade_id"]
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"


def test_parts_assemble_in_step_order_and_rerun_replaces(tmp_path):
    module_export.save_part(tmp_path, "outbox", "worker.py", "2", "def two():\n    return 2\n")
    module_export.save_part(tmp_path, "outbox", "worker.py", "header", "import json\n")
    module_export.save_part(tmp_path, "outbox", "worker.py", "10", "def ten():\n    return 10\n")
    module_export.save_part(tmp_path, "outbox", "worker.py", "2", "def two():\n    return 'again'\n")
    text = (tmp_path / "worker.py").read_text()
    assert text.index("import json") < text.index("def two") < text.index("def ten")
    assert text.count("def two") == 1 and "'again'" in text


def _execute(nb, cwd: Path, timeout: int = 120):
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def _text_outputs(nb) -> str:
    out = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            out.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def test_step_magic_writes_a_module_a_fresh_interpreter_imports(tmp_path, jupyter_env):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('from labkit.notebook import Lab\nlab = Lab("outbox")'),
        nbformat.v4.new_code_cell("%%step 1\ndef validate_event(event):\n    return 'first'"),
        nbformat.v4.new_code_cell("%%step 1\ndef validate_event(event):\n    return 'second'"),
        nbformat.v4.new_code_cell("print(validate_event(None))"),
    ]
    _execute(nb, tmp_path)
    assert "second" in _text_outputs(nb)  # defined in the kernel too
    module = tmp_path / "work" / "worker.py"
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import worker; print(worker.validate_event(None))"],
                         cwd=module.parent, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "second"
    assert module.read_text().count("def validate_event") == 1


def _notebook_copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copy(ROOT / "notebooks" / name, target)
    return target


@pytest.mark.slow
def test_student_notebook_runs_top_to_bottom_and_says_not_implemented(tmp_path, jupyter_env):
    nb = nbformat.read(_notebook_copy(tmp_path, "01-outbox.ipynb"), as_version=4)
    _execute(nb, tmp_path)
    text = _text_outputs(nb)
    for step in range(1, 9):
        assert f"Step {step} — " in text
    assert text.count("not implemented yet") >= 9
    assert "passed (" not in text


@pytest.mark.slow
def test_reference_notebook_passes_every_check(tmp_path, jupyter_env):
    lesson = build.parse(ROOT / "notebooks" / "source" / "01-outbox.md")
    nb = build.student_notebook(lesson)
    solutions = {b.arg: build.solution(b.text) for b in lesson.blocks if b.kind == "step"}
    for cell in nb.cells:
        part = cell.metadata.get("labkit", {}).get("part")
        if part:
            cell.source = f"%%step {part}\n{solutions[part]}"
    _execute(nb, tmp_path)
    text = _text_outputs(nb)
    assert "FAILED" not in text and "not implemented" not in text
    for step in list(range(1, 9)):
        assert f"Step {step} — " in text
    assert "Final check — the crash after the ACK: passed" in text
