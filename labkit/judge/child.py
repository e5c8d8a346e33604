"""Run a child process against the student's module and kill it, whatever it does.

`run_child`: one fresh interpreter that imports the student's file and runs one probe.
`child_session`: one interpreter that stays up and answers calls one at a time (a round
trip costs ~0.2 ms, a process start ~100 ms), for property tests that try hundreds of inputs.
Both start their child through `spawn`, the one place a judged child is started.
The child reports on a private pipe (its stdout is the student's); the judge enforces a
wall-clock limit, then kills the whole process group and anything that escaped it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from labkit import scratch
from labkit.judge.processes import Budget
from labkit.labs import package_of
from labkit.limits import CALL_TIMEOUT, CHILD_OUTPUT_BYTES, KILL_GRACE, MAX_RECORD_DEPTH, RUN_MARKER
from labkit.sandbox import reaper, zygote
from labkit.sandbox.launcher import CHILD_PYTHON
from labkit.sandbox.profiles import child_box
from labkit.values import too_deep

ROOT = Path(__file__).resolve().parents[2]
MAX_RESULT_BYTES = 8 * 1024 * 1024


@dataclass
class ChildRun:
    """What the judge saw of one child: its reports, how it ended, what it printed."""

    records: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    started_at: float = 0.0  # wall-clock, for timelines
    ended_at: float = 0.0
    restarted: str = ""  # why a first start was retried (`run_child`), else ""
    memory_limit: bool = False  # the sandbox saw its memory limit kill it (cgroup OOM)
    cpu_limit: bool = False  # a case's CPU budget ended it (`probe.started`): also `timed_out`

    @property
    def import_error(self) -> dict | None:
        for record in self.records:
            if record.get("event") == "import_failed":
                return record["error"]
        return None

    @property
    def imported(self) -> bool:
        return any(r.get("event") == "imported" for r in self.records)

    @property
    def reached_module(self) -> bool:
        """Whether the child got as far as loading the student's module (before that, only
        the course's code ran: a failure there is never the student's)."""
        return any(r.get("event") == "importing" for r in self.records)

    @property
    def importing(self) -> bool:
        """Whether it was still importing the student's module (it began, and neither ended)."""
        return self.reached_module and not self.imported and self.import_error is None

    @property
    def failed_to_start(self) -> bool:
        """Ended on its own, before it reached the student's module (`expect.import_problem`)."""
        return not self.timed_out and self.exit_code is not None and not self.reached_module

    @property
    def finished(self) -> bool:
        return any(r.get("event") == "done" for r in self.records)

    @property
    def aborted(self) -> dict | None:
        for record in self.records:
            if record.get("event") == "aborted":
                return record["error"]
        return None

    def cases(self) -> dict[str, dict]:
        return {r["case"]: r for r in self.records if r.get("event") == "case"}

    def unfinished_case(self) -> str | None:
        """The case that was started but never reported: where it hung or died."""
        reported = self.cases()
        started = [r["case"] for r in self.records if r.get("event") == "start"]
        pending = [c for c in started if c not in reported]
        return pending[-1] if pending else None

    def messages(self) -> list[dict]:
        return [r for r in self.records if r.get("event") == "note"]


def site_packages() -> str:
    """The package folders on the judge's own sys.path, in its order, for a child without
    `site` (`labkit.probe.main.add_site_packages`); the same interpreter would add the same."""
    import site

    folders = {*site.getsitepackages(), site.getusersitepackages()}
    return os.pathsep.join(p for p in sys.path if p in folders)


