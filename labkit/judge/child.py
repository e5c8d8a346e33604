"""Run a child process against the student's module and kill it, whatever it does.

One call = one fresh interpreter that imports the student's file and runs one probe.
The child reports on a private pipe (its stdout is the student's); the judge enforces a
wall-clock limit, then kills the whole process group and anything that escaped it.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.judge import reaper
from labkit.limits import CHILD_OUTPUT_BYTES, KILL_GRACE, RUN_MARKER
from labkit.sandbox import Outcome
from labkit.sandbox.profiles import child_box

ROOT = Path(__file__).resolve().parents[2]
MAX_RESULT_BYTES = 8 * 1024 * 1024


class SandboxError(RuntimeError):
    """The sandbox itself failed to start (a machine problem, not the student's code)."""


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


def child_env(marker: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env[RUN_MARKER] = marker
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def _read_capped(path: Path) -> str:
    with open(path, "rb") as fh:
        data = fh.read(CHILD_OUTPUT_BYTES + 1)
    text = data[:CHILD_OUTPUT_BYTES].decode("utf-8", "replace")
    return text + ("\n[... output cut]" if len(data) > CHILD_OUTPUT_BYTES else "")


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
) -> ChildRun:
    """Run `probe` (module:function) in a fresh interpreter with the student's module loaded."""
    marker = marker or reaper.new_marker()
    request = json.dumps({"module": str(module), "module_name": module_name, "probe": probe, "args": args})
    read_fd, write_fd = os.pipe()
    run = ChildRun(started_at=time.time())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="labkit-io-") as io_dir:
        out_path, err_path = Path(io_dir, "stdout"), Path(io_dir, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            # Sandboxed (when on): its own uid, namespaces and cgroup; sees only what it needs.
            child_vars = {RUN_MARKER: marker, "LABKIT_RESULT_FD": str(write_fd), **(env or {})}
            try:
                box = child_box(module, workdir, (probe.partition(":")[0],), child_vars)
                proc = box.spawn(
                    [sys.executable, "-P", "-m", "labkit.probe.main"],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=child_env(marker, {"LABKIT_RESULT_FD": str(write_fd), **(env or {})}),
                    pass_fds=(write_fd,),
                    start_new_session=True,
                )
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
            try:
                try:
                    proc.stdin.write(request.encode())
                    proc.stdin.close()
                except BrokenPipeError:  # died at once; the exit code tells
                    pass
                data = _collect(read_fd, proc, started + timeout)
                try:  # EOF on the pipe comes a moment before the exit status is ready
                    proc.wait(timeout=max(0.0, started + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                run.timed_out = proc.poll() is None
            finally:
                os.close(read_fd)
                reaper.kill_group(proc.pid)
                try:  # reap our own child first, so Popen (not the reaper) records its status
                    proc.wait(timeout=KILL_GRACE)
                except subprocess.TimeoutExpired:
                    pass
                reaper.kill_marked(marker)
                report = box.close(proc)
        if report.outcome == Outcome.SANDBOX_ERROR:  # the machine's fault, never the student's
            raise SandboxError(f"the sandbox could not start a child: {_read_capped(err_path)[-500:]}")
        run.exit_code = report.returncode
        run.ended_at = time.time()
        run.seconds = time.monotonic() - started
        run.stdout = _read_capped(out_path)
        run.stderr = _read_capped(err_path)
    run.records = _parse(data)
    return run


def _collect(fd: int, proc: subprocess.Popen, deadline: float) -> bytes:
    """Read the result pipe until the child exits (or the deadline passes).

    Stops at the child's exit, not at EOF: an escaped grandchild may hold the pipe open.
    """
    chunks: list[bytes] = []
    size = 0
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
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


def _parse(data: bytes) -> list[dict]:
    records = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line from a killed child
        if isinstance(record, dict):
            records.append(record)
    return records
