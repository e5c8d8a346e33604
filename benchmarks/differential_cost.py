"""What a differential property test (`labkit.judge.differential`) costs a step.

Prints, as medians over `--runs` runs on this machine: importing Hypothesis (paid once per judge
process, by the first step that uses it), starting a child session (import of the student's
module included), one call round trip on its pipe, and the whole `differential(...)` call for
several example counts, for a correct function (every example runs) and for a wrong one (it
stops at the first bug and shrinks). The toy under test is a frame parser in the style of lab
02's `parse_line`, so the figures carry over to the labs' pure functions. Target: <= 0.3 s a
step for 100-200 examples on a quiet machine.

    python benchmarks/differential_cost.py [--runs 5]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.judge.child import child_session  # noqa: E402
from labkit.judge.differential import differential  # noqa: E402
from labkit.judge.run import LabSpec, StepContext, StepSpec  # noqa: E402
from labkit.values import encode  # noqa: E402

PARSER = '''\
import re

FRAME = re.compile(rb"EVENT (0|[1-9][0-9]*) (0|-?[1-9][0-9]*){end}")


def parse(line):
    if type(line) is not bytes or len(line) > 64 or not line.endswith(b"\\n"):
        raise ValueError("not a frame")
    match = FRAME.fullmatch(line)
    if match is None:
        raise ValueError("not a frame")
    seq, delta = int(match[1]), int(match[2])
    if seq > 2147483647 or abs(delta) > 1000:
        raise ValueError("out of range")
    return seq, delta
'''


def oracle_from(source: str):
    """The correct parser, built in the judge from the same source (an oracle is judge-side code)."""
    namespace: dict = {}
    exec(compile(source, "oracle", "exec"), namespace)
    return namespace["parse"]


def frames():
    from hypothesis import strategies as st

    number = st.integers(-1005, 1005) | st.integers(0, 2**31 + 5)
    end = st.sampled_from([b"\n", b"\r\n", b"", b"\n\n"])
    frame = st.builds(lambda s, d, e: b"EVENT %d %d" % (s, d) + e, number, number, end)
    return st.tuples(frame | st.binary(max_size=70))


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms"


def import_cost(runs: int) -> list[float]:
    code = "import time; t = time.perf_counter(); import hypothesis.strategies; print(time.perf_counter() - t)"
    return [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(runs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="labkit-bench-"))
    try:
        right, wrong = folder / "right" / "toy.py", folder / "wrong" / "toy.py"
        for path, end in ((right, r"\n"), (wrong, r"\r?\n")):  # the wrong one accepts CRLF
            path.parent.mkdir()
            path.write_text(PARSER.format(end=end))
        lab = LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "parse", 1, lambda ctx: [])])
        oracle = oracle_from(right.read_text())

        starts, trips = [], []
        for _ in range(args.runs):
            began = time.perf_counter()
            with child_session(right, workdir=folder, timeout=10, module_name="toy") as session:
                starts.append(time.perf_counter() - began)
                began = time.perf_counter()
                for n in range(200):
                    session.call({"fn": "parse", "args": [encode(b"EVENT %d 1\n" % n)]})
                trips.append((time.perf_counter() - began) / 200)
        print(f"import hypothesis (once per judge process) {median_ms(import_cost(args.runs))}")
        print(f"child session start (import included)      {median_ms(starts)}")
        print(f"one call round trip                        {statistics.median(trips) * 1e6:8.0f} us")
        print("\ndifferential(...) for one step, whole call (session start included):")
        print("examples   correct function        wrong function (stops, shrinks)")
        for examples in (50, 100, 150, 200):
            row = []
            for path in (right, wrong):
                times, verdicts = [], set()
                for seed in range(1, args.runs + 1):
                    ctx = StepContext(lab, path, folder, random.Random(seed), seed, 10.0, step=1)
                    began = time.perf_counter()
                    [case] = differential(ctx, "parse", frames(), oracle, lambda line: ("1.frame", ""),
                                          clauses=("1.frame",), examples=examples)
                    times.append(time.perf_counter() - began)
                    verdicts.add(str(case.outcome))
                row.append(f"{median_ms(times)} ({'/'.join(sorted(verdicts))})")
            print(f"{examples:8d}   {row[0]:24s}{row[1]}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
