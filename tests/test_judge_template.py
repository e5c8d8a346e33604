"""The grading batch's template of the judge (`zygote.start_template`, `zygote_main`'s judge role).

A judge forked from it must be the judge a fresh `python -m labkit check` in the same box would
be: the same verdict, the job's uid, no capabilities, the seccomp filter, the box's namespaces
and cgroup. Only root may ask it for a judge; when it is gone, the judge starts fresh; it
leaves no process and no folder behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import sandbox
from labkit.grading import judge_box
from labkit.sandbox import zygote

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "worker.py"
# A realistic mistake of step 1: isinstance lets a bool through as a quantity.
WRONG = ("if type(qty) is not int or not 1 <= qty <= 1000:", "if not isinstance(qty, int) or not 1 <= qty <= 1000:")


@pytest.fixture
def template():
    if not sandbox.support().ok:
        pytest.skip(f"no sandbox here: {sandbox.support().reason}")
    judges = judge_box.start_template()
    assert judges is not None, "the judges' template did not start"
    yield judges
    judges.stop()


def _module(tmp_path: Path, wrong: bool) -> Path:
    source = REFERENCE.read_text()
    if wrong:
        assert WRONG[0] in source
        source = source.replace(*WRONG)
    folder = tmp_path / ("wrong" if wrong else "right")
    folder.mkdir()
    (folder / "worker.py").write_text(source)
    return folder / "worker.py"


def _outline(verdict) -> list:
    return [(s.step, s.status, sorted((c.name, c.passed) for c in s.cases)) for s in verdict.steps]


@pytest.mark.parametrize("wrong", [False, True], ids=["reference", "isinstance-bool"])
def test_a_forked_judge_gives_the_verdict_a_fresh_judge_gives(template, tmp_path, wrong):
    module = _module(tmp_path, wrong)
    forked = judge_box._run_once("outbox", module, 7, uid=sandbox.uid() + 1, timeout=120, marker_env={},
                                 judges=template.path)
    fresh = judge_box._run_once("outbox", module, 7, uid=sandbox.uid() + 1, timeout=120, marker_env={})
    assert forked.verdict is not None and not forked.retry, forked.error
    assert fresh.verdict is not None, fresh.error
    assert _outline(forked.verdict) == _outline(fresh.verdict)
    assert forked.verdict.passed is (not wrong)
    if wrong:
        step1 = next(s for s in forked.verdict.steps if s.step == 1)
        assert any(not c.passed and "1.qty-bool" in c.clauses for c in step1.cases)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in fh)}


def test_a_forked_judge_is_confined_like_a_fresh_one(template, tmp_path):
    """Seen from outside while it runs: the job's uid, nothing privileged, the box's namespaces."""
    module = _module(tmp_path, wrong=False)
    uid = sandbox.uid() + 2
    env = judge_box._env(uid, {})
    argv = [sys.executable, "-P", "-m", "labkit", "check", "outbox", "--solution", str(module), "--json"]
    with judge_box.judge_session(uid, module, env, judges=template.path) as (box, spawn):
        proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert isinstance(proc, zygote.ZygotePopen)
            deadline = time.monotonic() + 10  # forked as root, it drops everything before `check` runs
            while _status(proc.inner)["Seccomp"] != "2" and time.monotonic() < deadline:
                time.sleep(0.001)
            status = _status(proc.inner)
            cgroups = Path(f"/proc/{proc.inner}/cgroup").read_text()
            spaces = {name: os.readlink(f"/proc/{proc.inner}/ns/{name}") for name in ("net", "mnt", "pid", "ipc")}
            box_spaces = {name: os.readlink(f"/proc/{proc.box_pid}/ns/{name}") for name in spaces}
        finally:
            proc.stdout.read()
            proc.wait(timeout=120)
            box.close(proc)
    assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
    assert status["Groups"] == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    assert spaces == box_spaces
    mine = {name: os.readlink(f"/proc/self/ns/{name}") for name in spaces}
    assert all(spaces[name] != mine[name] for name in spaces), "the judge shares a namespace with the grader"
    assert box.policy.uid == uid and "labkit-" in cgroups
    assert proc.returncode == 0


def test_only_root_may_ask_the_template_for_a_judge(template):
    folder = os.path.dirname(template.path)
    assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(folder).st_uid == 0
    os.chmod(folder, 0o755)  # let a stranger reach the socket, to see the template refuse it
    os.chmod(template.path, 0o777)
    asker = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.settimeout(10); s.connect(sys.argv[1])\n"
             "try:\n"
             "    s.send(b'{\"targets\": [0, 1, 2], \"uid\": 0}')\n"
             "    print('closed' if s.recv(4096) == b'' else 'answered')\n"
             "except (BrokenPipeError, ConnectionResetError):\n    print('closed')\n")
    said = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                           asker, template.path], capture_output=True, text=True, timeout=30)
    assert said.stdout.strip() == "closed", (said.stdout, said.stderr)  # unanswered
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:  # and root is still served
        sock.settimeout(10)
        sock.connect(template.path)
        sock.send(b"{}")
        assert b"error" in sock.recv(4096)


def test_a_judge_whose_template_is_gone_starts_fresh(template, tmp_path):
    module = _module(tmp_path, wrong=False)
    template.zygote.proc.kill()
    template.zygote.proc.wait(timeout=10)
    run = judge_box.run("outbox", module, 3, uid=sandbox.uid() + 3, timeout=120, judges=template.path)
    assert run.verdict is not None and run.verdict.passed, run.error


def test_the_template_leaves_nothing_behind():
    if not sandbox.support().ok:
        pytest.skip(f"no sandbox here: {sandbox.support().reason}")
    judges = judge_box.start_template()
    assert judges is not None
    pid, folder = judges.zygote.proc.pid, os.path.dirname(judges.path)
    judges.stop()
    assert not os.path.exists(folder)
    assert judges.zygote.proc.poll() is not None
    # Killed with its grader (its control socket closes): it ends, and takes its folder along.
    judges = judge_box.start_template()
    folder = os.path.dirname(judges.path)
    judges.zygote.sock.close()
    judges.zygote.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while os.path.exists(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(folder)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_no_template_where_judges_cannot_be_forked(monkeypatch):
    monkeypatch.setenv(zygote.ENV, "off")
    assert zygote.start_template({}) is None
