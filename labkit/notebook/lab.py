"""The in-kernel side of the course: write the student's module, run checks, show verdicts.

The kernel never judges: `check()` runs `python -m labkit check` in a separate process and
only displays the JSON it prints. Patching labkit inside the kernel changes the picture on
the student's own screen, never a grade.

The setup cell (`lab = Lab("outbox")`) registers the lab for this kernel. The course's own
cells reach it through `Lab.of("outbox")`, which, before the setup cell has run (a fresh
kernel, or one just restarted), says so instead of failing with a `NameError`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from labkit import labs
from labkit.judge.verdict import Case, LabVerdict, Outcome, StepVerdict, from_json
from labkit.notebook import module_export, step_cell, warm_judge

SETUP_FIRST = ("Run the setup cell at the top of this notebook first (`lab = Lab(\"{lab}\")`): a fresh or "
               "restarted kernel does not know this lab yet. Then run this cell again.")

_active: dict[str, Lab] = {}  # lab name → the Lab the setup cell made in this kernel


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


class NotSetUp:
    """What `Lab.of(name)` gives before the setup cell ran: every call says to run it first."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):
            raise AttributeError(attribute)

        def tell(*args, **kwargs) -> None:
            from labkit.views import display

            display.show_next(SETUP_FIRST.format(lab=self.name))

        return tell


