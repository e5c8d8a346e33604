"""nbgrader's folders as `grade` input: `submitted/STUDENT/ASSIGNMENT/` and the exchange's `inbound/`.

Read from nbgrader 0.9's own code (`nbgrader/exchange/default/submit.py`, `collect.py`,
`coursedir.py`, `utils.parse_utc`):

- `nbgrader submit` copies the assignment into `EXCHANGE/COURSE/inbound/` as a folder named
  `{student}+{assignment}+{timestamp}`, newer versions adding `+{random}` (12 URL-safe base64
  characters), and writes the same timestamp into `timestamp.txt` inside it. The timestamp
  is `Exchange.timestamp_format` (default `%Y-%m-%d %H:%M:%S.%f %Z`, time zone UTC).
- `nbgrader collect` splits a name with `rsplit('+', 3)` (a student id may hold a `+`), keeps
  per student the submission with the latest timestamp (read by `parse_utc`), and copies it to
  `submitted/{student}/{assignment}/`, `timestamp.txt` included.

So a `submitted/` tree is already `FOLDER/STUDENT/...ipynb` (the first folder is nbgrader's
student id); only its `timestamp.txt` is new, and the row records it. An `inbound/` folder is
different: each entry is one submission, the student is the first part of its name, and only
the latest submission of each student and assignment counts — the row says which
(`submitted_at`), and flags the earlier ones it left out (`superseded:<timestamp>`).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

TIMESTAMP_FILE = "timestamp.txt"
MAX_TIMESTAMP_BYTES = 1024
MAX_TIMESTAMP_CHARS = 100
ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]{1,40}(?:/[A-Za-z0-9_+-]{1,40}){0,2}")


@dataclass(frozen=True)
class InboundEntry:
    """One folder of `inbound/`: one submission of one assignment by one student."""

    path: Path
    student: str
    assignment: str
    timestamp: str  # as nbgrader wrote it
    when: dt.datetime  # in UTC, without tzinfo (as nbgrader's parse_utc gives it)


def parse_utc(text: str) -> dt.datetime | None:
    """nbgrader's `utils.parse_utc`: a timestamp in UTC (naive), or None if it is not one."""
    import dateutil.parser
    import dateutil.tz

    if len(text) > MAX_TIMESTAMP_CHARS or not text.isprintable():
        return None  # nbgrader writes about 30 characters on one line
    try:
        parts = text.split(" ")
        if len(parts) == 3:
            zone = parts[2]
            try:
                tz = int(zone)
            except ValueError:
                # gettz opens a file by that name: only a zone's name ("UTC", "Europe/Paris"),
                # never a path of the student's choosing ("/proc/...", "../../...").
                tz = dateutil.tz.gettz(zone) if ZONE_NAME.fullmatch(zone) else None
            when = dateutil.parser.parse(" ".join(parts[:2] + ["TZ"]), tzinfos={"TZ": tz})
        else:
            when = dateutil.parser.parse(text)
        if when.tzinfo is not None:
            when = (when - when.utcoffset()).replace(tzinfo=None)
    except Exception:  # dateutil raises more than ValueError on what a student can write
        return None
    return when


def iso(when: dt.datetime) -> str:
    """How the gradebook writes a submission time: ISO 8601, UTC."""
    return when.isoformat(timespec="microseconds") + "Z"


def parse_entry(path: Path) -> InboundEntry | None:
    """`{student}+{assignment}+{timestamp}[+{random}]` split as `nbgrader collect` does, or None."""
    parts = path.name.rsplit("+", 3)
    if len(parts) < 3 or not parts[0] or not parts[1]:
        return None
    when = parse_utc(parts[2])
    if when is None:
        return None
    return InboundEntry(path, parts[0], parts[1], parts[2], when)


def _folders(top: Path) -> list[Path]:
    try:
        return sorted(p for p in top.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def is_inbound(top: Path) -> bool:
    """An exchange's `inbound/`: so named, or every folder in it named like a submission."""
    if not top.is_dir() or top.is_symlink():
        return False
    if top.name == "inbound":
        return True
    folders = _folders(top)
    return bool(folders) and all(parse_entry(p) is not None for p in folders)


@dataclass
class Inbound:
    latest: list[InboundEntry]  # one per student and assignment: the submission that counts
    superseded: dict[Path, list[InboundEntry]]  # latest's path → the earlier ones it replaces
    unnamed: list[Path]  # folders whose name is not a submission's


def choose(top: Path) -> Inbound:
    """The latest submission per student and assignment, as `nbgrader collect` picks it."""
    groups: dict[tuple[str, str], list[InboundEntry]] = {}
    unnamed = []
    for folder in _folders(top):
        entry = parse_entry(folder)
        if entry is None:
            unnamed.append(folder)
        else:
            groups.setdefault((entry.student, entry.assignment), []).append(entry)
    latest, superseded = [], {}
    for _, entries in sorted(groups.items()):
        entries.sort(key=lambda e: (e.when, e.path.name), reverse=True)
        latest.append(entries[0])
        superseded[entries[0].path] = entries[1:]
    return Inbound(latest, superseded, unnamed)


def submitted_at(notebook: Path, top: Path) -> str | None:
    """The `timestamp.txt` nearest above a notebook (inside `top`), as ISO UTC; None if none.

    The student's bytes: read capped (1 KB), UTF-8, at most 100 printable characters, parsed
    by `parse_utc`, which never raises. One that cannot be read is no timestamp (the row has
    no `submitted_at`), as for a submission nbgrader did not stamp; the grade does not change."""
    from labkit.grading.bounded import read_capped

    folder = notebook.parent
    while folder != top and top in folder.parents:
        stamp = folder / TIMESTAMP_FILE
        if os.path.lexists(stamp):
            try:
                text = read_capped(stamp, MAX_TIMESTAMP_BYTES).decode("utf-8").strip()
            except (OSError, UnicodeDecodeError):  # no timestamp, as nbgrader has none: not a fault
                return None
            when = parse_utc(text) if text else None
            return iso(when) if when is not None else None
        folder = folder.parent
    return None
