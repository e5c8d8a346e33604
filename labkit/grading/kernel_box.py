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

import importlib.util
import math
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from queue import Empty

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient

from labkit import sandbox
from labkit.grading.settings import Limits
from labkit.limits import RUN_MARKER
from labkit.sandbox import bwrap, profiles, zygote


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

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        """jupyter_client's wait (a kernel_info reply on shell, then a message on IOPub, which
        proves IOPub connected), without its last step: waiting until IOPub has been silent for
        0.2 s, a fifth of a second of every submission. What is left of kernel_info's messages
        is only read past: nbclient keeps only the messages of the request it made."""
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                msg = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                pass
            else:
                if msg["msg_type"] == "kernel_info_reply":
                    try:
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass  # IOPub not connected yet: ask again
                    else:
                        self._handle_kernel_info_reply(msg)
                        return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")


# The kernel's home and working folder inside its sandbox (a private tmpfs).
HOME = "/home/student"
# `python -m ipykernel_launcher`'s sys.argv[0], for a kernel forked from the template.
LAUNCHER = getattr(importlib.util.find_spec("ipykernel_launcher"), "origin", None) or "ipykernel_launcher"
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


def start_template() -> zygote.Template | None:
    """The batch's template of the grading kernel, with a kernel's environment (its marker comes
    with each kernel); None where kernels cannot be forked (they start fresh)."""
    env = kernel_env(HOME, "")
    del env[RUN_MARKER]
    return zygote.start_template(profiles.kernel_environment(HOME, env), TEMPLATE_ROLE)


# What the template of the kernel imports — ipykernel and labkit's notebook side, never a lab's
# checks, which no kernel may read (nor find in its memory) — and what each kernel forked from it
# runs: `python -m ipykernel_launcher ARGS`.
TEMPLATE_ROLE = {
    "warm": ["ipykernel.ipkernel", "ipykernel.kernelapp", "ipykernel.debugger", "IPython.extensions.storemagic",
             "IPython.core.completerlib", "sqlite3", "ipywidgets", "labkit.notebook", "labkit.notebook.lab"],
    "packages": ["labkit.views"],
    "entry": "ipykernel.kernelapp:launch_new_instance",
}


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
                 shown: dict[Path, str] | None = None, template: str | None = None):
        """`sockets`: the kernel's own folder (settings.socket_folder); `shown`: host files shown
        read-only in its home; `template`: the batch's template of the kernel (`start_template`),
        which a sandboxed kernel is forked from. The kernel reads the labs' manifests, never
        their checks."""
        self.sockets, self.lab, self.limits, self.marker = sockets, lab, limits, marker
        self.uid, self.shown, self.template = uid, dict(shown or {}), template
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

    def fork(self, box, cmd: list[str], drain: Drain):
        """The kernel `cmd` (`python -m ipykernel_launcher ARGS`) forked from the template into
        `box`: a Popen-like, or None (the box is then closed)."""
        if cmd[1:3] != ["-m", "ipykernel_launcher"]:  # another kernel than the course's: fresh
            box.close()
            return None
        return zygote.spawn_from(self.template, box, LAUNCHER, cmd[3:], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=drain.write_fd, pass_fds=())

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
                self._labkit_box, self._labkit_cmd, self._labkit_fds = box, cmd, kw.get("pass_fds", ())
                wrapped = owner.wrap(box, cmd)
                kw["pass_fds"] = (*self._labkit_fds, *box.pass_fds)
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
                    if owner.template is not None and self._labkit_box.active:
                        proc = owner.fork(self._labkit_box, self._labkit_cmd, self._labkit_drain)
                        if proc is not None:
                            self._labkit_forked(proc, kw)
                            return None
                        # the template could not: its box is closed, the kernel starts fresh in another
                        box = self._labkit_box = owner.open()
                        kernel_cmd = owner.wrap(box, self._labkit_cmd)
                        kw["pass_fds"] = (*self._labkit_fds, *box.pass_fds)
                    return await super()._async_launch_kernel(kernel_cmd, **kw)
                finally:
                    self._labkit_box.started()
                    self._labkit_drain.started()

            def _labkit_forked(self, proc, kw) -> None:
                """What the provisioner's own launch sets, for a kernel forked by the template: no
                process group to signal (the intermediate's is the template's), its box instead."""
                provisioner = self.provisioner
                provisioner.process, provisioner.pid, provisioner.pgid = proc, proc.pid, None
                provisioner.cwd = kw.get("cwd")
                self._reconcile_connection_info(provisioner.connection_info)

            async def _async_wait(self, pollinterval: float = 0.1) -> None:
                # After a kill: jupyter_client looks every 0.1 s (the kernel is gone within a few
                # ms); its caller bounds the wait.
                await super()._async_wait(pollinterval=0.005)

            async def _async_interrupt_kernel(self):
                if not owner.interrupt():
                    await super()._async_interrupt_kernel()

            interrupt_kernel = _async_interrupt_kernel

        return SandboxedKernelManager
