"""The sandbox, tried from inside: what student code cannot read, write, signal or reach.

One script (INSIDE) runs in the layout grading uses: a judge's box (its own network and /tmp)
that starts a judged child in its sandbox (`labkit.sandbox.profiles`), and the child tries
every forbidden thing, reporting each outcome. Each test below asserts one of them. Then:
limits that hold (memory in /dev/shm, processes, disk), nothing outliving the box, and exit
codes and signals passed through faithfully (the lab 03 judge SIGSTOPs a publisher and reads
its 73/74).

The sandbox needs root and bubblewrap; CI has both (`.ci/run`), so there it never skips.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from labkit import labs, sandbox
from labkit.limits import RUN_MARKER
from labkit.sandbox import Policy, profiles, reaper
from labkit.sandbox.policy import MiB

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "worker.py"
# The student's module as grading has it: a copy in the grader's work folder.
MODULE = Path(tempfile.mkdtemp(prefix="labkit-sandbox-test-")) / "worker.py"
atexit.register(shutil.rmtree, MODULE.parent, True)  # made at import, in every xdist worker
MODULE.write_text(SOLUTION.read_text())
MODULE.chmod(0o644)
MODULE.parent.chmod(0o711)
INSIDE_MODULE = MODULE.parent / "inside.py"  # a "student module" that looks around as it loads


def _require_sandbox() -> None:
    found = sandbox.support()
    if not found.ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {found.reason}")
        pytest.skip(f"no sandbox here: {found.reason}")


pytestmark = pytest.mark.usefixtures("sandbox_required")


@pytest.fixture(scope="module")
def sandbox_required():
    _require_sandbox()


# --- from inside ------------------------------------------------------------------------------

INSIDE = r'''
import errno, json, os, signal, socket, sys

targets = json.loads(os.environ["LABKIT_TARGETS"])
results = {}

def outcome(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return f"denied: {errno.errorcode.get(exc.errno, exc.errno)}"

def read(path):
    with open(path, "rb") as fh:
        fh.read(1)

def write(path):
    with open(path, "ab") as fh:
        fh.write(b"pwned")

def create(folder):
    with open(os.path.join(folder, "pwned-by-sandbox.txt"), "wb") as fh:
        fh.write(b"pwned")

for name, path in targets["read"].items():
    results["read " + name] = outcome(lambda p=path: read(p))
for name, path in targets["list"].items():
    try:
        results["list " + name] = sorted(os.listdir(path))
    except OSError as exc:
        results["list " + name] = []
for name, path in targets["write"].items():
    results["write " + name] = outcome(lambda p=path: write(p))
for name, path in targets["create"].items():
    results["create in " + name] = outcome(lambda p=path: create(p))
for name, pid in targets["signal"].items():
    results["signal " + name] = outcome(lambda p=pid: os.kill(p, signal.SIGKILL if p != 1 else signal.SIGTERM))
for name, port in targets["connect"].items():
    def connect(port=port):
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    results["connect to " + name] = outcome(connect)

def fill_tmp():
    with open("/tmp/fill", "wb") as fh:
        for _ in range(200):
            fh.write(b"x" * (1 << 20))
results["fill /tmp past its size"] = outcome(fill_tmp)
os.unlink("/tmp/fill")

results["uid"] = os.getuid()
results["gid"] = os.getgid()
results["groups"] = os.getgroups()
with open("/proc/self/status") as fh:
    results["CapEff"] = [l.split()[1] for l in fh if l.startswith("CapEff")][0]
results["environ"] = sorted(os.environ)
results["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(results))
'''

# The judge's side, inside its box: make a step folder, ask the launcher for a child whose
# "student module" is INSIDE (the launcher shows a child only the grader's copy of the module).
DRIVER = r'''
import json, os, sys, tempfile
from pathlib import Path
from labkit.judge import child
workdir = Path(tempfile.mkdtemp(prefix="labkit-"))
run = child.run_child(Path(sys.argv[2]), "labkit.probe:noop", {}, workdir=workdir, timeout=60,
                      env={"LABKIT_TARGETS": sys.argv[1]})
print(json.dumps({"child": run.stdout, "stderr": run.stderr[-2000:], "exit": run.exit_code,
                  "judge_uid": os.getuid(), "judge_env_marker": os.environ.get("LABKIT_TEST_SECRET")}))
'''


def _listen() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    """Run INSIDE in a child sandbox nested in a judge's box; return what it found."""
    _require_sandbox()
    profiles.compile_course()  # as the grader does: the child then sees some bytecode too
    tmp = tmp_path_factory.mktemp("sandbox")
    other = tmp / "submissions" / "victim"
    other.mkdir(parents=True)
    (other / "01-outbox.ipynb").write_text("{}")
    out = tmp / "out" / ".results"
    out.mkdir(parents=True)
    (out / "victim--outbox.json").write_text("{}")
    neighbour = tmp / "neighbour-step"  # another job's (or step's) folder
    neighbour.mkdir()
    (neighbour / "source.db").write_text("x")
    host_server = _listen()
    neighbour_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    targets = {
        "read": {"solutions/": str(SOLUTION), "notebooks/source/": str(ROOT / "notebooks/source/01-outbox.md"),
                 "the judge-side checks": str(ROOT / "checks/outbox/lab.py"),
                 "another submission": str(other / "01-outbox.ipynb"),
                 "--out's results": str(out / "victim--outbox.json"),
                 "another step's folder": str(neighbour / "source.db"),
                 "the grader's home": str(Path.home() / ".bashrc") if (Path.home() / ".bashrc").exists()
                 else str(Path.home()),
                 "/etc/shadow": "/etc/shadow",
                 "the grader's environment (/proc/<judge>/environ)": f"/proc/{os.getpid()}/environ"},
        "list": {"the grader's home": str(Path.home()), "the repository": str(ROOT),
                 "solutions/ (folder)": str(ROOT / "solutions"), "checks/": str(ROOT / "checks"),
                 "checks/__pycache__": str(ROOT / "checks" / "__pycache__"),
                 "checks/outbox/": str(ROOT / "checks" / "outbox"),
                 "checks/outbox/__pycache__": str(ROOT / "checks" / "outbox" / "__pycache__"),
                 "/": "/", "/etc": "/etc"},
        "write": {"the course's own labkit": str(ROOT / "labkit" / "__init__.py"),
                  "the venv's packages": str(profiles.runtime()[-1] / "pyvenv.cfg"),
                  "the Python runtime": str(Path(sys.base_prefix).resolve() / "lib/python3.11/os.py"),
                  "the student's own module (read-only)": str(MODULE)},
        "create": {"labkit/": str(ROOT / "labkit"), "--out": str(out), "the submissions": str(other),
                   "the venv": str(profiles.runtime()[-1]), "/etc": "/etc", "the grader's home": str(Path.home())},
        "signal": {"the grader (pytest)": os.getpid(), "another job's process": neighbour_proc.pid,
                   "bwrap's init (pid 1)": 1},
        "connect": {"a server on the host's loopback": host_server.getsockname()[1]},
    }
    from labkit.grading import judge_box

    inside_module = INSIDE_MODULE
    inside_module.write_text(INSIDE)
    os.environ["LABKIT_TEST_SECRET"] = "the-judges-secret"  # the grader's: never the judge's
    try:
        env = judge_box._env(sandbox.uid(), {})
    finally:
        del os.environ["LABKIT_TEST_SECRET"]
    proc = None
    try:
        with judge_box.judge_session(sandbox.uid(), inside_module, env) as (box, spawn):
            proc = spawn([sys.executable, "-c", DRIVER, json.dumps(targets), str(inside_module)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                stdout, stderr = proc.communicate(timeout=120)
            finally:
                box.close(proc)
    finally:
        host_server.close()
        neighbour_proc.kill()
        neighbour_proc.wait()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    report = json.loads(stdout)
    assert report["judge_uid"] == sandbox.uid() and report["judge_env_marker"] is None
    assert report["child"], report["stderr"]
    found = json.loads(report["child"])
    found["_host_files"] = {p: os.path.exists(os.path.join(p, "pwned-by-sandbox.txt"))
                            for p in targets["create"].values()}
    found["_targets"] = targets
    return found


FORBIDDEN = [
    "read solutions/", "read notebooks/source/", "read the judge-side checks", "read another submission",
    "read --out's results", "read another step's folder", "read the grader's home", "read /etc/shadow",
    "read the grader's environment (/proc/<judge>/environ)",
    "write the course's own labkit", "write the venv's packages", "write the Python runtime",
    "write the student's own module (read-only)",
    "create in labkit/", "create in --out", "create in the submissions", "create in the venv", "create in /etc",
    "create in the grader's home",
    "signal the grader (pytest)", "signal another job's process", "signal bwrap's init (pid 1)",
    "connect to a server on the host's loopback",
    "fill /tmp past its size",
]


@pytest.mark.parametrize("thing", FORBIDDEN)
def test_student_code_cannot(inside, thing):
    assert inside[thing].startswith("denied"), f"{thing}: {inside[thing]}"


def _probe_files(lab: str) -> list[str]:
    return [labs.manifest(lab).path(part).name for part in labs.manifest(lab).probes]


# What a listing may show: only what the sandbox binds (the runtime's path, the child-side code).
VISIBLE = {
    "list the grader's home": lambda names: set(names) <= {".pyenv"},
    "list the repository": lambda names: set(names) <= {"labkit", "checks", ".venv"},
    "list solutions/ (folder)": lambda names: names == [],
    "list checks/": lambda names: set(names) <= {"__init__.py", "__pycache__", *labs.manifests().keys(),
                                                 *(m.folder.name for m in labs.manifests().values())},
    "list checks/__pycache__": lambda names: {n.split(".")[0] for n in names} <= {"__init__"},
    # a lab's child-side probes, never its checks, contract or oracle (nor their compiled files)
    "list checks/outbox/": lambda names: set(names) <= {"__init__.py", "__pycache__", *_probe_files("outbox")},
    "list checks/outbox/__pycache__": lambda names: {n.split(".")[0] for n in names} <= {
        "__init__", *(Path(f).stem for f in _probe_files("outbox"))},
    "list /": lambda names: set(names) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root",
                                          "sbin", "tmp", "usr", *{p.split("/")[1] for p in (str(ROOT), sys.base_prefix)}},
    "list /etc": lambda names: set(names) <= {"hosts", "localtime", "nsswitch.conf", "ssl"},
}


@pytest.mark.parametrize("listing", sorted(VISIBLE))
def test_a_listing_shows_only_what_the_sandbox_binds(inside, listing):
    assert VISIBLE[listing](inside[listing]), f"{listing}: {inside[listing]}"


def test_nothing_the_sandbox_created_reached_the_host(inside):
    assert not any(inside["_host_files"].values()), inside["_host_files"]


def test_student_code_runs_as_an_unprivileged_uid_with_no_capabilities_and_no_groups(inside):
    assert inside["uid"] == sandbox.uid() != 0
    assert inside["gid"] == sandbox.uid() and inside["groups"] == []
    assert int(inside["CapEff"], 16) == 0


def test_student_code_gets_no_judge_environment_and_sees_only_its_own_processes(inside):
    assert "LABKIT_TEST_SECRET" not in inside["environ"] and "LABKIT_GRADE_JOB" not in inside["environ"]
    assert RUN_MARKER in inside["environ"]
    assert max(inside["processes"]) < 10, inside["processes"]  # bwrap's init, the child: a pid namespace


# --- limits that hold, nothing that outlives the box ----------------------------------------------


def _run(policy: Policy, code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, sandbox.Report]:
    box = sandbox.Box.open(profiles.copy_module(policy), sandbox.support().cgroups)
    proc = box.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        report = box.close(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()), report


def _policy(tmp_path: Path, **overrides) -> Policy:
    base = profiles.child(sandbox.uid(), module=MODULE, workdir=tmp_path,
                          env={RUN_MARKER: overrides.pop("marker", "limits-test")})
    return Policy(**{**base.__dict__, **overrides})


def test_shared_memory_counts_against_the_memory_limit(tmp_path):
    if sandbox.support().cgroups is None:
        pytest.skip("no cgroups here: /dev/shm is capped by its tmpfs size only")
    policy = _policy(tmp_path, memory_bytes=96 * MiB, tmp_bytes=512 * MiB, address_space=None)
    code = "f = open('/dev/shm/hog', 'wb')\nfor _ in range(400):\n    f.write(b'x' * 2**20); f.flush()\nprint('survived')"
    done, report = _run(policy, code)
    assert "survived" not in done.stdout
    assert report.outcome == sandbox.Outcome.MEMORY_LIMIT, (report, done.stderr[-500:])


def test_a_fork_bomb_stops_at_the_process_limit(tmp_path):
    if sandbox.support().cgroups is None:
        pytest.skip("no cgroups here")
    policy = _policy(tmp_path, max_processes=20)
    code = textwrap.dedent("""
        import os, time
        made = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(30); os._exit(0)
                made += 1
            except OSError:
                break
        print(made)
    """)
    done, report = _run(policy, code)
    assert int(done.stdout.strip()) < 20
    assert report.pids_refused >= 1


def test_a_file_cannot_grow_past_the_file_size_limit(tmp_path):
    policy = _policy(tmp_path, file_bytes=1 * MiB)
    code = "import os\ntry:\n    open('big', 'wb').write(b'x' * (2 * 2**20))\nexcept OSError as e:\n    print('refused', e.errno)"
    done, _ = _run(policy, code)
    assert "refused" in done.stdout, done.stderr[-500:]
    assert (tmp_path / "big").stat().st_size <= 1 * MiB


def test_a_setsid_grandchild_with_an_empty_environment_dies_with_the_box(tmp_path):
    """The marker-based reaper alone misses this one (issue 9: 'outlive its job')."""
    code = textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], {})
            os._exit(0)
        time.sleep(0.5)
        print("parent done")
    """)
    uid = own_uid()  # counted by uid: one no other run on this machine uses
    done, _ = _run(_policy(tmp_path, uid=uid, gid=uid), code)
    assert "parent done" in done.stdout
    deadline = time.monotonic() + 5
    while _uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _uid_processes(uid) == set()


def own_uid() -> int:
    """A sandbox uid of this test process's own, so that other runs' processes are not counted."""
    return sandbox.uid() + 10_000 + os.getpid() % 100_000


def _uid_processes(uid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.add(int(entry))
            except OSError:
                pass
    return found


def test_the_cgroup_is_removed_after_the_run(tmp_path):
    hierarchy = sandbox.support().cgroups
    if hierarchy is None:
        pytest.skip("no cgroups here")
    box = sandbox.Box.open(profiles.copy_module(_policy(tmp_path)), hierarchy)
    paths = list(box.group.paths.values())
    proc = box.spawn([sys.executable, "-c", "pass"])
    proc.wait()
    assert all(not p.exists() for p in paths)



def test_a_process_that_joins_the_group_after_the_kill_is_killed_and_the_group_removed():
    """A box closed while its command line's shell is still joining the group: the kill pass
    found it empty, then the shell joined. Seen twice in CI as a child that outlived its run,
    in a group nobody removed."""
    from labkit.sandbox import bwrap, cgroups

    hierarchy = sandbox.support().cgroups
    if hierarchy is None:
        pytest.skip("no cgroups here")
    group = cgroups.Group.create(hierarchy, 64 * MiB, 16)
    assert group.kill() == 0  # empty: nothing to kill yet
    late = subprocess.Popen(["/bin/sh", "-c", bwrap.JOIN_CGROUPS, "sh", *map(str, group.procs_files),
                             "--", "sleep", "60"])
    deadline = time.monotonic() + 10
    while late.pid not in group.pids() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert late.pid in group.pids(), "the late command line never joined"
    try:
        assert group.remove(), "the group outlived the process that joined it late"
        assert late.wait(timeout=5) == -signal.SIGKILL
        assert all(not p.exists() for p in group.paths.values())
    finally:
        late.kill()
        late.wait(timeout=5)
        group.remove()


def test_a_group_still_busy_after_the_grace_is_removed_later_not_left():
    """An empty group whose removal is refused past the grace (here: a group nested in it, as a
    slow pid-namespace teardown refuses it) is removed by the next group's creation."""
    from labkit.sandbox import cgroups

    hierarchy = sandbox.support().cgroups
    if hierarchy is None:
        pytest.skip("no cgroups here")
    group = cgroups.Group.create(hierarchy, 64 * MiB, 16)
    nested = [path / "busy" for path in dict.fromkeys(group.paths.values())]
    for path in nested:
        path.mkdir()
    try:
        assert not group.remove(grace=0.05)
        assert all(p.exists() for p in group.paths.values())
    finally:
        for path in nested:
            path.rmdir()
    cgroups.Group.create(hierarchy, 64 * MiB, 16).remove()  # the next box's group
    assert all(not p.exists() for p in group.paths.values()), "the busy group was left behind"


