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

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import sandbox
from labkit.judge import differential
from labkit.judge.verdict import LabVerdict, from_json
from labkit.sandbox import profiles

JUDGE_TMP = "/tmp"


@dataclass
class JudgeRun:
    verdict: LabVerdict | None
    error: str = ""
    seconds: float = 0.0
    sandbox: str = "none"


def _env(uid: int | None, marker_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
    env.update(marker_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(profiles.ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if uid is None:
        env[sandbox.MODE_ENV] = "off"
    else:
        env.update({sandbox.MODE_ENV: "on", sandbox.UID_ENV: str(uid), "TMPDIR": JUDGE_TMP, "HOME": JUDGE_TMP})
    return env


def run(lab: str, module: Path, seed: int, *, uid: int | None, timeout: float,
        marker_env: dict[str, str] | None = None) -> JudgeRun:
    """The judge's verdict on `module`; `uid` None runs it (and its children) unsandboxed."""
    started = time.monotonic()
    env = _env(uid, marker_env or {})
    argv = [sys.executable, "-P", "-m", "labkit", "check", lab, "--solution", str(module),
            "--seed", str(seed), "--json"]
    if uid is None:
        box, cwd = sandbox.NullBox(), str(module.parent)
    else:
        tables = differential.unicode_tables()
        if tables is not None:  # read-only: Hypothesis' failed writes there are silent
            env[differential.STORAGE_ENV] = str(tables)
        policy = profiles.judge_box(module=module, tmp=JUDGE_TMP, env=env, tables=tables)
        box, cwd = sandbox.Box.open(policy, sandbox.support().cgroups), str(module.parent)
    proc = None
    with tempfile.TemporaryFile() as err:
        try:
            proc = box.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                             cwd=cwd, env=env, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                box.kill()
                proc.kill()
                proc.communicate()
                return JudgeRun(None, f"the judge ran over {timeout:g} s", time.monotonic() - started,
                                _label(box))
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            box.close(proc)
        err.seek(0)
        said = err.read()[-3000:].decode("utf-8", "replace").strip()
    seconds = time.monotonic() - started
    if proc.returncode not in (0, 1):
        return JudgeRun(None, f"the judge exited with code {proc.returncode}: {said}", seconds, _label(box))
    try:
        return JudgeRun(from_json(json.loads(out)), "", seconds, _label(box))
    except (ValueError, KeyError, TypeError) as exc:
        return JudgeRun(None, f"the judge's verdict could not be read ({exc}): {said}", seconds, _label(box))


def _label(box) -> str:
    return "bubblewrap" if box.active else "none"
