"""The lesson sources, the generated notebooks, and the student's module written by `%%step`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import kernels
import nbformat
import pytest

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
    return kernels.execute(nb, cwd, timeout=timeout, allow_errors=False)


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


SOURCES = sorted((ROOT / "notebooks" / "source").glob("*.md"))
RED = ("FAILED", "✗")


def _reference_notebook(source: Path):
    """The student notebook with every step cell holding the lesson's reference solution."""
    lesson = build.parse(source)
    nb = build.student_notebook(lesson)
    solutions = {b.arg: build.solution(b.text) for b in lesson.blocks if b.kind == "step"}
    for cell in nb.cells:
        part = cell.metadata.get("labkit", {}).get("part")
        if part:
            cell.source = f"%%step {part}\n{solutions[part]}"
    return nb


def _checks(nb) -> list:
    return [c for c in nb.cells if "check" in c.metadata.get("labkit", {})]


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_untouched_student_notebook_runs_top_to_bottom_without_a_single_red(source, tmp_path, jupyter_env):
    """Run All on the notebook as the student gets it: no error, every check grey with a next action."""
    nb = nbformat.read(ROOT / "notebooks" / f"{source.stem}.ipynb", as_version=4)
    _execute(nb, tmp_path, timeout=240)  # allow_errors=False: any error output fails here
    checks = _checks(nb)
    assert checks
    for cell in checks:
        text = _text_outputs(nbformat.v4.new_notebook(cells=[cell]))
        assert "next:" in text and not any(mark in text for mark in RED), text
        assert "passed (" not in text
    setup = next(c for c in nb.cells if c.metadata.get("labkit", {}).get("setup"))
    progress_text = _text_outputs(nbformat.v4.new_notebook(cells=[setup]))
    assert "0 of " in progress_text and "✗" not in progress_text and "Next: step 1" in progress_text


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_reference_notebook_passes_every_check(source, tmp_path, jupyter_env):
    nb = _reference_notebook(source)
    _execute(nb, tmp_path, timeout=240)
    checks = _checks(nb)
    for cell in checks:
        text = _text_outputs(nbformat.v4.new_notebook(cells=[cell]))
        assert ": passed (" in text and not any(mark in text for mark in RED), text
    steps = {str(c.metadata["labkit"]["check"]) for c in checks}
    assert steps == {str(s.step) for s in __import__("labkit.labs", fromlist=["load"]).load(build.parse(source).lab).steps}


def _error_text(cell) -> str:
    """A cell's error output as plain text (IPython colours its tracebacks)."""
    text = "\n".join("\n".join(o.get("traceback", [])) for o in cell.outputs if o.output_type == "error")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.slow
def test_order_mistakes_and_syntax_errors_read_in_the_students_terms(tmp_path, jupyter_env):
    cells = [
        'from labkit.notebook import Lab\n\nLab.of("start-here").check(1)',  # before the setup cell
        'from labkit.notebook import Lab\n\nlab = Lab("start-here")',
        'from labkit.notebook import Lab\n\nLab.of("start-here").check(1)',  # before the step cell
        '%%step header\n"""warm-up"""',
        '%%step 1\ndef normalize_sku(s):\n    return s.strip()\n',
        '%%step 1\ndef normalize_sku(s):\n    if s = "":\n        return s\n',  # a syntax error
        'print(open("work/start-here/parts/1.py").read())',  # what step 1 is in the module now
        '%%step 1\ndef normalize_sku(s):\n    return helper(s)\n',
        'normalize_sku("x")',  # a scratch cell: NameError inside the step's function
        'lab.reveal(1)',
        'lab.reveal(1, confirm=True)',
        'lab.check(99)',
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    kernels.execute(nb, tmp_path)
    text = [_text_outputs(nbformat.v4.new_notebook(cells=[c])) for c in nb.cells]
    assert "Run the setup cell at the top of this notebook first" in text[0] and not _error_text(nb.cells[0])
    assert "not run yet" in text[2] and "Run the `%%step 1` cell above first" in text[2] and "✗" not in text[2]

    syntax = _error_text(nb.cells[5])
    assert "SyntaxError in your `%%step 1` cell" in syntax and "line 3" in syntax
    assert 'if s = "":' in syntax and "^" in syntax and "was NOT saved" in syntax
    assert "labkit" not in syntax and "site-packages" not in syntax  # only the student's cell
    assert "return s.strip()" in text[6]  # the version before the syntax error stays in the module

    scratch = _error_text(nb.cells[8])
    assert "return helper(s)" in scratch and "NameError" in scratch  # the step's own source line
    assert "labkit" not in scratch

    assert "your grader sees" in text[9] and "confirm=True" in text[9]
    shown = [o for o in nb.cells[10].outputs if o.get("metadata", {}).get("labkit", {}).get("revealed") == "1"]
    assert shown and '"-".join(s.split())' in text[10]
    revealed = json.loads((tmp_path / "work" / "revealed-start-here.json").read_text())
    assert set(revealed["steps"]) == {"1"}
    assert "Lab start-here has no step 99; its checks are 1." in text[11] and not _error_text(nb.cells[11])