def test_a_child_whose_end_is_not_seen_in_time_still_has_its_box_emptied_and_removed(tmp_path, monkeypatch):
    """A box closes when its bwrap's end is seen; on a loaded machine that wait can run out.
    Then the judge empties and removes the box all the same: nothing of it runs on."""
    from labkit.judge import child

    if sandbox.support().cgroups is None:
        pytest.skip("no cgroups here")
    started = child.start(MODULE, workdir=tmp_path, marker=reaper.new_marker(), lab="checks.outbox")
    proc, box = started.proc, started.proc._box
    paths = list(box.group.paths.values())
    real_wait, waits = proc.wait, []

    def slow_wait(timeout=None):
        waits.append(timeout)
        if len(waits) == 1:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        return real_wait(timeout)

    monkeypatch.setattr(proc, "wait", slow_wait)
    started.close()
    assert waits, "the judge never waited for the child"
    assert all(not p.exists() for p in paths), "the box's group outlived its child"
    assert box._closed

# --- exit codes and signals, as the judge sees them ---------------------------------------------


def _child(tmp_path: Path, code: str, marker: str):
    box = profiles.child_box(MODULE, tmp_path, {RUN_MARKER: marker})
    return box.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     cwd=tmp_path, start_new_session=True)


@pytest.mark.parametrize("code", [0, 3, 73, 74, 1])
def test_exit_codes_pass_through(tmp_path, code):
    proc = _child(tmp_path, f"import os; os._exit({code})", uuid.uuid4().hex)
    assert proc.wait(timeout=30) == code


