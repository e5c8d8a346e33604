"""Grade a batch: find the submissions, skip what is already graded, run the rest in parallel.

Each submission is graded by its own worker process (`labkit.grading.worker`), so one that
hangs, crashes or eats memory cannot delay or lose another's grade. A worker that overruns
its hard limit is killed with everything it started; its grade is then built from whatever
it had finished. The gradebook is rebuilt from the per-submission result files at the end,
so a rerun after an interruption continues where it stopped and never counts twice.
"""

from __future__ import annotations

import fcntl
import functools
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from labkit import labs, sandbox
from labkit.grading import (
    answers,
    bounded,
    gradebook,
    manifest,
    record,
    reveals,
    submissions,
    sweep,
)
from labkit.grading.settings import (
    CRASHED,
    EXECUTED,
    FEEDBACK,
    JOB_MARKER,
    TIMEOUT,
    WARM_LABS_ENV,
    WORK,
    Limits,
    release_dir,
    socket_folder,
    socket_folders,
    work_folder,
)
from labkit.grading.shards import WHOLE, Shard, shard_of
from labkit.grading.terminal import safe, safe_lines
from labkit.limits import step_timeout
from labkit.sandbox import course_view, reaper


class BatchUsageError(Exception):
    """Bad arguments: the command exits 2 with this message."""


@dataclass
class Batch:
    out: Path
    seed: int
    jobs: int
    force: bool
    limits: Limits = field(default_factory=Limits.from_env)
    sandboxed: bool = True  # False only with --no-sandbox
    sandbox_label: str = ""  # what the gradebook says about it
    shard: Shard = WHOLE
    # The sockets of the batch's templates: "judges", "kernels", and "child:<lab package>".
    templates: dict[str, str] = field(default_factory=dict)


def _lock(out: Path):
    fh = open(out / ".lock", "w")  # held (and locked) for the whole run
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise BatchUsageError(f"another `grade` run is writing to {out}") from None
    return fh


def _running_file(out: Path, key: str) -> Path:
    return gradebook.results_dir(out) / f"{key}.running"


def clean_stale(out: Path) -> int:
    """Kill and remove what an interrupted earlier run left: processes, work dirs, temp files."""
    folder = gradebook.results_dir(out)
    killed = 0
    for path in folder.glob("*.running") if folder.is_dir() else []:
        try:
            marker = json.loads(path.read_text())["marker"]
        except (OSError, ValueError, KeyError, TypeError):
            marker = None
        if marker:
            killed += _sweep(marker)
        for sockets in socket_folders(out, path.stem):
            shutil.rmtree(sockets, ignore_errors=True)
        path.unlink(missing_ok=True)
    for partial in folder.glob("*.verdict") if folder.is_dir() else []:
        partial.unlink(missing_ok=True)
    shutil.rmtree(out / WORK, ignore_errors=True)
    for sub in (gradebook.results_dir(out), out / FEEDBACK, out / EXECUTED):
        for tmp in sub.rglob(".*.tmp") if sub.is_dir() else []:
            tmp.unlink(missing_ok=True)
    return killed


def batch_seed(out: Path, seed: int | None) -> int:
    """--seed, else the seed this DIR was first graded with (a resumed batch keeps its cases)."""
    state = gradebook.results_dir(out) / "batch.state"
    if seed is None:
        try:
            seed = int(json.loads(state.read_text())["seed"])
        except (OSError, ValueError, KeyError, TypeError):
            seed = random.randrange(1, 2**31)
    gradebook.write_atomic(state, json.dumps({"seed": seed}))
    return seed


def _shown(path: Path) -> str:
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return submissions.shown_name(shown)  # a path that is not UTF-8 is listed, never graded