class Lab:
    """`lab = Lab("outbox")` in a notebook's first cell: registers `%%step`, shows the progress bar."""

    def __init__(self, name: str, workdir: str | os.PathLike = "work", *, show: bool = True) -> None:
        self.name = name
        self.module_file = labs.manifest(name).module_file
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.parts = module_export.lab_parts(name)
        _active[name] = self
        if _in_kernel():
            step_cell.register(self)
            if show:  # `%%step` run before the setup cell makes its Lab quietly
                self.progress()

    @classmethod
    def of(cls, name: str) -> Lab | NotSetUp:
        """The lab the setup cell made in this kernel, or a stand-in that says to run setup first."""
        return _active.get(name) or NotSetUp(name)

    @property
    def last_final_path(self) -> Path:
        """The last final check's verdict (JSON), for `ladder()` after a kernel restart."""
        return self.workdir / f"last-final-{self.name}.json"

    @property
    def module_path(self) -> Path:
        return self.workdir / self.module_file

    def saved_parts(self) -> dict[str, str]:
        return module_export.saved_parts(self.workdir, self.name)

    def run_judge(self, step: str | int | None = None, seed: int | None = None) -> LabVerdict | str:
        """Ask the kernel's judge (its own process, `warm_judge`); a verdict, or a message if it could not run."""
        if not self.module_path.exists():
            module_export.rebuild(self.workdir, self.name, self.module_file)
        request = {"lab": self.name, "solution": str(self.module_path.resolve()),
                   "steps": [str(step)] if step is not None else [], "seed": seed}
        reply = warm_judge.run(request, Path(self.workdir).resolve())
        if isinstance(reply, str):
            return reply
        if "error" in reply:
            return f"The check could not run.\n{reply['error']}"
        try:
            return from_json(reply)
        except (ValueError, KeyError, TypeError) as exc:
            return f"The check could not run: its verdict could not be read ({exc})."

    def _not_run_yet(self, step: str, saved: dict[str, str]) -> LabVerdict | None:
        """A check before its step cell (or before the provided-code cell) has nothing to judge:
        a grey verdict that names the cell to run, without starting the judge."""
        if not step.isdigit() or (step in saved and module_export.HEADER in saved):
            return None
        spec = labs.manifest(self.name).step(step)
        if step in saved:  # the step ran, but the module's head (imports, exceptions) never did
            cell = "the provided-code cell (`%%step header`) near the top"
        else:
            cell = f"the `%%step {step}` cell above"
        case = Case(f"{cell} has not run yet", Outcome.MISSING, called=f"%%step {step}",
                    hint=f"Run {cell}, then this check again.")
        return LabVerdict(self.name, seed=0, steps=[StepVerdict(spec.step, spec.title, spec.points, [case])])

    def check(self, step: str | int):
        from labkit.notebook import progress
        from labkit.views import display

        known = [str(s.step) for s in labs.manifest(self.name).steps]
        if str(step) not in known:
            display.show_next(f"Lab {self.name} has no step {step!r}; its checks are {', '.join(known)}.")
            return None
        saved = self.saved_parts()
        verdict = self._not_run_yet(str(step), saved)
        if verdict is not None:  # nothing was judged: no seed to show
            self._provenance(verdict, saved)
            verdict.steps[0].judged = ""
            display.show_step(verdict.steps[0], None, saved)
        else:
            verdict = self.run_judge(step)
            if isinstance(verdict, str):
                display.show_problem(verdict)
                return None
            self._in_cell_terms(verdict, saved)
            self._provenance(verdict, saved)
            if any(s.step == "final" for s in verdict.steps):
                module_export.write_atomic(self.last_final_path, json.dumps(verdict.to_json(), ensure_ascii=False))
            display.show_verdict(verdict, saved)
        state = progress.load(self.workdir, self.name)
        state.record(verdict, saved)
        progress.save(self.workdir, state)
        display.update_progress(state)
        if os.environ.get("NBGRADER_EXECUTION") and not verdict.passed:
            # nbgrader scores a test cell by whether it raises.
            raise AssertionError(f"{self.name} step {step} did not pass")
        return None

    def _provenance(self, verdict: LabVerdict, saved: dict[str, str]) -> None:
        """Which saved version each step's verdict is about, and a warning when the step's cell
        did not save at its last run or changed since (`attempts.provenance`)."""
        from labkit.notebook import attempts

        notebook = attempts.notebook_path()
        for step in verdict.steps:
            step.judged, step.warning = attempts.provenance(self.workdir, self.name, str(step.step), saved,
                                                            notebook, self.parts)

    def _in_cell_terms(self, verdict: LabVerdict, saved: dict[str, str]) -> None:
        """Line numbers in the assembled module → the student's own cells and lines."""
        for step in verdict.steps:
            for case in step.cases:
                case.trace = module_export.in_cell_terms(case.trace, self.module_file, saved)
                case.got = module_export.in_cell_terms(case.got, self.module_file, saved)

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
            display.show_next("No final check has run yet: run the final check's cell, then this one again.")
            return
        if final.waiting:  # also a verdict saved before the judge stopped drawing these
            display.show_next("Nothing to show yet: your last final check was waiting for your steps (some are "
                              "still the skeleton or not run), so its scenario never ran and the judge observed "
                              "nothing. Finish the steps still marked ·, run the final check's cell, then this "
                              "one again.")
            return
        if final.evidence is None or not final.evidence.ladder:
            display.show_next("Nothing to show yet: the last final check observed no rungs (it did not get as far "
                              "as the crash). Run the final check's cell again, then this one.")
            return
        display.show_ladder(final.evidence.ladder, verdict.seed)

    def quiz(self) -> None:
        """Show the lab's quiz; every answer is saved in `work/quiz-<lab>.json`."""
        from labkit.notebook import quiz
        from labkit.views import display

        questions = quiz.load(self.name)
        display.show_quiz(self.name, questions, lambda: quiz.answers(self.workdir, self.name),
                          lambda qid, index: quiz.record(self.workdir, self.name, questions, qid, index))

    def answer(self, question: str, choice: int | str) -> None:
        """Answer a quiz question without the widget: `lab.answer("inbox", "b")`."""
        from labkit.notebook import quiz
        from labkit.views import display, render_quiz

        questions = quiz.load(self.name)
        entry = quiz.record(self.workdir, self.name, questions, question, choice)
        verdict = "right" if entry["correct"] else "not quite"
        print(f"{question}: {verdict}.\n" + render_quiz.explain_text(quiz.find(questions, question), entry["choice"]))
        display.update_quiz(self.name, questions, quiz.answers(self.workdir, self.name))

    def reveal(self, step: int | str, confirm: bool = False) -> None:
        """Show one step's reference solution, after you tried. Asks first; your grader sees it."""
        from labkit.notebook import reveal

        reveal.offer(self, str(step), confirm)
