"""Grade one submission, start to finish, in its own process (forked by the batch's forkserver).

Restore the released cells, then two independent things at once: the judge scores the
module assembled from the step cells (in its own box: `judge_box`, never the kernel), and
nbclient executes the notebook for the feedback page (its kernel in a sandbox: `kernel_box`).
Then the executed notebook, the feedback page and — last, as the commit point — the result
file are written. Nothing a sandbox could write is read back: the verdict comes on the
judge's pipe, the quiz answers from the submitted folder (scored against the answer key).
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
from labkit.grading import answers, bounded, feedback, gradebook, judge_box, record
from labkit.grading.execute import cap_outputs, execute, prepare, untag
from labkit.grading.kernel_box import HOME, KernelBox
from labkit.grading.restore import Restored, check_step, restore
from labkit.grading.settings import (
    CRASHED,
    EXECUTED,
    JOB_MARKER,
    MAX_NOTEBOOK_BYTES,
    OK,
    Limits,
    socket_folder,
    work_folder,
)
from labkit.grading.submissions import NotANotebook, read_capped, read_notebook, slug
from labkit.judge.verdict import LabVerdict
from labkit.limits import RUN_MARKER
from labkit.notebook.module_export import assemble, parts_from_notebook
from labkit.sandbox import course_view, reaper, zygote

PR_SET_PDEATHSIG = 1
# The process this module was imported in: the forkserver, whose forks are the workers.
_IMPORTED_IN = os.getpid()


def _run_judge(job: dict, module: Path, box: dict, limits: Limits) -> None:
    """The judge in its own box (`judge_box`); its verdict arrives on a pipe only it holds."""
    try:
        run = judge_box.run(job["lab"], module, job["seed"], uid=job.get("uid"),
                            timeout=limits.notebook_timeout + limits.worker_grace / 2,
                            marker_env={JOB_MARKER: job["marker"]}, judges=_templates(job).get("judges"))
        box["seconds"], box["sandbox"] = run.seconds, run.sandbox
        if run.verdict is None:
            box["error"] = run.error
            return
        gradebook.write_atomic(record.partial_path(Path(job["out"]), job["key"]),
                               json.dumps(run.verdict.to_json()))
        box["verdict"] = run.verdict
    except BaseException as exc:  # a bug in the grader must not lose the notebook's run
        box["error"] = f"{type(exc).__name__}: {exc}"
        box["trace"] = traceback.format_exc()


def _templates(job: dict) -> dict[str, str]:
    """The batch's templates (`batch._start_templates`) this worker forks from."""
    return job.get("templates") or {}


def _shown_quiz(job: dict, raw: dict | None, work: Path) -> dict[Path, str]:
    """The student's own quiz answers, shown (read-only) to the kernel's quiz cell."""
    if raw is None:
        return {}
    copy = work / "quiz.json"
    copy.write_text(json.dumps(raw), encoding="utf-8")
    copy.chmod(0o644)
    return {copy: f"{HOME}/work/quiz-{job['lab']}.json"}


def _read_submission(job: dict, release) -> tuple[Restored, str, dict | None]:
    """The notebook (bounded, its shape checked), restored; the module its step cells make; the
    quiz answers. Raises for anything in the student's files that cannot be read."""
    nb = nbformat.from_dict(read_notebook(read_capped(Path(job["path"]), MAX_NOTEBOOK_BYTES)))
    restored = restore(nb, release) if release is not None else Restored(nb, ["no-release"], set())
    code = assemble(parts_from_notebook(restored.nb))
    code.encode("utf-8")  # (read_notebook refuses lone surrogates; this is where one would fail)
    return restored, code, answers.read(Path(job["path"]), job["lab"])


