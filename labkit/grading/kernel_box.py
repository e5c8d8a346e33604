"""The grading kernel, in a sandbox of its own (`labkit.sandbox.profiles.kernel`).

The kernel runs the whole notebook, student cells included, so it gets what a judge's child
gets and less: an unprivileged uid, no network at all (a namespace with only `lo`), a private
size-capped tmpfs as its home and working folder, read-only Python and labkit. nbclient talks
to it over unix sockets in one folder (`transport="ipc"`): the only host folder it may write
to, and only until it is ready — then the folder is locked (root's, not writable), so no
cell can put anything on the grader's disk.

Without a sandbox (`grade --no-sandbox`) the kernel still gets its limits (prlimit) and a
private environment, but sees and may write whatever the grader may.

The kernel's own stdio is never the grader's: the worker's stdout and stderr are its log in
`--out/.results/`, and jupyter_client would hand them to the kernel (and to bwrap) as they
are. The kernel gets /dev/null for stdin and stdout, and a pipe for stderr that a thread of
ours drains, keeping only its last `STDERR_TAIL` bytes (the reason a kernel failed to start);
no other descriptor of the worker is inherited (`close_fds`; only the box's status pipe is
passed on).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient

from labkit import sandbox
from labkit.grading.settings import Limits
from labkit.limits import RUN_MARKER
from labkit.sandbox import bwrap, profiles


class NoHeartbeatClient(AsyncKernelClient):
    """A kernel client without the heartbeat channel.

    The heartbeat's thread can wait forever: a cell that writes over the kernel's sockets breaks
    its REQ/REP cycle, the thread reconnects and awaits a `send` that a dead kernel never takes,
    and `stop_channels()` joins it without a timeout (jupyter_client 8.10), so the grader's
    worker hung until the batch killed it and the executed notebook was lost. Nothing needs the
    heartbeat: the client asks its manager, which watches the kernel's process, whether the
    kernel is alive."""

    def start_channels(self, shell: bool = True, iopub: bool = True, stdin: bool = True, hb: bool = True,
                       control: bool = True) -> None:
        super().start_channels(shell=shell, iopub=iopub, stdin=stdin, hb=False, control=control)


# The kernel's home and working folder inside its sandbox (a private tmpfs).
HOME = "/home/student"
# What is kept of the kernel's (and bwrap's) stderr: its end, in memory, never on disk.
STDERR_TAIL = 8192


class Drain:
    """The read end of a kernel's stderr pipe, read to its end by a thread; only the tail is kept."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both O_CLOEXEC: Popen dups the write end onto fd 2
        self.tail = bytearray()
        self.thread = threading.Thread(target=self._run, name="kernel-stderr", daemon=True)

    def started(self) -> None:
        """After the Popen: our copy of the write end goes, so the pipe ends with the kernel."""
        os.close(self.write_fd)
        self.thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self.read_fd, 65536):
                self.tail += chunk
                del self.tail[:-STDERR_TAIL]
        except OSError:
            pass
        finally:
            os.close(self.read_fd)

    def text(self) -> str:
        return bytes(self.tail).decode("utf-8", "replace")


def kernel_env(home: str, marker: str) -> dict[str, str]:
    """Every default write location inside the kernel's home; the marker that finds it."""
    return {
        "HOME": home, "JUPYTER_RUNTIME_DIR": f"{home}/.local/share/jupyter/runtime",
        "JUPYTER_DATA_DIR": f"{home}/.local/share/jupyter", "JUPYTER_CONFIG_DIR": f"{home}/.jupyter",
        "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": f"{home}/.ipython", "MPLCONFIGDIR": f"{home}/.cache",
        "XDG_CACHE_HOME": f"{home}/.cache", "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share", RUN_MARKER: marker,
    }


