"""Run a restored notebook with nbclient, its kernel in a sandbox (`kernel_box`), bounded in time.

Errors in cells are the student's and are kept (`allow_errors`). A cell over its timeout is
interrupted; if the interrupt does not end it, the kernel is killed. The whole run has a
wall-clock limit too. A kernel that dies is recorded, not fatal: the grade never depends on
the kernel (the judge scores the step code separately). Outputs are capped as they arrive,
so a cell that prints 50 MB leaves a short note instead.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import nbformat
from jupyter_client.utils import ensure_async
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode

from labkit.grading.kernel_box import KernelBox
from labkit.grading.settings import CRASHED, OK, TIMEOUT, Limits

SKIP_TAG = "skip-execution"


@dataclass
class Execution:
    status: str = OK  # ok | timeout | crashed
    start_retries: int = 0  # kernels that failed to start before any cell ran
    message: str = ""
    seconds: float = 0.0
    timed_out_cells: list[int] = field(default_factory=list)
    died_at: int | None = None  # index of the cell that was running when the kernel died
    truncated_cells: list[int] = field(default_factory=list)
    sandbox: str = "none"  # "bubblewrap": the kernel ran in its own sandbox


# A kernel that fails to start before any cell ran gets this many tries in all.
START_ATTEMPTS = 2


def _size(content: dict, msg_type: str) -> int:
    if msg_type == "stream":
        return len(content.get("text", ""))
    if msg_type == "error":
        return sum(len(line) for line in content.get("traceback", []))
    data = content.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())


class GradingClient(NotebookClient):
    """nbclient with capped outputs and a timeout that escalates from interrupt to kill."""

    def __init__(self, nb: NotebookNode, limits: Limits, kill_kernel, **kwargs):
        super().__init__(nb, **kwargs)
        self.limits = limits
        self.kill_kernel = kill_kernel
        self.current_cell: int | None = None
        self.interrupted: set[int] = set()
        self.cell_bytes: dict[int, int] = {}
        self.total_bytes = 0
        self.notes: dict[int, NotebookNode] = {}
        self.dropped: dict[int, int] = {}
        self.on_cell_start = self._started

    def _started(self, cell: NotebookNode, cell_index: int) -> None:
        self.current_cell = cell_index

    def output(self, outs, msg, display_id, cell_index):
        content, msg_type = msg.get("content", {}), msg.get("msg_type", "")
        size = _size(content, msg_type)
        used = self.cell_bytes.get(cell_index, 0)
        room = min(self.limits.cell_output_bytes - used, self.limits.notebook_output_bytes - self.total_bytes)
        if size <= room:
            self.cell_bytes[cell_index] = used + size
            self.total_bytes += size
            return super().output(outs, msg, display_id, cell_index)
        kept = None
        if msg_type == "stream" and room > 0:
            msg = {**msg, "content": {**content, "text": content["text"][:room]}}
            kept = super().output(outs, msg, display_id, cell_index)
            self.cell_bytes[cell_index] = used + room
            self.total_bytes += room
            size -= room
        self._note_dropped(outs, cell_index, size)
        return kept

    def _note_dropped(self, outs, cell_index: int, size: int) -> None:
        self.dropped[cell_index] = self.dropped.get(cell_index, 0) + size
        note = self.notes.get(cell_index)
        if note is None or note not in outs:
            note = nbformat.v4.new_output("stream", name="stderr", text="")
            outs.append(note)
            self.notes[cell_index] = note
        note["text"] = (f"\n[the grader cut this cell's output here: {self.dropped[cell_index]:,} more "
                        f"characters were not kept (limit {self.limits.cell_output_bytes:,} per cell)]\n")

    async def _async_handle_timeout(self, timeout, cell=None):
        index = self.current_cell if self.current_cell is not None else -1
        if index in self.interrupted:  # the interrupt did not end it: kill the kernel
            self.kill_kernel()
            raise CellTimeoutError.error_from_timeout_and_cell(
                "Cell execution timed out, and did not stop when interrupted", timeout, cell)
        self.interrupted.add(index)
        await ensure_async(self.km.interrupt_kernel())
        return None


def prepare(nb: NotebookNode, skip: set[str]) -> NotebookNode:
    """A copy to execute: the cells whose ids are in `skip` are tagged so nbclient skips them."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.get("id") in skip:
            tags = cell.metadata.setdefault("tags", [])
            if SKIP_TAG not in tags:
                tags.append(SKIP_TAG)
    return nb


