"""Folders for the real servers' tests, what a server could leave behind, and a run as another uid.

As root the servers run as `nobody`, which must be able to reach the folder: pytest's own temp
dirs are 0700, so each test gets a 0711 folder under /tmp instead, removed after it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from labkit.judge import tcp_table
from labkit.servers.processes import processes_in

ROOT = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def temp_base():
    """For a fixture: a 0711 folder under /tmp; a server's folder is made inside it (the server
    makes it); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-srv-", dir="/tmp"))
    os.chmod(folder, 0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def leftovers(*folders: Path) -> dict:
    """Everything of a server in its `folders` (PostgreSQL's data may have one of its own) that
    must be gone after it stopped."""
    return {"processes": processes_in(*folders), "folder exists": any(f.exists() for f in folders),
            "sockets": sorted(str(p) for f in folders if f.exists() for p in f.rglob("*") if p.is_socket())}


NOTHING = {"processes": [], "folder exists": False, "sockets": []}


def listening_on(port: int) -> bool:
    """A TCP socket listening on 127.0.0.1:port, whoever holds it (the kernel's table, by netlink)."""
    return any(row.local == ("127.0.0.1", port) for row in tcp_table.connections(socket.AF_INET, 1 << 10))


def run_as_uid(uid: int, folder: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` run by this venv's python as `uid` with no capabilities and no groups, in a
    folder the uid owns; root only (setpriv)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        if in_ci():
            pytest.fail("CI runs as root with setpriv (util-linux): the unprivileged run must happen")
        pytest.skip("needs root and setpriv to become another uid")
    os.chown(folder, uid, uid)
    script = folder / "run.py"
    script.write_text(textwrap.dedent(code))
    os.chown(script, uid, uid)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(folder), "LC_ALL": "C"}
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "--inh-caps=-all", "--bounding-set=-all", sys.executable, str(script)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