def grade(job: dict) -> dict:
    started = time.monotonic()
    out = Path(job["out"])
    limits = Limits.from_env()
    marker = job["marker"]
    work = work_folder(out, job["key"], marker)
    shutil.rmtree(work, ignore_errors=True)
    judge_dir, sockets = work / "judge", socket_folder(out, job["key"], job["marker"])
    shutil.rmtree(sockets, ignore_errors=True)
    judge_dir.mkdir(parents=True)
    work.chmod(0o711)  # the sandboxes reach their own paths below it, and cannot list it
    judge_dir.chmod(0o711)
    kernel = None
    try:
        release = nbformat.from_dict(read_notebook(Path(job["release"]).read_bytes())) if job.get("release") else None
        try:  # the student's files: whatever they hold ends as this submission's malformed row
            restored, code, raw_quiz = _read_submission(job, release)
        except (NotANotebook, bounded.Refused) as exc:
            return record.malformed(job, str(exc))
        except OSError as exc:
            return record.malformed(job, f"The file could not be read: {exc.strerror or exc}.")
        except Exception as exc:
            return record.malformed(job, f"The grader could not read this submission ({bounded.describe(exc)}).")
        flags = list(job.get("flags", [])) + restored.flags

        module = judge_dir / labs.manifest(job["lab"]).module_file
        module.write_text(code, encoding="utf-8")
        module.chmod(0o644)
        box: dict = {}
        judge = threading.Thread(target=_run_judge, args=(job, module, box, limits), name="judge", daemon=True)
        judge.start()

        skip = {c.get("id") for c in restored.nb.cells
                if check_step(c) is not None and c.get("id") in restored.released_ids}
        executed = prepare(restored.nb, skip)
        kernel = KernelBox(sockets, job["lab"], limits, marker, job.get("uid"), _shown_quiz(job, raw_quiz, work),
                           template=_templates(job).get("kernels"))
        execution = execute(executed, kernel, limits)
        kernel.close()
        executed_at = time.monotonic()
        judge.join()
        verdict: LabVerdict | None = box.get("verdict")

        untag(executed, skip)
        feedback.mark_death(executed, execution.died_at, execution.message)
        feedback.sanitize_student_cells(executed, restored.released_ids)
        feedback.fill_checks(executed, verdict, restored.released_ids)
        # The cap, measured on the notebook as it is written (the grader's verdicts are not counted).
        cut = cap_outputs(executed, limits, skip)
        execution.truncated_cells = sorted(set(execution.truncated_cells) | set(cut))
        quiz = answers.score(job["lab"], raw_quiz)  # correctness from the answer key, never the file
        gradebook.write_atomic(out / EXECUTED / slug(job["student"]) / f"{job['lab']}.ipynb",
                               nbformat.writes(executed))

        status, message, notes = execution.status, execution.message, []
        if execution.status != OK:
            notes.append(f"{execution.message} Your score does not depend on the kernel: the grader "
                         "scores the code of your step cells in separate processes.")
        if execution.truncated_cells:
            shown = execution.truncated_cells[:20]
            more = len(execution.truncated_cells) - len(shown)
            cells = ", ".join(map(str, shown)) + (f" and {more} more" if more else "")
            notes.append(f"The output of cell(s) {cells} was too long and was cut.")
        if verdict is None:
            status = CRASHED
            message = f"The judge could not run: {box.get('error', 'unknown error')}"
            notes.append(message)
        return record.finish(job, status=status, message=message, flags=flags, verdict=verdict,
                             seconds=time.monotonic() - started, nb=executed, notes=notes, quiz=quiz,
                             extra={"execution": asdict(execution), "judge_trace": box.get("trace", ""),
                                    "judge_sandbox": box.get("sandbox"),
                                    "timings": {"judge": box.get("seconds"), "execute": execution.seconds,
                                                "judge_wait": time.monotonic() - executed_at,
                                                "total": time.monotonic() - started}})
    finally:
        if kernel is not None:
            kernel.close()
        reaper.kill_marked(marker)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)


def _let_go_of_forkserver() -> None:
    """multiprocessing hands every forked child the write end of the forkserver's "alive" pipe,
    and the forkserver exits only at its EOF: with workers holding it, a SIGKILLed grader's
    forkserver lived on, so did its workers (their death signal is the forkserver's), grading
    into --out beside the rerun. Closed here, the grader is its only holder again."""
    from multiprocessing import forkserver

    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)  # private, 3.4 to 3.13
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None


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
    _let_go_of_forkserver()
    # A forkserver that died between the fork and the line above (its grader killed just as it
    # started this job) sent no signal: this worker would grade on, an orphan, into --out.
    if os.getpid() != _IMPORTED_IN and os.getppid() != _IMPORTED_IN:
        os._exit(1)


def entry(job: dict, log: str) -> None:
    """The forkserver's target: one process per submission."""
    _detach(Path(log))
    # Everything this worker starts carries the job marker (the judge's children too); only the
    # kernel gets it as its LABKIT_RUN marker, so sweeping the kernel never touches the judge.
    os.environ.pop(RUN_MARKER, None)
    os.environ[JOB_MARKER] = job["marker"]
    reaper.become_subreaper()
    zygote.use_templates({role.removeprefix("child:"): path for role, path in _templates(job).items()
                          if role.startswith("child:")})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        grade(job)
    finally:
        reaper.collect_zombies()  # the sandboxes' dead that re-parented to this worker
        course_view.remove()  # the forkserver ends this process by os._exit: no atexit
    sys.stdout.flush()
    sys.stderr.flush()
