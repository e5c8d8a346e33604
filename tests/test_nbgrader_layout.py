"""nbgrader's folders as `grade` input: `submitted/STUDENT/ASSIGNMENT/` and the exchange's `inbound/`.

The graded test lets nbgrader itself lay the folders out where it is installed (its own
`ExchangeSubmit` and `ExchangeCollect`, in the side venv `LABKIT_NBGRADER_PYTHON` as CI has
it): one student submits twice (the skeleton, then the reference), another once. Without
nbgrader it builds the same tree by hand, as nbgrader's code does. The other tests read names
and timestamps without a kernel.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from labkit.grading import nbgrader_layout
from labkit.grading.submissions import find
from tests.submissions import corpus
from tests.test_grading import SOURCES, grade_cmd, grader_env, needs_release

FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # nbgrader's Exchange.timestamp_format


@pytest.mark.parametrize("name, student, assignment, when", [
    ("ada+lab+2026-03-01 10:00:00.000001 UTC", "ada", "lab", dt.datetime(2026, 3, 1, 10, 0, 0, 1)),
    ("ada+lab+2026-03-01 10:00:00.000001 UTC+Zm9vYmFyYmF6cXV4", "ada", "lab", dt.datetime(2026, 3, 1, 10, 0, 0, 1)),
    # a student id with a '+' in it: nbgrader collect splits from the right
    ("a+b+lab+2026-03-01 10:00:00.5 UTC+Zm9vYmFyYmF6cXV4", "a+b", "lab", dt.datetime(2026, 3, 1, 10, 0, 0, 500000)),
    ("bob+lab+2026-03-01 12:00:00.000000 CET", "bob", "lab", dt.datetime(2026, 3, 1, 11, 0, 0)),
])
def test_inbound_names_split_as_nbgrader_collect_splits_them(name, student, assignment, when):
    entry = nbgrader_layout.parse_entry(Path(name))
    assert (entry.student, entry.assignment, entry.when) == (student, assignment, when)


@pytest.mark.parametrize("name", ["ada", "ada+lab", "ada+lab+not a time", "+lab+2026-03-01 10:00:00 UTC"])
def test_a_folder_not_named_like_a_submission_is_not_one(name):
    assert nbgrader_layout.parse_entry(Path(name)) is None


def _nb(path: Path, note: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [], "metadata": {"note": note}, "nbformat": 4, "nbformat_minor": 5}))


def test_inbound_takes_the_latest_submission_and_lists_the_rest(tmp_path):
    inbound = tmp_path / "inbound"
    for name in ("ada+lab+2026-03-01 10:00:00.000000 UTC", "ada+lab+2026-03-02 09:00:00.000000 UTC+xyz",
                 "ada+lab+2026-03-01 23:00:00.000000 UTC", "bob+lab+2026-03-01 08:00:00.000000 UTC"):
        _nb(inbound / name / "lab.ipynb", name)
    _nb(inbound / "stray" / "lab.ipynb")
    subs, skipped = find([inbound])
    chosen = {s.student: s for s in subs}
    assert sorted(chosen) == ["ada", "bob"]
    assert chosen["ada"].submitted_at == "2026-03-02T09:00:00.000000Z"
    assert sorted(chosen["ada"].flags) == ["superseded:2026-03-01T10:00:00.000000Z",
                                           "superseded:2026-03-01T23:00:00.000000Z"]
    assert chosen["ada"].path.parent.name.endswith("+xyz")
    assert [s.path.name for s in skipped] == ["stray"]


def test_submitted_records_the_timestamp_file_of_the_submission(tmp_path):
    folder = tmp_path / "submitted" / "ada" / "lab"
    _nb(folder / "lab.ipynb")
    (folder / "timestamp.txt").write_text("2026-03-02 09:00:00.250000 UTC")
    _nb(tmp_path / "submitted" / "bob" / "lab" / "lab.ipynb")  # collected by hand: no timestamp
    subs, _ = find([tmp_path / "submitted"])
    assert {s.student: s.submitted_at for s in subs} == {"ada": "2026-03-02T09:00:00.250000Z", "bob": None}


def test_a_timestamp_link_is_not_followed(tmp_path):
    folder = tmp_path / "submitted" / "ada" / "lab"
    _nb(folder / "lab.ipynb")
    (tmp_path / "elsewhere.txt").write_text("2026-03-02 09:00:00 UTC")
    (folder / "timestamp.txt").symlink_to(tmp_path / "elsewhere.txt")
    subs, _ = find([tmp_path / "submitted"])
    assert subs[0].submitted_at is None


# --- nbgrader lays the folders out; grade reads them ------------------------------------------

NBGRADER_SCRIPT = r"""
import json, os, sys, time
from traitlets.config import Config
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.exchange.default import ExchangeCollect, ExchangeSubmit

