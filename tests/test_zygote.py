"""The zygote (labkit.sandbox.zygote): a child forked warm into its box has every guarantee of a
child started fresh in the same box, and a zygote that cannot serve never costs a verdict.

A "student module" (FACTS) describes, as it loads, what it can see and do: its ids, capabilities,
seccomp and no_new_privs, limits, processes, /tmp, open fds, environment (its variables and the
block /proc shows), the course's folder. The same module runs once forked by the zygote and once
started fresh (LABKIT_ZYGOTE=off); both must say the same, but for what must differ (pids, the
random stream) and the one process the zygote's box adds (the shell that holds it, asleep).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from labkit import sandbox
from labkit.judge import child
from labkit.limits import RUN_MARKER
from labkit.sandbox import box as box_module
from labkit.sandbox import reaper, zygote

ROOT = Path(__file__).resolve().parents[1]
SECRET = "LABKIT_TEST_JUDGES_SECRET"
FACTS = f"""
import errno, json, os, random, resource, sys
def tried(call):
    try:
        call()
        return "allowed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
open("/tmp/left-by-" + str(os.getpid()), "w").close()
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
print(json.dumps({{
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    "status": {{k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}},
    "limits": [resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE")],
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "tmp": sorted(os.listdir("/tmp")),
    # the standard ones by number; the judge's pipes by count only: they keep the judge's numbers,
    # which follow whatever else the judge's threads had open at that moment
    "fds": [[n for n in fds if n <= 3], len([n for n in fds if n > 3])],
    "env": dict(os.environ),
    "environ_block": open("/proc/self/environ", "rb").read().decode("utf-8", "replace"),
    "course": sorted(os.listdir({str(ROOT)!r})),
    "cwd": os.getcwd(),
    "own_session": os.getsid(0) == os.getpid(),
    "signals": {{pid: tried(lambda: os.kill(int(pid), 0)) for pid in os.listdir("/proc")
                 if pid.isdigit() and int(pid) != os.getpid()}},
    "random": random.random(),
    "argv": sys.argv,
}}))
"""


@pytest.fixture(autouse=True)
def sandbox_required():
    found = sandbox.support()
    if not found.ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {found.reason}")
        pytest.skip(f"no sandbox here: {found.reason}")


@pytest.fixture
def fresh_zygotes(monkeypatch):
    """Zygotes started within the test (with the test's environment), stopped after it."""
    zygote.stop_all()
    monkeypatch.delenv(zygote.ENV, raising=False)
    yield
    zygote.stop_all()


def looks(tmp_path: Path, name: str, source: str = FACTS) -> tuple[dict, child.ChildRun, object]:
    """Run `source` as a student's module in a judged child; what it printed, the run, its proc."""
    workdir = tmp_path / name
    workdir.mkdir()
    module = workdir / "worker.py"
    module.write_text(source)
    started = child.start(module, workdir=workdir, marker=reaper.new_marker(), lab="checks.outbox")
    proc = started.proc
    proc.groups = list(proc._box.group.paths.values()) if proc._box.group is not None else []  # before they go
    run = child.run_child(module, "labkit.probe:noop", {}, workdir=workdir, timeout=30, started=started,
                          lab="checks.outbox")
    assert run.finished, (run.exit_code, run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1]), run, proc


def comparable(env: dict) -> dict:
    """A child's environment but for what differs from run to run: the run's own marker, its
    folder, and the numbers of the judge's pipes (the judge's own fds, whatever was free)."""
    numbers = ("LABKIT_REQUEST_FD", "LABKIT_RESULT_FD")
    return {k: ("<fd>" if k in numbers else v) for k, v in env.items() if k not in (RUN_MARKER, "PWD")}


def left(facts: dict) -> list[str]:
    """The files in its /tmp that a FACTS child leaves (the rest is the path to its work folder)."""
    return [name for name in facts["tmp"] if name.startswith("left-by-")]


def test_a_forked_child_sees_and_may_do_what_a_fresh_one_does(tmp_path, monkeypatch, fresh_zygotes):
    forked, _, proc = looks(tmp_path, "forked")
    assert isinstance(proc, zygote.ZygotePopen)
    monkeypatch.setenv(zygote.ENV, "off")
    fresh, _, plain = looks(tmp_path, "fresh")
    assert isinstance(plain, box_module.BoxedPopen)

    uid = sandbox.uid()
    assert forked["ids"] == [uid, uid, uid, uid, []]
    assert all(int(forked["status"][k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
    assert forked["status"]["NoNewPrivs"] == "1" and forked["status"]["Seccomp"] == "2"
    assert forked["own_session"]
    # Its box's processes only: bwrap's init, the shell that holds the box, itself.
    assert len(forked["pids"]) <= len(fresh["pids"]) + 1, (forked["pids"], fresh["pids"])
    assert left(forked) == [f"left-by-{forked['pids'][-1]}"]  # what it made itself, nothing from before
    assert Path(forked["cwd"]).name == "forked" and Path(fresh["cwd"]).name == "fresh"
    assert Path(forked["cwd"]).parent == Path(fresh["cwd"]).parent
    # Every other process of its box is beyond its signals (bwrap's init, and the holder: uid 65534).
    assert set(forked["signals"].values()) == set(fresh["signals"].values()) == {"EPERM"}
    for key in ("ids", "status", "limits", "fds", "course", "argv"):
        assert forked[key] == fresh[key], key
    assert comparable(forked["env"]) == comparable(fresh["env"])
    assert forked["env"]["PWD"] == forked["cwd"] and fresh["env"]["PWD"] == fresh["cwd"]


def test_nothing_of_the_judges_environment_reaches_a_forked_child(tmp_path, monkeypatch, fresh_zygotes):
    token = os.urandom(8).hex()
    monkeypatch.setenv(SECRET, token)  # in the judge when its zygote starts
    facts, _, proc = looks(tmp_path, "env")
    assert isinstance(proc, zygote.ZygotePopen)
    assert SECRET not in facts["env"] and token not in json.dumps(facts["env"])
    assert token not in facts["environ_block"] and SECRET not in facts["environ_block"]


def test_each_forked_case_is_a_fresh_process_with_a_fresh_tmp_and_its_own_random_stream(tmp_path, fresh_zygotes):
    first, _, _ = looks(tmp_path, "one")
    second, _, _ = looks(tmp_path, "two")
    assert len(left(first)) == len(left(second)) == 1  # only the file it made itself
    assert left(first) != left(second) or first["pids"] == second["pids"]
    assert first["random"] != second["random"]


def test_a_forked_childs_box_and_everything_it_started_are_gone_after_the_run(tmp_path, fresh_zygotes):
    source = ("import os, time\n"
              "if os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n"  # a grandchild that would linger
              "print('{}')\n")
    _, run, proc = looks(tmp_path, "linger", source)
    assert isinstance(proc, zygote.ZygotePopen) and run.exit_code == 0 and proc.groups
    assert proc.sandbox_report is not None
    assert not [path for path in proc.groups if path.exists()]
    assert proc.holder.poll() is not None


def test_a_childs_kill_of_every_process_it_may_signal_leaves_its_box_standing(tmp_path, fresh_zygotes):
    """kill(-1, SIGKILL) reaches what the child may signal in its box: in a fresh box, nothing but
    its own; the zygote's box holds nothing more of the child's uid (a grading test's submission
    did this at import, and lost every point when the holder was the child's uid)."""
    source = ("import os, signal, time\nos.kill(-1, signal.SIGSTOP)\nos.kill(-1, signal.SIGKILL)\n"
              "time.sleep(1)\nprint('{}')\n")  # a box that came down would take this child with it meanwhile
    facts, run, proc = looks(tmp_path, "killer", source)
    assert isinstance(proc, zygote.ZygotePopen) and facts == {} and run.exit_code == 0


def test_a_zygote_that_does_not_start_costs_nothing(tmp_path, monkeypatch, fresh_zygotes):
    monkeypatch.setattr(zygote, "_start", lambda *args, **kwargs: None)
    facts, _, proc = looks(tmp_path, "nostart")
    assert isinstance(proc, box_module.BoxedPopen) and facts["ids"][0] == sandbox.uid()


def test_a_zygote_that_died_costs_nothing_and_is_not_asked_again(tmp_path, fresh_zygotes):
    looks(tmp_path, "before")
    (zygote_pid,) = zygote.pids()
    os.kill(zygote_pid, signal.SIGKILL)
    facts, _, proc = looks(tmp_path, "after")
    assert isinstance(proc, box_module.BoxedPopen) and facts["ids"][0] == sandbox.uid()
    assert zygote.pids() == set()
    _, _, again = looks(tmp_path, "again")
    assert isinstance(again, box_module.BoxedPopen)


def test_zygote_off_starts_every_child_fresh(tmp_path, monkeypatch, fresh_zygotes):
    monkeypatch.setenv(zygote.ENV, "off")
    _, _, proc = looks(tmp_path, "off")
    assert isinstance(proc, box_module.BoxedPopen) and zygote.pids() == set()


def test_a_child_forked_from_a_batchs_template_sees_what_a_fresh_one_does(tmp_path, monkeypatch, fresh_zygotes):
    """A grading batch forks its judges' children from one template per lab (`use_templates`)."""
    template = zygote.start_template(zygote.child_env("checks.outbox", child.site_packages()))
    assert template is not None
    zygote.use_templates({"checks.outbox": template.path})
    try:
        forked, _, proc = looks(tmp_path, "templated")
        assert isinstance(proc, zygote.ZygotePopen)
        assert zygote.pids() == set(), "a zygote of its own was started beside the template"
        zygote.use_templates({})
        monkeypatch.setenv(zygote.ENV, "off")
        fresh, _, _ = looks(tmp_path, "fresh")  # (with the template's socket still open: the same fd numbers)
    finally:
        zygote.use_templates({})
        template.stop()
    for key in ("ids", "status", "limits", "fds", "course", "argv"):
        assert forked[key] == fresh[key], key
    assert set(forked["signals"].values()) == {"EPERM"}
    assert comparable(forked["env"]) == comparable(fresh["env"])