def examine_contained(sub: submissions.Submission, known: dict, lab_names: list[str]) -> None:
    """Read and examine one submission — its notebook, the reveals in it and in
    `work/revealed-<lab>.json`, and `work/quiz-<lab>.json` — so that nothing its files hold
    reaches the batch: every failure, of any kind, is this submission's `problem` (its row is
    `malformed`, with the reason), and no one else's row is touched.

    Deep input never reaches a recursive parser (`bounded`: the nesting is counted by a linear
    scan before json.loads); this `try` is the second wall, for whatever else a file could
    make the grader's own code raise (RecursionError and MemoryError included)."""
    try:
        nb = submissions.examine(sub, known, lab_names)
        if nb is not None and sub.lab:
            sub.revealed = reveals.read(sub.path, sub.lab, nb, [str(s.step) for s in labs.manifest(sub.lab).steps])
            answers.read(sub.path, sub.lab)  # the worker reads it again; a damaged file is refused here
    except bounded.Refused as exc:
        sub.problem, sub.revealed = str(exc), []
    except Exception as exc:
        sub.problem, sub.revealed = f"The grader could not read this submission ({bounded.describe(exc)}).", []


def make_job(sub: submissions.Submission, batch: Batch, known: dict) -> dict:
    release = known.get(sub.lab) if sub.lab else None
    return {"student": sub.student, "path": str(sub.path), "notebook": _shown(sub.path),
            "sha256": sub.sha256, "lab": sub.lab, "flags": list(sub.flags), "key": sub.key,
            "release": str(release.path) if release else None, "seed": batch.seed,
            "out": str(batch.out), "problem": sub.problem, "sandbox": batch.sandbox_label,
            "submitted_at": sub.submitted_at, "revealed": list(sub.revealed) if sub.lab else None}


def _order(job: dict) -> tuple:
    """Malformed files first (they take no time), then the largest notebooks: the more a
    student solved, the longer the judge runs, and the longest jobs started first leave no
    long one alone at the end with the other slots idle (LPT scheduling)."""
    try:
        size = os.stat(job["path"]).st_size
    except OSError:
        size = 0
    return gradable(job), -size, job["key"]


def gradable(job: dict) -> bool:
    """A job for a worker: its lab is known and nothing in its files was refused. (A lab's notebook
    whose side files were refused keeps its lab: its malformed row stands under that lab.)"""
    return bool(job["lab"]) and not job["problem"]


def already_graded(job: dict, batch: Batch, explicit_seed: int | None) -> bool:
    if batch.force:
        return False
    result = gradebook.read_result(gradebook.result_path(batch.out, job["key"]))
    if result is None or result.get("sha256") != job["sha256"]:
        return False
    return explicit_seed is None or not job["lab"] or result.get("seed") == explicit_seed


@dataclass
class Running:
    job: dict
    proc: multiprocessing.Process
    started: float
    deadline: float
    log: Path


