"""The launcher, as a judge would use it: what it starts, what it refuses, what it leaves.

The launcher here serves this test process as its "judge" (our own namespaces, our numbering
of pids), over the same socket pair and the same client (`labkit.sandbox.remote`) a judge in
its box uses. Each refusal is a request a compromised judge could send; the deputy test
swaps the step folder's path for a link between the judge opening it and the launcher
binding it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from labkit import sandbox
from labkit.limits import RUN_MARKER
from labkit.sandbox import launcher, reaper, remote

ROOT = Path(__file__).resolve().parents[1]
PROBE = [*launcher.CHILD_PYTHON, "labkit.probe.main"]


@pytest.fixture
def served(tmp_path):
    found = sandbox.support()
    if not found.ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {found.reason}")
        pytest.skip(f"no sandbox here: {found.reason}")
    folder = Path(tempfile.mkdtemp(prefix="labkit-launcher-test-", dir="/tmp"))
    folder.chmod(0o755)
    module = folder / "worker.py"
    module.write_text("import os\nopen('written-by-the-child', 'w').write(str(os.getuid()))\n")
    serving = launcher.Launcher.pair(sandbox.uid(), module, found.cgroups, "/tmp")
    serving.level = 0  # the "judge" is this process: the host's numbering
    for name in ("net", "pid", "mnt"):
        setattr(serving, f"{name}ns", os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
    serving._thread = threading.Thread(target=serving._serve, daemon=True)
    serving._thread.start()
    conn = remote._Connection(serving.judge_end).start()
    step = folder / "step"
    step.mkdir()
    os.chown(step, sandbox.uid(), sandbox.uid())
    yield serving, conn, module, step
    serving.close()
    # This process played the judge: a box's first process, in the judge's pid namespace,
    # re-parented here when bwrap ended. A judge collects it when it kills the run
    # (`reaper.kill_marked`); these tests only wait for the probe, so they collect it here,
    # or a later test that counts zombies would find it (a CI run did).
    deadline = time.monotonic() + 10
    while reaper.nested_children() and time.monotonic() < deadline:
        reaper.collect_nested_zombies()
        time.sleep(0.01)
    shutil.rmtree(folder, ignore_errors=True)


def _run(conn, module: Path, step: Path, timeout: float = 60):
    """Start the probe for `module` in `step`, as `child.spawn` does; wait for its end."""
    box = remote.RemoteBox(conn)
    result_r, result_w = os.pipe()
    with open(step.parent / "out", "wb") as out, open(step.parent / "err", "wb") as err:
        proc = box.spawn(PROBE, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=step,
                         env={"LABKIT_RESULT_FD": str(result_w)}, pass_fds=(result_w,))
    os.close(result_w)
    proc.stdin.write(json.dumps({"module": str(module), "module_name": "worker",
                                 "probe": "labkit.probe:noop", "args": {}}).encode())
    proc.stdin.close()
    code = proc.wait(timeout)
    with os.fdopen(result_r, "rb") as results:
        records = results.read()
    return proc, code, records


def test_a_probe_child_runs_as_the_jobs_uid_in_the_folder_it_was_sent(served):
    _, conn, module, step = served
    proc, code, records = _run(conn, module, step)
    assert code == 0, (step.parent / "err").read_text()[-2000:]
    assert b'"imported"' in records
    assert (step / "written-by-the-child").read_text() == str(sandbox.uid())
    assert proc.sandbox_report.outcome == sandbox.Outcome.OK


def test_a_link_swapped_in_after_the_judge_opened_the_folder_is_never_followed(served):
    """The judge opens the step folder; a child of an earlier step could not touch its path,
    but suppose the path now names a link to /etc: the launcher binds the folder the fd is."""
    _, conn, module, step = served
    box = remote.RemoteBox(conn)
    moved = step.parent / "step-moved"
    real_open = os.open

    def open_then_swap(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if str(path) == str(step):
            os.rename(step, moved)
            os.symlink("/etc", step)
        return fd

    result_r, result_w = os.pipe()
    os.open = open_then_swap
    try:
        with open(step.parent / "err", "wb") as err:
            proc = box.spawn(PROBE, stdin=subprocess.PIPE, stdout=err, stderr=err, cwd=step,
                             env={"LABKIT_RESULT_FD": str(result_w)}, pass_fds=(result_w,))
    finally:
        os.open = real_open
        os.close(result_w)
    proc.stdin.write(json.dumps({"module": str(module), "module_name": "worker",
                                 "probe": "labkit.probe:noop", "args": {}}).encode())
    proc.stdin.close()
    code = proc.wait(60)
    with os.fdopen(result_r, "rb") as results:
        records = results.read()
    assert code == 0 and b'"imported"' in records, (code, records, (step.parent / "err").read_text()[-2000:])
    assert step.is_symlink()
    assert (moved / "written-by-the-child").exists()
    assert not Path("/etc/written-by-the-child").exists()


@pytest.mark.parametrize("change, refusal", [
    ({"argv": [sys.executable, "-c", "print('anything')"]}, "only the course's probe"),
    ({"argv": ["/bin/sh", "-P", "-m", "labkit.probe.main"]}, "only the course's probe"),
    ({"workdir": "/etc"}, "inside the judge's /tmp"),
    ({"workdir": "/tmp/../etc"}, "inside the judge's /tmp"),
    ({"code_modules": ["checks.outbox.oracle"]}, "only modules of labkit/"),
    ({"lab": "solutions"}, "probes of one of the course's labs only"),
    ({"lab": ["checks.outbox"]}, "probes of one of the course's labs only"),
    ({"env": {"A": 1}}, "text to text"),
    ({"fd_env": {"LABKIT_RESULT_FD": 3}}, "fds:"),
    ({"op": "format the disk"}, "unknown request"),
])
def test_the_launcher_refuses_what_the_policy_does_not_allow(served, change, refusal):
    serving, conn, _module, step = served
    request = {"op": "spawn", "argv": PROBE, "env": {}, "workdir": str(step), "code_modules": [],
               "fd_env": {}, **change}
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)] + [os.open(step, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        with pytest.raises(remote.LauncherGone, match=refusal):
            conn.ask(request, fds if request["op"] == "spawn" else [])
    finally:
        for fd in fds:
            os.close(fd)
    assert not serving.children  # nothing was started


def test_a_malformed_message_is_answered_and_the_launcher_keeps_serving(served):
    serving, conn, module, step = served
    conn.sock.send(b"[" * 100_000)  # deep: a recursive parser would fail, not answer
    conn.sock.send(b"\xff not json")
    _, code, _ = _run(conn, module, step)
    assert code == 0
    assert serving._thread.is_alive()


def test_closing_the_launcher_ends_every_child_and_leaves_no_cgroup(served):
    serving, conn, module, step = served
    module.write_text("import time\ntime.sleep(600)\n")
    marker = f"launcher-close-{uuid.uuid4().hex}"
    box = remote.RemoteBox(conn)
    # A result pipe, as `child.spawn` gives: without one the probe ends at once (KeyError), and
    # this test passed only when it looked within that moment (more often on a loaded machine).
    result_r, result_w = os.pipe()
    with open(os.devnull, "wb") as sink:
        proc = box.spawn(PROBE, stdin=subprocess.PIPE, stdout=sink, stderr=sink, cwd=step,
                         env={RUN_MARKER: marker, "LABKIT_RESULT_FD": str(result_w)}, pass_fds=(result_w,))
    os.close(result_w)
    proc.stdin.write(json.dumps({"module": str(module), "module_name": "worker",
                                 "probe": "labkit.probe:noop", "args": {}}).encode())
    proc.stdin.close()
    groups = [list(child.box.group.paths.values()) for child in serving.children.values() if child.box.group]
    deadline = time.monotonic() + 20
    while not reaper.marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    with os.fdopen(result_r, "rb") as results:
        os.set_blocking(results.fileno(), False)
        deadline = time.monotonic() + 20
        said = b""
        while b'"importing"' not in said and time.monotonic() < deadline:  # asleep in the module's import
            said += results.read() or b""
            time.sleep(0.05)
        assert proc.poll() is None and groups and reaper.marked_pids(marker), said
        serving.close()
        assert proc.wait(30) is not None
    assert not any(path.exists() for paths in groups for path in paths)
    assert not reaper.marked_pids(marker)


def test_a_launched_child_nobody_sent_a_request_is_ended_when_closed(served):
    """A step's early child that no case took (its case wanted an environment of its own) is
    closed by the judge. A launched child is numbered by its sandbox's init, which leads no
    process group: the group kill missed it, and closing waited out KILL_GRACE with the child
    still running (2 s in each such step of every grading judge). Its box is killed instead."""
    from labkit.judge import child

    _, conn, module, step = served
    box = remote.RemoteBox(conn)
    result_r, result_w = os.pipe()
    request_r, request_w = os.pipe()
    io_dir = Path(tempfile.mkdtemp(prefix="labkit-io-"))
    with open(os.devnull, "wb") as sink:
        proc = box.spawn(PROBE, stdin=subprocess.PIPE, stdout=sink, stderr=sink, cwd=step,
                         env={"LABKIT_RESULT_FD": str(result_w), "LABKIT_REQUEST_FD": str(request_r)},
                         pass_fds=(result_w, request_r))
    os.close(result_w)
    os.close(request_r)
    assert proc.poll() is None  # waiting for a request that never comes
    child.Started(module, step, reaper.new_marker(), proc, result_r, request_w, io_dir).close()
    assert proc.poll() is not None, "the child outlived its close"
    assert not io_dir.exists()


@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "forked"])
@pytest.mark.parametrize("failures", [1, 2])
def test_a_judge_box_that_ends_before_the_judge_began_is_retried_once_then_named(tmp_path, monkeypatch, failures,
                                                                                 forked):
    """The launcher attaches to the judge's first process; when that process is already gone
    (bwrap failed after reporting it), nothing of the student's ran: the run is tried once
    more, and a second such end is a readable error, never the grader's own traceback. So too
    for a judge forked from the batch's template (the launcher attaches to its box's holder:
    when that is gone, so is the box's pid namespace, the judge with it), tried again fresh."""
    from labkit.grading import judge_box

    if not sandbox.support().ok:
        pytest.skip(f"no sandbox here: {sandbox.support().reason}")
    real, calls = launcher.Launcher.attach, []

    def attach(self, judge_pid):
        calls.append(judge_pid)
        if len(calls) <= failures:  # as seen in CI: the judge's first process is already gone
            os.kill(judge_pid, signal.SIGKILL)
            raise FileNotFoundError(f"/proc/{judge_pid}/ns/net")
        return real(self, judge_pid)

    monkeypatch.setattr(launcher.Launcher, "attach", attach)
    module = tmp_path / "warmup.py"
    module.write_text((ROOT / "solutions" / "warmup.py").read_text())
    template = judge_box.start_template() if forked else None
    try:
        started = time.monotonic()
        run = judge_box.run("start-here", module, 1, uid=sandbox.uid(), timeout=120,
                            judges=template.path if template is not None else None)
    finally:
        if template is not None:
            template.stop()
    assert time.monotonic() - started < 60, "a judge without its launcher ran to its timeout"
    assert len(calls) == 2
    if failures == 1:
        assert run.verdict is not None and run.error == "", run.error
    else:
        assert run.verdict is None and run.error.startswith("the judge's sandbox ended before the judge began")
