"""Notebooks that tests execute with nbclient, over unix sockets.

A TCP kernel is handed ports its manager found free, and binds them a moment later; on a busy
machine another process can take one in between, and the kernel dies before it replies
("Address already in use" in a CI run). Unix sockets in a folder of the test's own cannot
collide. (The grader's kernels use them too: labkit/grading/kernel_box.py.)
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient


def execute(nb, folder: Path, *, timeout: int = 120, kernel_name: str = "python3",
            allow_errors: bool = True, env: dict | None = None):
    """Run every cell of `nb` in `folder` (its working directory); return `nb`, executed."""
    # A short path: a unix socket's path is limited to 107 bytes.
    sockets = Path(tempfile.mkdtemp(prefix="kernel-", dir="/tmp"))
    km = None
    try:
        km = AsyncKernelManager(kernel_name=kernel_name, transport="ipc", ip=str(sockets / "k"),
                                connection_file=str(sockets / "connection.json"))
        client = NotebookClient(nb, km=km, timeout=timeout, kernel_name=kernel_name, allow_errors=allow_errors,
                                resources={"metadata": {"path": str(folder)}})
        client.execute(**({"env": env} if env is not None else {}))
    finally:
        # nbclient shuts down only a kernel it made: one handed in ran on until this process
        # ended ("Parent appears to have exited"), and its warm judge, servers and views with it.
        if km is not None and km.has_kernel:
            run_sync(km.shutdown_kernel)(now=False)
        shutil.rmtree(sockets, ignore_errors=True)
    return nb
