"""Run a restored notebook with nbclient, its kernel in a sandbox (`kernel_box`), bounded in time.

Errors in cells are the student's and are kept (`allow_errors`). A cell over its timeout is
interrupted; if the interrupt does not end it, the kernel is killed. The whole run has a
wall-clock limit too. A kernel that dies is recorded, not fatal: the grade never depends on
the kernel (the judge scores the step code separately).

Only this run's outputs: `prepare` clears every stored output (and execution count) of the
submission, its widget state and every attachment but a markdown cell's pictures, so nothing
the student saved can pass for the grader's. Outputs are capped as they arrive (`GradingClient`),
each output measured as it will be written (every kind: streams, every MIME type of a display
or result, tracebacks, output metadata), per cell and per notebook. An update to an earlier
display (`update_display_data`, or a new display with the same id) is charged for what it
adds, `clear_output` gives back what it clears, and widget messages are not kept at all (the
feedback page is static: it could not show them). Whatever still gets past the count (it is
an estimate) is cut from the finished notebook by `cap_outputs`, which measures the serialized
file: the cap is a guarantee. A cut always leaves a note saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
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
from labkit.judge.processes import Budget

SKIP_TAG = "skip-execution"
# Markdown attachments kept (the student's own pictures, shown through the sanitizer's `data:` rule).
ATTACHMENT_TYPES = {"image/png", "image/jpeg", "image/gif"}
# At most this many cells get a note of their own about a cut (each note is small; a notebook of
# a million one-line cells must not get a million notes). The feedback page lists them all.
MAX_NOTES = 100
# Charged per output and per line of text on top of its JSON (the file's indentation, and
# nbformat writing each line of a text as a string of its own).
OUTPUT_COST, LINE_COST, TEXT_LINE_COST = 96, 8, 16
TOO_BIG = 1 << 62  # what an output that cannot even be measured (nested too deep) counts as
# A cell's outputs may pass its cap by the grader's own note about the cut.
NOTE_ALLOWANCE = 1024


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
# After interrupting a cell over its timeout, how long the kernel has to stop before it is
# killed: a kernel that ignores SIGINT (or whose channels a cell broke) would otherwise hold
# its job for a second whole cell timeout.
INTERRUPT_GRACE = 5.0


def output_size(node) -> int:
    """Bytes an output (or a message's content) takes in the written notebook, estimated from above:
    its JSON as nbformat writes it (indented, UTF-8, every text line a string of its own)."""
    try:
        text = json.dumps(node, ensure_ascii=False, indent=1, default=repr)
    except (RecursionError, ValueError, TypeError):
        return TOO_BIG
    return (len(text.encode("utf-8", "surrogatepass")) + OUTPUT_COST + LINE_COST * text.count("\n")
            + TEXT_LINE_COST * text.count("\\n"))


def _measured(content: dict) -> dict:
    """The part of a message's content that is kept in the notebook."""
    return {k: v for k, v in content.items() if k not in ("transient", "execution_count")}


class GradingClient(NotebookClient):
    """nbclient with capped outputs and a timeout that escalates from interrupt to kill.

    `held[cell]` is what the cell's outputs take now (by `output_size`), `total_bytes` their sum:
    a new output, or an update that makes a display bigger, must fit under both caps; a clear
    gives its bytes back. Widget messages are counted, never kept (`store_widget_state` off, no
    Output-widget mimic: what such a widget captures shows in its cell as ordinary output)."""

    def __init__(self, nb: NotebookNode, limits: Limits, kill_kernel, **kwargs):
        super().__init__(nb, store_widget_state=False, **kwargs)
        self.comm_open_handlers = {}
        self.limits = limits
        self.kill_kernel = kill_kernel
        self.current_cell: int | None = None
        self.interrupted: set[int] = set()
        self.killed_at: int | None = None  # the cell whose interrupt did not stop it in time
        self.finished: set[int] = set()
        self.held: dict[int, int] = {}
        self.sizes: dict[int, dict[int, tuple[NotebookNode, int]]] = {}  # cell → id(output) → (it, size)
        self.total_bytes = 0
        self.notes: dict[int, NotebookNode] = {}
        self.dropped: dict[int, int] = {}
        self.widget_messages: dict[int, int] = {}
        self.budget: Budget | None = None  # the running cell's time (`_over_time`)
        self.on_cell_start = self._started
        self.on_cell_executed = self._executed

    def _started(self, cell: NotebookNode, cell_index: int) -> None:
        self.current_cell = cell_index
        pid = self._kernel_pid()
        self.budget = Budget(pid, self.limits.cell_timeout) if pid is not None else None

    def _kernel_pid(self) -> int | None:
        """The pid nbclient's kernel manager launched (the kernel's sandbox, or the kernel)."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(process, "pid", None)

    async def _over_time(self) -> bool:
        """Wait out what a busy machine took from the running cell; True if it is still running then.

        nbclient's timeout is on the clock. A cell's limit is about the student's code, so the
        time its kernel (and what the kernel started) spent runnable but waiting for a CPU is
        added, up to `WALL_FACTOR` times the limit (`processes.Budget`): a cell that sleeps or
        hangs is stopped at its limit, one slowed by a loaded machine is not (seen in CI: a cell
        writing 4 GB to a capped tmpfs passed its 5 s on an idle machine and not on a busy one)."""
        budget = self.budget
        while budget is not None and time.monotonic() < budget.deadline():
            with contextlib.suppress(Exception):  # a broken channel: the timeout stands
                if await ensure_async(self.kc.shell_channel.msg_ready()):
                    return False  # answered meanwhile: nbclient reads the reply next
            await asyncio.sleep(0.05)
        return True

    def _executed(self, cell: NotebookNode, cell_index: int, execute_reply=None, **_) -> None:
        self.finished.add(cell_index)

    def _room(self, cell_index: int) -> int:
        return min(self.limits.cell_output_bytes - self.held.get(cell_index, 0),
                   self.limits.notebook_output_bytes - self.total_bytes)

    def _charge(self, cell_index: int, out: NotebookNode, size: int) -> None:
        sizes = self.sizes.setdefault(cell_index, {})
        _, before = sizes.get(id(out), (out, 0))
        sizes[id(out)] = (out, size)
        self.held[cell_index] = self.held.get(cell_index, 0) + size - before
        self.total_bytes += size - before

    def _release(self, cell_index: int) -> None:
        """The cell's outputs were cleared: what they held is free again."""
        self.total_bytes -= self.held.pop(cell_index, 0)
        self.sizes.pop(cell_index, None)

    def output(self, outs, msg, display_id, cell_index):
        content, msg_type = msg.get("content", {}), msg.get("msg_type", "")
        if self.clear_before_next_output:  # a clear_output(wait=True) before this: clear now, free its bytes
            outs[:] = []
            self.clear_display_id_mapping(cell_index)
            self.clear_before_next_output = False
            self._release(cell_index)
        size = output_size(_measured(content))
        room = self._room(cell_index)
        if size <= room:
            out = super().output(outs, msg, display_id, cell_index)
            if out is not None:
                self._charge(cell_index, out, size)
            return out
        kept = None
        text = content.get("text")
        if msg_type == "stream" and isinstance(text, str) and room > 4 * OUTPUT_COST and size < TOO_BIG:
            # Cut by its share of the estimate (escapes and line breaks weigh more than a plain
            # character), then shorter until it fits.
            keep = int(len(text) * (room - 4 * OUTPUT_COST) / size)
            while keep > 0:
                part = {**msg, "content": {**content, "text": text[:keep]}}
                kept_size = output_size(_measured(part["content"]))
                if kept_size <= room:
                    kept = super().output(outs, part, display_id, cell_index)
                    if kept is not None:
                        self._charge(cell_index, kept, kept_size)
                        size = max(0, size - kept_size)
                    break
                keep = keep * 3 // 4
        self._note(outs, cell_index, dropped=size)
        return kept

    def clear_output(self, outs, msg, cell_index):
        super().clear_output(outs, msg, cell_index)
        if not msg.get("content", {}).get("wait"):
            self._release(cell_index)

    def _update_display_id(self, display_id, msg):
        """An update to earlier outputs (`update_display_data`, or a display reusing the id): each
        target is charged what it grows by; one that would not fit shows a note instead."""
        if display_id not in self._display_id_map:
            return None
        header = {**msg["header"], "msg_type": "display_data"}
        content = msg.get("content", {})
        size = output_size({"data": content.get("data"), "metadata": content.get("metadata"),
                            "output_type": "display_data"})
        try:
            new = nbformat.v4.output_from_msg({**msg, "header": header}) if size < TOO_BIG else None
        except (ValueError, KeyError, TypeError, RecursionError):
            new = None
        for cell_index, positions in self._display_id_map[display_id].items():
            outputs = self.nb.cells[cell_index].get("outputs", [])
            for position in positions:
                if not 0 <= position < len(outputs):
                    continue
                target = outputs[position]
                _, before = self.sizes.get(cell_index, {}).get(id(target), (target, 0))
                if new is not None and size - before <= self._room(cell_index):
                    target["data"], target["metadata"] = new["data"], new["metadata"]
                    self._charge(cell_index, target, size)
                    continue
                text = f"[the grader did not apply an update to this display: {size:,} bytes over the output limit]"
                target["data"], target["metadata"] = nbformat.from_dict({"text/plain": text}), nbformat.from_dict({})
                self._charge(cell_index, target, output_size(target))
                self.dropped[cell_index] = self.dropped.get(cell_index, 0) + size
        return None

    def handle_comm_msg(self, outs, msg, cell_index):
        """Widget state is not kept (a static page cannot show it); the cell says how much was left out."""
        self.widget_messages[cell_index] = self.widget_messages.get(cell_index, 0) + 1
        count = self.widget_messages[cell_index]
        if count == 1 or count % 1000 == 0:  # the note's text, now and then: a flood of messages stays cheap
            self._note(outs, cell_index)

    def _note(self, outs, cell_index: int, dropped: int = 0) -> None:
        self.dropped[cell_index] = self.dropped.get(cell_index, 0) + dropped
        note = self.notes.get(cell_index)
        if note is None or not any(o is note for o in outs):
            if len(self.notes) >= MAX_NOTES and cell_index not in self.notes:
                return
            note = nbformat.v4.new_output("stream", name="stderr", text="")
            outs.append(note)
            self.notes[cell_index] = note
        said = []
        if self.dropped.get(cell_index):
            said.append(f"the grader cut this cell's output here: {self.dropped[cell_index]:,} more bytes were not "
                        f"kept (limits: {self.limits.cell_output_bytes:,} per cell, "
                        f"{self.limits.notebook_output_bytes:,} per notebook)")
        if self.widget_messages.get(cell_index):
            said.append(f"the grader keeps no widget state: this cell's widget messages "
                        f"({self.widget_messages[cell_index]:,}+) were not kept")
        note["text"] = "".join(f"\n[{line}]\n" for line in said)

    @property
    def cut_cells(self) -> list[int]:
        return sorted(set(self.dropped) | set(self.widget_messages))

    async def _async_handle_timeout(self, timeout, cell=None):
        index = self.current_cell if self.current_cell is not None else -1
        if index in self.interrupted:  # the interrupt did not end it: kill the kernel
            self.kill_kernel()
            raise CellTimeoutError.error_from_timeout_and_cell(
                "Cell execution timed out, and did not stop when interrupted", timeout, cell)
        if not await self._over_time():
            return None
        self.interrupted.add(index)
        await ensure_async(self.km.interrupt_kernel())
        grace = threading.Timer(INTERRUPT_GRACE, self._kill_if_still, args=(index,))
        grace.daemon = True
        grace.start()
        return None

    def _kill_if_still(self, index: int) -> None:
        """The interrupted cell is still the one running: the interrupt did not end it."""
        if self.current_cell == index and index not in self.finished:
            self.killed_at = index
            self.kill_kernel()


def prepare(nb: NotebookNode, skip: set[str]) -> NotebookNode:
    """A copy to execute, holding nothing but what this run will produce.

    Every code cell loses its stored outputs and execution count (a cell nbclient does not run —
    a check cell, one with an empty source, one the student tagged to be skipped — would
    otherwise show what the student saved as if the grader had run it); the notebook loses its
    widget state; attachments stay only on markdown cells, and only pictures (PNG, JPEG, GIF:
    shown through the sanitizer's `data:` rule). The cells whose ids are in `skip` are tagged
    so nbclient skips them (the grader writes its verdict into them afterwards)."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        attachments = cell.pop("attachments", None)
        if cell.get("cell_type") == "markdown" and isinstance(attachments, dict):
            pictures = {name: {mime: data for mime, data in bundle.items() if mime in ATTACHMENT_TYPES}
                        for name, bundle in attachments.items() if isinstance(bundle, dict)}
            pictures = {name: bundle for name, bundle in pictures.items() if bundle}
            if pictures:
                cell["attachments"] = nbformat.from_dict(pictures)
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
                if client.killed_at is not None:
                    result.status = TIMEOUT
                    result.message = (f"Cell {client.killed_at} ran over {limits.cell_timeout:g} s and did not "
                                      f"stop within {INTERRUPT_GRACE:g} s of an interrupt; the kernel was "
                                      "stopped there.")
                elif out_of_time.is_set():
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
                said = kernel.stderr().strip() if client.current_cell is None else ""
                if said:  # before any cell ran, only the kernel's start (and its sandbox's) could say this
                    result.message += f" The kernel said: {said[-300:]}"
            break
    finally:
        watchdog.cancel()
        kill_kernel()
    result.timed_out_cells = sorted(i for i in client.interrupted if i >= 0)
    if result.status == OK and result.timed_out_cells:
        result.status = TIMEOUT
        cells = ", ".join(map(str, result.timed_out_cells))
        result.message = f"Cell {cells} ran over {limits.cell_timeout:g} s and was interrupted."
    result.truncated_cells = client.cut_cells
    result.seconds = time.monotonic() - started
    return result


def _writes(nb: NotebookNode) -> int:
    """The notebook's size as written (nbformat's own serializer, without its validation)."""
    from nbformat.v4 import nbjson

    return len(nbjson.writes(nb).encode("utf-8", "surrogatepass"))


def outputs_bytes(nb: NotebookNode, keep: set[str]) -> int:
    """What the outputs of the cells not in `keep` add to the written notebook, in bytes."""
    bare = copy.copy(nb)
    bare.cells = [cell if cell.get("cell_type") != "code" or cell.get("id") in keep
                  else nbformat.NotebookNode({**cell, "outputs": []}) for cell in nb.cells]
    return _writes(nb) - _writes(bare)


def _cut_note(count: int, size: int, limits: Limits) -> NotebookNode:
    return nbformat.v4.new_output("stream", name="stderr", text=(
        f"\n[the grader cut {count:,} output(s) of this cell, {size:,} bytes: the saved notebook keeps at most "
        f"{limits.cell_output_bytes:,} bytes of output per cell and {limits.notebook_output_bytes:,} in all]\n"))


def cap_outputs(nb: NotebookNode, limits: Limits, keep: set[str]) -> list[int]:
    """Make the cap a guarantee on the file: outputs of cells not in `keep` (the grader's own
    verdicts) take at most `cell_output_bytes` per cell (by the estimate, which is from above; plus
    `NOTE_ALLOWANCE` for the grader's note) and `notebook_output_bytes` in all, as written. The largest go first, each cell that lost any says so in a note (at most MAX_NOTES
    notes; a notebook that is still over then loses every student output). Returns the cells cut."""
    cells = [(i, cell) for i, cell in enumerate(nb.cells)
             if cell.get("cell_type") == "code" and cell.get("id") not in keep and cell.get("outputs")]
    cut: dict[int, list[int]] = {}  # cell → [outputs removed, bytes]

    def remove(i: int, cell, index: int, size: int) -> None:
        del cell["outputs"][index]
        count = cut.setdefault(i, [0, 0])
        count[0] += 1
        count[1] += size

    for i, cell in cells:  # per cell, by the estimate (which is from above)
        sizes = [output_size(out) for out in cell["outputs"]]
        over = sum(sizes) - limits.cell_output_bytes - NOTE_ALLOWANCE
        for index in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
            if over <= 0:
                break
            over -= sizes[index]
            sizes[index] = -1
        for index in reversed(range(len(sizes))):
            if sizes[index] < 0:
                remove(i, cell, index, output_size(cell["outputs"][index]))
    for _ in range(3):  # the whole notebook, measured as written
        ranked = sorted(((output_size(out), id(out)) for _, cell in cells for out in cell["outputs"]),
                        key=lambda t: -t[0])
        if sum(size for size, _ in ranked) <= limits.notebook_output_bytes:
            break  # the estimate is from above: the file cannot be over (writing it twice was ~60 ms a notebook)
        excess = outputs_bytes(nb, keep) - limits.notebook_output_bytes
        if excess <= 0:
            break
        chosen: set[int] = set()
        for size, key in ranked:
            if excess <= 0:
                break
            chosen.add(key)
            excess -= size
        for i, cell in cells:
            for index in reversed(range(len(cell["outputs"]))):
                if id(cell["outputs"][index]) in chosen:
                    remove(i, cell, index, output_size(cell["outputs"][index]))
    for n, (i, (count, size)) in enumerate(sorted(cut.items())):
        if n < MAX_NOTES:
            nb.cells[i]["outputs"].append(_cut_note(count, size, limits))
    if cut and outputs_bytes(nb, keep) > limits.notebook_output_bytes:  # the notes themselves: last resort
        for _, cell in cells:
            cell["outputs"] = []
        if cells:
            cells[0][1]["outputs"] = [_cut_note(0, 0, limits)]
    return sorted(cut)
