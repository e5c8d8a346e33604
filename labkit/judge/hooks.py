"""A crash at a hook, carried out by the judge: the child reports the hook and waits; the judge
kills its whole sandbox from outside.

The probe's hook (`after_delivery`, `after_claim`, `before_ack`) writes one record on the private
result pipe ("I reached the hook, with this") and then blocks (`labkit.probe.hold`). On that
record the judge SIGKILLs every process of the child's sandbox (`child.kill_sandbox`): the
student's code cannot replace that death (a patched `os._exit`, a caught SystemExit, an atexit
or signal handler, a `setsid` helper: none of them runs or survives), and the judge reads the
files only after nothing of the sandbox runs any more.

    run, hook = run_to_hook(ctx.solution, "checks.outbox.probes:crash_dispatch", args,
                            workdir=ctx.workdir, timeout=ctx.timeout, marker=ctx.marker(),
                            module_name="worker", at_hook=lambda r: r.get("kind") == "hook")
    run.exit_code == KILLED_AT_HOOK  # when hook is not None

`on_hook(record, session)` may instead act on the live child and return "continue" (the relay's
pause: freeze from outside, run another publisher, thaw, then `release(session)`).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from labkit.judge.child import ChildRun, ChildSession, child_session, kill_sandbox
from labkit.limits import KILL_GRACE

KILLED_AT_HOOK = -signal.SIGKILL  # the exit the judge records for a child it killed at the hook
KILLED_TEXT = "killed by the judge at the hook (SIGKILL)"


def release(session: ChildSession, timeout: float = 2.0) -> bool:
    """Let a child that holds at a hook go on (one line on its private request pipe)."""
    return session._write(b"go\n", time.monotonic() + timeout)


def run_to_hook(module: Path, probe: str, args: dict, *, workdir: Path, timeout: float, marker: str,
                module_name: str, at_hook: Callable[[dict], bool], env: dict[str, str] | None = None,
                on_hook: Callable[[dict, ChildSession], str] | None = None) -> tuple[ChildRun, dict | None]:
    """Run `probe` in a child (bounded by `timeout`); kill its sandbox when it reports `at_hook`.

    Returns the child's run (records, how it ended) and the hook record the judge acted on
    (None: the child never reached the hook). After a kill at the hook, `run.exit_code` is
    `KILLED_AT_HOOK` and `run.timed_out` is False, whatever the child's status said.
    """
    hook: dict | None = None
    killed = False
    with child_session(module, workdir=workdir, timeout=timeout, marker=marker, module_name=module_name,
                       env=env, probe=probe, args=args) as session:
        run = session.run
        deadline = time.monotonic() + timeout
        if session.imported:
            while True:
                found = session._wait_for(lambda r: r.get("event") == "note" and at_hook(r), deadline)
                if found is None:
                    break
                run.records.append(found)
                action = on_hook(found, session) if on_hook is not None else "kill"
                if action == "kill":
                    hook = found
                    kill_sandbox(session.proc, marker)
                    killed = True
                    break
                hook = found
                deadline = time.monotonic() + timeout  # the judge's own pause is not the child's time
            if not killed:
                try:  # EOF on the pipe comes a moment before the exit status is ready
                    session.proc.wait(timeout=max(0.0, min(deadline - time.monotonic(), KILL_GRACE)))
                except subprocess.TimeoutExpired:
                    pass
                run.timed_out = session.proc.poll() is None and time.monotonic() >= deadline
            session._wait_for(lambda r: False, time.monotonic())  # what it said before it ended
    if killed:
        run.exit_code, run.timed_out = KILLED_AT_HOOK, False
    return run, hook
