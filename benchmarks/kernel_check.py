"""What a notebook's check costs from the kernel: a fresh `python -m labkit check` per step (as
before) next to the kernel's warm judge (`labkit.notebook.warm_judge`), same steps, same seed,
alternating so both see the same load. Prints medians in seconds and their ratio.

    python benchmarks/kernel_check.py [--runs 5] [--lab outbox ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import labs  # noqa: E402
from labkit.notebook import warm_judge  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lab", action="append")
    args = parser.parse_args()
    for lab in args.lab or [name for name in labs.available() if name != "start-here"]:
        module = ROOT / "solutions" / labs.manifest(lab).module_file
        cwd = Path(tempfile.mkdtemp(prefix="labkit-bench-"))
        steps = [str(s.step) for s in labs.manifest(lab).steps]
        cold: dict[str, list[float]] = {s: [] for s in steps}
        warm: dict[str, list[float]] = {s: [] for s in steps}
        warm_judge.run({"lab": lab, "solution": str(module), "steps": [steps[0]], "seed": 1}, cwd)  # its start
        for run in range(args.runs):
            for step in steps:
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "labkit", "check", lab, "--solution", str(module), "--json",
                                "--step", step, "--seed", str(run + 1)], capture_output=True, cwd=cwd, timeout=300)
                cold[step].append(time.perf_counter() - started)
                started = time.perf_counter()
                reply = warm_judge.run({"lab": lab, "solution": str(module), "steps": [step], "seed": run + 1}, cwd)
                warm[step].append(time.perf_counter() - started)
                assert isinstance(reply, dict) and all(s["passed"] for s in reply["steps"]), reply
        warm_judge.stop()
        print(f"\nlab {lab}: {args.runs} runs, medians in seconds")
        print(f"{'step':6} {'command':>8} {'warm':>8} {'ratio':>6}")
        for step in steps:
            c, w = statistics.median(cold[step]), statistics.median(warm[step])
            print(f"{step:6} {c:8.3f} {w:8.3f} {c / w:6.2f}")


if __name__ == "__main__":
    main()
