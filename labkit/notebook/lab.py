"""The in-kernel side of the course: write the student's module, run checks, show verdicts.

The kernel never judges: `check()` runs `python -m labkit check` in a separate process and
only displays the JSON it prints. Patching labkit inside the kernel changes the picture on
the student's own screen, never a grade.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from labkit.judge.verdict import LabVerdict, from_json
from labkit.labs import MODULE_FILES
from labkit.notebook import module_export

CHECK_TIMEOUT = 180.0  # the judge bounds each step itself; this only guards the guard


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


class Lab:
    """`lab = Lab("outbox")` in a notebook's first cell: registers `%%step`, shows the progress bar."""

    def __init__(self, name: str, workdir: str | os.PathLike = "work") -> None:
        self.name = name
        self.module_file = MODULE_FILES[name]
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._register_magic()
        if _in_kernel():
            self.progress()

    @property
    def last_final_path(self) -> Path:
        """The last final check's verdict (JSON), for `ladder()` after a kernel restart."""
        return self.workdir / f"last-final-{self.name}.json"

    @property
    def module_path(self) -> Path:
        return self.workdir / self.module_file

    def _register_magic(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

        def step(line: str, cell: str) -> None:
            part = line.strip()
            module_export.save_part(self.workdir, self.name, self.module_file, part, cell)
            # Also define the functions here, so the student can try them in scratch cells.
            exec(compile(cell, f"<step {part}>", "exec"), shell.user_ns)  # noqa: S102

        shell.register_magic_function(step, "cell", "step")

    def run_judge(self, step: str | int | None = None, seed: int | None = None) -> LabVerdict | str:
        """Run the judge in its own process; returns a verdict, or a message if it could not run."""
        if not self.module_path.exists():
            module_export.rebuild(self.workdir, self.name, self.module_file)
        cmd = [sys.executable, "-m", "labkit", "check", self.name, "--solution", str(self.module_path), "--json"]
        if step is not None:
            cmd += ["--step", str(step)]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=self.workdir)
        try:
            out, err = proc.communicate(timeout=CHECK_TIMEOUT)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.send_signal(signal.SIGTERM)  # the judge cleans up its children on SIGTERM
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
        try:
            return from_json(json.loads(out))
        except (ValueError, KeyError):
            return f"The check could not run (exit {proc.returncode}).\n{err.strip()[-2000:]}"

    def check(self, step: str | int):
        from labkit.notebook import progress
        from labkit.views import display

        verdict = self.run_judge(step)
        if isinstance(verdict, str):
            display.show_problem(verdict)
            return None
        display.show_verdict(self, verdict)
        if any(s.step == "final" for s in verdict.steps):
            module_export.write_atomic(self.last_final_path, json.dumps(verdict.to_json(), ensure_ascii=False))
        state = progress.load(self.workdir, self.name)
        state.record(verdict)
        progress.save(self.workdir, state)
        display.update_progress(state)
        if os.environ.get("NBGRADER_EXECUTION") and not verdict.passed:
            # nbgrader scores a test cell by whether it raises.
            raise AssertionError(f"{self.name} step {step} did not pass")
        return None

    def progress(self) -> None:
        """Show this lab's progress bar (saved in `work/progress-<lab>.json`)."""
        from labkit.notebook import progress
        from labkit.views import display

        display.show_progress(progress.load(self.workdir, self.name))

    def ladder(self) -> None:
        """Show the evidence ladder of the last final check you ran (also after a restart)."""
        from labkit.views import display

        try:
            verdict = from_json(json.loads(self.last_final_path.read_text(encoding="utf-8")))
            final = next(s for s in verdict.steps if s.step == "final")
        except (OSError, ValueError, KeyError, StopIteration):
            display.show_message("No final check has run yet: run the final check's cell, then this one again.")
            return
        if final.evidence is None or not final.evidence.ladder:
            display.show_message("The last final check observed no rungs (did it run at all?): run it again.")
            return
        display.show_ladder(final.evidence.ladder, verdict.seed)

    def quiz(self) -> None:
        """Show the lab's quiz; every answer is saved in `work/quiz-<lab>.json`."""
        from labkit.notebook import quiz
        from labkit.views import display

        questions = quiz.load(self.name)
        display.show_quiz(self.name, questions, quiz.answers(self.workdir, self.name),
                          lambda qid, index: quiz.record(self.workdir, self.name, questions, qid, index))

    def answer(self, question: str, choice: int | str) -> None:
        """Answer a quiz question without the widget: `lab.answer("inbox", "b")`."""
        from labkit.notebook import quiz

        questions = quiz.load(self.name)
        entry = quiz.record(self.workdir, self.name, questions, question, choice)
        verdict = "right" if entry["correct"] else "not quite"
        print(f"{question}: {verdict}.\n" + quiz.explain_text(quiz.find(questions, question), entry["choice"]))
