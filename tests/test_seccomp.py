"""The seccomp filter on every box, tried from inside (issue: "Nothing shared between submissions").

Key rings are not namespaced: one submission stored its solution in a key of its uid, and a
later one (same uid) read it back. A judged child here (`profiles.child`, as grading makes
it) calls each forbidden system call itself through ctypes and reports its errno; each test
asserts one of them, and that the payload really ran. Then what must keep working inside
(fork, threads, subprocess, sqlite3, loopback sockets, asyncio), /proc's masked files, the
judge's own box (its variant of the filter), and the box's fds on every path.

The sandbox needs root and bubblewrap; CI has both (`.ci/run`), so there it never skips.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from labkit import sandbox
from labkit.limits import RUN_MARKER
from labkit.sandbox import Policy, bwrap, profiles, seccomp

MARKER = "labkit-seccomp-payload-ran"


def _require_sandbox() -> None:
    found = sandbox.support()
    if not found.ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {found.reason}")
        pytest.skip(f"no sandbox here: {found.reason}")


def _numbers() -> dict[str, int]:
    """This machine's system call numbers, from libseccomp (the payload has no table of its own)."""
    lib = seccomp._pyseccomp()
    names = ["add_key", "keyctl", "request_key", "ptrace", "process_vm_readv", "process_vm_writev",
             "userfaultfd", "perf_event_open", "bpf", "mount", "umount2", "pivot_root", "unshare",
             "setns", "clone", "clone3", "io_uring_setup", "kexec_load", "init_module", "finit_module",
             "delete_module", "open_by_handle_at", "name_to_handle_at", "swapon", "reboot", "acct",
             "syslog", "settimeofday", "clock_settime", "personality", "fsopen", "open_tree", "getpid"]
    return {name: lib.resolve_syscall(lib.Arch.NATIVE, name) for name in names}


