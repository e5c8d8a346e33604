"""A judge run leaves nothing behind, whatever the student's code does.

Before and after each run we take a snapshot of what a run could leave: processes carrying
this run's marker (found as the reaper finds them, through /proc/*/environ), child processes
of this test process, zombies among them, listening TCP sockets of this process and its
children, and the judge's `labkit-*` temp dirs. Both snapshots must be equal.

Every test runs for each lab (lab 01's outbox, lab 02's vending machine).

Other runs may share the machine, so the markers get a prefix of our own and the temp dir is
private to the test: what we count is ours alone.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit import labs
from labkit.judge import reaper
from labkit.judge.run import run_lab
from labkit.limits import RUN_MARKER

ROOT = Path(__file__).resolve().parents[1]


def _step_one(reference: Path) -> str:
    """The first plain (not async) function of step 1 in a reference module: a test puts its lines there."""
    text = reference.read_text()
    step = text.split("# --- step 1 ", 1)[1].split("# --- step ", 1)[0]
    return re.search(r"^def (\w+)\(", step, re.M).group(1)


# Every lab (lab 03 too once it lands; not the warm-up), its reference, and where its step 1 code lives.
LABS = {lab: (ROOT / "solutions" / module, _step_one(ROOT / "solutions" / module))
        for lab, module in labs.MODULE_FILES.items()
        if lab != "start-here" and lab in labs.available() and (ROOT / "solutions" / module).exists()}


@pytest.fixture
def judge_tmp(tmp_path, monkeypatch):
    """A private temp dir for the judge (and its children), and a list of what it created there."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    created: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def spy(*args, **kwargs):
        path = real_mkdtemp(*args, **kwargs)
        created.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return private, created


@pytest.fixture
def tag(monkeypatch):
    """Every marker of this test's runs starts with a tag, so /proc scans see only our processes."""
    prefix = f"leftovers-{os.getpid()}-"
    real_new_marker = reaper.new_marker
    monkeypatch.setattr(reaper, "new_marker", lambda: prefix + real_new_marker())
    return prefix


def marked(prefix: str) -> set[int]:
    """Like reaper.marked_pids, for every marker that starts with `prefix`."""
    needle = f"{RUN_MARKER}={prefix}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read():
                        found.add(int(entry))
            except OSError:
                continue
    return found


def snapshot(prefix: str, private: Path) -> dict:
    me = psutil.Process()
    children = me.children(recursive=True)
    listening = set()
    for proc in [me, *children]:
        try:
            listening |= {(proc.pid, c.laddr.port) for c in proc.net_connections(kind="tcp")
                          if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
    zombies = set()
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return {
        "marked processes": marked(prefix),
        "children": {c.pid for c in children},
        "zombies": zombies,
        "listening sockets": listening,
        "labkit temp dirs": sorted(p.name for p in private.glob("labkit-*")),
    }


def with_code(tmp_path: Path, lab: str, *lines: str) -> Path:
    """The lab's reference solution with `lines` run first in its chosen function."""
    reference, function = LABS[lab]
    source = reference.read_text()
    head = re.compile(rf"^def {function}\(.*\):\n", re.M)
    assert len(head.findall(source)) == 1, function
    path = tmp_path / reference.name
    path.write_text(head.sub(lambda m: m.group(0) + "".join(f"    {line}\n" for line in lines), source))
    return path


@pytest.fixture(params=sorted(LABS))
def lab(request) -> str:
    return request.param


@pytest.fixture
def judged(tag, judge_tmp, lab):
    """Run the judge and prove that the world afterwards is the world before."""
    private, created = judge_tmp

    def run(solution: Path, steps=None, timeout=None):
        before = snapshot(tag, private)
        verdict = run_lab(labs.load(lab), solution, steps=steps, seed=1, timeout=timeout)
        after = snapshot(tag, private)
        assert after == before
        assert created, "the judge made no temp dir: this test would not see one left behind"
        assert not [p for p in created if os.path.exists(p)]
        return verdict

    return run


def test_full_reference_run(judged, lab):
    assert judged(LABS[lab][0]).passed


def test_hanging_step(judged, tmp_path, lab):
    verdict = judged(with_code(tmp_path, lab, "while True:", "    pass"), steps=[1], timeout=2)
    assert verdict.steps[0].cases[0].outcome == "timed_out"


def test_step_that_kills_itself(judged, tmp_path, lab):
    verdict = judged(with_code(tmp_path, lab, "import os", "os._exit(9)"), steps=[1])
    assert not verdict.passed


@pytest.mark.parametrize("close_fds", [False, True], ids=["keeps its fds", "closes its fds"])
def test_grandchild_that_escapes_with_setsid(judged, tmp_path, close_fds, lab):
    # The parent records each grandchild's pid itself, after the grandchild has said (through a
    # pipe) that its setsid is done: every escapee is on the list before the reaper can act.
    # (A grandchild writing its own pid raced the reaper: 4 of 12 runs failed under load.)
    pids = tmp_path / "grandchildren.txt"
    path = with_code(
        tmp_path, lab,
        "import os, time",
        "ready, tell = os.pipe()",
        "child = os.fork()",
        "if child == 0:",
        "    os.setsid()",
        "    os.write(tell, b'x')",
        "    if " + repr(close_fds) + ":",
        "        os.closerange(0, 65536)",
        "    time.sleep(60)",
        "    os._exit(0)",
        "os.close(tell)",
        "os.read(ready, 1)",
        "os.close(ready)",
        f"with open({str(pids)!r}, 'a') as fh:",
        "    fh.write(f'{child}\\n')",
    )
    verdict = judged(path, steps=[1])
    assert verdict.passed  # the parent's answers are right; only its grandchildren misbehave
    escaped = [int(line) for line in pids.read_text().split()]
    assert len(escaped) == len(verdict.steps[0].cases)
    assert not [pid for pid in escaped if psutil.pid_exists(pid)]
