"""Grade one submission, start to finish, in its own process (forked by the batch's forkserver).

Restore the released cells, then two independent things at once: the judge scores the
module assembled from the step cells (`labkit.judge.run.run_lab`, never the kernel), and nbclient
executes the notebook for the feedback page. Then the executed notebook, the feedback page and
— last, as the commit point — the result file are written.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import nbformat

from labkit import labs
from labkit.grading import feedback, gradebook, record, sandbox
from labkit.grading.execute import execute, prepare, untag
from labkit.grading.restore import Restored, check_step, restore
from labkit.grading.settings import CRASHED, EXECUTED, JOB_MARKER, OK, WORK, Limits
from labkit.grading.submissions import NotANotebook, read_notebook, slug
from labkit.judge import reaper
from labkit.judge.verdict import LabVerdict
from labkit.limits import RUN_MARKER
from labkit.notebook.module_export import assemble, parts_from_notebook

PR_SET_PDEATHSIG = 1


def _run_judge(job: dict, module: Path, box: dict) -> None:
    from labkit.judge.run import run_lab

    started = time.monotonic()
    try:
        verdict = run_lab(labs.load(job["lab"]), module, seed=job["seed"])
        box["seconds"] = time.monotonic() - started
        gradebook.write_atomic(record.partial_path(Path(job["out"]), job["key"]),
                               json.dumps(verdict.to_json()))
        box["verdict"] = verdict
    except BaseException as exc:  # a bug in the judge must not lose the notebook's run
        box["error"] = f"{type(exc).__name__}: {exc}"
        box["trace"] = traceback.format_exc()


def _quiz(kernel_dir: Path, lab: str) -> dict | None:
    path = kernel_dir / "work" / f"quiz-{lab}.json"
    try:  # the kernel made this file: no symlink out of its dir, no giant file
        if (path.is_file() and path.resolve().is_relative_to(kernel_dir.resolve())
                and path.stat().st_size <= 256 * 1024):
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {"answers": data}
    except (OSError, ValueError):
        pass
    return None


def _bring_quiz(job: dict, kernel_dir: Path) -> None:
    """A quiz answered in the student's own JupyterLab is saved beside the notebook, in work/."""
    name = f"quiz-{job['lab']}.json"
    source = Path(job["path"]).parent / "work" / name
    try:
        if source.is_file() and not source.is_symlink() and source.stat().st_size <= 256 * 1024:
            (kernel_dir / "work").mkdir(exist_ok=True)
            shutil.copyfile(source, kernel_dir / "work" / name)
    except OSError:
        pass


def grade(job: dict) -> dict:
    started = time.monotonic()
    out = Path(job["out"])
    limits = Limits.from_env()
    marker = job["marker"]
    work = out / WORK / job["key"]
    shutil.rmtree(work, ignore_errors=True)
    judge_dir, kernel_dir = work / "judge", work / "kernel"
    judge_dir.mkdir(parents=True)
    kernel_dir.mkdir(parents=True)
    judge_dir.chmod(0o700)
    # This process's own Jupyter files (none expected) stay in the submission's dir too.
    os.environ.update({k: v for k, v in sandbox.redirected_env(judge_dir).items() if k.startswith("JUPYTER_")})
    try:
        try:
            nb = nbformat.from_dict(read_notebook(Path(job["path"]).read_bytes()))
        except (OSError, NotANotebook) as exc:
            return record.malformed(job, str(exc))
        flags = list(job.get("flags", []))
        if job.get("release"):
            release = nbformat.from_dict(read_notebook(Path(job["release"]).read_bytes()))
            restored = restore(nb, release)
        else:
            restored = Restored(nb, ["no-release"], set())
        flags += restored.flags

        module = judge_dir / labs.MODULE_FILES[job["lab"]]
        module.write_text(assemble(parts_from_notebook(restored.nb)), encoding="utf-8")
        box: dict = {}
        judge = threading.Thread(target=_run_judge, args=(job, module, box), name="judge", daemon=True)
        judge.start()

        _bring_quiz(job, kernel_dir)
        skip = {c.get("id") for c in restored.nb.cells
                if check_step(c) is not None and c.get("id") in restored.released_ids}
        executed = prepare(restored.nb, skip)
        execution = execute(executed, kernel_dir, limits, marker, job.get("private_fs", False))
        executed_at = time.monotonic()
        judge.join()
        verdict: LabVerdict | None = box.get("verdict")

        untag(executed, skip)
        feedback.mark_death(executed, execution.died_at, execution.message)
        feedback.sanitize_student_cells(executed, restored.released_ids)
        feedback.fill_checks(executed, verdict, restored.released_ids)
        quiz = _quiz(kernel_dir, job["lab"])
        gradebook.write_atomic(out / EXECUTED / slug(job["student"]) / f"{job['lab']}.ipynb",
                               nbformat.writes(executed))

        status, message, notes = execution.status, execution.message, []
        if execution.status != OK:
            notes.append(f"{execution.message} Your score does not depend on the kernel: the grader "
                         "scores the code of your step cells in separate processes.")
        if execution.truncated_cells:
            cells = ", ".join(map(str, execution.truncated_cells))
            notes.append(f"The output of cell(s) {cells} was too long and was cut.")
        if verdict is None:
            status = CRASHED
            message = f"The judge could not run: {box.get('error', 'unknown error')}"
            notes.append(message)
        return record.finish(job, status=status, message=message, flags=flags, verdict=verdict,
                             seconds=time.monotonic() - started, nb=executed, notes=notes, quiz=quiz,
                             extra={"execution": asdict(execution), "judge_trace": box.get("trace", ""),
                                    "timings": {"judge": box.get("seconds"), "execute": execution.seconds,
                                                "judge_wait": time.monotonic() - executed_at,
                                                "total": time.monotonic() - started}})
    finally:
        sandbox.sweep(marker)
        shutil.rmtree(work, ignore_errors=True)


def _detach(log: Path) -> None:
    """Own session, own output file, and death with the forkserver (which dies with the grader)."""
    try:
        os.setsid()
    except OSError:
        pass
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def entry(job: dict, log: str) -> None:
    """The forkserver's target: one process per submission."""
    _detach(Path(log))
    # Everything this worker starts carries the job marker (the judge's children too); only the
    # kernel gets it as its LABKIT_RUN marker, so sweeping the kernel never touches the judge.
    os.environ.pop(RUN_MARKER, None)
    os.environ[JOB_MARKER] = job["marker"]
    reaper.become_subreaper()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    grade(job)
    sys.stdout.flush()
    sys.stderr.flush()
