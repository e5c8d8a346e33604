"""The sandbox every piece of student code runs in: a declared policy → bubblewrap + cgroups.

- `policy`: `Policy`, what one sandboxed program may see and use, as data;
- `bwrap`: a policy → one command line (bubblewrap, setpriv, prlimit, cgroup join);
- `cgroups`: per-sandbox memory and process-count groups (v1 or v2);
- `box`: one run: `Box.open(policy)`, `box.spawn(argv, ...)`, `box.close(proc)` → `Report`
  with a named `Outcome`; `NullBox` when there is no sandbox;
- `profiles`: the course's policies: a judge's child, a grading kernel, the judge's own box.

Whether to sandbox is decided once per process (`LABKIT_SANDBOX`): `on` (required: refuse
to run student code without it), `off`, or `auto` (default: on when running as root and the
machine can, since root is exactly who must not run student code unconfined).
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
from dataclasses import dataclass

from labkit.sandbox import bwrap, cgroups
from labkit.sandbox.box import Box, NullBox, Outcome, Report, returncode
from labkit.sandbox.policy import DEFAULT_UID, Policy

__all__ = ["Box", "NullBox", "Outcome", "Policy", "Report", "Support", "enabled", "returncode",
           "support", "uid", "MODE_ENV", "UID_ENV"]

MODE_ENV = "LABKIT_SANDBOX"  # on | off | auto
UID_ENV = "LABKIT_SANDBOX_UID"  # the unprivileged uid (and gid) sandboxed programs run as


class SandboxUnavailable(RuntimeError):
    """LABKIT_SANDBOX=on, but this machine cannot sandbox; the message says why."""


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""  # why not, in words an instructor can act on
    cgroups: cgroups.Hierarchy | None = None

    @property
    def describe(self) -> str:
        if not self.ok:
            return f"none ({self.reason})"
        limits = f"cgroup v{self.cgroups.version} memory+pids" if self.cgroups else "rlimits only, no cgroups"
        return f"bubblewrap, uid {uid()}, {limits}"


_SUPPORT_LOCK = threading.Lock()


def support() -> Support:
    """Can this process run sandboxes? Tried once for real, then remembered. Where it can, the
    groups of sandboxes whose maker has died are cleared first (`cgroups.sweep_orphans`).

    Locked: a judge's steps start in threads, and each would otherwise try at once."""
    with _SUPPORT_LOCK:
        return _try_support()


@functools.lru_cache(maxsize=1)
def _try_support() -> Support:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return Support(False, "the grader is not running as root, so it cannot give student code "
                              "another (unprivileged) user id")
    missing = [name for name in bwrap.TOOLS if bwrap.tool(name) is None]
    if missing:
        return Support(False, f"{', '.join(missing)} not found under /usr (Debian: apt-get install "
                              f"bubblewrap util-linux)")
    hierarchy = cgroups.find()
    box = Box.open(Policy(memory_bytes=None, max_processes=None, tmp_bytes=1024 * 1024))
    try:
        proc = box.spawn(["/usr/bin/true"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support(False, f"bubblewrap could not start: {exc}")
    finally:
        box.close()
    if proc.returncode != 0:
        said = err.decode("utf-8", "replace").strip()[-300:]
        return Support(False, f"bubblewrap failed here (exit {proc.returncode}): {said}")
    if hierarchy is not None:
        cgroups.sweep_orphans(hierarchy)
    return Support(True, cgroups=hierarchy)


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto").strip().lower()
    return value if value in ("on", "off", "auto") else "auto"


def enabled() -> bool:
    """Whether student code started by this process goes into a sandbox.

    Raises SandboxUnavailable when the sandbox is required here but cannot run.
    """
    wanted = mode()
    if wanted == "off":
        return False
    found = support()
    if wanted == "on" and not found.ok:
        raise SandboxUnavailable(f"no sandbox: {found.reason}")
    return found.ok


def uid() -> int:
    try:
        return int(os.environ.get(UID_ENV) or DEFAULT_UID)
    except ValueError:
        return DEFAULT_UID


def open_box(policy: Policy) -> Box | NullBox:
    """A box for `policy` when sandboxing is on here, else a `NullBox`."""
    if not enabled():
        return NullBox()
    return Box.open(policy, support().cgroups)