def _context():
    """Workers fork from a forkserver that imported everything once (see `warm`)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["labkit.grading.warm"])
    return ctx


def _start_templates(labs_graded: list[str]) -> dict:
    """The templates each submission's judge, kernel and the judge's children are forked from,
    where they can run: a child's by its lab's package (and one for children of no lab)."""
    from labkit.grading import judge_box, kernel_box
    from labkit.judge.child import site_packages
    from labkit.sandbox import zygote

    starts = {"judges": functools.partial(judge_box.start_template, labs_graded), "kernels": kernel_box.start_template}
    for package in ["", *(labs.manifest(lab).package for lab in labs_graded)]:
        env = zygote.child_env(package or None, site_packages())
        starts[f"child:{package}"] = functools.partial(zygote.start_template, env)
    with ThreadPoolExecutor(len(starts)) as pool:  # they warm up side by side
        started = dict(zip(starts, pool.map(lambda start: start(), starts.values()), strict=True))
    return {role: template for role, template in started.items() if template is not None}


def _start_forkserver(labs_graded: list[str]) -> None:
    from multiprocessing import forkserver

    os.environ[WARM_LABS_ENV] = ",".join(labs_graded)  # read by `warm` in the forkserver
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(WARM_LABS_ENV, None)


def _stop_forkserver() -> None:
    """Stop the forkserver and resource tracker and collect them, so the grader leaves no process
    behind: on their own they exit a moment after the grader, and pass to whoever is above it.
    The forkserver is killed rather than asked (it holds nothing to flush, and its warm
    interpreter took 0.15 s to tear down); the resource tracker is asked, since it may have
    something to clean. (`_stop` and the fields are private but present from 3.8 to 3.13;
    without them they simply exit later.)"""
    from multiprocessing import forkserver, resource_tracker

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if isinstance(pid, int):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for helper in (server, resource_tracker._resource_tracker):
        try:
            helper._stop()
        except (AttributeError, OSError, ChildProcessError):
            pass


def _worker_entry(job: dict, log: str) -> None:
    from labkit.grading import worker  # already imported in the forkserver; slow to import here

    worker.entry(job, log)


def start_worker(ctx, job: dict, batch: Batch, slot: int, number: int = 0) -> Running:
    out, key = batch.out, job["key"]
    # Each submission's code (its judge, children and kernel) runs as a uid of its own, never
    # reused within the batch: `number` counts the jobs started (`None`: no sandbox).
    uid = sandbox.uid() + 1 + number if batch.sandboxed else None
    job = {**job, "marker": reaper.new_marker(), "uid": uid, "slot": slot, "templates": batch.templates}
    gradebook.write_atomic(_running_file(out, key), json.dumps({"marker": job["marker"], "key": key}))
    log = gradebook.results_dir(out) / f"{key}.log"
    proc = ctx.Process(target=_worker_entry, args=(job, str(log)), name=f"grade-{key}")
    proc.start()
    now = time.monotonic()
    return Running(job, proc, now, now + batch.limits.notebook_timeout + batch.limits.worker_grace, log)


def collect(run: Running, batch: Batch) -> dict:
    """After a worker ended (or overran): kill what is left, and return its result, or a fallback."""
    job, out = run.job, batch.out
    status, message = None, ""
    if run.proc.exitcode is None:
        run.proc.kill()
        status = TIMEOUT
        limit = run.deadline - run.started
        message = f"Grading this notebook took over {limit:g} s and was stopped."
    run.proc.join()
    _sweep(job["marker"])
    shutil.rmtree(work_folder(out, job["key"], job["marker"]), ignore_errors=True)
    shutil.rmtree(socket_folder(out, job["key"], job["marker"]), ignore_errors=True)
    result = gradebook.read_result(gradebook.result_path(out, job["key"]))
    if result is not None and result.get("marker") == job["marker"]:
        run.log.unlink(missing_ok=True)  # kept only when the worker itself failed
    else:
        if status is None:  # a bug in the grader, not the student's doing: the log stays for us
            status = CRASHED
            message = (f"The grader failed on this notebook (worker exit {run.proc.exitcode}); "
                       f"its log is {run.log}.")
        result = record.fallback(job, status, message, time.monotonic() - run.started)
    _running_file(out, job["key"]).unlink(missing_ok=True)
    run.proc.close()
    return result


def stop_all(active: list[Running]) -> None:
    for run in active:
        if run.proc.exitcode is None:
            run.proc.kill()
    for run in active:
        run.proc.join()
        _sweep(run.job["marker"])


def _sweep(marker: str) -> int:
    """Kill whatever a job left (its sandboxes die with their bwrap; this is the backstop)."""
    return reaper.kill_marked(marker, 3.0, JOB_MARKER) + reaper.kill_marked(marker)


class Progress:
    """A tqdm bar on a terminal, one plain line per submission otherwise."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.bar = None
        if sys.stderr.isatty() and total:
            from tqdm import tqdm

            size = shutil.get_terminal_size()  # falls back to 80x24 where a pty reports 0x0
            self.bar = tqdm(total=total, unit="notebook", ncols=size.columns, nrows=size.lines,
                            file=sys.stderr)

    def update(self, row: dict) -> None:
        self.done += 1
        # Names, file names and flags are the student's: printed only through `safe`.
        line = safe(f"{row['student']} {row['lab'] or row['notebook']}: {row['total']}/{row['max']} "
                    f"{row['status']}" + (f" [{', '.join(row['flags'])}]" if row["flags"] else "")
                    + f" ({row['seconds']:.1f} s)")
        if self.bar is not None:
            self.bar.set_postfix_str(line[:40], refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {line}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


NO_SANDBOX_HELP = (
    "grade refuses to run student code without a sandbox: {reason}. Without it every submission "
    "runs as this user, can read the reference solutions and the other submissions, write the "
    "gradebook and signal the grader. Install bubblewrap and run as root (see docs/grading.md), "
    "or pass --no-sandbox to grade anyway; every row then says sandbox = none.")


def sandbox_choice(no_sandbox: bool) -> tuple[bool, str]:
    """(sandboxed?, what the gradebook says); raises BatchUsageError when there is none."""
    if no_sandbox:
        return False, "none (--no-sandbox)"
    if sandbox.mode() == "off":
        raise BatchUsageError(NO_SANDBOX_HELP.format(reason=f"{sandbox.MODE_ENV}=off is set"))
    found = sandbox.support()
    if not found.ok:
        raise BatchUsageError(NO_SANDBOX_HELP.format(reason=found.reason))
    return True, found.describe


def run(paths: list[Path], out: Path, jobs: int | None, seed: int | None, force: bool,
        no_sandbox: bool = False, shard: Shard | None = None) -> int:
    if jobs is not None and jobs < 1:
        raise BatchUsageError("--jobs must be at least 1")
    if shard is not None and seed is None:
        raise BatchUsageError("--shard needs --seed: every shard of a class must draw the same hidden "
                              "cases, or `merge` refuses them")
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise BatchUsageError(f"--out {out} is a file, not a folder")
    try:
        found, skipped = submissions.find(paths, exclude=out)
    except FileNotFoundError as exc:
        raise BatchUsageError(f"no such file or folder: {exc.args[0]}") from None
    if not found and not skipped:
        raise BatchUsageError("no notebooks (*.ipynb) found in " + ", ".join(map(str, paths)))
    sandboxed, label = sandbox_choice(no_sandbox)
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)
    try:
        batch = Batch(out, 0, jobs or default_jobs(), force, sandboxed=sandboxed, sandbox_label=label,
                      shard=shard or WHOLE)
        return _run_locked(found, skipped, batch, seed)
    finally:
        lock.close()


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) or 1


