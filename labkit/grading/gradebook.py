"""Per-submission result files, and the gradebook rebuilt from them.

Each graded submission leaves one JSON file in `DIR/.results/` (written last, atomically:
it is the commit point). The gradebook — `grades.csv` and `grades.json`, one row per student
and lab — is always rebuilt from those files, so an interrupted run loses nothing and a
rerun never counts anything twice.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from pathlib import Path

from labkit.grading.settings import RESULTS

VERSION = 1
FIRST = ["student", "lab"]
AFTER_STEPS = ["total", "max", "status", "flags", "seed", "seconds", "notebook", "message", "sandbox"]
# Columns a row has only when it knows them: nbgrader's submission time, the steps revealed.
OPTIONAL = ["submitted_at", "revealed"]
# OWASP's rule against CSV formula injection: a text cell starting with one of these is
# prefixed with a quote, so a spreadsheet shows it as text instead of running it.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# A spreadsheet told to split on `;` or tab (or that trims spaces, or that reads the quotes
# as text) starts a field wherever one of these is, not only where our commas are: after
# any separator, line break or quote, then any run of spaces, quotes and control characters.
# A formula sign there (ASCII, or its fullwidth form, which some spreadsheets fold to ASCII)
# gets a `'` put right before it: whatever the split, the field then starts with `'` or
# with text, never with the sign. See `defuse`.
FIELD_START = re.compile('(?:^|(?<=[,;\t\r\n"]))[\\s"\x00-\x1f\x7f]*(?=[=+\\-@\uff1d\uff0b\uff0d\uff20])')


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a temp file next to `path`, then rename it over: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def results_dir(out: Path) -> Path:
    return out / RESULTS


def result_path(out: Path, key: str) -> Path:
    return results_dir(out) / f"{key}.json"


def read_result(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION or "row" not in data:
        return None
    return data


def save_result(out: Path, key: str, result: dict) -> None:
    result = {"version": VERSION, "key": key, **result}
    write_atomic(result_path(out, key), json.dumps(result, ensure_ascii=False, indent=1))


def column(step: str) -> str:
    return "final" if step == "final" else f"step_{step}"


def make_row(*, student: str, lab: str, notebook: str, steps: dict[str, int], max_points: int,
             status: str, flags: list[str], seed: int | None, seconds: float, message: str = "",
             quiz: dict | None = None, sandbox: str = "", submitted_at: str | None = None,
             revealed: list[str] | None = None) -> dict:
    row = {"student": student, "lab": lab}
    row.update({column(step): points for step, points in steps.items()})
    row.update(total=sum(steps.values()), max=max_points, status=status, flags=list(flags), seed=seed,
               seconds=round(seconds, 2), notebook=notebook, message=message, sandbox=sandbox)
    if submitted_at is not None:
        row["submitted_at"] = submitted_at
    if revealed is not None:
        row["revealed"] = list(revealed)
    if quiz is not None:
        row["quiz"] = quiz
    return row


def skipped_path(out: Path) -> Path:
    return results_dir(out) / "skipped.list"


def load_rows(out: Path) -> list[dict]:
    rows = []
    folder = results_dir(out)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = read_result(path)
        if data is not None:
            rows.append(data["row"])
    try:
        rows += [r for r in json.loads(skipped_path(out).read_text(encoding="utf-8")) if isinstance(r, dict)]
    except (OSError, ValueError):
        pass
    rows.sort(key=lambda r: (r["student"], r["lab"], r["notebook"]))
    return rows


def _step_order(name: str) -> tuple[int, int]:
    if name == "final":
        return (2, 0)
    number = name.removeprefix("step_")
    return (0, int(number)) if number.isdigit() else (1, 0)


def _quiz_columns(row: dict) -> dict[str, str]:
    """`work/quiz-<lab>.json` as columns: per question the letter chosen and whether it is right."""
    quiz = row.get("quiz")
    if not isinstance(quiz, dict):
        return {}
    cols: dict = {}
    for key, value in quiz.items():
        if key == "answers" and isinstance(value, dict):
            for qid, answer in value.items():
                if isinstance(answer, dict):
                    choice = answer.get("choice")
                    cols[f"quiz_{qid}"] = "abcdefgh"[choice] if isinstance(choice, int) and 0 <= choice < 8 \
                        else answer.get("option", "")
                    cols[f"quiz_{qid}_correct"] = answer.get("correct")
                else:
                    cols[f"quiz_{qid}"] = answer
        elif key != "lab":
            cols[f"quiz_{key}"] = value
    return {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in cols.items()}


def to_csv(rows: list[dict]) -> str:
    steps = sorted({k for r in rows for k in r if k.startswith("step_") or k == "final"}, key=_step_order)
    quiz = sorted({k for r in rows for k in _quiz_columns(r)})
    optional = [name for name in OPTIONAL if any(name in r for r in rows)]
    fields = FIRST + steps + AFTER_STEPS + optional + quiz
    buffer = io.StringIO()
    # RFC 4180 line ends: a CR or LF inside a cell (a student's name, a message) gets quoted too.
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\r\n")
    writer.writeheader()
    for row in rows:
        flat = {**row, **_quiz_columns(row), "flags": ";".join(row.get("flags", [])),
                "revealed": ";".join(row.get("revealed") or [])}
        flat["seed"] = "" if row.get("seed") is None else row["seed"]
        writer.writerow({key: defuse(value) for key, value in flat.items()})
    return buffer.getvalue()


def defuse(value):
    """A CSV cell that a spreadsheet will show as text, never evaluate (numbers stay numbers).

    Splitting on `,`, `;` or tab, a field can start at the cell's start or after any
    separator, line break or quote inside it. Wherever the first character past the spaces,
    quotes and control characters there is a formula sign, a `'` goes right before the sign:
    a field cut there (its quotes and spaces stripped or not) starts with `'` or with the
    characters before it, which are not signs — never with `= + - @`. The cell's own start
    also keeps OWASP's rule (a tab or CR first: prefixed too). The JSON keeps the real text.
    """
    if not isinstance(value, str):
        return value
    value = FIELD_START.sub(lambda m: m.group() + "'", value)
    return "'" + value if value.startswith(FORMULA_START) else value


def write_gradebook(out: Path) -> list[dict]:
    rows = load_rows(out)
    write_atomic(out / "grades.csv", to_csv(rows))
    write_atomic(out / "grades.json", json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
    return rows