# The payload: each attempt returns 0 (it worked) or the errno it failed with.
PAYLOAD = r'''
import ctypes, errno, json, os, sys

MARKER, NR, ONLY = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_USER_KEYRING = -2, -4
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x00020000, 0x40000000, 0x20000000
SIGCHLD = 17

def call(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(NR[name]), *args)
    return (result, 0) if result >= 0 else (result, ctypes.get_errno())

def plain(name, *args):
    return call(name, *args)[1]

class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def vm(name):
    src, dst = ctypes.create_string_buffer(b"secret", 8), ctypes.create_string_buffer(8)
    local, remote = IOVec(ctypes.addressof(dst), 8), IOVec(ctypes.addressof(src), 8)
    return plain(name, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)

def ptrace_attach():
    child = os.fork()
    if child == 0:
        import time
        time.sleep(30)
        os._exit(0)
    try:
        return plain("ptrace", 16, child, None, None)  # PTRACE_ATTACH to its own child
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)

def clone_with(flags):
    result, err = call("clone", ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
    if result == 0:  # the new process (it must not get here): leave at once
        os._exit(0)
    if result > 0:
        os.waitpid(result, 0)
    return err

def io_uring():
    params = ctypes.create_string_buffer(120)
    result, err = call("io_uring_setup", 8, params)
    if result >= 0:
        os.close(result)
    return err

def setns():
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        return plain("setns", fd, 0)
    finally:
        os.close(fd)

def os_unshare():
    if not hasattr(os, "unshare"):  # Python 3.12
        return plain("unshare", CLONE_NEWUSER)
    try:
        os.unshare(os.CLONE_NEWUSER)
        return 0
    except OSError as exc:
        return exc.errno

ATTEMPTS = {
    "add_key": lambda: plain("add_key", b"user", b"labkit-solution", b"def solve(): ...", 16,
                             KEY_SPEC_PROCESS_KEYRING),
    "keyctl": lambda: plain("keyctl", 0, KEY_SPEC_PROCESS_KEYRING, 0),  # KEYCTL_GET_KEYRING_ID
    "request_key": lambda: plain("request_key", b"user", b"labkit-solution", None, 0),
    "ptrace": ptrace_attach,
    "process_vm_readv": lambda: vm("process_vm_readv"),
    "process_vm_writev": lambda: vm("process_vm_writev"),
    "userfaultfd": lambda: plain("userfaultfd", os.O_CLOEXEC | 1),  # UFFD_USER_MODE_ONLY
    "perf_event_open": lambda: plain("perf_event_open", None, 0, -1, -1, 0),
    "bpf": lambda: plain("bpf", 0, None, 0),
    "mount": lambda: plain("mount", b"none", b"/tmp", b"tmpfs", 0, None),
    "umount2": lambda: plain("umount2", b"/tmp", 0),
    "pivot_root": lambda: plain("pivot_root", b"/tmp", b"/tmp"),
    "fsopen": lambda: plain("fsopen", b"tmpfs", 0),
    "open_tree": lambda: plain("open_tree", -100, b"/tmp", 1),  # OPEN_TREE_CLONE
    "unshare(CLONE_NEWUSER)": lambda: plain("unshare", CLONE_NEWUSER),
    "unshare(CLONE_NEWNS)": lambda: plain("unshare", CLONE_NEWNS),
    "os.unshare(CLONE_NEWUSER)": os_unshare,
    "setns": setns,
    "clone(CLONE_NEWUSER)": lambda: clone_with(CLONE_NEWUSER),
    "clone(CLONE_NEWNET)": lambda: clone_with(CLONE_NEWNET),
    "clone(CLONE_NEWPID)": lambda: clone_with(CLONE_NEWPID),
    "clone3": lambda: plain("clone3", None, 0),
    "io_uring_setup": io_uring,
    "kexec_load": lambda: plain("kexec_load", 0, 0, None, 0),
    "init_module": lambda: plain("init_module", None, 0, b""),
    "finit_module": lambda: plain("finit_module", -1, b"", 0),
    "delete_module": lambda: plain("delete_module", b"labkit", 0),
    "open_by_handle_at": lambda: plain("open_by_handle_at", -100, None, 0),
    "name_to_handle_at": lambda: plain("name_to_handle_at", -100, b"/tmp", None, None, 0),
    "swapon": lambda: plain("swapon", b"/tmp/swap", 0),
    "reboot": lambda: plain("reboot", 0, 0, 0, None),  # wrong magic: harmless even if allowed
    "acct": lambda: plain("acct", None),
    "syslog": lambda: plain("syslog", 10, None, 0),  # SYSLOG_ACTION_SIZE_BUFFER
    "settimeofday": lambda: plain("settimeofday", None, None),
    "clock_settime": lambda: plain("clock_settime", 0, None),
    "personality(ADDR_NO_RANDOMIZE)": lambda: plain("personality", 0x0040000),
}

print(MARKER, flush=True)
found = {}
for label, attempt in ATTEMPTS.items():
    if ONLY and label not in ONLY:
        continue
    try:
        found[label] = attempt()
    except Exception as exc:
        found[label] = f"{type(exc).__name__}: {exc}"
with open("/proc/self/status") as fh:
    found["_status"] = {k: v.strip() for k, v in (l.split(":", 1) for l in fh if l.startswith(("Seccomp", "NoNewPrivs")))}
print(json.dumps(found), flush=True)
'''

EXPECTED = {label: errno.EPERM for label in [
    "add_key", "keyctl", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "userfaultfd",
    "perf_event_open", "bpf", "mount", "umount2", "pivot_root", "fsopen", "open_tree",
    "unshare(CLONE_NEWUSER)", "unshare(CLONE_NEWNS)", "os.unshare(CLONE_NEWUSER)", "setns",
    "clone(CLONE_NEWUSER)", "clone(CLONE_NEWNET)", "clone(CLONE_NEWPID)", "io_uring_setup",
    "kexec_load", "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
    "swapon", "reboot", "acct", "syslog", "settimeofday", "clock_settime", "personality(ADDR_NO_RANDOMIZE)"]}
