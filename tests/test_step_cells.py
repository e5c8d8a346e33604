"""A `%%step` cell means the same to the student's kernel and to the grader, line shape by shape;
a syntax error is shown in the student's own terms and never saved; errors name their cell."""

from __future__ import annotations

import json

import kernels
import nbformat
import pytest

from labkit.notebook import module_export

BODY = 'def shape_{n}():\n    return "shape {n}"\n'

# (first line(s) of the cell, the part both sides must save it as, or None: not saved anywhere)
SHAPES = [
    ("%%step 3", "3"),
    ("%%step  3", "3"),
    ("%%step\t3", "3"),
    ("%%step 3  # accept", "3"),
    ("%%step 3\t# accept\t", "3"),
    ("%%step 3 # a comment # with hashes", "3"),
    ("%%step 03", "3"),
    ("%%step header", "header"),
    ("\n\n%%step 3", "3"),  # IPython drops leading blank lines
    ("%%step 3 extra", None),
    ("%%step", None),
    ("%%step 99", None),  # not a step of lab outbox
    ("%%step final", None),
    ("%%step foo", None),
    ("%%step ３", None),  # a full-width digit
    ("%%stepx 3", None),  # another magic
    ("# my notes\n%%step 3", None),  # not the first line: IPython sees a line magic, not this one
    ("x = 1\n%%step 3", None),
]


def _cell(head: str, n: int) -> str:
    return f"{head}\n{BODY.format(n=n)}"


def test_the_reader_splits_a_step_cell_like_ipython():
    cell = module_export.read_step_cell("%%step 3  # accept\ndef f():\n    return 1\n", {"3"})
    assert (cell.part, cell.body, cell.problem) == ("3", "def f():\n    return 1\n", "")
    indented = module_export.read_step_cell("  %%step 3\n  def f():\n      return 1\n", {"3"})
    assert indented.part == "3" and indented.body.startswith("def f():")
    refused = module_export.read_step_cell("%%step 3 extra\nx = 1", {"3"})
    assert refused.part is None and "one step per cell" in refused.problem
    assert module_export.split_magic("print(1)") == (None, "print(1)")


def test_a_part_that_does_not_compile_is_not_graded_and_the_earlier_version_stays():
    nb = nbformat.v4.new_notebook(metadata={"labkit": {"lab": "outbox"}})
    nb.cells = [nbformat.v4.new_code_cell("%%step 3\ndef accept():\n    return 'first'"),
                nbformat.v4.new_code_cell("%%step 3\ndef accept(:\n    return 'broken'")]
    assert module_export.parts_from_notebook(nb) == {"3": "def accept():\n    return 'first'"}


def test_module_lines_map_back_to_the_students_cells():
    parts = {"header": "import json\n", "3": "\n\ndef accept():\n    x = undefined\n"}
    text = module_export.assemble(parts)
    line = text.splitlines().index("    x = undefined") + 1
    assert module_export.where(parts, line) == ("3", 5)  # %%step on 1, two blank lines, def on 4
    trace = f'  File "/tmp/x/worker.py", line {line}, in accept\n'
    assert "your `%%step 3` cell, line 5" in module_export.in_cell_terms(trace, "worker.py", parts)


@pytest.mark.slow
def test_kernel_and_grader_agree_on_every_line_shape(tmp_path, jupyter_env):

    reset = ('import shutil, json\nshutil.rmtree("work/outbox/parts", ignore_errors=True)\n'
             'from labkit.notebook import module_export\n')
    snapshot = 'print(json.dumps(module_export.saved_parts(module_export.Path("work"), "outbox")))'
    cells = [nbformat.v4.new_code_cell('from labkit.notebook import Lab\nlab = Lab("outbox")')]
    for n, (head, _) in enumerate(SHAPES):
        cells += [nbformat.v4.new_code_cell(reset), nbformat.v4.new_code_cell(_cell(head, n)),
                  nbformat.v4.new_code_cell(snapshot)]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"labkit": {"lab": "outbox"}})
    kernels.execute(nb, tmp_path)

    for n, (head, expected) in enumerate(SHAPES):
        shape_cell, after = nb.cells[2 + 3 * n], nb.cells[3 + 3 * n]
        kernel = json.loads("".join(o.get("text", "") for o in after.outputs if o.output_type == "stream"))
        single = nbformat.v4.new_notebook(cells=[shape_cell], metadata=nb.metadata)
        grader = module_export.parts_from_notebook(single)
        assert set(kernel) == set(grader) == ({expected} if expected else set()), (head, kernel, grader)
        if expected:
            assert kernel[expected].strip() == grader[expected].strip() == BODY.format(n=n).strip(), head
        else:  # the student was told why (no silent ignore)
            assert any(o.output_type in ("error", "stream") for o in shape_cell.outputs), head
