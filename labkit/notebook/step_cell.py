"""The `%%step N` cell magic: save a step cell into the student's module, in the student's terms.

- The cell's first line is read by `module_export.read_step_cell`, the same reader the grader
  uses, so a line the kernel refuses is one the grader ignores, and the other way round.
- A cell that does not compile is NOT saved: the previous version of that step stays in the
  module, and the student sees only their own cell, its line number and a caret.
- A cell that compiles is run here (so its functions can be tried in scratch cells), then
  saved. Its code is registered with IPython's own cache under "Cell In[N]", so tracebacks
  through these functions show the student's lines; an error while running it shows only the
  student's frames, and the cell is still saved (the checks then stop at the same line).
- A cell interrupted while it runs (Kernel → Interrupt on a loop at its top level) is NOT
  saved: what runs forever here would run forever on every import of the module. The student
  sees their own frames (where it was) and one line: "Step N was NOT saved: interrupted".
- Every run is recorded (`attempts.record`), saved or not, so a check can say which saved
  version it judged and warn when the cell above did not save.
- `%%step` is there from the kernel's start: `labkit start` makes every kernel of the
  workspace load `labkit.notebook.kernel` (a kernel spec of the course's own), which registers
  it before any setup cell; the lab comes from the notebook's metadata.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING

from labkit.notebook import attempts, module_export

if TYPE_CHECKING:
    from labkit.notebook.lab import Lab


class StepNotSaved(Exception):
    """A step cell that did not compile; IPython shows `_render_traceback_`, not our frames."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return self.lines


def _previous(lab: Lab, part: str) -> str:
    path = module_export.parts_dir(lab.workdir, lab.name) / f"{part}.py"
    if not path.exists():
        return f"Nothing of {_name(part)} is in `work/{lab.module_file}` yet."
    saved_at = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
    return f"`work/{lab.module_file}` keeps the version of {_name(part)} you ran at {saved_at}."


def _name(part: str) -> str:
    return "the provided code" if part == module_export.HEADER else f"step {part}"


def syntax_error_lines(exc: SyntaxError, part: str, number: int | None) -> list[str]:
    """Python's own rendering of the error (the line, the caret), headed by the student's cell."""
    where = f"Cell In[{number}], " if number else ""
    head = f"SyntaxError in {module_export.cell_name(part)} ({where}line {exc.lineno}):"
    body = traceback.format_exception_only(type(exc), exc)
    if body and body[0].lstrip().startswith("File "):
        body = body[1:]  # the file is this cell: named in the head line already
    return [head, *(line.rstrip("\n") for line in body)]


def _student_frames(tb, filename: str):
    """The traceback from the first frame of the student's cell on (our own frames dropped)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb


SETUP_FIRST = ("`%%step` does not know which lab this notebook is: run the setup cell at the top of "
               "this notebook first (`lab = Lab(...)`), then this cell again.")


def _lab_of_notebook() -> Lab | None:
    """The lab of the notebook this kernel runs (its metadata names it), set up quietly."""
    from labkit.notebook import lab as lab_mod

    if len(lab_mod._active) == 1:
        return next(iter(lab_mod._active.values()))
    notebook = attempts.notebook_path()
    if notebook is None:
        return None
    try:
        import nbformat

        name = nbformat.read(notebook, as_version=4).metadata.get("labkit", {}).get("lab")
        return lab_mod._active.get(name) or lab_mod.Lab(name, notebook.parent / "work", show=False)
    except Exception:  # noqa: BLE001 - no lab found: the student is told to run the setup cell
        return None


def register(lab: Lab | None) -> None:
    """Register `%%step` for this lab (again after a restart: the setup cell runs this), or,
    with None (the kernel extension, before any setup cell), for the notebook's own lab."""
    from IPython import get_ipython
    from IPython.core.error import UsageError

    shell = get_ipython()
    transforms = shell.input_transformers_cleanup
    if module_export.step_line_transform not in transforms:
        transforms.append(module_export.step_line_transform)

    def step(line: str, cell: str) -> None:
        current = lab or _lab_of_notebook()
        if current is None:
            raise UsageError(SETUP_FIRST)
        run_step(shell, current, line, cell)

    shell.register_magic_function(step, "cell", "step")


def run_step(shell, lab: Lab, line: str, cell: str) -> None:
    from IPython.core.error import UsageError

    part, problem = module_export.parse_step_arg(line, lab.parts)
    if problem:
        raise UsageError(problem)
    number = shell.execution_count - 1  # IPython counts the running cell before it runs it
    # IPython's own cache: tracebacks say "Cell In[N], line L" and show the student's lines.
    filename = shell.compile.cache(f"%%step {line}\n{cell}", number)
    try:
        code = module_export.compile_step(cell, filename)
    except (SyntaxError, ValueError) as exc:
        if not isinstance(exc, SyntaxError):
            exc = SyntaxError(str(exc))
        lines = syntax_error_lines(exc, part, number)
        lines.append(f"{_name(part).capitalize()} was NOT saved. {_previous(lab, part)} "
                     "Fix the line above and run this cell again.")
        attempts.record(lab.workdir, lab.name, part, cell, attempts.SYNTAX_ERROR)
        raise StepNotSaved(lines) from None
    try:
        exec(code, shell.user_ns)  # noqa: S102 - the student's own code, in their own kernel
    except KeyboardInterrupt as exc:
        # Not saved: a cell that had to be interrupted here would hang every import of the module.
        attempts.record(lab.workdir, lab.name, part, cell, attempts.INTERRUPTED)
        frames = _student_frames(exc.__traceback__, filename)
        stb = shell.InteractiveTB.structured_traceback(type(exc), exc, frames) if frames is not None else []
        raise StepNotSaved([*stb, f"{_name(part).capitalize()} was NOT saved: interrupted.",
                            f"{_previous(lab, part)} Code at the top level of a step cell runs every time "
                            "your module is imported: keep loops and waits inside functions."]) from None
    except BaseException as exc:  # SystemExit too: saved, as the judge would meet it on import
        module_export.save_part(lab.workdir, lab.name, lab.module_file, part, cell)
        attempts.record(lab.workdir, lab.name, part, cell, attempts.SAVED)
        frames = _student_frames(exc.__traceback__, filename)
        stb = shell.InteractiveTB.structured_traceback(type(exc), exc, frames)
        note = (f"{_name(part).capitalize()} was saved into work/{lab.module_file}, but running it "
                "raised the error above, so the checks will stop at the same line when they import "
                "your module.")
        if isinstance(exc, NameError) and module_export.HEADER not in lab.saved_parts():
            note += " Did you run the provided-code cell (`%%step header`) near the top first?"
        exc._render_traceback_ = lambda: [*stb, note]  # IPython shows this instead of our frames
        raise
    module_export.save_part(lab.workdir, lab.name, lab.module_file, part, cell)
    attempts.record(lab.workdir, lab.name, part, cell, attempts.SAVED)