def test_a_sigkill_from_outside_reads_as_minus_9(tmp_path):
    marker = uuid.uuid4().hex
    proc = _child(tmp_path, "import time; print('up', flush=True); time.sleep(60)", marker)
    assert proc.stdout.readline() == b"up\n"
    pids = reaper.marked_pids(marker)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_the_judge_can_stop_and_continue_the_real_process(tmp_path):
    """Lab 03 freezes a publisher from outside: found by its marker, it really stops."""
    marker = uuid.uuid4().hex
    code = "import time\nprint('up', flush=True)\nfor i in range(30):\n    print(i, flush=True); time.sleep(0.05)\nimport os; os._exit(74)"
    proc = _child(tmp_path, code, marker)
    assert proc.stdout.readline() == b"up\n"
    (pid,) = reaper.marked_pids(marker)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.2)
    with open(f"/proc/{pid}/stat") as fh:
        assert fh.read().split(")")[1].split()[0] == "T"
    os.kill(pid, signal.SIGCONT)
    assert proc.wait(timeout=30) == 74
    assert proc.stdout.read().split()[-1] == b"29"


def test_a_self_inflicted_signal_reads_as_that_signal(tmp_path):
    proc = _child(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", uuid.uuid4().hex)
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_the_policy_never_binds_what_student_code_must_not_see():
    profiles.compile_course()
    policy = profiles.child(sandbox.uid(), module=MODULE, workdir=Path(tempfile.gettempdir()))
    seen = [str(p) for p in (*policy.read_only, *policy.writable, *(dest for _, dest in policy.mapped))]
    for secret in ("solutions", "notebooks", "checks/outbox/lab.py", "checks/vending/lab.py", "tests"):
        assert not any(s == str(ROOT / secret) or s.startswith(str(ROOT / secret) + "/") for s in seen), secret
    assert str(MODULE) in seen
    compiled = [Path(s) for s in seen if s.endswith(".pyc")]
    assert compiled, "the course was compiled (profiles.compile_course): its bytecode is shown too"
    for pyc in compiled:  # only of modules the child sees as source too
        assert str(pyc.parent.parent / (pyc.name.split(".")[0] + ".py")) in seen, pyc


def test_a_child_of_one_lab_is_shown_that_labs_probes_only():
    """Each bind mount costs a child's start ~0.2 ms: a child is shown its own lab's probes (the
    lab package its probe or its check names), and every lab's only when nothing names one."""
    workdir = Path(tempfile.gettempdir())
    shown = {str(p) for p in profiles.child(sandbox.uid(), module=MODULE, workdir=workdir, lab="checks.vending").read_only}
    every = {str(p) for p in profiles.child(sandbox.uid(), module=MODULE, workdir=workdir).read_only}
    for lab in labs.manifests().values():
        probes = {str(lab.path(part)) for part in lab.probes}
        assert probes <= every, lab.name
        assert (probes <= shown) == (lab.package == "checks.vending"), (lab.name, probes & shown)
    assert labs.package_of("checks.vending.sweep_probes:run") == "checks.vending"
    assert labs.package_of("labkit.probe:serve") is None


def test_a_module_that_does_not_exist_is_an_import_verdict_in_the_sandbox(tmp_path):
    """The box copies the module before the child starts; a missing file must not crash the judge."""
    from labkit import labs
    from labkit.judge.run import run_lab
    from labkit.judge.verdict import Outcome

    assert sandbox.enabled()
    verdict = run_lab(labs.load("outbox"), tmp_path / "missing" / "worker.py", steps=[1], seed=1)
    [case] = verdict.steps[0].cases
    assert case.outcome is Outcome.IMPORT_FAILED and "No such file" in case.got


READ_TABLES = '''
import gzip, json, os
opened = []
real = gzip.GzipFile
def logged(filename=None, mode=None, *args, **kwargs):
    found = real(filename, mode, *args, **kwargs)
    opened.append([os.path.basename(str(filename)), mode])  # opened: it was there
    return found
gzip.GzipFile = logged
from hypothesis import Phase, given, settings, strategies as st
drawn = []
@settings(database=None, max_examples=3, phases=[Phase.generate], deadline=None)
@given(st.text(min_size=1))
def draw(text):
    drawn.append(text)
draw()
try:
    open(os.path.join(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], "written-by-the-judge"), "w")
    writable = True
except OSError:
    writable = False
print(json.dumps({"opened": opened, "drawn": len(drawn), "writable": writable}))
'''


def test_tables_drawn_once_are_not_drawn_again_without_importing_hypothesis(tmp_path):
    """A batch's forkserver warms the tables each time; once they are drawn for this Hypothesis
    and Unicode, it needs no Hypothesis import (0.07 s of CPU on the batch's start-up path)."""
    from labkit.judge import differential

    env = {**os.environ, differential.STORAGE_ENV: str(tmp_path / "hypothesis")}
    ask = ("import sys; from labkit.judge import differential as d; "
           "print(d.warm_unicode_tables(), 'hypothesis' in sys.modules)")
    said = [subprocess.run([sys.executable, "-c", ask], env=env, check=True, timeout=120, capture_output=True,
                           text=True).stdout.split() for _ in range(2)]
    assert said[0][1] == "True" and said[1] == [said[0][0], "False"], said
    stamp = Path(said[0][0]) / differential.STAMP
    stamp.write_text("hypothesis 0.0.1, unicode 1.0.0\n")  # drawn for another version: drawn again
    again = subprocess.run([sys.executable, "-c", ask], env=env, check=True, timeout=120, capture_output=True,
                           text=True).stdout.split()
    assert again == [said[0][0], "True"] and stamp.read_text() != "hypothesis 0.0.1, unicode 1.0.0\n"


def test_a_judge_in_its_box_reads_the_graders_unicode_tables_and_cannot_change_them(tmp_path):
    """Without the grader's tables a boxed judge rebuilt them in its fresh home (~1.5 s of CPU
    each, measured: outbox's step 1 took 2.4 s instead of 0.8 s)."""
    from labkit.grading import judge_box
    from labkit.judge import differential

    storage = tmp_path / "hypothesis"
    env = {**os.environ, differential.STORAGE_ENV: str(storage)}
    said = subprocess.run([sys.executable, "-c", "from labkit.judge import differential as d; "
                           "print(d.warm_unicode_tables())"], env=env, check=True, timeout=120, capture_output=True)
    tables = Path(said.stdout.decode().strip())
    built = sorted(p.name for p in storage.glob("unicode_data/*/*.json.gz"))
    assert any(name.startswith("charmap") for name in built) and any("utf-8" in name for name in built), built
    assert tables.resolve() != storage.resolve()
    # Hypothesis writes its codec table again, mode 0600, after every process that uses it (one
    # run as root between two batches): the judges read a copy that no such run touches.
    for path in storage.glob("unicode_data/*/*.json.gz"):
        path.chmod(0o600)

    env = judge_box._env(sandbox.uid(), {})
    env[differential.STORAGE_ENV] = str(tables)
    box = sandbox.Box.open(profiles.judge_box(sandbox.uid(), module=MODULE, tmp="/tmp", env=env, tables=tables),
                           sandbox.support().cgroups)
    try:
        proc = box.spawn([sys.executable, "-c", READ_TABLES], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, start_new_session=True)
        out, err = proc.communicate(timeout=120)
    finally:
        box.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    seen = json.loads(out)
    assert seen["drawn"] == 3 and not seen["writable"]
    reading = (None, "r", "rb")  # GzipFile's default mode reads
    assert sorted(name for name, mode in seen["opened"] if mode in reading) == built
    assert not [name for name, mode in seen["opened"] if mode not in reading], seen["opened"]


def test_a_child_the_memory_limit_killed_is_told_so_not_that_it_died(tmp_path, monkeypatch):
    """The box's report reaches the verdict: a cgroup OOM kill is its own outcome, with its own
    words, not a bare "died (exit code -9)". The address-space limit is lifted here so that the
    cgroup's limit, not a MemoryError, is what stops the allocation."""
    if sandbox.support().cgroups is None:
        pytest.skip("no cgroups here: nothing but the address-space limit bounds memory")
    from labkit.judge import expect
    from labkit.judge.child import run_child
    from labkit.judge.verdict import Outcome

    real = profiles.child
    monkeypatch.setattr(profiles, "child", lambda *args, **kwargs: Policy(
        **{**real(*args, **kwargs).__dict__, "memory_bytes": 96 * MiB, "address_space": None}))
    module = tmp_path / "worker.py"
    module.write_text("def hog():\n    blob = [bytearray(2**20) for _ in range(1024)]\n    return len(blob)\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = run_child(module, "labkit.probe:calls", {"calls": [{"name": "hog", "fn": "hog", "args": []}]},
                    workdir=workdir, timeout=20.0)
    plan = expect.Plan("hog", "hog()", "1024", expect.returns(1024))
    [case] = expect.judge(run, [plan], 20.0)
    assert run.memory_limit and case.outcome is Outcome.MEMORY_LIMIT, (run.exit_code, case)
    assert "memory limit" in case.got and "died" not in case.got


def test_children_side_by_side_in_one_folder_never_share_or_replace_a_module_copy(tmp_path):
    """Each child's copy of the module is its own: a copy shared by name and replaced at each
    start was unlinked under a bwrap still binding it, and that child ended before it loaded
    the module ("... (deleted) in mount table"), seen with four children of a step at once."""
    first = profiles.copy_module(_policy(tmp_path))
    (copy, shown), = first.mapped
    inode = os.stat(copy).st_ino
    second = profiles.copy_module(_policy(tmp_path))
    (other, _), = second.mapped
    assert other != copy and os.stat(copy).st_ino == inode  # the first is still the file bound
    assert Path(copy).read_bytes() == Path(other).read_bytes() == Path(shown).read_bytes()
    assert oct(os.stat(other).st_mode & 0o777) == "0o644"
