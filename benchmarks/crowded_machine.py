"""What a check costs the whole machine when many other processes run beside it (as in CI).

A judge's clean-up once read every process's environment (/proc/N/environ) to find what a child
left behind, a few times per child: cheap on a quiet laptop, milliseconds per search on CI's
machine, where the test workers, JupyterLab, Chromium, kernels and servers make 150-670
processes. This starts `--crowd` idle processes (`sleep`), runs each lab's whole check on its
reference `--runs` times in a fresh interpreter, and prints the machine's CPU seconds per run
(user + system, all processes, from /proc/stat: a sandbox's tools and its kernel work count
too), with no crowd and with it. `--before DIR` runs an older checkout the same way, in the
same invocation, variants interleaved, and prints after/before as ratios.

    python benchmarks/crowded_machine.py [--crowd 400] [--runs 4] [--repeat 3] [--lab outbox ...]
                                         [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from labkit import labs
from labkit.judge import coverage
from labkit.judge.run import run_lab
spec = labs.load(sys.argv[2])
for seed in range(1, int(sys.argv[3]) + 1):
    run_lab(spec, coverage.reference(sys.argv[2]), seed=seed, explain=False)
"""


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def measure(checkout: Path, lab: str, runs: int, crowd: int) -> float:
    """The machine's CPU seconds per whole-lab check, with `crowd` idle processes around."""
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(crowd)]
    try:
        time.sleep(0.2)
        before = machine_cpu()
        subprocess.run([sys.executable, "-c", LOOP, str(checkout), lab, str(runs)], cwd=checkout, check=True,
                       stdout=subprocess.DEVNULL, timeout=900)
        return (machine_cpu() - before) / runs
    finally:
        for proc in idle:
            proc.kill()
        for proc in idle:
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crowd", type=int, default=400, help="idle processes beside the check (default 400)")
    parser.add_argument("--runs", type=int, default=4, help="whole-lab checks per measurement (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per variant (default 3)")
    parser.add_argument("--lab", action="append", help="lab(s) to check (default: outbox)")
    parser.add_argument("--before", type=Path, help="an older checkout, measured the same way")
    args = parser.parse_args(argv)
    checkouts = {"after": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    print(f"machine CPU seconds per whole-lab check; {args.runs} checks a measurement, median of {args.repeat}")
    for lab in args.lab or ["outbox"]:
        found: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeat):  # interleaved: the machine's drift hits every variant alike
            for name, checkout in checkouts.items():
                for crowd in (0, args.crowd):
                    found.setdefault((name, crowd), []).append(measure(checkout, lab, args.runs, crowd))
        median = {key: statistics.median(values) for key, values in found.items()}
        for name in checkouts:
            quiet, crowded = median[(name, 0)], median[(name, args.crowd)]
            print(f"{lab:8s} {name:6s} quiet {quiet:6.2f}  with {args.crowd} processes {crowded:6.2f}"
                  f"  crowded/quiet {crowded / quiet:5.2f}x")
        if args.before:
            for crowd in (0, args.crowd):
                print(f"{lab:8s} after/before with {crowd} processes: "
                      f"{median[('after', crowd)] / median[('before', crowd)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