EXPECTED["clone3"] = errno.ENOSYS  # flags in memory: glibc falls back to clone, whose flags are checked


def _policy(workdir: Path, **overrides) -> Policy:
    module = workdir / "worker.py"
    if not module.exists():
        module.write_text("def solve():\n    return 42\n")
        module.chmod(0o644)
    base = profiles.child(sandbox.uid(), module=module, workdir=workdir,
                          env={RUN_MARKER: overrides.pop("marker", f"seccomp-test-{uuid.uuid4().hex}")})
    return Policy(**{**base.__dict__, **overrides})


def _run(policy: Policy, argv: list[str], timeout: float = 60) -> tuple[subprocess.CompletedProcess, sandbox.Report]:
    box = sandbox.Box.open(profiles.copy_module(policy), sandbox.support().cgroups)
    proc = box.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        report = box.close(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()), report


def _payload(policy: Policy, only: list[str] = ()) -> dict:
    done, _ = _run(policy, [sys.executable, "-c", PAYLOAD, MARKER, json.dumps(_numbers()), json.dumps(list(only))])
    lines = done.stdout.splitlines()
    assert lines and lines[0] == MARKER, f"the payload never ran: {done.stdout[-500:]} {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(lines[1])


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    _require_sandbox()
    return _payload(_policy(tmp_path_factory.mktemp("seccomp")))


def test_the_payload_ran_under_a_seccomp_filter_set_by_bwrap(inside):
    assert inside["_status"]["Seccomp"] == "2", inside["_status"]  # 2: filter mode
    assert inside["_status"]["NoNewPrivs"] == "1"


@pytest.mark.parametrize("call", sorted(EXPECTED))
def test_student_code_cannot_call(inside, call):
    expected = EXPECTED[call]
    assert inside[call] == expected, f"{call}: {inside[call]} (errno {errno.errorcode.get(inside[call], '?')}), " \
                                     f"expected {errno.errorcode[expected]}"


def test_the_filter_is_what_refuses(tmp_path):
    """The same calls without the filter (a test-only policy): these succeed or fail otherwise,
    so the EPERMs above are the filter's. Only calls that leave nothing behind are tried, and
    only those whose unfiltered answer does not hang on a sysctl (bpf, io_uring, userfaultfd do)."""
    _require_sandbox()
    harmless = ["add_key", "keyctl", "ptrace", "process_vm_readv", "process_vm_writev", "perf_event_open",
                "clone3", "clock_settime", "personality(ADDR_NO_RANDOMIZE)"]
    found = _payload(_policy(tmp_path, seccomp=False), harmless)
    assert found["_status"]["Seccomp"] == "0"
    for call in harmless:
        assert found[call] != EXPECTED[call], f"{call} fails the same way without the filter: {found[call]}"


ORDINARY = r'''
import asyncio, json, os, socket, sqlite3, subprocess, sys, threading, multiprocessing
found = {}
pid = os.fork()
if pid == 0:
    os._exit(7)
found["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
box = []
threads = [threading.Thread(target=box.append, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
found["threads"] = sorted(box)
found["subprocess"] = subprocess.run(["/usr/bin/true"]).returncode
found["subprocess_python"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                                             text=True).stdout.strip()
db = sqlite3.connect("seccomp.db")
db.execute("CREATE TABLE t (x)")
with db:
    db.execute("INSERT INTO t VALUES (42)")
db.close()
found["sqlite"] = sqlite3.connect("seccomp.db").execute("SELECT x FROM t").fetchone()[0]
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
conn, _ = server.accept()
client.sendall(b"ping")
found["tcp"] = conn.recv(4).decode()
async def echo():
    r, w = await asyncio.open_connection(*server.getsockname())
    c, _ = server.accept()
    w.write(b"pong"); await w.drain()
    data = c.recv(4).decode()
    w.close(); c.close()
    return data
found["asyncio"] = asyncio.run(echo())
with multiprocessing.get_context("fork").Pool(2) as pool:
    found["multiprocessing"] = pool.map(abs, [-1, -2])
print(json.dumps(found))
'''


