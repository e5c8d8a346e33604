"""Where the test suite's CPU goes: CPU time per test and per module, not only wall time.

    python benchmarks/suite_cpu.py [--top 30] [--out FILE.jsonl] [-- PYTEST ARGS...]

CI's time on two cores is the suite's CPU (three xdist workers keep both cores busy), and
pytest's `--durations` shows wall time only: a test that waits out a timeout looks as costly
as one that computes. This runs pytest (the README's command, or the arguments after `--`)
with itself as a plugin: each xdist worker moves into a cgroup of its own (cgroup v1
`cpuacct`) and reads the group's CPU before and after each test (set-up, call and tear-down),
so everything the test starts counts — sandboxes, servers, browsers, graders — even after it
is re-parented. Where no cpuacct hierarchy can be written, each worker's own and waited-for
children's CPU is read instead (`getrusage`), which misses what outlives its parent: the
report says which one it used.

Prints the totals (with the machine's busy CPU over the same run, from /proc/stat, to show
what the groups did not see: kernel threads, the controller), CPU and wall per module, and the
`--top` tests by CPU. `--out` keeps every test's row (JSON lines) for comparing two runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
ROWS_ENV = "LABKIT_SUITE_CPU_ROWS"  # the folder each process writes its rows to
GROUP_PREFIX = "labkit-suite-cpu-"  # then the run's folder name, the worker, its pid
OUTSIDE = "(outside tests: collection, session fixtures, start-up and end)"


# --- the plugin: runs in every pytest process (controller and xdist workers) -------------------

class _Meter:
    """CPU seconds of this process and everything it starts: its own cpuacct group, else rusage."""

    def __init__(self, run: str, name: str) -> None:
        self.group: Path | None = None
        try:
            group = CPUACCT / f"{GROUP_PREFIX}{run}-{name}-{os.getpid()}"
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group = group
        except OSError:
            self.group = None
        self.method = "cpuacct" if self.group else "rusage"
        self.at_start = self.read()
        self.in_tests = 0.0

    def read(self) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def close(self) -> None:
        """Back to the parent group, which this leaves to the runner to remove (`remove_groups`):
        what the worker started may still be ending."""
        if self.group is None:
            return
        try:
            (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            pass


_meter: _Meter | None = None
_rows = None


def pytest_configure(config) -> None:
    global _meter, _rows
    folder = os.environ.get(ROWS_ENV)
    workerinput = getattr(config, "workerinput", None)  # only an xdist worker has it
    distributed = getattr(config.option, "numprocesses", None) not in (None, 0)
    if not folder or (distributed and workerinput is None):
        return  # the xdist controller runs no test
    name = workerinput["workerid"] if workerinput else "main"
    _meter = _Meter(Path(folder).name, name)
    _rows = open(Path(folder) / f"{name}-{os.getpid()}.jsonl", "x", encoding="utf-8")


def pytest_unconfigure(config) -> None:
    if _meter is not None:
        outside = _meter.read() - _meter.at_start - _meter.in_tests
        _rows.write(json.dumps({"id": OUTSIDE, "cpu": round(outside, 3), "wall": 0.0, "method": _meter.method}) + "\n")
        _rows.close()
        _meter.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _meter is None:
        yield
        return
    cpu, wall = _meter.read(), time.monotonic()
    yield
    cpu = _meter.read() - cpu
    _meter.in_tests += cpu
    _rows.write(json.dumps({"id": item.nodeid, "cpu": round(cpu, 3),
                            "wall": round(time.monotonic() - wall, 3), "method": _meter.method}) + "\n")
    _rows.flush()


# --- the runner ----------------------------------------------------------------------------------

def remove_groups(run: str, wait: float = 10.0) -> list[str]:
    """Remove the run's cgroups once empty (bounded); what is left, with the pids still in it."""
    deadline = time.monotonic() + wait
    left = sorted(CPUACCT.glob(f"{GROUP_PREFIX}{run}-*"))
    while left:
        for group in list(left):
            try:
                group.rmdir()
                left.remove(group)
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [f"{g.name}: pids {' '.join((g / 'cgroup.procs').read_text().split())}" for g in left if g.exists()]


def summarize(rows: list[dict], top: int) -> list[str]:
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        figures = modules[row["id"].split("::", 1)[0]]
        figures[0] += row["cpu"]
        figures[1] += row["wall"]
        figures[2] += 1
    total = sum(r["cpu"] for r in rows) or 1.0
    lines = [f"{'CPU s':>8s} {'share':>6s} {'wall s':>8s} {'rows':>6s}  module (rows: tests, or pytest processes)"]
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{cpu:8.1f} {100 * cpu / total:5.1f}% {wall:8.1f} {count:6d}  {name}")
    lines += ["", f"the {top} tests that took the most CPU (set-up, call and tear-down together):",
              f"{'CPU s':>8s} {'wall s':>8s}  test"]
    for row in sorted((r for r in rows if r["id"] != OUTSIDE), key=lambda r: -r["cpu"])[:top]:
        lines.append(f"{row['cpu']:8.1f} {row['wall']:8.1f}  {row['id']}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="keep every test's row here (JSON lines)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the README's run)")
    args = parser.parse_args()
    # beside this file: the machine's busy CPU seconds, from /proc/stat
    from crowded_machine import machine_cpu

    with tempfile.TemporaryDirectory(prefix="labkit-suite-cpu-") as folder:
        # not an xdist worker's variables (this may run inside one): the run is a session of its own
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}, ROWS_ENV: folder,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))}
        busy, started = machine_cpu(), time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_cpu", *args.pytest_args], cwd=ROOT, env=env)
        busy, wall = machine_cpu() - busy, time.monotonic() - started
        for group in remove_groups(Path(folder).name):
            print(f"left running after pytest ended, its cgroup kept: {group}", file=sys.stderr)
        rows = [json.loads(line) for path in sorted(Path(folder).glob("*.jsonl"))
                for line in path.read_text(encoding="utf-8").splitlines()]
    tests = sum(1 for r in rows if r["id"] != OUTSIDE)
    if not tests:
        print(f"pytest exited with {code} and no test was measured", file=sys.stderr)
        return code or 1
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    measured = sum(r["cpu"] for r in rows)
    methods = sorted({r["method"] for r in rows})
    print(f"\npytest exited with {code}: {tests} tests, {wall:.0f} s wall; CPU measured per test "
          f"({', '.join(methods)}): {measured:.0f} s; the machine was busy {busy:.0f} CPU-s "
          f"({100 * measured / max(busy, 1e-9):.0f} % of it measured), {os.cpu_count()} cores\n")
    print("\n".join(summarize(rows, args.top)))
    return code


if __name__ == "__main__":
    sys.exit(main())
