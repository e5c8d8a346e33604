"""`python -m labkit grade` handles lab 04 notebooks like the others, its servers inside the
judge's box, the students' children reaching them only as their step's least-privilege users.

Three submissions built from the released notebook and the reference module: one solved, one with
only steps 1 and 2 done and a check cell edited, and one solved whose step 8 attacks the servers
(`tests/submissions/hostile_servers.py`) and whose module SIGSTOPs and SIGKILLs every process it
can see when the judge's children import it. The attack must have run (its verdict quotes what
each attempt got), every attempt must have been refused, the servers must have gone on serving
every other step, and nothing of the batch may be left running.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from tests.submissions import corpus, hostile, hostile_servers
from tests.test_grading import grader_env, sandbox_uid_processes, survivors

ROOT = Path(__file__).resolve().parents[1]
SEED = 4242
RELEASE = ROOT / "notebooks" / "04-pipeline.ipynb"
REFERENCE = ROOT / "solutions" / "pipeline.py"


@pytest.mark.slow
def test_grade_scores_lab_04_notebooks_and_the_servers_survive_an_attack(tmp_path):
    release = nbformat.read(RELEASE, as_version=4)
    assert release.metadata["labkit"]["lab"] == "pipeline"
    parts = corpus.reference_parts(REFERENCE.read_text())
    solved = corpus.solved(release, parts, corpus.ALL)
    partial = corpus.solved(release, parts, {"1", "2"})
    edited = next(c for c in partial.cells if c.metadata.get("labkit", {}).get("check") == "3")
    edited.source = "print('all good')"  # the grader restores the released check cell, and flags it
    mal = corpus.solved(release, parts, corpus.ALL)
    corpus._append_to_step(mal, "8", hostile_servers.SERVER_ATTACK)
    hostile._header_first(mal, hostile.in_judged_children(hostile.STOP_ALL + hostile.KILL_ALL))
    subs = tmp_path / "submissions"
    corpus.write([corpus.Entry("ada", "04-pipeline.ipynb", solved, corpus.ALL),
                  corpus.Entry("bo", "04-pipeline.ipynb", partial, frozenset({"1", "2"})),
                  corpus.Entry("mal", "04-pipeline.ipynb", mal, corpus.ALL)], subs)
    token, out = uuid.uuid4().hex, tmp_path / "out"
    env = grader_env(tmp_path, token)
    env["LABKIT_GRADE_NOTEBOOK_TIMEOUT"] = "240"
    proc = subprocess.run([sys.executable, "-m", "labkit", "grade", str(subs), "--out", str(out), "--jobs", "2",
                           "--seed", str(SEED)], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    check = subprocess.run([sys.executable, "-m", "labkit", "check", "pipeline", "--solution", str(REFERENCE),
                            "--seed", str(SEED), "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    reference = {str(s["step"]): s["points"] for s in json.loads(check.stdout)["steps"]}
    assert sum(reference.values()) == 15

    rows = {r["student"]: r for r in json.loads((out / "grades.json").read_text())}
    assert set(rows) == {"ada", "bo", "mal"}
    for row in rows.values():
        assert (row["lab"], row["status"], row["seed"]) == ("pipeline", "ok", SEED), \
            {k: row.get(k) for k in ("student", "status", "message", "flags", "notes")}
    points = {s: {k.removeprefix("step_"): v for k, v in r.items() if k.startswith("step_") or k == "final"}
              for s, r in rows.items()}
    assert points["ada"] == reference
    assert points["bo"] == {k: (v if k in ("1", "2") else 0) for k, v in reference.items()}
    assert any("pipeline-check-3" in flag for flag in rows["bo"]["flags"]), rows["bo"]["flags"]
    assert points["mal"] == {k: (0 if k in ("8", "final") else v) for k, v in reference.items()}, \
        "an attack on the servers must cost its author step 8 and the final check, and nothing else"

    page = (out / "feedback" / "mal" / "pipeline.html").read_text()
    said = re.search(re.escape(hostile_servers.FIRED) + r"([^\n<]*)", page)
    assert said, "no evidence that the attack ran inside the sandbox"
    got = dict(item.rsplit(":", 1) for item in said.group(1).split())
    assert set(got) >= set(hostile_servers.ATTEMPTS), got
    assert [name for name, result in got.items() if result != "no"] == [], said.group(1)

    assert survivors(token) == []
    assert sandbox_uid_processes() == [], "a server or a child of the batch is still running"