def test_ordinary_python_still_works_inside(tmp_path):
    _require_sandbox()
    done, report = _run(_policy(tmp_path), [sys.executable, "-c", ORDINARY])
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"fork": 7, "threads": list(range(8)), "subprocess": 0,
                                       "subprocess_python": "42", "sqlite": 42, "tcp": "ping",
                                       "asyncio": "pong", "multiprocessing": [1, 2]}
    assert report.outcome == sandbox.Outcome.OK


def test_another_abi_kills_the_process(tmp_path):
    """An x32 system call (bit 30 on x86_64) would go around rules written for x86_64."""
    _require_sandbox()
    if os.uname().machine != "x86_64":
        pytest.skip("x32 is an x86_64 ABI")
    code = "import ctypes\nprint('ran', flush=True)\nctypes.CDLL(None).syscall(ctypes.c_long(0x40000000 | 39))\nprint('alive')"
    done, report = _run(_policy(tmp_path), [sys.executable, "-c", code])
    assert done.stdout == "ran\n" and done.returncode == -31, (done.stdout, done.returncode)  # SIGSYS


@pytest.mark.parametrize("path", ["/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/kallsyms"])
def test_procs_kernel_wide_files_are_masked(tmp_path, path):
    _require_sandbox()
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist on this kernel")
    code = (f"try:\n    print(repr(open({path!r}, 'rb').read()))\nexcept OSError as e:\n"
            f"    print('denied', e.errno)")
    done, _ = _run(_policy(tmp_path), [sys.executable, "-c", code])
    assert done.stdout.strip() in ("b''", f"denied {errno.EACCES}"), done.stdout + done.stderr[-500:]


KEYRING_ATTACK = r'''
import ctypes, json, sys
nr, name, role = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEY_SPEC_USER_KEYRING = -4
def err(result):
    return 0 if result >= 0 else ctypes.get_errno()
found = {}
if role == "store":  # submission A: keep the solution where the next submission of this uid looks
    secret = b"def solve(): return 42  # the answer"
    found["add_key"] = err(libc.syscall(ctypes.c_long(nr["add_key"]), b"user", name.encode(), secret,
                                        len(secret), KEY_SPEC_USER_KEYRING))
else:  # submission B, later, same uid: find it and read it
    key = libc.syscall(ctypes.c_long(nr["request_key"]), b"user", name.encode(), None, 0)
    found["request_key"] = err(key)
    found["search"] = err(libc.syscall(ctypes.c_long(nr["keyctl"]), 10, KEY_SPEC_USER_KEYRING, b"user",
                                       name.encode(), 0))  # KEYCTL_SEARCH
    buf = ctypes.create_string_buffer(256)
    got = libc.syscall(ctypes.c_long(nr["keyctl"]), 11, ctypes.c_long(key), buf, 256)  # KEYCTL_READ
    found["read"] = buf.raw[:max(got, 0)].decode("latin-1") if key >= 0 and got > 0 else ""
    try:
        found["/proc/keys"] = open("/proc/keys").read()
    except OSError as exc:
        found["/proc/keys"] = f"denied {exc.errno}"
print(json.dumps(found))
'''