exchange, course, cache, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def config(root, student):
    c = Config()
    c.CourseDirectory.course_id = "dtao"
    c.CourseDirectory.assignment_id = "lab"
    c.CourseDirectory.root = root
    c.CourseDirectory.student_id = student
    c.Exchange.root = exchange
    c.Exchange.cache = cache
    return c

for student, home in plan:
    c = config(home, student)
    submit = ExchangeSubmit(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c)
    submit.assignment_dir = home
    submit.start()
    time.sleep(0.05)  # the next submission gets a later timestamp
c = config(course, "*")
ExchangeCollect(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()
"""


def _nbgrader_python() -> str | None:
    for python in (sys.executable, os.environ.get("LABKIT_NBGRADER_PYTHON")):
        if python and subprocess.run([python, "-c", "import nbgrader"], capture_output=True).returncode == 0:
            return python
    return None


def _by_hand(exchange: Path, course: Path, plan: list[tuple[str, Path]]) -> None:
    """What nbgrader's submit and collect write, for a machine without nbgrader."""
    inbound = exchange / "dtao" / "inbound"
    latest: dict[str, tuple[str, Path]] = {}
    for i, (student, home) in enumerate(plan):
        stamp = (dt.datetime(2026, 3, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=i)).strftime(FORMAT)
        folder = inbound / f"{student}+lab+{stamp}+{uuid.uuid4().hex[:12]}"
        folder.mkdir(parents=True)
        for nb in (home / "lab").iterdir():
            (folder / nb.name).write_bytes(nb.read_bytes())
        (folder / "timestamp.txt").write_text(stamp)
        latest[student] = (stamp, folder)
    for student, (_, folder) in latest.items():
        target = course / "submitted" / student / "lab"
        target.mkdir(parents=True)
        for file in folder.iterdir():
            (target / file.name).write_bytes(file.read_bytes())


def _lay_out(tmp: Path) -> tuple[Path, Path, str]:
    release, reference = SOURCES
    parts = corpus.reference_parts(reference)
    exchange, course = tmp / "exchange", tmp / "course"
    (exchange / "dtao" / "inbound").mkdir(parents=True)
    (exchange / "dtao" / "outbound" / "lab").mkdir(parents=True)
    course.mkdir()
    name = "01-outbox.ipynb"
    nbformat.write(release, exchange / "dtao" / "outbound" / "lab" / name)  # as release_assignment leaves it
    homes = {}
    for who, solved in (("ada-first", set()), ("ada", corpus.ALL), ("bob", {"header", "1", "2"})):
        home = tmp / "homes" / who
        (home / "lab").mkdir(parents=True)
        nbformat.write(corpus.solved(release, parts, solved), home / "lab" / name)
        homes[who] = home
    plan = [("ada", homes["ada-first"]), ("ada", homes["ada"]), ("bob", homes["bob"])]
    python = _nbgrader_python()
    if python is None:
        _by_hand(exchange, course, plan)
        return exchange, course, "by hand"
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(python).parent), os.environ["PATH"]]))  # alembic
    proc = subprocess.run([python, "-c", NBGRADER_SCRIPT, str(exchange), str(course), str(tmp / "cache"),
                           json.dumps([(s, str(h)) for s, h in plan])], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return exchange, course, "nbgrader"


@needs_release
@pytest.mark.slow
def test_grade_reads_what_nbgrader_submit_and_collect_lay_out(tmp_path):
    exchange, course, how = _lay_out(tmp_path)
    inbound = exchange / "dtao" / "inbound"
    assert len(list(inbound.iterdir())) == 3 and sorted(p.name for p in (course / "submitted").iterdir()) == \
        ["ada", "bob"]
    env = grader_env(tmp_path, uuid.uuid4().hex)
    rows = {}
    for label, source in (("submitted", course / "submitted"), ("inbound", inbound)):
        out = tmp_path / f"out-{label}"
        proc = subprocess.run(grade_cmd(source, "--out", out, "--seed", "3"), env=env, capture_output=True,
                              text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rows[label] = {r["student"]: r for r in json.loads((out / "grades.json").read_text())}
    stamps = {}
    for folder in inbound.iterdir():
        entry = nbgrader_layout.parse_entry(folder)
        stamps.setdefault(entry.student, []).append(nbgrader_layout.iso(entry.when))
    for label in ("submitted", "inbound"):
        got = rows[label]
        assert sorted(got) == ["ada", "bob"], (how, label, got)
        # ada's second submission (the reference) counts, not her first (the skeleton)
        assert got["ada"]["total"] == got["ada"]["max"] > 0, (how, label, got["ada"])
        assert got["ada"]["submitted_at"] == max(stamps["ada"]), (how, label)
        assert 0 < got["bob"]["total"] < got["bob"]["max"], (how, label, got["bob"])
        assert got["bob"]["submitted_at"] == stamps["bob"][0]
        assert "submitted_at" in (tmp_path / f"out-{label}" / "grades.csv").read_text().splitlines()[0]
    assert rows["inbound"]["ada"]["flags"] == [f"superseded:{min(stamps['ada'])}"]
