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

from labkit import module_export
from labkit.labs import MODULE_FILES
from labkit.verdict import LabVerdict, from_json

CHECK_TIMEOUT = 180.0  # the judge bounds each step itself; this only guards the guard


class Lab:
    """`lab = Lab("outbox")` in a notebook's first cell."""

    def __init__(self, name: str, workdir: str | os.PathLike = "work") -> None:
        self.name = name
        self.module_file = MODULE_FILES[name]
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._register_magic()

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
        from labkit import display

        verdict = self.run_judge(step)
        if isinstance(verdict, str):
            display.show_problem(verdict)
            return None
        display.show_verdict(self, verdict)
        if os.environ.get("NBGRADER_EXECUTION") and not verdict.passed:
            # nbgrader scores a test cell by whether it raises.
            raise AssertionError(f"{self.name} step {step} did not pass")
        return None
