"""`grade --shard I/N` and `merge`, without a kernel: shard folders made here as the grader makes them.

The class test (tests/test_class.py) grades a real class whole and as shards; these tests
prove what merge refuses and reports on shards built by hand (manifest + grader records).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.grading import gradebook, manifest, record
from labkit.grading.shards import Shard, ShardError, shard_of
from labkit.grading.submissions import find
from labkit.judge.verdict import Case, LabVerdict, Outcome, StepVerdict

LAB = "outbox"
SEED = 5


@pytest.mark.parametrize("text, shard", [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)), (" 4 / 4 ", Shard(4, 4))])
def test_shard_parses_i_of_n(text, shard):
    assert Shard.parse(text) == shard


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "2", "a/b", "-1/4", ""])
def test_a_shard_outside_1_to_n_is_refused(text):
    with pytest.raises(ShardError):
        Shard.parse(text)


def test_shards_partition_a_class_into_even_parts():
    names = [f"student{i}" for i in range(400)]
    owners = [[Shard(i, 4).holds(n) for i in range(1, 5)].count(True) for n in names]
    assert owners == [1] * 400  # each student in exactly one shard
    sizes = Counter(shard_of(n, 4) for n in names)
    assert all(60 <= sizes[i] <= 140 for i in range(1, 5)), sizes


def _nb(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [], "metadata": {"note": text}, "nbformat": 4, "nbformat_minor": 5}))


def test_adding_files_to_other_students_folders_moves_nobody(tmp_path):
    for name in ("ada", "bob", "cyd", "dee", "eve", "fay"):
        _nb(tmp_path / name / "lab.ipynb")

    def placement() -> dict[str, int]:
        subs, _ = find([tmp_path])
        return {sub.student: next(i for i in range(1, 4) if Shard(i, 3).holds(sub.student)) for sub in subs}

    before = placement()
    for name in ("bob", "eve"):
        for i in range(5):
            _nb(tmp_path / name / f"extra{i}.ipynb", "more")
    _nb(tmp_path / "zed" / "lab.ipynb")
    after = placement()
    assert {name: after[name] for name in before} == before


def test_grade_with_a_shard_needs_a_seed(tmp_path, capsys):
    (tmp_path / "subs").mkdir()
    assert main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--shard", "1/2"]) == 2
    assert "--shard needs --seed" in capsys.readouterr().err
    assert main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--shard", "3/2",
                 "--seed", "1"]) == 2


# --- shard folders made by hand ----------------------------------------------------------------

STUDENTS = ["ada", "bob", "cyd", "dee", "eve", "fay", "gus", "hal"]


def _verdict(good: bool) -> LabVerdict:
    from labkit import labs

    steps = [StepVerdict(s.step, s.title, s.points,
                         [Case("c", Outcome.PASSED if good or s.step != 1 else Outcome.WRONG)])
             for s in labs.load(LAB).steps]
    return LabVerdict(LAB, SEED, steps)


def _key(student: str) -> str:
    return f"{student}--{LAB}"


def make_shard(out: Path, index: int, count: int, *, seed: int = SEED, release: str = "r1",
               students: list[str] = STUDENTS, grade: list[str] | None = None) -> Path:
    """A --out folder as `grade --shard index/count` leaves it: manifest, records, pages."""
    owned = [s for s in students if shard_of(s, count) == index] if grade is None else grade
    subs = {_key(s): {"student": s, "lab": LAB, "sha256": s * 4, "shard": shard_of(s, count)} for s in students}
    manifest.write(out, manifest.Manifest(seed=seed, shard=[index, count], release={LAB: release}, code="c",
                                          limits={"memory": 1}, step_timeout=1.0, sandboxed=True, sandbox="test",
                                          students=sorted(students), submissions=subs))
    for student in owned:
        job = {"student": student, "lab": LAB, "notebook": f"{student}/lab.ipynb", "path": f"/x/{student}.ipynb",
               "key": _key(student), "sha256": student * 4, "seed": seed, "out": str(out), "sandbox": "test"}
        record.finish(job, status="ok", message="", flags=[], verdict=_verdict(student < "e"), seconds=1.5)
    gradebook.write_gradebook(out)
    return out


def merge_cmd(shards: list[Path], out: Path) -> list[str]:
    return ["merge", *map(str, shards), "--out", str(out)]


def test_merged_shards_equal_the_whole_class(tmp_path, capsys):
    whole = make_shard(tmp_path / "whole", 1, 1)
    shards = [make_shard(tmp_path / f"s{i}", i, 3) for i in (1, 2, 3)]
    assert main(merge_cmd(shards, tmp_path / "merged")) == 0
    assert (tmp_path / "merged" / "grades.csv").read_bytes() == (whole / "grades.csv").read_bytes()
    assert (tmp_path / "merged" / "grades.json").read_bytes() == (whole / "grades.json").read_bytes()
    assert (tmp_path / "merged" / "report.html").is_file()
    pages = sorted(p.relative_to(tmp_path / "merged") for p in (tmp_path / "merged" / "feedback").rglob("*.html"))
    assert len(pages) == len(STUDENTS)
    assert manifest.read(tmp_path / "merged").shard == [1, 1]


@pytest.mark.parametrize("change, words", [
    ({"seed": 6}, "seed"),
    ({"release": "r2"}, "release"),
    ({"students": STUDENTS + ["ivy"]}, "students"),
])
def test_merge_refuses_shards_of_other_runs(tmp_path, capsys, change, words):
    one = make_shard(tmp_path / "s1", 1, 2)
    two = make_shard(tmp_path / "s2", 2, 2, **change)
    assert main(merge_cmd([one, two], tmp_path / "merged")) == 2
    err = capsys.readouterr().err
    assert "not shards of one grading run" in err and words in err
    assert not (tmp_path / "merged").exists()


def test_merge_refuses_a_shard_given_twice_and_a_folder_without_a_manifest(tmp_path, capsys):
    one = make_shard(tmp_path / "s1", 1, 2)
    copy = make_shard(tmp_path / "copy", 1, 2)
    assert main(merge_cmd([one, copy], tmp_path / "m1")) == 2
    assert "given twice" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert main(merge_cmd([one, tmp_path / "plain"], tmp_path / "m2")) == 2
    assert "manifest" in capsys.readouterr().err


def test_merge_refuses_a_non_empty_out_folder(tmp_path, capsys):
    one, two = make_shard(tmp_path / "s1", 1, 2), make_shard(tmp_path / "s2", 2, 2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    assert main(merge_cmd([one, two], tmp_path / "busy")) == 2
    assert main(merge_cmd([one, two], one)) == 2


def test_merge_lists_students_of_a_missing_shard_and_exits_1(tmp_path, capsys):
    one = make_shard(tmp_path / "s1", 1, 2)
    assert main(merge_cmd([one], tmp_path / "merged")) == 1
    out = capsys.readouterr().out
    absent = [s for s in STUDENTS if shard_of(s, 2) == 2]
    assert f"shard(s) 2 of 2 not given: {len(absent)} student(s)" in out
    for student in absent:
        assert f"{student} ({_key(student)}): shard 2/2 was not given" in out
    rows = json.loads((tmp_path / "merged" / "grades.json").read_text())
    assert sorted(r["student"] for r in rows) == sorted(set(STUDENTS) - set(absent))


def test_merge_verifies_records_and_reports_bad_and_duplicated_ones(tmp_path, capsys):
    one, two = make_shard(tmp_path / "s1", 1, 2), make_shard(tmp_path / "s2", 2, 2)
    victim = next(s for s in STUDENTS if shard_of(s, 2) == 1)
    path = gradebook.result_path(one, _key(victim))
    data = json.loads(path.read_text())
    data["sha256"] = "f" * 64  # a record of another version of the notebook
    path.write_text(json.dumps(data))
    stray = next(s for s in STUDENTS if shard_of(s, 2) == 2)
    extra = make_shard(tmp_path / "extra", 1, 2, grade=[stray])  # shard 1 also graded a shard-2 student
    gradebook.write_atomic(gradebook.result_path(one, _key(stray)),
                           gradebook.result_path(extra, _key(stray)).read_bytes())
    assert main(merge_cmd([one, two], tmp_path / "merged")) == 1
    out = capsys.readouterr().out
    assert f"{victim} ({_key(victim)}): shard 1: its record is of another version of the notebook" in out
    assert f"{stray} ({_key(stray)}): shards 1, 2" in out
    rows = {r["student"] for r in json.loads((tmp_path / "merged" / "grades.json").read_text())}
    assert victim not in rows and stray in rows
