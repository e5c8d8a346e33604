"""`python -m labkit merge OUT_1 ... OUT_N --out DIR`: the shards of one class as one gradebook.

Each shard's --out folder has a manifest (`manifest`): the release and the grader's code as
fingerprints, the seed, the limits, sandbox on or off, its shard `I/N`, and every submission
of the whole class with the shard that owes it. Merging refuses (exit 2) shards that differ
in any of that — other releases, seeds, options or submissions — and a shard given twice.
Then every record a shard owes is verified the way a resumed `grade` verifies its own (the
grader's result file, its version, its key, the notebook's hash and the seed); the good ones,
with their feedback pages and executed notebooks, are copied into DIR, and DIR gets its
gradebook, report and a manifest of its own (a whole class: 1/1), so `grade` and `report`
work on it as on any --out folder. Students whose record is missing or bad, and records found
in more than one shard, are listed; the exit code is then 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading import gradebook, manifest, record, report
from labkit.grading.settings import EXECUTED
from labkit.grading.shards import Shard
from labkit.grading.submissions import page_name, read_capped, slug
from labkit.grading.terminal import safe, safe_lines

# A feedback page or executed notebook larger than this is not copied (the grader caps both
# far below it: outputs at 4 MB, notebooks at 20 MB).
MAX_COPY_BYTES = 64 * 1024**2


class MergeRefused(Exception):
    """The shards cannot be merged; the message says why (exit 2)."""


@dataclass
class ShardDir:
    path: Path
    manifest: manifest.Manifest

    @property
    def index(self) -> int:
        return self.manifest.shard[0]


@dataclass
class Outcome:
    merged: dict[str, tuple[ShardDir, bytes, dict]] = field(default_factory=dict)  # key → (shard, file, record)
    missing: dict[str, str] = field(default_factory=dict)  # key → why
    duplicated: dict[str, list[int]] = field(default_factory=dict)  # key → the shards that hold it


def _read(paths: list[Path]) -> list[ShardDir]:
    shards = []
    for path in paths:
        if not path.is_dir():
            raise MergeRefused(f"{path} is not a folder")
        try:
            shards.append(ShardDir(path.resolve(), manifest.read(path)))
        except manifest.ManifestError as exc:
            raise MergeRefused(str(exc)) from None
    return shards


def _describe(name: str, value) -> str:
    if isinstance(value, (list, dict)):
        return f"{len(value)} {name}"
    return f"{value!r}"


def check_compatible(shards: list[ShardDir]) -> int:
    """The shards' common N; raises MergeRefused when they are not shards of one class."""
    first = shards[0]
    problems = []
    for other in shards[1:]:
        mine, theirs = first.manifest.options(), other.manifest.options()
        for name in mine:
            if mine[name] != theirs[name]:
                detail = ""
                if isinstance(mine[name], (list, dict)):
                    only = sorted(set(mine[name]) ^ set(theirs[name]))
                    detail = f" (differing: {', '.join(map(str, only[:5]))}{', …' if len(only) > 5 else ''})" \
                        if only else " (same names, other contents)"
                problems.append(f"{name}: {first.path} has {_describe(name, mine[name])}, "
                                f"{other.path} has {_describe(name, theirs[name])}{detail}")
    if problems:
        raise MergeRefused("these are not shards of one grading run (same release, grader, seed, options "
                           "and submissions); they differ in\n  " + "\n  ".join(problems))
    seen: dict[int, Path] = {}
    for shard in shards:
        if shard.index in seen:
            raise MergeRefused(f"shard {shard.index}/{shard.manifest.shard[1]} is given twice: {seen[shard.index]} "
                               f"and {shard.path}")
        seen[shard.index] = shard.path
    return first.manifest.shard[1]


def verify(shard: ShardDir, key: str, expected: dict) -> tuple[bytes, dict] | str:
    """The shard's record for `key`, checked as a resumed run checks its own; else why not."""
    path = gradebook.result_path(shard.path, key)
    try:
        raw = read_capped(path, MAX_COPY_BYTES)
    except FileNotFoundError:
        return "not graded (no result file)"
    except OSError as exc:
        return f"its result file cannot be read ({exc.strerror or exc})"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "its result file is not JSON"
    if not isinstance(data, dict) or data.get("version") != gradebook.VERSION or not isinstance(data.get("row"), dict):
        return "its result file is not a grader's record"
    row = data["row"]
    if data.get("key") != key or row.get("student") != expected["student"] or row.get("lab", "") != expected["lab"]:
        return "its result file names another submission"
    if data.get("sha256") != expected["sha256"]:
        return "its record is of another version of the notebook"
    if expected["lab"] and data.get("seed") != shard.manifest.seed:
        return "its record was graded with another seed"
    return raw, data


