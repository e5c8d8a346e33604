"""The grading batch's template of the kernel (`kernel_box.start_template`, `zygote_main`'s
kernel role): a kernel forked from it is the kernel a fresh start in the same box would be.

One cell describes, from inside, what the kernel is and holds: its ids, capabilities, seccomp,
limits, working folder and sys.path, its environment, and which of the course's modules are in
its memory. Forked and fresh must say the same; and no lab's checks may be among its modules
(a kernel's box cannot read them, so nothing forked into it may carry them either).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from labkit import sandbox
from labkit.grading import kernel_box
from labkit.grading.execute import execute, prepare
from labkit.grading.settings import Limits
from labkit.sandbox import reaper

FACTS = """
import json, os, resource, sys
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    "status": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")},
    "limits": [resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE")],
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "env": sorted(k for k in os.environ if k != "LABKIT_RUN"),
    "checks": sorted(m for m in sys.modules if m.startswith("checks.")),
    "parent_is_kernel_launcher": os.path.basename(sys.argv[0]),
}))
"""


@pytest.fixture
def template():
    if not sandbox.support().ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {sandbox.support().reason}")
        pytest.skip(f"no sandbox here: {sandbox.support().reason}")
    started = kernel_box.start_template()
    assert started is not None, "the kernels' template did not start"
    yield started
    started.stop()


def _facts(tmp_path: Path, name: str, template: str | None) -> tuple[dict, list]:
    limits = Limits.from_env()
    kernel = kernel_box.KernelBox(tmp_path / name, "outbox", limits, reaper.new_marker(), sandbox.uid() + 11,
                                  template=template)
    nb = prepare(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FACTS)]), set())
    try:
        execution = execute(nb, kernel, limits)
        boxes = list(kernel.boxes)
    finally:
        kernel.close()
    assert execution.status == "ok", execution.message
    return json.loads(nb.cells[0].outputs[0]["text"]), boxes


def test_a_forked_kernel_is_the_kernel_a_fresh_start_would_be(template, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_TEST_GRADERS_SECRET", "1")  # the grader's environment, never a kernel's
    forked, boxes = _facts(tmp_path, "forked", template.path)
    fresh, _ = _facts(tmp_path, "fresh", None)
    assert len(boxes) == 1, "the template could not serve: the kernel started fresh"
    uid = sandbox.uid() + 11
    assert forked["ids"] == [uid, uid, uid, uid, []]
    assert all(int(forked["status"][k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
    assert forked["status"]["NoNewPrivs"] == "1" and forked["status"]["Seccomp"] == "2"
    assert forked["checks"] == [] == fresh["checks"]
    assert "LABKIT_TEST_GRADERS_SECRET" not in forked["env"]
    for key in ("ids", "status", "limits", "cwd", "path0", "env", "parent_is_kernel_launcher"):
        assert forked[key] == fresh[key], key


def test_a_kernel_whose_template_is_gone_starts_fresh(template, tmp_path):
    template.zygote.proc.kill()
    template.zygote.proc.wait(timeout=10)
    facts, boxes = _facts(tmp_path, "after", template.path)
    assert len(boxes) == 2  # the template's box, closed, and the fresh kernel's
    assert facts["ids"][0] == sandbox.uid() + 11
