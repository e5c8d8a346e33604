"""The `%%step N` cell magic: save a step cell into the student's module, in the student's terms.

- The cell's first line is read by `module_export.read_step_cell`, the same reader the grader
  uses, so a line the kernel refuses is one the grader ignores, and the other way round.
- A cell that does not compile is NOT saved: the previous version of that step stays in the
  module, and the student sees only their own cell, its line number and a caret.
- A cell that compiles is saved, then run here too, so its functions can be tried in scratch
  cells. Its code is registered with IPython's own cache under "Cell In[N]", so tracebacks
  through these functions show the student's lines; an error while running it shows only the
  student's frames.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING

from labkit.notebook import module_export

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


def register(lab: Lab) -> None:
    """Register `%%step` for this lab (again after a restart: the setup cell runs this)."""
    from IPython import get_ipython
    from IPython.core.error import UsageError

    shell = get_ipython()
    transforms = shell.input_transformers_cleanup
    if module_export.step_line_transform not in transforms:
        transforms.append(module_export.step_line_transform)

    def step(line: str, cell: str) -> None:
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
            raise StepNotSaved(lines) from None
        module_export.save_part(lab.workdir, lab.name, lab.module_file, part, cell)
        try:
            exec(code, shell.user_ns)  # noqa: S102 - the student's own code, in their own kernel
        except Exception as exc:
            frames = _student_frames(exc.__traceback__, filename)
            stb = shell.InteractiveTB.structured_traceback(type(exc), exc, frames)
            note = (f"{_name(part).capitalize()} was saved into work/{lab.module_file}, but running it "
                    "raised the error above, so the checks will stop at the same line when they import "
                    "your module.")
            if isinstance(exc, NameError) and module_export.HEADER not in lab.saved_parts():
                note += " Did you run the provided-code cell (`%%step header`) near the top first?"
            exc._render_traceback_ = lambda: [*stb, note]  # IPython shows this instead of our frames
            raise

    shell.register_magic_function(step, "cell", "step")