def child_env(marker: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env[RUN_MARKER] = marker
    env["LABKIT_SITE_PACKAGES"] = site_packages()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def _read_capped(path: Path) -> str:
    with open(path, "rb") as fh:
        data = fh.read(CHILD_OUTPUT_BYTES + 1)
    text = data[:CHILD_OUTPUT_BYTES].decode("utf-8", "replace")
    return text + ("\n[... output cut]" if len(data) > CHILD_OUTPUT_BYTES else "")


def spawn(module: Path, *, workdir: Path, env: dict[str, str], pass_fds: tuple[int, ...],
          stdout: IO[bytes], stderr: IO[bytes], lab: str | None = None) -> subprocess.Popen:
    """Start one judged child: `python -S -P -m labkit.probe.main` for the student's `module`.

    The ONE place a child that runs student code is started (`run_child` and `child_session`
    both call it), so a sandbox wraps exactly this. The child gets its own session (one
    killpg ends it and everything it forks), `workdir` as cwd, exactly `env` (see
    `child_env`), only the `pass_fds` beyond stdio (its private pipes, named in `env`), a
    pipe as stdin (the request, then closed) and `stdout`/`stderr` going to the judge's files.
    `CHILD_PYTHON` says why each flag. `lab`: the lab package whose probes it may import
    (`labs.package_of`); None: any lab's.
    """
    # Sandboxed when the sandbox is on (labkit.sandbox.profiles.child): its own uid, namespaces
    # and cgroup; it sees only what it needs. A plain Popen when it is off.
    box = child_box(module, workdir, env, lab=lab)
    if zygote.usable(box):  # the same box, the interpreter forked warm into it
        proc = zygote.spawn(box, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, pass_fds=pass_fds,
                            lab=lab, site_packages=env.get("LABKIT_SITE_PACKAGES", ""))
        if proc is not None:
            return proc
        box.close()  # the zygote could not serve it: a fresh child, in a fresh box
        box = child_box(module, workdir, env, lab=lab)
    return box.spawn(
        [*CHILD_PYTHON, "labkit.probe.main"],
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=stderr,
        cwd=workdir,
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
    )


@dataclass
class Started:
    """A judged child spawned before its request: its interpreter, labkit and the lab's heavy
    imports (`PRELOAD`) load while the judge still prepares the step (servers, databases, files).
    The request decides what it then does: one probe (`run_child`) or a session (`child_session`).
    Whoever takes it owns it; `close` ends one that nobody took."""

    module: Path
    workdir: Path
    marker: str
    proc: subprocess.Popen
    result_r: int  # the judge's ends of the private pipes
    request_w: int
    io_dir: Path  # the student's stdout and stderr, capped when read
    closed: bool = False

    def ready(self) -> None:
        """What the judge made in the child's folder since it started becomes the child's (as a
        box's folder is when it opens): called before the request, before any student code runs."""
        hand_over = getattr(self.proc, "hand_over", None)
        if hand_over is not None:
            hand_over()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.result_r, self.request_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            _kill(self.proc, self.marker)
        finally:
            shutil.rmtree(self.io_dir, ignore_errors=True)


# The modules a child imports before it reads its request (a lab's manifest, `preload`): a
# comma-separated list of top-level names. What the student's module then imports is there.
PRELOAD = "LABKIT_PRELOAD"


def start(module: Path, *, workdir: Path, marker: str, env: dict[str, str] | None = None,
          preload: tuple[str, ...] = (), lab: str | None = None) -> Started:
    """Spawn a child for `module` that waits for its request (`run_child` or `child_session`
    sends it): both private pipes, the student's output to files of its own."""
    io_dir = scratch.folder("labkit-io-")
    result_r, result_w = os.pipe()
    request_r, request_w = os.pipe()
    ours, theirs = (result_r, request_w), (result_w, request_r)
    extra = {"LABKIT_RESULT_FD": str(result_w), "LABKIT_REQUEST_FD": str(request_r)}
    if preload:
        extra[PRELOAD] = ",".join(preload)
    try:
        with open(io_dir / "stdout", "wb") as out, open(io_dir / "stderr", "wb") as err:
            proc = spawn(module, workdir=workdir, stdout=out, stderr=err, pass_fds=theirs, lab=lab,
                         env=child_env(marker, {**extra, **(env or {})}))
    except BaseException:
        for fd in ours:
            os.close(fd)
        shutil.rmtree(io_dir, ignore_errors=True)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return Started(module, workdir, marker, proc, result_r, request_w, io_dir)


def _start_request(module: Path, module_name: str, probe: str, args: dict) -> bytes:
    return json.dumps({"module": str(module), "module_name": module_name, "probe": probe,
                       "args": args}).encode()


def _send_request(proc: subprocess.Popen, request: bytes) -> None:
    """The first request goes on stdin, which is then closed: the student's code reads EOF there."""
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:  # died at once; the exit code tells
        pass


def kill_sandbox(proc: subprocess.Popen, marker: str | None = None, grace: float = KILL_GRACE) -> None:
    """Stop everything a judged child runs, from OUTSIDE, before the judge reads what it left.

    The ONE place the judge acts on a child's sandbox as a whole: every process of the box
    (its cgroup: `setsid`, cleared environment or not) is first stopped (SIGSTOP: so none sees
    another die and writes one more row), then SIGKILLed (`Box.kill`), and the wait is bounded
    until nothing of it runs. Neither signal can be caught, ignored or delayed by the student's
    code; no atexit or handler runs. Without a sandbox (`NullBox`: no `_box`, or an inactive
    one) the child's process group and everything carrying `marker` get the same treatment.
    Safe to call on a child that has already ended, and twice.
    """
    deadline = time.monotonic() + grace
    box = getattr(proc, "_box", None)
    boxed = box is not None and getattr(box, "active", False) and callable(getattr(box, "kill", None))
    if boxed:
        box.signal(signal.SIGSTOP)  # one pass over the box's cgroup: then nothing of it runs on
        box.kill()
    else:
        with _suppress_lookup():
            os.killpg(proc.pid, signal.SIGSTOP)
        reaper.kill_group(proc.pid)
        if marker:
            reaper.kill_marked(marker, grace=max(0.0, deadline - time.monotonic()))
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    if boxed:
        from labkit.judge import freeze

        while freeze.box_pids(proc) and time.monotonic() < deadline:
            box.kill()
            time.sleep(0.01)


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


def hit_memory_limit(proc: subprocess.Popen) -> bool:
    """Whether the sandbox's report of this ended child says the kernel's OOM killer ended it."""
    report = getattr(proc, "sandbox_report", None)
    return report is not None and (str(report.outcome) == "memory-limit" or report.oom_kills > 0)


def died(exit_code: int | None, memory_limit: bool) -> dict:
    """How a child that ended without answering ended, for `expect.ended_case`."""
    return {"kind": "memory_limit"} if memory_limit else {"kind": "died", "exit_code": exit_code}


def _kill(proc: subprocess.Popen, marker: str) -> None:
    """End the child's whole group and anything marked that escaped it; reap the child, and
    what it forked that re-parented to us once it died (a zombie's marker can no longer be
    read, so they are listed while they live). A sandboxed child's processes all live in its
    box's pid namespace, which its box's end empties, and re-parent to the box's init, never
    to us: no search of /proc for its marker (two per child, each a millisecond or more on a
    machine running hundreds of processes)."""
    box = getattr(proc, "_box", None)
    boxed = box is not None
    forked = set() if boxed else set(reaper.marked_pids(marker)) - {proc.pid}
    reaper.kill_group(proc.pid)
    if proc.poll() is None:
        # A launched child (a judge in its box: RemotePopen) is numbered by its sandbox's init,
        # which leads no group: the group kill missed it, and an early child nobody took waited
        # out KILL_GRACE (2 s a step in every grading judge). Its box is killed from outside.
        with contextlib.suppress(OSError):
            proc.kill()
    try:  # reap our own child first, so Popen (not the reaper) records its status
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        # Its box closes when its end is seen, and it was not: empty and remove it all the same.
        if box is not None and getattr(box, "active", False):
            box.close(proc)
    if not boxed:
        reaper.kill_marked(marker)
    reaper.collect(forked, time.monotonic() + KILL_GRACE, parents=frozenset({proc.pid}))


def run_child(
    module: Path,
    probe: str,
    args: dict,
    *,
    workdir: Path,
    timeout: float,
    marker: str | None = None,
    module_name: str = "worker",
    env: dict[str, str] | None = None,
    started: Started | None = None,
    lab: str | None = None,
) -> ChildRun:
    """Run `probe` (module:function) in a fresh interpreter with the student's module loaded
    (`started`: one already booting, from `start`, used for the first try).

    A child that ends before it reaches the student's module ran only the course's code, so it
    is started once more, within what is left of `timeout`: seen in CI on a loaded machine,
    several children of one step at once, and never the student's doing.
    """
    marker = started.marker if started is not None else marker or reaper.new_marker()
    deadline = time.monotonic() + timeout
    lab = lab or package_of(probe)
    run = _run_child_once(module, probe, args, workdir=workdir, timeout=timeout, marker=marker,
                          module_name=module_name, env=env, started=started, lab=lab)
    if run.failed_to_start and deadline - time.monotonic() > 1.0:
        first = run
        run = _run_child_once(module, probe, args, workdir=workdir, timeout=deadline - time.monotonic(),
                              marker=marker, module_name=module_name, env=env, lab=lab)
        run.restarted = f"exit code {first.exit_code}: {last_line(first.stderr)}"
    return run


# After its result pipe ended, how long a child may take to have an exit status: a sandbox's
# init reaps and exits after the child, and on a loaded machine that took over 0.2 s (the final
# check of lab 04 read a process that died in its hook as one that "did not finish in time").
EXIT_AFTER_EOF = 5.0


def last_line(text: str) -> str:
    """The last non-blank line of a child's stderr, capped: what a verdict quotes of it."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "nothing on stderr"


def _run_child_once(module: Path, probe: str, args: dict, *, workdir: Path, timeout: float, marker: str,
                    module_name: str, env: dict[str, str] | None, started: Started | None = None,
                    lab: str | None = None) -> ChildRun:
    request = _start_request(module, module_name, probe, args)
    if started is None:
        started = start(module, workdir=workdir, marker=marker, env=env, lab=lab)
    run = ChildRun(started_at=time.time())
    begun = time.monotonic()
    proc = started.proc
    data = b""
    try:
        os.close(started.request_w)  # a one-shot child reads its request on stdin only: EOF here
        started.ready()
        _send_request(proc, request)
        budget = Budget(proc.pid, timeout, begun)
        data = _collect(started.result_r, proc, budget)
        try:  # EOF on the pipe comes a moment before the exit status is ready
            proc.wait(timeout=max(0.0, budget.deadline() - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        run.timed_out = proc.poll() is None
    finally:
        os.close(started.result_r)
        try:
            _kill(proc, started.marker)
        finally:
            run.exit_code = proc.returncode
            run.memory_limit = hit_memory_limit(proc)
            run.ended_at = time.time()
            run.seconds = time.monotonic() - begun
            run.stdout = _read_capped(started.io_dir / "stdout")
            run.stderr = _read_capped(started.io_dir / "stderr")
            shutil.rmtree(started.io_dir, ignore_errors=True)
    run.records = _parse(data)
    _out_of_cpu(run)
    return run


# How a CPU budget ends a child (`probe._limit_cpu`'s SIGPROF; SIGXCPU, a CPU rlimit's), as Popen
# and as bwrap (128 + the signal) report it.
OUT_OF_CPU = {-signal.SIGPROF, 128 + signal.SIGPROF, -signal.SIGXCPU, 128 + signal.SIGXCPU}


def _out_of_cpu(run: ChildRun) -> None:
    """A child that a CPU budget ended while the student's module imported, or in a case with a
    CPU budget, hung there, as one the clock stopped would have (`probe.budget_import`,
    `probe.started`)."""
    if run.exit_code in OUT_OF_CPU and (run.importing or run.unfinished_case() is not None):
        run.timed_out = run.cpu_limit = True


def _collect(fd: int, proc: subprocess.Popen, budget: Budget) -> bytes:
    """Read the result pipe until the child exits (or its budget is spent).

    Stops at the child's exit, not at EOF: an escaped grandchild may hold the pipe open.
    """
    chunks: list[bytes] = []
    size = 0
    deadline = budget.first
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                deadline = budget.deadline()  # the time a busy machine took from the child is added
                remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            exited = proc.poll() is not None
            events = sel.select(timeout=0 if exited else min(remaining, 0.05))
            got_data = False
            for _key, _mask in events:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return b"".join(chunks)
                got_data = True
                if size < MAX_RESULT_BYTES:
                    chunks.append(chunk)
                    size += len(chunk)
            if exited and not got_data:
                break
    return b"".join(chunks)


def _malformed(why: str) -> dict:
    """The record put in place of one the judge refused: the child's report is its own failure."""
    return {"event": "aborted", "malformed": True,
            "error": {"kind": "raised", "type": "MalformedReport", "module": "labkit.judge.child",
                      "mro": ["MalformedReport"], "bases": [],
                      "message": f"the judge dropped a report this process wrote on its result pipe: {why}",
                      "trace": ""}}


def _parse(data: bytes) -> list[dict]:
    """The child's records, one JSON object per line: bounded in size and depth, never raising.

    A complete line the judge cannot read (too deep, too large, not JSON, anything else) is
    dropped and replaced by a `_malformed` record, so the child's verdict says so; the
    unterminated tail (a killed child's torn last line, or the pipe cut at `MAX_RESULT_BYTES`)
    is dropped silently: the cases it would have reported count as not reached, and those
    reported before keep their verdicts (a student whose function returns a huge value is told
    about that value, not that the process ended)."""
    records = []
    lines = data.split(b"\n")
    lines.pop()
    for line in lines:
        if not line.strip():
            continue
        if len(line) > MAX_RESULT_BYTES:
            records.append(_malformed(f"a record of more than {MAX_RESULT_BYTES} bytes"))
            continue
        try:
            if too_deep(line, MAX_RECORD_DEPTH):
                records.append(_malformed(f"a record nested deeper than {MAX_RECORD_DEPTH} levels"))
                continue
            record = json.loads(line)
        except (ValueError, RecursionError, MemoryError) as exc:
            records.append(_malformed(f"a record that is not valid JSON ({type(exc).__name__})"))
            continue
        except Exception as exc:  # noqa: BLE001 - whatever the bytes were, the judge goes on
            records.append(_malformed(f"an unreadable record ({type(exc).__name__})"))
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            records.append(_malformed(f"a record that is not a JSON object ({type(record).__name__})"))
    return records


# --- a child that stays up and answers calls one at a time ---------------------------------


class ChildSession:
    """One child that imports the student's module once, then answers requests one at a time.

    Made by `child_session`. `call(request)` writes one JSON line on the child's private
    request pipe and returns the child's reply: `{"outcome": ..., "observed": ...}` as the probe
    (e.g. `labkit.probe:serve`) reports it. A child that does not answer within the call's
    timeout is killed; one that dies is noted; either way that call and every later one return
    a reply whose outcome kind says how the child ended, never an exception:
    `{"kind": "timed_out", "seconds": s}`, `{"kind": "died", "exit_code": n}`, `{"kind": "memory_limit"}`, or
    `{"kind": "aborted", "error": {...}}` (SystemExit or another BaseException left the probe).
    `run` is a `ChildRun` of everything but the replies (import events, exit code, the
    student's capped stdout/stderr once the session is closed), so `expect.import_problem`
    reads it as it reads a one-shot child.
    """

    def __init__(self, proc: subprocess.Popen, marker: str, result_fd: int, request_fd: int,
                 io_dir: Path, run: ChildRun) -> None:
        self.proc = proc
        self.marker = marker
        self.run = run
        self.ended: dict | None = None  # how the child ended, once it has
        self.calls = 0
        self._result_fd = result_fd
        self._request_fd = request_fd
        self._io_dir = io_dir
        self._buffer = b""
        self._eof = False  # the result pipe has ended: the child is gone, or closed it
        self._pending: list[dict] = []  # parsed, not yet looked at (see `_wait_for`)
        self._started = time.monotonic()
        self._closed = False
        os.set_blocking(result_fd, False)
        os.set_blocking(request_fd, False)

    @property
    def imported(self) -> bool:
        return self.run.imported and self.ended is None

    def call(self, request: dict, timeout: float = CALL_TIMEOUT,
             on_note: Callable[[dict, ChildSession], None] | None = None) -> dict:
        """Send one request (the probe's format; an "id" is added) and wait at most `timeout`.

        With `on_note`, each note the child sends before its reply (a hook it holds at) is
        handed to it, the child still waiting (e.g. the judge freezes it from outside, acts,
        thaws it and `hooks.release`s it); the judge's own time there is not the child's."""
        if self.ended is not None:
            return {"outcome": self.ended, "observed": {}}
        self.calls += 1
        budget = Budget(self.proc.pid, timeout)
        line = json.dumps({**request, "id": self.calls}, separators=(",", ":")).encode() + b"\n"
        if self._write(line, budget.first):
            while True:
                found = self._wait_for(lambda r: (r.get("event") == "reply" and r.get("id") == self.calls)
                                       or (on_note is not None and r.get("event") == "note"), budget)
                if found is None or found["event"] == "reply":
                    break
                self.run.records.append(found)
                on_note(found, self)
                budget = Budget(self.proc.pid, timeout)
            if found is not None:
                return found
        return {"outcome": self._end(timeout), "observed": {}}

    def wait_imported(self, timeout: float) -> bool:
        """Wait (bounded) until the module is imported; if it is not, end the child."""
        found = self._wait_for(lambda r: r.get("event") in ("imported", "import_failed"),
                               Budget(self.proc.pid, timeout))
        if found is not None:
            self.run.records.append(found)
        if found is None or found["event"] != "imported":
            self._end(timeout)
            return False
        return True

    def close(self) -> None:
        """Kill the child's group and marked escapees, collect its output; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            os.close(self._request_fd)  # EOF: a serving probe returns by itself
            _kill(self.proc, self.marker)
            self.run.exit_code = self.proc.returncode
            self.run.stdout = _read_capped(self._io_dir / "stdout")
            self.run.stderr = _read_capped(self._io_dir / "stderr")
        finally:
            os.close(self._result_fd)
            shutil.rmtree(self._io_dir, ignore_errors=True)
            self.run.ended_at = time.time()
            self.run.seconds = time.monotonic() - self._started

    # -- the pipes --------------------------------------------------------------------------

    def _write(self, data: bytes, deadline: float) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(self._request_fd, selectors.EVENT_WRITE)
            while data:
                if self.proc.poll() is not None:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not sel.select(timeout=min(remaining, 0.05)):
                    continue
                try:
                    data = data[os.write(self._request_fd, data):]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError):
                    return False
        return True

    def _wait_for(self, wanted: Callable[[dict], bool], deadline: float | Budget) -> dict | None:
        """Read records until one is `wanted` (returned, not kept), the child exits or the deadline
        passes (a Budget's: extended by the time a busy machine took from the child)."""
        budget = deadline if isinstance(deadline, Budget) else None
        deadline = budget.first if budget is not None else deadline
        with selectors.DefaultSelector() as sel:
            sel.register(self._result_fd, selectors.EVENT_READ)
            while True:
                # Records read together with the wanted one stay for the next wait (a child that
                # reports on without waiting for a request sends several in one chunk).
                records, self._pending = self._pending + self._records(), []
                for i, record in enumerate(records):
                    if wanted(record):
                        self._pending = records[i + 1:]
                        return record
                    self.run.records.append(record)
                remaining = deadline - time.monotonic()
                if remaining <= 0 and budget is not None:
                    deadline = budget.deadline()
                    remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                exited = self.proc.poll() is not None
                ready = sel.select(timeout=0 if exited else min(remaining, 0.05))
                if not ready:
                    if exited:
                        return None
                    continue
                try:
                    chunk = os.read(self._result_fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:  # EOF: the child is gone (or closed its pipe); its exit status follows
                    self._eof = True
                    return None
                if len(self._buffer) < MAX_RESULT_BYTES:
                    self._buffer += chunk

    def _records(self) -> list[dict]:
        *lines, self._buffer = self._buffer.split(b"\n")
        return _parse(b"".join(line + b"\n" for line in lines))  # complete lines only

    def _end(self, timeout: float) -> dict:
        """The child did not answer: say how it ended (killing it if it still runs)."""
        if self.ended is not None:
            return self.ended
        try:  # EOF comes a moment before the exit status is ready: longer in a box on a busy machine
            self.proc.wait(timeout=EXIT_AFTER_EOF if self._eof else 0.2)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            self.run.timed_out = True
            _kill(self.proc, self.marker)
            self.ended = {"kind": "timed_out", "seconds": timeout}
            return self.ended
        self._wait_for(lambda r: False, time.monotonic())  # keep what it said before dying
        self.run.exit_code = self.proc.returncode
        _out_of_cpu(self.run)
        if self.run.cpu_limit:
            self.ended = {"kind": "timed_out", "seconds": timeout}
            return self.ended
        aborted = self.run.aborted
        self.ended = ({"kind": "aborted", "error": aborted} if aborted is not None
                      else died(self.proc.returncode, hit_memory_limit(self.proc)))
        return self.ended


@contextmanager
def child_session(
    module: Path,
    *,
    workdir: Path,
    timeout: float,
    marker: str | None = None,
    module_name: str = "worker",
    env: dict[str, str] | None = None,
    probe: str = "labkit.probe:serve",
    args: dict | None = None,
    started: Started | None = None,
    lab: str | None = None,
) -> Iterator[ChildSession]:
    """A child that stays up and answers `session.call(request)` one at a time.

        with child_session(module, workdir=ctx.workdir, timeout=ctx.timeout) as session:
            if session.imported:
                reply = session.call({"fn": "parse_line", "args": [encode(b"EVENT 1 2\\n")]})

    The same guarantees as `run_child`: one `spawn`, a private result pipe (and a private
    request pipe), the student's stdout/stderr captured and capped, resource limits applied
    in the child, every wait bounded (`timeout` for the import, each call its own), and on
    every path out of the block the whole process group and every marked escapee killed.
    `started`: a child already booting (`start`), used instead of a new one.
    """
    marker = started.marker if started is not None else marker or reaper.new_marker()
    if started is None:
        started = start(module, workdir=workdir, marker=marker, env=env, lab=lab or package_of(probe))
    session = ChildSession(started.proc, marker, started.result_r, started.request_w, started.io_dir,
                           ChildRun(started_at=time.time()))
    try:
        started.ready()
        _send_request(started.proc, _start_request(module, module_name, probe, args or {}))
        session.wait_imported(timeout)
        yield session
    finally:
        session.close()