def test_a_solution_kept_in_the_kernels_key_ring_does_not_reach_the_next_submission(tmp_path):
    _require_sandbox()
    name = f"labkit-solution-{uuid.uuid4().hex[:8]}"
    numbers = json.dumps(_numbers())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    store, _ = _run(_policy(tmp_path / "a"), [sys.executable, "-c", KEYRING_ATTACK, numbers, name, "store"])
    fetch, _ = _run(_policy(tmp_path / "b"), [sys.executable, "-c", KEYRING_ATTACK, numbers, name, "fetch"])
    assert store.returncode == 0 and fetch.returncode == 0, store.stderr[-1000:] + fetch.stderr[-1000:]
    stored, fetched = json.loads(store.stdout), json.loads(fetch.stdout)
    assert stored["add_key"] == errno.EPERM
    assert fetched["request_key"] == errno.EPERM and fetched["search"] == errno.EPERM
    assert fetched["read"] == ""
    assert "42" not in fetched["/proc/keys"] and name not in fetched["/proc/keys"]


JUDGE_VIEW = textwrap.dedent(r'''
    import ctypes, json, os, sys, tempfile
    from pathlib import Path
    from labkit.judge import child
    nr = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    def errno_of(name, *args):
        return 0 if libc.syscall(ctypes.c_long(nr[name]), *args) >= 0 else ctypes.get_errno()
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    found = {"uid": os.getuid(), "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
             "keyctl": errno_of("keyctl", 0, -2, 0), "ptrace": errno_of("ptrace", 0x4206, 1, 0, 0),
             "cgroupfs": os.path.exists("/sys/fs/cgroup"), "sys": os.path.exists("/sys"),
             "environ": sorted(os.environ),
             "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
    run = child.run_child(Path(sys.argv[2]), "labkit.probe:noop", {}, workdir=Path(tempfile.mkdtemp()), timeout=60)
    found["child"] = [l.split(":")[1].strip() for l in run.stdout.splitlines() if l.startswith(("Seccomp", "Uid"))]
    found["child_err"] = run.stderr[-500:]
    print(json.dumps(found))
''')


