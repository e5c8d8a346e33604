"""The zygote: a warm interpreter that forks each judged child into a box bwrap has made.

A fresh child pays ~30-200 ms of CPU to start Python and import the course's child code and the
lab's heavy modules (psycopg, valkey, asyncio) before it reaches the student's module. This
process pays that once: it imports exactly what a child would (`labkit.probe.main`, the lab's
probes, the manifest's `preload`) and never anything else, never the student's code and never
the judge's. For each case the judge (`zygote.py`) first opens the case's box as before (bwrap:
its mounts, a fresh /tmp, pid/ipc/uts/cgroup namespaces, its cgroup; a shell in it, as uid 65534,
that only says "ready" and sleeps), then sends here the box's namespace fds, the child's stdio and pipes.

Here, per case: fork (the *intermediate*, root, outside the box's pid namespace: it joins the
box's cgroup, enters its namespaces (net too: a launched box has the judge's), forks the child and reports its exit status on a pipe),
then, in the child, before any of the student's code: a new session, the box's work folder,
no capabilities (bounding set dropped, then a real unprivileged uid and gid, no groups), the
per-process limits, `no_new_privs` and the same seccomp filter bwrap installs, the judge's fd
numbers, every other fd closed, the environment the box would get; then `labkit.probe.main`.

Runs as root outside every box (it has to enter namespaces): started with the box's plain
environment (`profiles.base_env`), so no variable of the judge's ever reaches a child; it exits
when the judge's end of its socket closes. Single-threaded, so a fork copies nothing half-done.

Given a *role* (`ROLE_ENV`: what to import, what each forked process runs, as data from the
program's own module), one per grading batch, it is a template of another program instead:
of the judge (`judge_box`: what `labkit check` imports, every lab's checks, Hypothesis; each
fork runs `labkit check`) or of the kernel (`kernel_box`: ipykernel and labkit's notebook side,
never a lab's checks, which a kernel's box cannot read and so its memory must not hold). It
imports nothing of any submission, and forks each submission's program into its box as it
forks a child. The workers reach a template one connection per process, on a listening socket
in a folder only root can enter; a peer that is not root is refused.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import tempfile
import threading

FD_ENV = "LABKIT_ZYGOTE_FD"  # the zygote's end of its socket
ROLE_ENV = "LABKIT_ZYGOTE_ROLE"  # a template's role, as data (`_ROLE`); unset: a child's zygote
LISTEN_ENV = "LABKIT_ZYGOTE_LISTEN"  # the judge role's listening socket (one connection per judge)
CONNECTION_TIMEOUT = 5.0  # a connected worker sends its request at once
MAX_FDS = 32
MAX_MESSAGE = 1 << 20
NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "mnt")  # mnt last: after it, host paths are gone
# On the status pipe: the child's pid (as the host numbers it) once it is forked, then how it
# ended: its exit code (Popen's convention, -N: signal N) and the CPU it and what it waited for
# used (user, system seconds).
STARTED = struct.Struct("i")
ENDED = struct.Struct("idd")
CAP_LAST = 63  # PR_CAPBSET_DROP of a number the kernel does not know is EINVAL: ignored
PR_CAPBSET_DROP, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 4, 38, 22
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2
START_FAILED = 125  # the intermediate or the child could not be set up: never the student's doing

_libc = ctypes.CDLL(None, use_errno=True)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _warm_child() -> None:
    """What every child of this lab imports before the student's module."""
    import labkit.probe.main as main

    main.add_site_packages()
    main.preload()
    for name in filter(None, os.environ.get("LABKIT_ZYGOTE_PROBES", "").split(",")):
        importlib.import_module(name)


# A template's role (`ROLE_ENV`, JSON, given by the program's own module: `judge_box`,
# `kernel_box`): "warm", the modules to import; "packages", packages to import whole (some of
# their modules are imported only at first use); "entry", "module:function", called with the
# request's argv, its return value the exit code. None: a child's zygote.
_ROLE: dict | None = None
# What the warm imports set in the environment (debugpy sets PYDEVD_USE_FRAME_EVAL): the same
# imports in a fresh start would set it in the child's, so a forked child gets it too.
_WARM_ENV: dict[str, str] = {}


