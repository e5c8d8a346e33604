"""benchmarks/suite_cpu.py: a test's CPU is what it and everything it started computed — a
sleeping test costs none, and a process that outlives its parent still counts — and the run
leaves no cgroup behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE_CPU = ROOT / "benchmarks" / "suite_cpu.py"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")

TESTS = textwrap.dedent('''
    import os, subprocess, sys, time

    BURN = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass\\n"

    def test_sleeps():
        time.sleep(0.4)

    def test_burns_in_a_child():
        subprocess.run([sys.executable, "-c", BURN], check=True)

    def test_burns_in_an_orphan(tmp_path):
        # the child exits at once; its own child, re-parented, burns and then leaves a mark
        done = tmp_path / "done"
        code = BURN + f"open({str(done)!r}, 'w').close()\\n"
        subprocess.run([sys.executable, "-c",
                        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {code!r}])"], check=True)
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists()
''')


@pytest.mark.parametrize("workers", ["0", "2"])
def test_cpu_follows_the_work_not_the_clock(tmp_path, workers):
    groups_before = set(CPUACCT.glob("labkit-suite-cpu-*"))
    (tmp_path / "test_work.py").write_text(TESTS)
    rows = tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(SUITE_CPU), "--out", str(rows), "--",
                           "-q", "-p", "no:cacheprovider", "-n", workers, "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    measured = {r["id"].split("::")[-1]: r for r in map(json.loads, rows.read_text().splitlines())}
    assert measured["test_sleeps"]["wall"] >= 0.35 and measured["test_sleeps"]["cpu"] < 0.2
    assert measured["test_burns_in_a_child"]["cpu"] >= 0.3
    method = measured["test_sleeps"]["method"]
    if method == "cpuacct":
        assert measured["test_burns_in_an_orphan"]["cpu"] >= 0.3
    else:  # where no cgroup can be written the report says so, and CI must not be such a place
        assert method == "rusage" and not os.environ.get("CI"), method
    assert "test_burns_in_a_child" in proc.stdout and "module" in proc.stdout
    assert set(CPUACCT.glob("labkit-suite-cpu-*")) <= groups_before, "the run's cgroups were left behind"