def untag(nb: NotebookNode, skip: set[str]) -> None:
    for cell in nb.cells:
        if cell.get("id") in skip:
            tags = [t for t in cell.metadata.get("tags", []) if t != SKIP_TAG]
            if tags:
                cell.metadata["tags"] = tags
            else:
                cell.metadata.pop("tags", None)


def execute(nb: NotebookNode, kernel: KernelBox, limits: Limits) -> Execution:
    """Execute `nb` in place, its kernel in `kernel`'s sandbox; never raises for what the notebook does."""
    result = Execution(sandbox="bubblewrap" if kernel.sandboxed else "none")
    started = time.monotonic()
    out_of_time = threading.Event()

    def kill_kernel() -> None:
        kernel.kill()

    def on_deadline() -> None:
        out_of_time.set()
        kill_kernel()

    def new_client() -> GradingClient:
        client = GradingClient(
            nb, limits, kill_kernel,
            timeout=max(1, int(limits.cell_timeout)),
            startup_timeout=60,
            allow_errors=True,
            interrupt_on_timeout=True,
            kernel_name="python3",
            kernel_manager_class=kernel.manager_class(),
            resources={"metadata": {"path": str(kernel.sockets)}},
            skip_cells_with_tag=SKIP_TAG,
            shutdown_kernel="immediate",
            iopub_timeout=4,
            record_timing=False,
        )
        client.on_notebook_start = lambda **_: kernel.lock()  # ready, before any cell runs
        return client

    watchdog = threading.Timer(limits.notebook_timeout, on_deadline)
    watchdog.daemon = True
    watchdog.start()
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            client = new_client()
            try:
                client.execute()
            except CellTimeoutError:
                result.status = TIMEOUT
                result.died_at = client.current_cell
                result.message = (f"Cell {client.current_cell} ran over {limits.cell_timeout:g} s and did not "
                                  "stop when interrupted; the kernel was stopped there.")
            except DeadKernelError:
                result.died_at = client.current_cell
                if out_of_time.is_set():
                    result.status = TIMEOUT
                    result.message = (f"The notebook ran over its {limits.notebook_timeout:g} s limit; "
                                      f"the kernel was stopped at cell {client.current_cell}.")
                else:
                    result.status = CRASHED
                    result.message = f"The kernel died while running cell {client.current_cell}."
            except Exception as exc:  # the kernel never started, or the protocol broke
                if client.current_cell is None and attempt < START_ATTEMPTS and not out_of_time.is_set():
                    # No cell ran: the student's code cannot be the cause. Seen once in CI under
                    # load ("Kernel didn't respond in 60 seconds"); a fresh kernel gets a try.
                    kill_kernel()
                    result.start_retries += 1
                    continue
                result.status = TIMEOUT if out_of_time.is_set() else CRASHED
                result.message = f"The notebook could not be executed: {type(exc).__name__}: {str(exc)[:300]}"
            break
    finally:
        watchdog.cancel()
        kill_kernel()
    result.timed_out_cells = sorted(i for i in client.interrupted if i >= 0)
    if result.status == OK and result.timed_out_cells:
        result.status = TIMEOUT
        cells = ", ".join(map(str, result.timed_out_cells))
        result.message = f"Cell {cells} ran over {limits.cell_timeout:g} s and was interrupted."
    result.truncated_cells = sorted(client.dropped)
    result.seconds = time.monotonic() - started
    return result
