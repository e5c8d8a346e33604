"""A small synthetic class graded whole and as two shards (separate processes), then merged.

The same run as benchmarks/class_run.py at 200 notebooks, kept small for CI: the generator's
mix of reference, partial, skeleton and wrong notebooks across every lab with a catalogue,
quiz answers and reveals. The merged gradebook must equal the whole run's byte for byte
(timing fields aside), and the class report's figures must equal the counts the generator
knows from how it built each notebook (`classmix.expected`), never the report's own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from labkit.grading import report
from tests.submissions import classmix, corpus
from tests.submissions.gradebooks import differences
from tests.test_grading import grader_env, needs_release

SEED = 7
# Three grade runs of a few notebooks each and a merge: about a minute on a quiet
# 2-core machine, but the fixture counts against pytest's 300 s per test, and a loaded machine
# (seen: load 45) takes longer.
pytestmark = pytest.mark.timeout(1200)


def labkit(*args) -> list[str]:
    return [sys.executable, "-m", "labkit", *map(str, args)]


def covers_enough(entries) -> bool:
    kinds = {e.known.kind for e in entries}
    return {"reference", "wrong"} <= kinds and bool(kinds & {"partial", "skeleton"}) \
        and any(e.known.quiz for e in entries) and any(e.known.revealed for e in entries)


def small_mix():
    """Two students, one notebook per lab each, one in each of two shards: the first mix (by
    seed) with every kind in it. (s002 and s003 fall in different shards; each grade costs a
    notebook's judge and kernel, so the class is as small as covers every kind.)"""
    from labkit.grading.shards import shard_of

    count = 2 * len(classmix.labs())
    return next(entries for entries in (classmix.build(count, seed, first_student=2) for seed in range(1, 50))
                if covers_enough(entries) and {shard_of(e.student, 2) for e in entries} == {1, 2})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    entries = small_mix()
    corpus.write(entries, tmp / "subs")
    env = grader_env(tmp, uuid.uuid4().hex)
    # The grading tests' 5 s per cell is for hostile notebooks; these are honest ones, and a cell
    # that runs over its limit under load would read differently in the two runs (interrupted or
    # stopped): the default limits, as a class would be graded.
    for name in ("LABKIT_GRADE_CELL_TIMEOUT", "LABKIT_GRADE_NOTEBOOK_TIMEOUT", "LABKIT_GRADE_KERNEL_MEMORY"):
        env.pop(name, None)

    def run(*cmds, ok=(0,)):
        procs = [subprocess.Popen(c, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for c in cmds]
        outputs = [p.communicate(timeout=900)[0] for p in procs]
        for proc, out in zip(procs, outputs, strict=True):
            assert proc.returncode in ok, out[-3000:]
        return outputs

    whole = run(labkit("grade", tmp / "subs", "--out", tmp / "whole", "--seed", SEED))[0]
    run(*[labkit("grade", tmp / "subs", "--out", tmp / f"shard-{i}", "--shard", f"{i}/2", "--seed", SEED,
                 "--jobs", 1) for i in (1, 2)])
    merged = run(labkit("merge", tmp / "shard-1", tmp / "shard-2", "--out", tmp / "merged"))[0]
    return tmp, entries, whole, merged


@needs_release
@pytest.mark.slow
def test_the_mix_covers_every_kind_and_both_shards(graded):
    _, entries, _, _ = graded
    assert covers_enough(entries)
    from labkit.grading.shards import shard_of

    assert {shard_of(e.student, 2) for e in entries} == {1, 2}


@needs_release
@pytest.mark.slow
def test_shards_merged_give_the_whole_runs_gradebook_byte_for_byte(graded):
    tmp, entries, _, _ = graded
    assert differences(tmp / "whole", tmp / "merged") == []
    rows = json.loads((tmp / "merged" / "grades.json").read_text())
    assert len(rows) == len(entries)


@needs_release
@pytest.mark.slow
@pytest.mark.parametrize("folder", ["whole", "merged"])
def test_report_figures_equal_the_counts_the_generator_knows(graded, folder):
    tmp, entries, _, _ = graded
    assert classmix.report_problems(report.build(tmp / folder), entries) == []
    assert (tmp / folder / report.REPORT).is_file()


@needs_release
@pytest.mark.slow
def test_the_gradebook_lists_the_steps_each_student_revealed(graded):
    tmp, entries, _, _ = graded
    rows = {(r["student"], r["lab"]): r for r in json.loads((tmp / "whole" / "grades.json").read_text())}
    for entry in entries:
        assert set(rows[(entry.student, entry.lab)]["revealed"]) == set(entry.known.revealed), entry.why


@needs_release
@pytest.mark.slow
def test_grade_and_merge_end_with_the_text_summary(graded):
    _, entries, whole, merged = graded
    for text in (whole, merged):
        assert "Class report:" in text
        for lab in {e.lab for e in entries}:
            students = sum(1 for e in entries if e.lab == lab)
            assert f"{lab}: {students} student(s)" in text
