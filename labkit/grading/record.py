"""Record one submission's outcome: the feedback page first, then the result file.

The result file is the commit point: a submission counts as graded once it exists. Used by
the worker for a normal grade, and by the batch for a malformed file or a worker that ended
without a result (then the verdict the judge saved early, if any, keeps the steps' points).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from labkit import labs
from labkit.grading import feedback, gradebook
from labkit.grading.settings import FEEDBACK, MALFORMED, SKIPPED
from labkit.grading.submissions import Skipped, page_name, slug
from labkit.judge.verdict import LabVerdict, from_json


def partial_path(out: Path, key: str) -> Path:
    """Where the worker saves the verdict as soon as the judge is done, before anything else."""
    return gradebook.results_dir(out) / f"{key}.verdict"


def page_path(out: Path, student: str, name: str) -> Path:
    return out / FEEDBACK / slug(student) / f"{name}.html"


def steps_of(verdict: LabVerdict | None, lab: str) -> tuple[dict[str, int], int]:
    if verdict is not None:
        return {str(s.step): s.points for s in verdict.steps}, verdict.max_score
    steps = labs.manifest(lab).steps
    return {str(s.step): 0 for s in steps}, sum(s.points for s in steps)


def finish(job: dict, *, status: str, message: str, flags: list[str], verdict: LabVerdict | None,
           seconds: float, nb=None, notes: list[str] | None = None, quiz: dict | None = None,
           extra: dict | None = None) -> dict:
    out, lab = Path(job["out"]), job.get("lab") or ""
    steps, max_points = steps_of(verdict, lab) if lab else ({}, 0)
    row = gradebook.make_row(student=job["student"], lab=lab, notebook=job["notebook"], steps=steps,
                             max_points=max_points, status=status, flags=flags,
                             seed=job.get("seed") if lab else None, seconds=seconds, message=message,
                             quiz=quiz, sandbox=job.get("sandbox", ""), submitted_at=job.get("submitted_at"),
                             revealed=job.get("revealed") if lab else None)
    name = page_name(lab, Path(job["path"]).name)
    gradebook.write_atomic(page_path(out, job["student"], name),
                           feedback.page(row, verdict, nb, notes or []))
    result = {"row": row, "sha256": job.get("sha256", ""), "seed": job.get("seed"),
              "marker": job.get("marker"), "verdict": verdict.to_json() if verdict else None,
              "graded_at": time.time(), **(extra or {})}
    gradebook.save_result(out, job["key"], result)
    partial_path(out, job["key"]).unlink(missing_ok=True)
    return result


def malformed(job: dict, message: str) -> dict:
    return finish(job, status=MALFORMED, message=message, flags=list(job.get("flags", [])),
                  verdict=None, seconds=0.0)


def fallback(job: dict, status: str, message: str, seconds: float) -> dict:
    """The worker ended without a result: keep the verdict if the judge had finished."""
    verdict = None
    try:
        verdict = from_json(json.loads(partial_path(Path(job["out"]), job["key"]).read_text()))
    except (OSError, ValueError, KeyError):
        pass
    if verdict is None:
        message += " The judge had not finished either, so no step could be scored."
    return finish(job, status=status, message=message, flags=list(job.get("flags", [])),
                  verdict=verdict, seconds=seconds)


def skipped_rows(out: Path, skipped: list[Skipped], sandbox: str) -> None:
    """Every path found but not graded, with its reason: rows of the gradebook (rewritten each run)."""
    from labkit.grading.batch import _shown

    rows = [gradebook.make_row(student=item.student, lab="", notebook=_shown(item.path), steps={},
                               max_points=0, status=SKIPPED, flags=[], seed=None, seconds=0.0,
                               message=f"Not graded: {item.reason}.", sandbox=sandbox)
            for item in skipped]
    gradebook.write_atomic(gradebook.skipped_path(out), json.dumps(rows, ensure_ascii=False, indent=1))
