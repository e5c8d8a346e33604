"""Run a lab's reference N times, optionally with every core kept busy, and compare verdicts.

    python benchmarks/stability.py --lab outbox --runs 20 --busy 2

Prints one line per run and a summary: how many runs passed and whether every run gave the
same verdict (the same step, case and pass/fail for every case). Exit 1 if not.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import labs  # noqa: E402


def burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def signature(verdict: dict) -> list:
    return [(s["step"], c["name"], c["passed"]) for s in verdict["steps"] for c in s["cases"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default="outbox", choices=labs.available())
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=2, help="CPU-burning processes beside the judge")
    ap.add_argument("--random-seeds", action="store_true", help="a new seed per run (default: seed 1)")
    args = ap.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in burners:
        p.start()
    signatures, seconds, passed = [], [], 0
    try:
        for run in range(1, args.runs + 1):
            seed = random.randrange(1, 2**31) if args.random_seeds else 1
            started = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "labkit", "check", args.lab, "--solution",
                                  str(ROOT / "solutions" / labs.manifest(args.lab).module_file), "--seed", str(seed), "--json"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=300)
            seconds.append(time.monotonic() - started)
            verdict = json.loads(out.stdout)
            signatures.append(signature(verdict))
            passed += verdict["passed"]
            failing = [f"{s['step']}:{c['name']}" for s in verdict["steps"] for c in s["cases"] if not c["passed"]]
            print(f"run {run:2d} seed {seed:10d} exit {out.returncode} {verdict['score']}/{verdict['max_score']} "
                  f"{seconds[-1]:.2f} s {'' if not failing else 'FAILING: ' + ', '.join(failing)}", flush=True)
    finally:
        stop.set()
        for p in burners:
            p.join(timeout=5)
    same = all(s == signatures[0] for s in signatures)
    print(f"\n{args.lab}: {passed}/{args.runs} runs passed with {args.busy} busy processes; "
          f"identical verdicts: {same}; median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
          f"(wall time of the whole CLI call)")
    return 0 if same and passed == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
