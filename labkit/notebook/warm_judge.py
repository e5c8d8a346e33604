"""The kernel's judge: one `labkit.judge.serve` process, started on the first check and reused.

Each check used to start `python -m labkit check`, and most of a step's wait was that
interpreter importing the judge. The warm judge imports it once per kernel. It is still a
separate process (the kernel never judges: patching labkit in the kernel changes nothing it
decides), and it is started again, fresh, whenever what it was started with changed: the
course's code on disk (a course update), the kernel's environment, the working folder, or
it ended. A check that is interrupted or runs over its time stops it, as the command was.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT = 180.0  # the judge bounds each step itself; this only guards the guard
STOP_GRACE = 10.0


@dataclass
class _Judge:
    proc: subprocess.Popen
    stderr: IO[bytes]
    started_with: tuple


_judge: _Judge | None = None


def _course_code() -> tuple[int, int]:
    """The newest change and the number of the judge's files: a course update restarts it."""
    newest, count = 0, 0
    for top in ("labkit", "checks"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".py", ".toml"):
                try:
                    newest = max(newest, path.stat().st_mtime_ns)
                except OSError:
                    continue
                count += 1
    return newest, count


def _started_with(cwd: Path) -> tuple:
    return str(cwd), sys.executable, hash(frozenset(os.environ.items())), _course_code()


def _ready(cwd: Path) -> _Judge:
    global _judge
    wanted = _started_with(cwd)
    if _judge is not None and (_judge.proc.poll() is not None or _judge.started_with != wanted):
        stop()
    if _judge is None:
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "labkit.judge.serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, bufsize=0, cwd=cwd,
                                start_new_session=True)
        _judge = _Judge(proc, stderr, wanted)
    return _judge


def stop() -> None:
    """End the judge (SIGTERM: it kills its children on the way out), bounded; forget it."""
    global _judge
    judge, _judge = _judge, None
    if judge is None:
        return
    for pipe in (judge.proc.stdin, judge.proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass
    if judge.proc.poll() is None:
        judge.proc.send_signal(signal.SIGTERM)
        try:
            judge.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            judge.proc.kill()
            judge.proc.wait()
    judge.stderr.close()


def _reply(proc: subprocess.Popen, timeout: float) -> bytes | None:
    """One line from the judge within `timeout`; None when it ended first."""
    deadline, data = time.monotonic() + timeout, bytearray()
    fd = proc.stdout.fileno()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        if select.select([fd], [], [], min(remaining, 1.0))[0]:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            data += chunk
    return bytes(data)


def run(request: dict, cwd: Path, timeout: float = CHECK_TIMEOUT) -> dict | str:
    """The judge's answer to `request` (the verdict's JSON, or {"error": ...}), or what went
    wrong when it could not answer. Ctrl-C and the timeout stop the judge, then propagate."""
    judge = _ready(cwd)
    try:
        judge.proc.stdin.write((json.dumps(request) + "\n").encode())
        line = _reply(judge.proc, timeout)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        stop()
        raise
    except OSError:  # its stdin is gone: it ended
        line = None
    if line is not None:
        try:
            return json.loads(line)
        except ValueError:
            pass
    try:
        judge.proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        pass
    judge.stderr.seek(0)
    said = judge.stderr.read()[-4000:].decode("utf-8", "replace").strip()
    code = judge.proc.returncode
    stop()
    return f"The check could not run (exit {code}).\n{said[-2000:]}"