def _check_shard(out: Path, shard: Shard) -> None:
    """An --out folder holds one shard's grades (or the whole class's), never two."""
    try:
        earlier = manifest.read(out)
    except manifest.ManifestError:
        return  # a new folder, or one graded before manifests existed
    if earlier.shard != shard.to_json():
        what = "the whole class" if earlier.shard == WHOLE.to_json() else f"shard {earlier.shard[0]}/{earlier.shard[1]}"
        now = "the whole class" if shard == WHOLE else f"shard {shard}"
        raise BatchUsageError(f"{out} holds the grades of {what}; grade {now} into another --out folder")


def _run_locked(found, skipped, batch: Batch, seed: int | None) -> int:
    started = time.monotonic()
    out = batch.out
    _check_shard(out, batch.shard)
    reaper.become_subreaper()
    clean_stale(out)
    if batch.sandboxed:
        swept = sweep.stale_groups()
        if swept:
            print(f"removed {len(swept)} empty control group(s) left by an earlier grader that was killed", flush=True)
    known = submissions.releases(release_dir())
    lab_names = labs.available()
    for sub in found:
        examine_contained(sub, known, lab_names)
    chosen = submissions.one_per_lab(found, known)
    batch.seed = batch_seed(out, seed)
    all_jobs = [make_job(sub, batch, known) for sub in chosen]
    manifest.write(out, class_manifest(batch, all_jobs, skipped, known))
    mine = [job for job in all_jobs if batch.shard.holds(job["student"])]
    record.skipped_rows(out, [item for item in skipped if batch.shard.holds(item.student)], batch.sandbox_label)
    todo = [job for job in mine if not already_graded(job, batch, seed)]
    done = len(mine) - len(todo)
    todo.sort(key=_order)
    shard_note = "" if batch.shard == WHOLE else f" (shard {batch.shard}: {len(mine)} of {len(all_jobs)})"
    print(safe(f"grading {len(todo)} notebook(s){shard_note} with {batch.jobs} job(s), seed {batch.seed}, "
               f"sandbox: {batch.sandbox_label}"
               + (f"; {done} already graded (--force regrades)" if done else "")
               + (f"; {len(skipped)} path(s) skipped (listed in the gradebook)" if skipped else "")), flush=True)
    progress = Progress(len(todo))
    graded = sorted({job["lab"] for job in todo if gradable(job)})
    ctx = _context() if graded else None  # nothing to grade (all done, or malformed): no workers
    if ctx is not None:  # the forkserver renders the releases of the labs it will grade
        _start_forkserver(graded)
    templates = _start_templates(graded) if batch.sandboxed and graded else {}
    batch.templates = {role: template.path for role, template in templates.items()}
    queue, active = list(todo), []
    free = list(range(batch.jobs))  # slots: how many run at once
    launched = 0  # each started job's uid is its own (`start_worker`)
    try:
        while queue or active:
            while queue and len(active) < batch.jobs:
                job = queue.pop(0)
                if gradable(job):
                    active.append(start_worker(ctx, job, batch, free.pop(0), launched))
                    launched += 1
                else:
                    progress.update(record.malformed({**job, "marker": None}, job["problem"])["row"])
            if not active:
                continue
            timeout = max(0.0, min(run.deadline for run in active) - time.monotonic())
            multiprocessing.connection.wait([run.proc.sentinel for run in active], timeout=timeout)
            for run in list(active):
                if run.proc.exitcode is not None or time.monotonic() > run.deadline:
                    active.remove(run)
                    progress.update(collect(run, batch)["row"])
                    free.append(run.job["slot"])
            reaper.collect_zombies({run.proc.pid for run in active})
    except BaseException:
        stop_all(active)
        gradebook.write_gradebook(out)
        raise
    finally:
        progress.close()
        for template in templates.values():
            template.stop()
        if ctx is not None:
            _stop_forkserver()
        # A worker killed on a timeout (or by a hostile notebook's judge) could not remove its
        # views of the course: with every worker gone, the grader removes them.
        course_view.sweep_ended()
    try:
        (out / WORK).rmdir()
    except OSError:
        pass
    rows = gradebook.write_gradebook(out)
    finish_report(out, rows, time.monotonic() - started)
    return 0