def collect(shards: list[ShardDir]) -> Outcome:
    found = Outcome()
    by_index = {shard.index: shard for shard in shards}
    submissions = shards[0].manifest.submissions
    for key, expected in sorted(submissions.items()):
        owner = by_index.get(expected["shard"])
        if owner is None:
            found.missing[key] = f"shard {expected['shard']}/{shards[0].manifest.shard[1]} was not given"
            continue
        checked = verify(owner, key, expected)
        if isinstance(checked, str):
            found.missing[key] = f"shard {owner.index}: {checked}"
            continue
        found.merged[key] = (owner, *checked)
        holders = [s.index for s in shards if s is not owner and gradebook.result_path(s.path, key).exists()]
        if holders:
            found.duplicated[key] = sorted([owner.index, *holders])
    return found


def _copy(source: Path, target: Path) -> None:
    try:
        data = read_capped(source, MAX_COPY_BYTES)
    except OSError:
        return  # no page (or a page that is not a regular file): the gradebook still has the row
    gradebook.write_atomic(target, data)


def _skipped_rows(shard: ShardDir) -> list[dict]:
    """The shard's skipped paths, only those of its own students."""
    try:
        rows = json.loads(read_capped(gradebook.skipped_path(shard.path), MAX_COPY_BYTES).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    holds = Shard(*shard.manifest.shard).holds
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("student"), str) and holds(r["student"])
            and r.get("status") == "skipped"] if isinstance(rows, list) else []


def write(shards: list[ShardDir], found: Outcome, out: Path) -> None:
    for key, (shard, raw, data) in found.merged.items():
        gradebook.write_atomic(gradebook.result_path(out, key), raw)
        row = data["row"]
        name = page_name(row["lab"], Path(row.get("notebook", "")).name)
        _copy(record.page_path(shard.path, row["student"], name), record.page_path(out, row["student"], name))
        if row["lab"]:
            executed = Path(EXECUTED) / slug(row["student"]) / f"{row['lab']}.ipynb"
            _copy(shard.path / executed, out / executed)
    skipped = sorted((r for shard in sorted(shards, key=lambda s: s.index) for r in _skipped_rows(shard)),
                     key=lambda r: (r["student"], r.get("notebook", "")))
    gradebook.write_atomic(gradebook.skipped_path(out), json.dumps(skipped, ensure_ascii=False, indent=1))
    whole = shards[0].manifest
    merged = manifest.Manifest(**{**whole.__dict__, "shard": [1, 1],
                                  "submissions": {k: {**v, "shard": 1} for k, v in whole.submissions.items()}})
    manifest.write(out, merged)
    gradebook.write_atomic(gradebook.results_dir(out) / "batch.state", json.dumps({"seed": whole.seed}))


def _student(key: str, shards: list[ShardDir]) -> str:
    return shards[0].manifest.submissions[key]["student"]


def run(paths: list[Path], out: Path) -> int:
    from labkit.grading.batch import BatchUsageError, _lock

    shards = _read(paths)
    count = check_compatible(shards)
    out = out.resolve()
    if any(out == shard.path for shard in shards):
        raise MergeRefused(f"--out {out} is one of the shards: merge into a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeRefused(f"--out {out} exists and is not empty: merge into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    try:
        lock = _lock(out)
    except BatchUsageError as exc:
        raise MergeRefused(str(exc)) from None
    try:
        found = collect(shards)
        write(shards, found, out)
        rows = gradebook.write_gradebook(out)
        summary = report.write(out)
    finally:
        lock.close()
    given = ", ".join(str(s.index) for s in sorted(shards, key=lambda s: s.index))
    print(safe(f"merged shard(s) {given} of {count}: {len(found.merged)} record(s), {len(rows)} row(s) in "
               f"{out / 'grades.csv'}"), flush=True)
    absent = sorted(set(range(1, count + 1)) - {s.index for s in shards})
    if absent:
        holds = {i: [n for n in shards[0].manifest.students if Shard(i, count).holds(n)] for i in absent}
        print(f"shard(s) {', '.join(map(str, absent))} of {count} not given: "
              f"{sum(map(len, holds.values()))} student(s) have no rows")
    if found.missing:
        print(f"missing: {len(found.missing)} submission(s) have no good record:")
        for key, why in sorted(found.missing.items()):
            print("  " + safe(f"{_student(key, shards)} ({key}): {why}"))
    if found.duplicated:
        print(f"duplicated: {len(found.duplicated)} record(s) are in more than one shard (the one of the "
              "shard that owns the student was taken):")
        for key, holders in sorted(found.duplicated.items()):
            print("  " + safe(f"{_student(key, shards)} ({key}): shards {', '.join(map(str, holders))}"))
    print(safe_lines(summary), flush=True)
    return 1 if found.missing or found.duplicated or absent else 0
