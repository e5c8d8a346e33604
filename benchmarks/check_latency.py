"""How long a student waits for a check, next to the floor of what one check must cost.

For each lab's reference solution: the median wall time of each step's check (a judge run
with only that step, in this process) and of the whole lab, over `--runs` runs; and the floor,
the median time to start one child interpreter that imports the module and does nothing
(`labkit.judge.child.run_child(module, "labkit.probe:noop", {})`). Every check starts at least one.
The "warm judge" column is what a student waits in the notebook: each check as the kernel's warm
judge runs it (`labkit.judge.serve`), after the pause in which it prepared the next one.

    python benchmarks/check_latency.py [--runs 10] [--lab outbox|vending|relay ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import labs  # noqa: E402
from labkit.judge.ahead import DrawsAhead, SessionsAhead  # noqa: E402
from labkit.judge.child import run_child  # noqa: E402
from labkit.judge.run import LabSpec, run_lab  # noqa: E402
from labkit.limits import step_timeout  # noqa: E402
from labkit.sandbox import reaper  # noqa: E402


def reference(lab: str) -> Path:
    return ROOT / "solutions" / labs.manifest(lab).module_file


def floor(spec: LabSpec, module: Path, runs: int) -> list[float]:
    """Wall time of one child interpreter that imports the module and runs the no-op probe."""
    times = []
    for _ in range(runs):
        workdir = Path(tempfile.mkdtemp(prefix="labkit-bench-"))
        marker = reaper.new_marker()
        try:
            started = time.perf_counter()
            run = run_child(module, "labkit.probe:noop", {}, workdir=workdir, timeout=step_timeout(),
                            marker=marker, module_name=spec.module_name)
            times.append(time.perf_counter() - started)
        finally:
            reaper.kill_marked(marker)
            shutil.rmtree(workdir, ignore_errors=True)
        if not run.imported:
            raise SystemExit(f"{module} did not import in a child: {run.stderr[-500:]}")
    return times


def timed_run(spec: LabSpec, module: Path, steps: list | None, seed: int,
              ahead: SessionsAhead | None = None) -> tuple[float, list]:
    started = time.perf_counter()
    verdict = run_lab(spec, module, steps=steps, seed=seed, ahead=ahead)
    wall = time.perf_counter() - started
    failed = [str(s.step) for s in verdict.steps if not s.passed]
    if failed:  # the time of a failing run measures something else: say so
        print(f"warning: lab {spec.name}: the reference failed step(s) {', '.join(failed)} with seed {seed}",
              file=sys.stderr)
    return wall, verdict.steps


# Between two checks a student reads the verdict for longer than this: the session made ahead
# (servers up, spare databases made) is ready, and its start does not load the next measurement.
READING = 1.0


def settle(ahead: SessionsAhead | None, draws: DrawsAhead, spec: LabSpec) -> None:
    if ahead is not None:
        ahead.session_ready(spec.name)
    draws.settle()
    time.sleep(READING)


def warm_run(spec: LabSpec, module: Path, steps: list | None, ahead: SessionsAhead | None,
             draws: DrawsAhead) -> float:
    """One check as the kernel's warm judge runs it (`serve.answer`): under the seed chosen when
    the last check ended, its property tests' inputs drawn meanwhile, its session made ahead."""
    settle(ahead, draws, spec)
    with draws.checking():
        wall = timed_run(spec, module, steps, draws.seed(spec.name), ahead)[0]
    draws.after(spec.name, [str(s) for s in steps] if steps else None)
    return wall


def bench(lab: str, runs: int) -> None:
    spec, module = labs.load(lab), reference(lab)
    step_walls: dict[str, list[float]] = {str(s.step): [] for s in spec.steps}
    step_own: dict[str, list[float]] = {str(s.step): [] for s in spec.steps}
    step_ahead: dict[str, list[float]] = {str(s.step): [] for s in spec.steps}
    whole: list[float] = []
    whole_ahead: list[float] = []
    for seed in range(1, runs + 1):
        for step in spec.steps:
            wall, verdicts = timed_run(spec, module, [step.step], seed)
            step_walls[str(step.step)].append(wall)
            step_own[str(step.step)].append(verdicts[0].seconds)
        whole.append(timed_run(spec, module, None, seed)[0])
    # The warm judge's way: each check's session made, and its inputs drawn, during the one before.
    ahead = SessionsAhead() if spec.session is not None else None
    draws = DrawsAhead()
    try:
        warm_run(spec, module, None, ahead, draws)
        for _ in range(runs):
            for step in spec.steps:
                step_ahead[str(step.step)].append(warm_run(spec, module, [step.step], ahead, draws))
            whole_ahead.append(warm_run(spec, module, None, ahead, draws))
    finally:
        draws.close()
        if ahead is not None:
            ahead.close()
    base = floor(spec, module, runs)
    low = statistics.median(base)

    print(f"\nlab {lab} — reference {module.relative_to(ROOT)} — {runs} runs, medians in seconds")
    def warm(walls: list[float]) -> str:
        return f"{statistics.median(walls):>13.3f}" if walls else f"{'—':>13}"

    print(f"{'step':<7}{'title':<28}{'run_lab':>9}{'min':>8}{'max':>8}{'step only':>11}{'× floor':>9}"
          f"{'warm judge':>13}")
    for step in spec.steps:
        walls = step_walls[str(step.step)]
        median = statistics.median(walls)
        print(f"{step.step!s:<7}{step.title[:27]:<28}{median:>9.3f}{min(walls):>8.3f}{max(walls):>8.3f}"
              f"{statistics.median(step_own[str(step.step)]):>11.3f}{median / low:>8.1f}×"
              f"{warm(step_ahead[str(step.step)])}")
    median_whole = statistics.median(whole)
    print(f"{'all':<7}{'whole lab':<28}{median_whole:>9.3f}{min(whole):>8.3f}{max(whole):>8.3f}"
          f"{'':>11}{median_whole / low:>8.1f}×{warm(whole_ahead)}")
    print(f"{'floor':<7}{'child start + import':<28}{low:>9.3f}{min(base):>8.3f}{max(base):>8.3f}")
    print(f"whole lab / floor = {median_whole / low:.1f}")
    print("run_lab: wall time of run_lab(steps=[s]) (includes the import check child);"
          " step only: the step's own StepVerdict.seconds")
    print("warm judge: run_lab's wall time as the kernel's warm judge runs it (labkit.judge.serve): the"
          " property tests' inputs" + (" and the lab's session (its servers)" if ahead is not None else "")
          + " made ahead while the student read the previous verdict (labkit.judge.ahead)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per measurement (default 10)")
    parser.add_argument("--lab", choices=sorted(labs.available()), action="append",
                        help="lab to measure; repeatable (default: outbox, and vending once its checks exist)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    chosen = args.lab or ["outbox"] + (["vending"] if "vending" in labs.available() else [])
    for lab in chosen:
        if lab not in labs.available():
            parser.error(f"lab {lab} has no checks yet (checks/{lab}.py)")
        if not reference(lab).is_file():
            parser.error(f"no reference solution {reference(lab)}")
        bench(lab, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
