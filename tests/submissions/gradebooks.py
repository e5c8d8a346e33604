"""Two --out folders compared as gradebooks: byte for byte, apart from the timing fields.

Used by the class test (tests/test_class.py) and benchmarks/class_run.py: a class graded
whole and the same class graded as shards and merged must give the same gradebook.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

TIMING = ("seconds",)


def without_timing_json(path: Path) -> bytes:
    rows = json.loads(path.read_text())
    for row in rows:
        for name in TIMING:
            if name in row:
                row[name] = None
    return json.dumps(rows, ensure_ascii=False, indent=1).encode()


def without_timing_csv(path: Path) -> bytes:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    blank = [i for i, name in enumerate(header) if name in TIMING]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    for row in rows:
        writer.writerow([("" if i in blank and row is not header else cell) for i, cell in enumerate(row)])
    return buffer.getvalue().encode()


def files(top: Path, sub: str) -> set[str]:
    return {str(p.relative_to(top)) for p in (top / sub).rglob("*") if p.is_file()}


def differences(whole: Path, merged: Path) -> list[str]:
    """Where the merged gradebook differs from the whole run's (timing fields aside)."""
    found = []
    for name, read in (("grades.json", without_timing_json), ("grades.csv", without_timing_csv)):
        a, b = read(whole / name), read(merged / name)
        if a != b:
            lines_a, lines_b = a.decode().splitlines(), b.decode().splitlines()
            diff = [f"  - {x}\n  + {y}" for x, y in zip(lines_a, lines_b, strict=False) if x != y][:5]
            found.append(f"{name} differs ({len(lines_a)} vs {len(lines_b)} lines):\n" + "\n".join(diff))
    for sub in ("feedback", "executed"):
        if files(whole, sub) != files(merged, sub):
            found.append(f"{sub}/ differs: {sorted(files(whole, sub) ^ files(merged, sub))[:5]}")
    return found
