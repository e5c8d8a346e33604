"""Where one judged child's time goes, layer by layer: a table of CPU (user + system) and wall.

Every check starts children, and a step's verdict costs little more than its children (see
`check_latency.py`). This splits one child's start into the layers it pays for, each measured
by running just that layer N times in this process's children (`RUSAGE_CHILDREN`):

- the sandbox's tools alone (`sh`, `setpriv`, `prlimit` on /bin/true), and a whole box around
  /bin/true (cgroup made and removed, bubblewrap's namespaces and mounts): the sandbox's part,
  and the same box with every course file a bind of its own (before `course_view`);
- the interpreter alone (`python -P -c pass`, and with `-S`: what `site` costs);
- the interpreter with the child's code (`labkit.probe.main`), then with each lab's probes and
  the imports of its reference solution: what a child of that lab loads before any case runs;
- a whole sandboxed child of each lab (`run_child` with the no-op probe), judge's side included:
  started fresh (`LABKIT_ZYGOTE=off`), and forked warm into its box by the lab's zygote
  (`labkit.sandbox.zygote`). A forked child is not this process's child: its CPU is the one its
  intermediate reports, plus the zygote's own (its forks), read from /proc.

    python benchmarks/child_cost.py [--runs 20] [--lab outbox ...]

Compare rows of one run with each other (ratios), not with another machine's figures.
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import labs, sandbox  # noqa: E402
from labkit.judge.child import run_child  # noqa: E402
from labkit.limits import step_timeout  # noqa: E402
from labkit.sandbox import course_view, profiles, zygote  # noqa: E402

_spawn = zygote.spawn


def _recorded(*args, **kwargs):
    proc = _spawn(*args, **kwargs)
    if proc is not None:
        FORKED.append(proc)
    return proc


zygote.spawn = _recorded


def cpu() -> tuple[float, float]:
    """(this process, its children): user + system seconds so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


FORKED: list[zygote.ZygotePopen] = []  # the forked children of the row being measured


def forked_cpu() -> float:
    """CPU of the children the zygotes forked so far (what each reported), and of the zygotes."""
    total = sum(proc.cpu_seconds or 0.0 for proc in FORKED)
    for pid in zygote.pids():
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def measure(runs: int, once: Callable[[], None]) -> tuple[float, float, float]:
    """Median wall, children's CPU and this process's CPU per run, in ms (one warm-up run first)."""
    once()
    walls = []
    own0, kids0 = cpu()
    forked0 = forked_cpu()
    for _ in range(runs):
        started = time.perf_counter()
        once()
        walls.append(time.perf_counter() - started)
    own1, kids1 = cpu()
    kids1 += forked_cpu() - forked0
    return (statistics.median(walls) * 1000, (kids1 - kids0) / runs * 1000, (own1 - own0) / runs * 1000)


def command(argv: list[str]) -> Callable[[], None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return lambda: subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=True)


def imports_of(path: Path) -> list[str]:
    """The top-level modules a solution imports (what its child loads beside the course's code)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return [name for name in dict.fromkeys(found) if name != "__future__"]


def boxed_true(workdir: Path) -> Callable[[], None]:
    """A whole sandbox of a judge's child around /bin/true: cgroup, namespaces, mounts, tools."""
    module = workdir / "empty.py"
    module.write_text("")

    def once() -> None:
        box = profiles.child_box(module, workdir, dict(os.environ))
        proc = box.spawn(["/bin/true"], stdin=subprocess.DEVNULL, cwd=workdir, start_new_session=True)
        proc.wait(timeout=30)
        box.close(proc)

    return once


def file_by_file(once: Callable[[], None]) -> Callable[[], None]:
    """`once` with the course's files bound one by one, not through views (`course_view`)."""

    def unviewed() -> None:
        real = course_view.collapse
        course_view.collapse = lambda read_only: (list(read_only), [])
        try:
            once()
        finally:
            course_view.collapse = real

    return unviewed


def child_of(lab: str, workdir: Path, forked: bool) -> Callable[[], None]:
    module = ROOT / "solutions" / labs.manifest(lab).module_file
    spec = labs.load(lab)

    def once() -> None:
        os.environ[zygote.ENV] = "on" if forked else "off"
        run = run_child(module, "labkit.probe:noop", {}, workdir=workdir, timeout=step_timeout(),
                        module_name=spec.module_name, lab=labs.package_of(spec.probes))
        if not run.imported:
            raise SystemExit(f"{module} did not import in a child: {run.stderr[-500:]}")

    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lab", action="append", choices=[name for name in labs.available() if name != "start-here"])
    args = parser.parse_args()
    chosen = args.lab or [name for name in labs.available() if name != "start-here"]
    python = [sys.executable, "-P"]
    rows: list[tuple[str, Callable[[], None]]] = [
        ("sh -c exec /bin/true", command(["/bin/sh", "-c", "exec /bin/true"])),
        ("setpriv ... /bin/true", command(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                           "--inh-caps=-all", "--no-new-privs", "--", "/bin/true"])),
        ("prlimit ... /bin/true", command(["prlimit", "--as=1000000000", "--core=0", "--", "/bin/true"])),
        ("python -S: no site", command([*python, "-S", "-c", "pass"])),
        ("python: interpreter and site", command([*python, "-c", "pass"])),
        ("python + labkit.probe.main", command([*python, "-c", "import labkit.probe.main"])),
    ]
    for lab in chosen:
        manifest = labs.manifest(lab)
        solution = ROOT / "solutions" / manifest.module_file
        probes = [manifest.module(part) for part in manifest.probes]
        imports = ", ".join(["labkit.probe.main", *probes, *imports_of(solution)])
        rows.append((f"{lab}: + its probes and the solution's imports", command([*python, "-c", f"import {imports}"])))
    workdir = Path(tempfile.mkdtemp(prefix="labkit-bench-"))
    try:
        if sandbox.enabled():
            rows.append(("a sandbox around /bin/true", boxed_true(workdir)))
            rows.append(("  the same, each course file bound alone", file_by_file(boxed_true(workdir))))
        for lab in chosen:
            rows.append((f"{lab}: a whole judged child started fresh", child_of(lab, workdir, forked=False)))
            if sandbox.enabled():
                rows.append((f"{lab}: a whole judged child forked by the zygote", child_of(lab, workdir, forked=True)))
        print(f"sandbox: {sandbox.support().describe if sandbox.enabled() else 'off'}; {args.runs} runs a row; ms")
        print(f"{'layer':52s} {'wall':>7s} {'child CPU':>10s} {'judge CPU':>10s}")
        for name, once in rows:
            wall, kids, own = measure(args.runs, once)
            print(f"{name:52s} {wall:7.1f} {kids:10.1f} {own:10.1f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
