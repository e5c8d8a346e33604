"""A synthetic class graded whole and as shards, merged, and the two gradebooks compared.

    python benchmarks/class_run.py [--n 200] [--shards 4] [--jobs 2] [--shard-jobs 1] [--seed 7]
                                   [--keep DIR] [--sequential]

1. Builds N notebooks with the class generator (`tests/submissions/classmix.py`): correct,
   partial, skeleton and wrong solutions of every lab, with quiz answers and reveals.
2. `python -m labkit grade SUBS --out whole --seed S --jobs J`.
3. `python -m labkit grade SUBS --out shard-I --shard I/K --seed S --jobs JS`, the K shards as
   K separate processes at once (or one after the other with --sequential).
4. `python -m labkit merge shard-1 … shard-K --out merged`.
5. Compares `grades.json` and `grades.csv` of whole and merged byte for byte, with the timing
   fields (`seconds`) blanked in both; the set of feedback pages and executed notebooks; and
   the class report's figures against the counts the generator knows (never the report's own
   code). Prints every figure, and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.submissions import classmix, corpus  # noqa: E402
from tests.submissions.gradebooks import differences  # noqa: E402


def env_for(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (tmp / name.lower()).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp / name.lower())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def labkit(*args) -> list[str]:
    return [sys.executable, "-m", "labkit", *map(str, args)]


def run_all(label: str, cmds: list[list[str]], env: dict, cwd: Path, ok=(0,), together: bool = True) -> float:
    started = time.monotonic()
    outputs = []
    if together:
        procs = [subprocess.Popen(c, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for c in cmds]
        outputs = [(p, p.communicate()[0]) for p in procs]
    else:
        for cmd in cmds:
            proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            outputs.append((proc, proc.communicate()[0]))
    seconds = time.monotonic() - started
    for proc, out in outputs:
        if proc.returncode not in ok:
            print(out.decode(errors="replace")[-4000:], file=sys.stderr)
            raise SystemExit(f"{label} failed (exit {proc.returncode})")
    print(f"{label}: {seconds:.1f} s", flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=None, help="--jobs of the whole run (default: grade's own)")
    ap.add_argument("--shard-jobs", type=int, default=1, help="--jobs of each shard")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mix-seed", type=int, default=1)
    ap.add_argument("--sequential", action="store_true", help="run the shards one after the other")
    ap.add_argument("--keep", type=Path, help="keep everything in this (new) folder")
    args = ap.parse_args(argv)
    from labkit import sandbox
    from labkit.grading import report

    tmp_ctx = tempfile.TemporaryDirectory(prefix="labkit-class-") if args.keep is None else None
    tmp = Path(tmp_ctx.name) if tmp_ctx else args.keep.resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        entries = classmix.build(args.n, args.mix_seed)
        corpus.write(entries, tmp / "subs")
        env = env_for(tmp)
        kinds = {}
        for e in entries:
            kinds[(e.lab, e.known.kind)] = kinds.get((e.lab, e.known.kind), 0) + 1
        print(f"{len(entries)} notebooks, {len({e.student for e in entries})} students, "
              f"{len(os.sched_getaffinity(0))} cores; mix: "
              + ", ".join(f"{lab} {kind} {n}" for (lab, kind), n in sorted(kinds.items())), flush=True)
        extra = [] if sandbox.support().ok else ["--no-sandbox"]
        jobs = [] if args.jobs is None else ["--jobs", args.jobs]
        whole = run_all("whole class, one grade run",
                        [labkit("grade", tmp / "subs", "--out", tmp / "whole", "--seed", args.seed, *jobs, *extra)],
                        env, tmp)
        shard_cmds = [labkit("grade", tmp / "subs", "--out", tmp / f"shard-{i}", "--shard", f"{i}/{args.shards}",
                             "--seed", args.seed, "--jobs", args.shard_jobs, *extra)
                      for i in range(1, args.shards + 1)]
        how = "one after the other" if args.sequential else "at once"
        sharded = run_all(f"{args.shards} shards as separate processes ({how})", shard_cmds, env, tmp,
                          together=not args.sequential)
        merged = run_all("merge", [labkit("merge", *[tmp / f"shard-{i}" for i in range(1, args.shards + 1)],
                                          "--out", tmp / "merged")], env, tmp)
        rows = json.loads((tmp / "whole" / "grades.json").read_text())
        print(f"\nwhole:   {len(rows)} rows, {args.n / whole * 60:.1f} notebooks/minute")
        print(f"sharded: {args.n / (sharded + merged) * 60:.1f} notebooks/minute (shards + merge, {how})")
        problems = differences(tmp / "whole", tmp / "merged")
        print("gradebooks (timing fields aside): " + ("IDENTICAL, byte for byte" if not problems else "DIFFER"))
        for problem in problems:
            print(problem)
        wrong = classmix.report_problems(report.build(tmp / "merged"), entries)
        whole_wrong = classmix.report_problems(report.build(tmp / "whole"), entries)
        print(f"report figures vs the generator's counts: {'all agree' if not wrong else f'{len(wrong)} differ'} "
              f"(merged); {'all agree' if not whole_wrong else f'{len(whole_wrong)} differ'} (whole)")
        for problem in wrong:
            print("  " + problem)
        built = report.build(tmp / "merged")
        for lab in built.labs:
            top = [(s.step, c.label, c.students) for s in lab.steps for c in s.clauses]
            top.sort(key=lambda t: -t[2])
            print(f"  {lab.lab}: {lab.students} students, median {lab.median}, rules broken: {len(top)}, "
                  f"most hit: " + "; ".join(f"step {s} {k} ({n})" for s, k, n in top[:3]))
        if args.keep:
            print(f"\nkept in {tmp}")
        return 1 if problems or wrong or whole_wrong else 0
    finally:
        if tmp_ctx is not None:
            tmp_ctx.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