def test_the_judges_box_is_unprivileged_and_its_children_come_from_the_launcher(tmp_path):
    """The judge runs as the job's uid with no capability, no cgroupfs and the student filter;
    it cannot start a sandbox itself, so its children come from the launcher, filtered too."""
    _require_sandbox()
    from labkit.grading import judge_box

    module = tmp_path / "worker.py"
    module.write_text("print(open('/proc/self/status').read())\n")
    tmp_path.chmod(0o755)
    env = judge_box._env(sandbox.uid(), {})
    with judge_box.judge_session(sandbox.uid(), module, env) as (box, spawn):
        proc = spawn([sys.executable, "-c", JUDGE_VIEW, json.dumps(_numbers()), str(module)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            box.close(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    found = json.loads(out)
    assert found["uid"] == sandbox.uid() != 0
    assert int(found["CapEff"], 16) == 0 and int(found["CapBnd"], 16) == 0
    assert found["keyctl"] == errno.EPERM
    assert found["ptrace"] == errno.EPERM
    assert not found["cgroupfs"] and not found["sys"]
    assert max(found["processes"]) < 10, found["processes"]  # its own pid namespace: no other job's
    allowed = {*profiles.base_env(), *profiles.PASS_THROUGH, *judge_box.JUDGE_SETTINGS, "PYTHONPATH", "PWD",
               "PYTHONDONTWRITEBYTECODE", "LABKIT_LAUNCHER_FD"}
    assert set(found["environ"]) <= allowed, set(found["environ"]) - allowed  # built from nothing
    uids = [line for line in found["child"] if line.startswith(str(sandbox.uid()))]
    assert uids and "1" in found["child"], found  # the child: the job's uid, one filter (the launcher's)


# --- the box's side: fds, failures ------------------------------------------------------------

def test_the_command_line_reads_the_filter_from_the_fd_passed_on(tmp_path):
    policy = _policy(tmp_path)
    box = sandbox.Box(policy)
    argv = box.command(["/usr/bin/true"])
    status_fd, seccomp_fd = box.pass_fds
    assert argv[argv.index("--seccomp") + 1] == str(seccomp_fd)
    assert os.read(seccomp_fd, 1 << 20) == seccomp.program(seccomp.STUDENT)
    for path in bwrap.MASKED_PROC:
        if os.path.exists(path):
            assert ["--ro-bind", "/dev/null", path] == argv[argv.index(path) - 2:argv.index(path) + 1]
            assert argv.index(path) > argv.index("--proc")
    box.close()
    for fd in (status_fd, seccomp_fd):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_filter_is_small_and_built_once():
    assert 0 < len(seccomp.program(seccomp.STUDENT)) < 65536
    started = time.perf_counter()
    seccomp.program(seccomp.STUDENT)
    assert time.perf_counter() - started < 0.01  # cached
    assert "--seccomp" not in bwrap.command(Policy(seccomp=False), ["/usr/bin/true"])


def _open_fds() -> set[int]:
    return set(map(int, os.listdir("/proc/self/fd")))


def test_without_libseccomp_no_box_starts_and_support_says_why(monkeypatch, tmp_path):
    def missing(kind=seccomp.STUDENT):
        raise seccomp.SeccompUnavailable(f"no seccomp filter for the sandbox (Unable to find libseccomp): "
                                         f"{seccomp.INSTALL}")

    monkeypatch.setattr(seccomp, "filter_fd", missing)
    before = _open_fds()
    box = sandbox.Box(_policy(tmp_path))
    with pytest.raises(OSError, match="pyseccomp"):
        box.spawn(["/usr/bin/true"])
    assert _open_fds() <= before  # the status pipe too
    if os.geteuid() == 0 and all(bwrap.tool(n) for n in bwrap.TOOLS):
        found = sandbox._try_support.__wrapped__()
        assert not found.ok and "pyseccomp" in found.reason and "libseccomp2" in found.reason


def test_a_failed_spawn_closes_the_filters_fd(tmp_path):
    before = _open_fds()
    box = sandbox.Box(_policy(tmp_path))
    with pytest.raises(OSError):
        box.spawn(["/usr/bin/true"], cwd=str(tmp_path / "does-not-exist"))
    assert _open_fds() <= before


KERNEL_VIEW = r'''
import ctypes, json, os, sys
nr = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(name, *args):
    return 0 if libc.syscall(ctypes.c_long(nr[name]), *args) >= 0 else ctypes.get_errno()
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
root = sys.argv[2]
print(json.dumps({
    "uid": os.getuid(), "CapEff": status["CapEff"].strip(), "Seccomp": status["Seccomp"].strip(),
    "keyctl": errno_of("keyctl", 0, -2, 0), "ptrace": errno_of("ptrace", 0x4206, 1, 0, 0),
    "sys": os.path.exists("/sys"), "interfaces": sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else
        [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]],
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "judge_only": {name: os.path.exists(os.path.join(root, name)) for name in
                   ("checks/outbox/lab.py", "checks/outbox/oracle.py", "checks/outbox/contract.py", "solutions", "notebooks")},
}))
'''


def test_the_grading_kernels_box_holds_no_privilege_no_network_and_no_judge_file(tmp_path):
    """The third kind of box, seen from inside: the kernel runs every cell of the notebook."""
    _require_sandbox()
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    policy = profiles.kernel(sandbox.uid(), home="/tmp/home", sockets=sockets, lab="outbox", shown={},
                             env={}, memory_bytes=512 * 1024 * 1024, file_bytes=64 * 1024 * 1024)
    done, _ = _run(policy, [sys.executable, "-c", KERNEL_VIEW, json.dumps(_numbers()), str(profiles.ROOT)])
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["uid"] == sandbox.uid() != 0
    assert int(found["CapEff"], 16) == 0 and found["Seccomp"] == "2"
    assert found["keyctl"] == errno.EPERM and found["ptrace"] == errno.EPERM
    assert found["interfaces"] == ["lo"]
    assert max(found["processes"]) < 10, found["processes"]  # its own pid namespace only
    assert not any(found["judge_only"].values()), found["judge_only"]