def class_manifest(batch: Batch, jobs: list[dict], skipped: list, known: dict) -> manifest.Manifest:
    """Everything `merge` compares across shards, and every submission of the whole class."""
    students = sorted({job["student"] for job in jobs} | {item.student for item in skipped})
    return manifest.Manifest(
        seed=batch.seed, shard=batch.shard.to_json(), release=manifest.release_fingerprint(known),
        code=manifest.code_fingerprint(), limits=batch.limits.to_json(), step_timeout=step_timeout(),
        sandboxed=batch.sandboxed, sandbox=batch.sandbox_label, students=students,
        submissions={job["key"]: {"student": job["student"], "lab": job["lab"] or "", "sha256": job["sha256"],
                                  "shard": shard_of(job["student"], batch.shard.count)}
                     for job in jobs})


def finish_report(out: Path, rows: list[dict], seconds: float) -> None:
    """The gradebook's one-line summary, the class report, and its text summary."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(safe(f"{len(rows)} row(s) in {out / 'grades.csv'} ({summary}); feedback in {out / FEEDBACK} "
               f"({seconds:.1f} s)"), flush=True)
    from labkit.grading import report

    try:
        text = report.write(out)
    except Exception as exc:  # the grades are written; a report that fails must not hide them
        print(safe(f"the class report could not be written: {type(exc).__name__}: {exc}"), file=sys.stderr,
              flush=True)
        return
    print(safe_lines(text), flush=True)
