"""Benchmark `python -m labkit grade` against itself unsandboxed, plain execution and nbgrader.

    python benchmarks/grading.py [--n 20] [--jobs 2] [--nbgrader-python PATH] [--skip-nbgrader]
                                 [--before DIR] [--skip-bare]

Builds N submissions of the released lab from the corpus generator (the reference, partial
solutions and untouched copies, in turn), then times:

1. `python -m labkit grade SUBS --out DIR --jobs J` (restore, execute, judge, feedback,
   gradebook), with the sandbox (every child and kernel in bubblewrap, each judge in a box);
   with `--before DIR` (an earlier commit unpacked: `git archive REV | tar -x -C DIR`), that
   commit's `grade` on the same notebooks too: before and after in one run;
2. the same with `--no-sandbox` (where the machine can sandbox; skipped otherwise);
3. plain `jupyter nbconvert --execute` of the same notebooks, split over J processes
   (each check cell then runs the judge inside the kernel, as for a student);
4. `nbgrader autograde` of the same notebooks, where nbgrader is installed (it grades one
   notebook at a time).

Before anything is timed, one untimed `grade` of two of the notebooks (sandboxed, then not)
warms what a first run pays once per machine (the page cache, the course's bytecode, the
judges' Unicode tables); without it the first variant timed carried those costs alone. With
`--repeat R` each `grade` variant is timed R times, interleaved, and the median counts.

Prints submissions per minute and the ratios, all measured in this one run. Targets: the
sandbox costs at most 15 % of throughput (sandboxed / unsandboxed <= 1.15), grade <= 1.3x
plain execution, and grade at least 5x faster than nbgrader (grade / nbgrader <= 0.2; issue 19).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.submissions import corpus  # noqa: E402


def build(dest: Path, n: int) -> list[Path]:
    sources = corpus.default_sources(ROOT)
    if sources is None:
        raise SystemExit("no released notebook with a labelled reference module: run python -m labkit.notebook.build")
    release, reference = sources
    parts = corpus.reference_parts(reference)
    steps = [p for p in parts if p != "header"]
    kinds = [corpus.ALL, set(steps[: len(steps) // 2]), set(), set(steps[:2])]
    paths = []
    for i in range(n):
        path = dest / f"student{i:02d}" / "lab.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(corpus.solved(release, parts, kinds[i % len(kinds)]), path)
        paths.append(path)
    return paths


def env_for(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (tmp / name.lower()).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp / name.lower())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def timed(label: str, cmds: list[list[str]], env: dict, cwd: Path) -> float:
    """Run the commands in parallel; return the wall-clock seconds until all are done."""
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for cmd in cmds]
    outputs = [p.communicate()[0] for p in procs]
    seconds = time.monotonic() - started
    for proc, out in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            print(out.decode(errors="replace")[-3000:], file=sys.stderr)
            raise SystemExit(f"{label} failed (exit {proc.returncode})")
    print(f"{label}: {seconds:.1f} s", flush=True)
    return seconds


def nbgrader_python(given: str | None) -> str | None:
    for python in (given, os.environ.get("LABKIT_NBGRADER_PYTHON"), sys.executable):
        if python and subprocess.run([python, "-c", "import nbgrader"], capture_output=True).returncode == 0:
            return python
    return None


def run_nbgrader(python: str, paths: list[Path], tmp: Path, env: dict) -> float:
    course = tmp / "course"
    release, _ = corpus.default_sources(ROOT)
    (course / "source" / "lab").mkdir(parents=True)
    nbformat.write(release, course / "source" / "lab" / "lab.ipynb")
    for path in paths:
        target = course / "submitted" / path.parent.name / "lab" / "lab.ipynb"
        target.parent.mkdir(parents=True)
        target.write_bytes(path.read_bytes())
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.course_id = 'bench'\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{course}/gradebook.db'\nc.Execute.timeout = 600\n")
    env = {**env, "PATH": os.pathsep.join([str(Path(python).parent), env["PATH"]])}
    timed("nbgrader generate_assignment (not counted)",
          [[python, "-m", "nbgrader", "generate_assignment", "lab", "--create", "--force"]], env, course)
    return timed("nbgrader autograde", [[python, "-m", "nbgrader", "autograde", "lab", "--create"]], env, course)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nbgrader-python", help="an interpreter with nbgrader installed")
    ap.add_argument("--skip-nbgrader", action="store_true")
    ap.add_argument("--before", type=Path, help="a checkout of an earlier commit (git archive REV | tar -x -C DIR): "
                    "its `grade` is timed on the same submissions in the same run")
    ap.add_argument("--skip-bare", action="store_true", help="do not time --no-sandbox")
    ap.add_argument("--repeat", type=int, default=1, help="time each grade variant this many times (median)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="labkit-bench-") as name:
        tmp = Path(name)
        paths = build(tmp / "subs", args.n)
        env = env_for(tmp)
        print(f"{args.n} submissions, {args.jobs} jobs, {len(os.sched_getaffinity(0))} cores", flush=True)
        grade_cmd = [sys.executable, "-m", "labkit", "grade", str(tmp / "subs"), "--jobs", str(args.jobs),
                     "--seed", str(args.seed)]
        from labkit import sandbox

        sandboxed = sandbox.support().ok
        own = [] if sandboxed else ["--no-sandbox"]
        warm_cmd = [sys.executable, "-m", "labkit", "grade", str(tmp / "warm"), "--jobs", str(args.jobs)]
        for path in paths[:2]:
            (tmp / "warm" / path.parent.name).mkdir(parents=True)
            (tmp / "warm" / path.parent.name / path.name).write_bytes(path.read_bytes())
        for n, extra in enumerate([own, ["--no-sandbox"]] if sandboxed else [own]):
            timed("warm-up grade of 2 (not counted)", [[*warm_cmd, "--out", str(tmp / f"warm-out{n}"), *extra]],
                  env, tmp)
        variants = {"grade": ("labkit grade" + (" (sandboxed)" if sandboxed else " (no sandbox here)"), env, own)}
        if args.before is not None:
            old_env = dict(env, PYTHONPATH=os.pathsep.join([str(args.before.resolve()), env["PYTHONPATH"]]),
                           LABKIT_RELEASE_DIR=str(args.before.resolve() / "notebooks"))
            variants["before"] = (f"labkit grade of {args.before} (before)", old_env, own)
        if sandboxed and not args.skip_bare:
            variants["bare"] = ("labkit grade --no-sandbox", env, ["--no-sandbox"])
        times: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(args.repeat):
            for name, (label, variant_env, extra) in variants.items():
                times[name].append(timed(label, [[*grade_cmd, "--out", str(tmp / f"out-{name}-{run}"), *extra]],
                                         variant_env, tmp))
        grade = statistics.median(times["grade"])
        before = statistics.median(times["before"]) if "before" in times else None
        bare = statistics.median(times["bare"]) if "bare" in times else None
        chunks = [paths[i::args.jobs] for i in range(args.jobs)]
        plain = timed(f"jupyter nbconvert --execute ({args.jobs} processes)",
                      [[sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "notebook",
                        "--allow-errors", "--ExecutePreprocessor.timeout=600",
                        "--output-dir", str(tmp / f"plain{i}"), *map(str, chunk)]
                       for i, chunk in enumerate(chunks)], env, tmp)
        nbgrader = None
        python = None if args.skip_nbgrader else nbgrader_python(args.nbgrader_python)
        if python is not None:
            nbgrader = run_nbgrader(python, paths, tmp, env)
        elif not args.skip_nbgrader:
            print("nbgrader: not installed (pass --nbgrader-python), skipped")
        print()
        print(f"labkit grade:        {args.n / grade * 60:6.1f} submissions/minute")
        if before is not None:
            print(f"  before:            {args.n / before * 60:6.1f} submissions/minute")
            print(f"after / before:      {grade / before:6.2f}x   (time; <= 1 keeps or beats the earlier rate)")
        if bare is not None:
            print(f"  --no-sandbox:      {args.n / bare * 60:6.1f} submissions/minute")
            print(f"sandbox cost:        {grade / bare:6.2f}x   (target <= 1.15x)")
        print(f"plain execution:     {args.n / plain * 60:6.1f} submissions/minute")
        print(f"grade / plain:       {grade / plain:6.2f}x   (target <= 1.3x)")
        if nbgrader is not None:
            print(f"nbgrader autograde:  {args.n / nbgrader * 60:6.1f} submissions/minute")
            print(f"grade / nbgrader:    {grade / nbgrader:6.2f}x   (target <= 0.2x: 5x faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