def warm() -> None:
    before = dict(os.environ)
    try:
        _warm()
    finally:
        _WARM_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})


def _warm() -> None:
    if _ROLE is None:
        _warm_child()
        return
    for name in _ROLE.get("warm", ()):
        importlib.import_module(name)
    for package in _ROLE.get("packages", ()):
        _import_all(package)


def _run(request: dict) -> int:
    """The forked process's program: the role's entry, or the judged child's probe."""
    if _ROLE is None:
        import labkit.probe.main as main

        return main.main()
    module, _, name = _ROLE["entry"].partition(":")
    try:
        code = getattr(importlib.import_module(module), name)(list(request["argv"]))
    except SystemExit as exc:  # as the program would end when started with `python -m`
        code = exc.code if isinstance(exc.code, int) else 1
    return code if isinstance(code, int) else 0


def _import_all(package: str) -> None:
    import pkgutil

    for info in pkgutil.iter_modules(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001, S112 - one the judge never imports costs nothing
            continue


def serve(sock: socket.socket, bpf: bytes) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # intermediates are reaped by the kernel
    while _serve_one(sock, bpf):
        pass


def serve_listening(control: socket.socket, listener: socket.socket, bpf: bytes) -> None:
    """A batch's template: one request per connection, from root only, until `control` closes.

    It is a subreaper with SIGCHLD ignored: a killed box's processes whose intermediate died
    first come here and are gone at once. (Passed on to the grader, they stayed zombies there
    until its next round, and the judge's pid namespace, which waits for them, held its box
    for seconds.)"""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    while True:
        ready = select.select([control, listener], [], [])[0]
        if control in ready:
            try:
                if not control.recv(1):
                    return
            except OSError:
                return
        if listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid == 0:
                    conn.settimeout(CONNECTION_TIMEOUT)
                    _serve_one(conn, bpf)


def _serve_one(sock: socket.socket, bpf: bytes) -> bool:
    """Answer one request on `sock`; False once it is closed."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except OSError:
        return False
    if not data:
        return False
    try:
        request = json.loads(data)
        pid = _fork(request, fds, bpf, sock)
        reply = {"pid": pid}
    except Exception as exc:  # noqa: BLE001 - a bad request is answered, never fatal here
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    try:
        sock.send(json.dumps(reply).encode())
    except OSError:
        return False
    return True


def _fork(request: dict, fds: list[int], bpf: bytes, sock: socket.socket) -> int:
    if len(fds) != len(NAMESPACES) + 1 + len(request["targets"]):
        raise ValueError("wrong number of fds")
    pid = os.fork()
    if pid == 0:
        code = START_FAILED
        try:
            sock.close()
            code = _intermediate(request, fds, bpf)
        except BaseException as exc:  # noqa: BLE001 - said on the child's stderr, as bwrap would
            _say(fds, request, f"labkit zygote: {type(exc).__name__}: {exc}")
        os._exit(code)
    return pid


def _say(fds: list[int], request: dict, text: str) -> None:
    try:
        os.write(fds[len(NAMESPACES) + 1 + request["targets"].index(2)], text.encode() + b"\n")
    except (OSError, ValueError, IndexError):
        pass


def _intermediate(request: dict, fds: list[int], bpf: bytes) -> int:
    """Root, outside the box's pid namespace: join the box, fork the child, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # so waitpid works, here and in the child
    ns, status_w, passed = fds[:len(NAMESPACES)], fds[len(NAMESPACES)], fds[len(NAMESPACES) + 1:]
    for procs in request["cgroups"]:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    for fd in ns:
        _check(_libc.setns(fd, 0), "setns")
    child = os.fork()  # the first process of ours in the box's pid namespace
    if child == 0:
        code = START_FAILED
        try:
            os.close(status_w)
            _become_child(request, passed, bpf)
            code = _run(request)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - the student may have closed or replaced it
                    pass
        except BaseException as exc:  # noqa: BLE001 - before the student's code: the course's fault
            try:  # stderr is at 2 once the fds are placed, and still among `fds` before
                os.write(2, f"labkit zygote: {type(exc).__name__}: {exc}\n".encode())
            except OSError:
                _say(fds, request, f"labkit zygote: {type(exc).__name__}: {exc}")
        os._exit(code)
    for fd in fds:
        if fd != status_w:
            os.close(fd)
    os.write(status_w, STARTED.pack(child))
    _, status, usage = os.wait4(child, 0)
    os.write(status_w, ENDED.pack(os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime))
    return 0


def _become_child(request: dict, passed: list[int], bpf: bytes) -> None:
    """Everything bwrap's command line (setpriv, prlimit, seccomp) does, in this process."""
    os.setsid()
    os.chdir(request["cwd"])
    for cap in range(CAP_LAST + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(request["gid"], request["gid"], request["gid"])
    os.setresuid(request["uid"], request["uid"], request["uid"])  # permitted and effective caps go
    _check_no_capabilities()
    for limit, value in ((resource.RLIMIT_AS, request.get("as")), (resource.RLIMIT_FSIZE, request.get("fsize")),
                         (resource.RLIMIT_CORE, 0)):
        if value is not None:
            resource.setrlimit(limit, (value, value))
    # As after an exec of a plain program (setpriv's): the child may read its own /proc entries.
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _Fprog(len(bpf) // 8, ctypes.addressof(program))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")
    _place_fds(passed, request["targets"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in _WARM_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["PWD"] = request["cwd"]  # as bwrap's --chdir sets it
    sys.argv = [request["argv0"], *request.get("argv", ())]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None  # found again from the box's environment
    # What the zygote listed of folders in the host's view (names only) is not the box's view.
    importlib.invalidate_caches()
    sys.path_importer_cache.clear()


def _check_no_capabilities() -> None:
    with open("/proc/self/status") as fh:
        caps = {k: v.strip() for k, _, v in (line.partition(":") for line in fh) if k.startswith("Cap")}
    kept = {k: v for k, v in caps.items() if int(v, 16) != 0}
    if kept:
        raise PermissionError(f"capabilities left after the uid change: {kept}")


def _place_fds(passed: list[int], targets: list[int]) -> None:
    """Each passed fd at the number the judge gave it (the child's environment names them),
    every other fd closed."""
    import fcntl

    above = max(targets) + 1  # moved out of every target's way first
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in passed]
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target, inheritable=True)
    low = 0
    for keep in sorted(set(targets)):
        if keep > low:  # (closerange(a, a) would close everything: close_range(a, ~0))
            os.closerange(low, keep)
        low = keep + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _remove(path: str) -> None:
    """The listening socket and its folder, gone with the template."""
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def main() -> int:
    global _ROLE
    role = os.environ.pop(ROLE_ENV, None)
    _ROLE = json.loads(role) if role else None
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    bpf = sock.recv(MAX_MESSAGE)  # the judge's first message: the compiled seccomp filter
    if not bpf or len(bpf) % 8:
        return 2
    try:
        warm()
    except Exception as exc:  # noqa: BLE001 - the judge starts children the usual way then
        sock.send(json.dumps({"error": f"warm-up failed: {exc!r}"}).encode())
        return 2
    if threading.active_count() > 1:  # a fork would copy a thread's half-done work
        sock.send(json.dumps({"error": "warm-up started a thread"}).encode())
        return 2
    gc.freeze()  # what is warm stays out of the collector's sight: a fork does not copy it back
    sock.send(json.dumps({"ready": True}).encode())
    listening = os.environ.pop(LISTEN_ENV, None)
    if listening is not None:
        listener = socket.socket(fileno=int(listening))
        try:
            serve_listening(sock, listener, bpf)
        finally:  # also when the grader was killed: its end of `sock` closed
            _remove(listener.getsockname())
    else:
        serve(sock, bpf)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing here needs finalizing, and tearing down a warm interpreter's modules took 30 ms
    # of CPU that whoever stops it (a batch, a `labkit check`) waited for.
    os._exit(code)