class KernelBox:
    """One submission's kernels (a fresh one per start attempt) and their sandboxes."""

    def __init__(self, sockets: Path, lab: str, limits: Limits, marker: str, uid: int | None,
                 shown: dict[Path, str] | None = None):
        """`sockets`: the kernel's own folder (settings.socket_folder); `shown`: host files shown
        read-only in its home. The kernel reads the labs' manifests, never their checks."""
        self.sockets, self.lab, self.limits, self.marker = sockets, lab, limits, marker
        self.uid, self.shown = uid, dict(shown or {})
        self.boxes: list = []
        self.drains: list[Drain] = []
        sockets.mkdir(parents=True, exist_ok=True)
        sockets.chmod(0o700)

    @property
    def sandboxed(self) -> bool:
        return self.uid is not None

    def home(self) -> str:
        return HOME if self.sandboxed else str(self.sockets / "home")

    def open(self):
        """A box for the next kernel start."""
        if not self.sandboxed:
            Path(self.home()).mkdir(exist_ok=True)
            for host, inside in self.shown.items():
                target = Path(self.home()) / Path(inside).relative_to(HOME)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(host, target)
            box = sandbox.NullBox()
        else:
            policy = profiles.kernel(self.uid, home=HOME, sockets=self.sockets, lab=self.lab,
                                     shown=self.shown, env=kernel_env(HOME, self.marker),
                                     memory_bytes=self.limits.kernel_memory,
                                     file_bytes=self.limits.kernel_file_size)
            box = sandbox.Box.open(policy, sandbox.support().cgroups)
        self.boxes.append(box)
        return box

    def wrap(self, box, cmd: list[str]) -> list[str]:
        if box.active:
            return box.command(cmd)
        limits = [f"--as={self.limits.kernel_memory}", f"--fsize={self.limits.kernel_file_size}", "--core=0"]
        return [bwrap.tool("prlimit") or "prlimit", *limits, "--", *cmd]

    def env(self) -> dict[str, str]:
        """The environment the kernel's launcher gets (the sandbox replaces it for the kernel)."""
        env = dict(os.environ)
        for name in ("JPY_SESSION_NAME", "NBGRADER_EXECUTION", "PYTEST_CURRENT_TEST"):
            env.pop(name, None)
        if not self.sandboxed:
            env.update(profiles.base_env(self.home()))
            env.update(kernel_env(self.home(), self.marker))
            env["TMPDIR"] = self.home()
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(profiles.ROOT), os.environ.get("PYTHONPATH")]))
        return env

    def lock(self) -> None:
        """Once the kernel is ready: its socket folder is root's again, and not writable for it."""
        if self.sandboxed:
            os.chown(self.sockets, 0, 0)
            self.sockets.chmod(0o711)

    def interrupt(self) -> bool:
        """SIGINT to the kernel itself (bwrap would die of it); False when not sandboxed."""
        if not self.boxes or not self.boxes[-1].active:
            return False
        self.boxes[-1].signal(signal.SIGINT)
        return True

    def kill(self) -> None:
        """Kill every kernel started so far and everything they started."""
        from labkit.sandbox import reaper

        for box in self.boxes:
            box.kill()
        reaper.kill_marked(self.marker)

    def stderr(self) -> str:
        """The end of what the last kernel started (and its sandbox) wrote to stderr."""
        return self.drains[-1].text() if self.drains else ""

    def close(self) -> None:
        self.kill()
        for box in self.boxes:
            box.close()
        self.boxes.clear()

    def manager_class(self) -> type[AsyncKernelManager]:
        """A kernel manager that starts the kernel in this box, for nbclient's `kernel_manager_class`."""
        owner = self

        class SandboxedKernelManager(AsyncKernelManager):
            """Starts the kernel through its sandbox; unix sockets in the owner's folder."""

            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.client_factory = NoHeartbeatClient
                self.transport = "ipc"
                self.ip = str(owner.sockets / f"k{uuid.uuid4().hex[:8]}")
                self.connection_file = str(owner.sockets / f"kernel-{uuid.uuid4().hex}.json")

            async def _async_pre_start_kernel(self, **kw):
                cmd, kw = await super()._async_pre_start_kernel(**kw)
                box = owner.open()  # after the connection file exists: it is handed over too
                self._labkit_box = box
                wrapped = owner.wrap(box, cmd)
                kw["pass_fds"] = (*kw.get("pass_fds", ()), *box.pass_fds)
                kw["env"] = owner.env()
                kw["cwd"] = str(owner.sockets) if box.active else owner.home()
                # Never the worker's stdio (its log, in --out) nor any other descriptor of ours.
                drain = self._labkit_drain = Drain()
                owner.drains.append(drain)
                kw.update(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=drain.write_fd,
                          close_fds=True)
                return wrapped, kw

            async def _async_launch_kernel(self, kernel_cmd, **kw):
                try:
                    return await super()._async_launch_kernel(kernel_cmd, **kw)
                finally:
                    self._labkit_box.started()
                    self._labkit_drain.started()

            async def _async_interrupt_kernel(self):
                if not owner.interrupt():
                    await super()._async_interrupt_kernel()

            interrupt_kernel = _async_interrupt_kernel

        return SandboxedKernelManager
