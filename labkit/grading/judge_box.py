"""Run the judge for one submission in a box of its own, and take its verdict from a pipe.

The judge (`python -m labkit check LAB --solution MODULE --seed S --json`) is the course's own
trusted code, but it starts the student's children and serves them on loopback, so it runs
in `labkit.sandbox.profiles.judge_box`: a network namespace of its own (a child reaches its
own judge's servers and nothing else: not another job's servers or kernels, not the host's
loopback), a private size-capped /tmp for every step's files (a child filling its folder
fills only this job's tmpfs, and it all goes with the box), and a read-only view of the
runtime, labkit, checks and the module. Its children get a sandbox each, under the job's uid.

The verdict is the JSON the judge prints on its stdout — a pipe only the judge holds (every
child's stdout is a file of its own): nothing a child could touch is read back as a result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit import limits, sandbox
from labkit.judge import differential
from labkit.judge.verdict import LabVerdict, from_json
from labkit.sandbox import launcher, profiles, zygote

JUDGE_TMP = "/tmp"
# The grader's variables a judge may see: the course's own settings that the judge reads.
JUDGE_SETTINGS = (limits.TIMEOUT_ENV,)
MAX_VERDICT = 32 * 1024 * 1024  # the judge's JSON verdict, read capped


@dataclass
class JudgeRun:
    verdict: LabVerdict | None
    error: str = ""
    seconds: float = 0.0
    sandbox: str = "none"
    retry: bool = False  # nothing of the student's ran: the sandbox failed to start the judge


def _env(uid: int | None, marker_env: dict[str, str]) -> dict[str, str]:
    """The judge's environment. Sandboxed: built from nothing (the course's own settings, the
    locale, the marker), never the grader's; unsandboxed: the grader's, as before."""
    if uid is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
        env[sandbox.MODE_ENV] = "off"
    else:
        env = profiles.base_env(JUDGE_TMP)
        env.update({k: os.environ[k] for k in JUDGE_SETTINGS if k in os.environ})
    env.update(marker_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(profiles.ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _show_tables(env: dict[str, str]) -> Path | None:
    """The grader's Hypothesis Unicode tables, named in a judge's `env` (read-only to it:
    Hypothesis' failed writes there are silent); None when there are none."""
    tables = differential.unicode_tables()
    if tables is not None:
        env[differential.STORAGE_ENV] = str(tables)
    return tables


def start_template(labs_graded: list[str] | None = None) -> zygote.Template | None:
    """The batch's template of the judge, started with a judge's environment (its own uid and
    markers come with each judge); None where judges cannot be forked (they start fresh).
    `labs_graded`: the labs whose checks it imports (default: every lab)."""
    env = _env(0, {})
    _show_tables(env)
    return zygote.start_template(env, TEMPLATE_ROLE | {"packages": _lab_packages(labs_graded)})


# What the template of the judge imports, and what each judge forked from it runs: `labkit check`.
# (The warehouse is imported at first use by two labs' checks; lab 04's servers come with its
# package, so a batch without lab 04 never loads psycopg or valkey: ~0.3 s of its start.)
TEMPLATE_ROLE = {
    "warm": ["hypothesis.strategies", "labkit.cli", "labkit.grading.terminal", "labkit.judge.run",
             "labkit.judge.serve", "labkit.sandbox.remote", "labkit.views.render_text", "labkit.servers.warehouse"],
    "entry": "labkit.cli:main",
}


def _lab_packages(labs_graded: list[str] | None = None) -> list[str]:
    """The graded labs' packages (every lab's by default): the template imports all of their
    modules (some are imported at first use)."""
    from labkit import labs

    return [labs.manifest(lab).package for lab in (labs.available() if labs_graded is None else labs_graded)]


@contextmanager
def judge_session(uid: int, module: Path, env: dict[str, str], tables: Path | None = None,
                  judges: str | None = None):
    """A judge's box for `uid` and its launcher (this process keeps the only privilege).

    Yields `(box, spawn)`: `spawn(argv, **popen)` starts `argv` in the box as the judge and
    attaches the launcher to it (one judge per session); close the box with `box.close(proc)`.
    With `judges` (the batch's template: `zygote.start_template`), a `python -m labkit ...` argv
    is forked from it into the same box instead; when the template cannot serve it, the box is
    closed and `spawn` raises `zygote.ZygoteGone` (nothing ran: start again without it).
    The launcher is closed on leaving: every child it started is killed and cleaned up."""
    env = dict(env)
    os.chmod(module, 0o644)  # the grader's copy, which the judge and its children read
    launch = launcher.Launcher.pair(uid, module, sandbox.support().cgroups, JUDGE_TMP)
    env[launcher.FD_ENV] = str(launch.judge_end.fileno())
    box = sandbox.Box.open(profiles.judge_box(uid, module=module, tmp=JUDGE_TMP, env=env, tables=tables),
                           sandbox.support().cgroups)
    box.before_close = launch.close  # its children first: they live in the judge's namespaces

    def spawn(argv: list[str], **popen) -> subprocess.Popen:
        if judges is not None and argv[1:4] == ["-P", "-m", "labkit"]:
            return _forked(argv[4:], **popen)
        proc = box.spawn(argv, cwd=JUDGE_TMP, env=env, start_new_session=True,
                         pass_fds=(launch.judge_end.fileno(),), **popen)
        _attach(proc, box.wait_child_pid(launcher.START_TIMEOUT))
        return proc

    def _forked(args: list[str], *, stdin, stdout, stderr) -> subprocess.Popen:
        out_r, out_w = os.pipe() if stdout == subprocess.PIPE else (None, stdout)
        try:
            proc = zygote.spawn_from(judges, box, zygote.JUDGE_MAIN, args, stdin=stdin, stdout=out_w,
                                     stderr=stderr, pass_fds=(launch.judge_end.fileno(),))
        finally:
            if out_r is not None:
                os.close(out_w)
        if proc is None:  # the box is closed: nothing of the judge's ran in it
            if out_r is not None:
                os.close(out_r)
            raise zygote.ZygoteGone("the judges' template could not start this judge")
        proc.stdout = os.fdopen(out_r, "rb") if out_r is not None else None
        _attach(proc, proc.box_pid)
        return proc

    def _attach(proc, judge_pid: int | None) -> None:
        try:
            if judge_pid is None:  # bwrap failed: its exit status and stderr say why
                raise ProcessLookupError("bubblewrap reported no process")
            launch.attach(judge_pid)
        except OSError:  # its first process already gone: no judge, so no student code, ran
            launch.judge_end.close()
            proc.never_attached = True

    try:
        yield box, spawn
    finally:
        launch.close()


def run(lab: str, module: Path, seed: int, *, uid: int | None, timeout: float,
        marker_env: dict[str, str] | None = None, judges: str | None = None) -> JudgeRun:
    """The judge's verdict on `module`; `uid` None runs it (and its children) unsandboxed.

    Sandboxed, the judge runs as `uid` with no capabilities, and this process keeps the only
    privilege: a `launcher` thread that makes its children's sandboxes on request. `judges`:
    the batch's template of the judge (`zygote.start_template`), which the judge is forked from.
    """
    started = time.monotonic()
    run = _run_once(lab, module, seed, uid=uid, timeout=timeout, marker_env=marker_env, judges=judges)
    if run.retry:  # the box ended before its judge began (bwrap's own failure): once more, fresh
        run = _run_once(lab, module, seed, uid=uid, timeout=timeout, marker_env=marker_env)
    return dataclasses.replace(run, seconds=time.monotonic() - started)


def _run_once(lab: str, module: Path, seed: int, *, uid: int | None, timeout: float,
              marker_env: dict[str, str] | None, judges: str | None = None) -> JudgeRun:
    started = time.monotonic()
    env = _env(uid, marker_env or {})
    argv = [sys.executable, "-P", "-m", "labkit", "check", lab, "--solution", str(module),
            "--seed", str(seed), "--json"]
    with ExitStack() as stack:
        if uid is None:
            box = sandbox.NullBox()

            def spawn(argv: list[str], **popen) -> subprocess.Popen:
                return box.spawn(argv, cwd=str(module.parent), env=env, start_new_session=True, **popen)
        else:
            tables = _show_tables(env)
            box, spawn = stack.enter_context(judge_session(uid, module, env, tables, judges))
        proc = None
        err = stack.enter_context(tempfile.TemporaryFile())
        try:
            try:
                proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            except zygote.ZygoteGone as exc:
                return JudgeRun(None, str(exc), time.monotonic() - started, _label(box), retry=True)
            try:
                out = _read_capped(proc, timeout)
            except subprocess.TimeoutExpired:
                box.kill()
                proc.kill()
                proc.wait()
                return JudgeRun(None, f"the judge ran over {timeout:g} s", time.monotonic() - started,
                                _label(box))
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            box.close(proc)
        err.seek(0)
        said = err.read(3000).decode("utf-8", "replace").strip()
    seconds = time.monotonic() - started
    if getattr(proc, "never_attached", False):
        return JudgeRun(None, f"the judge's sandbox ended before the judge began (exit code {proc.returncode}): "
                        f"{said}", seconds, _label(box), retry=True)
    if proc.returncode not in (0, 1):
        return JudgeRun(None, f"the judge exited with code {proc.returncode}: {said}", seconds, _label(box))
    try:
        return JudgeRun(from_json(json.loads(out)), "", seconds, _label(box))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return JudgeRun(None, f"the judge's verdict could not be read ({exc}): {said}", seconds, _label(box))


def _read_capped(proc: subprocess.Popen, timeout: float) -> bytes:
    """The judge's stdout, at most `MAX_VERDICT` bytes, within `timeout`; the rest is drained."""
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if size < MAX_VERDICT:
            chunks.append(chunk)
            size += len(chunk)
    proc.stdout.close()
    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    return b"".join(chunks)[:MAX_VERDICT]


def _label(box) -> str:
    return "bubblewrap" if box.active else "none"
