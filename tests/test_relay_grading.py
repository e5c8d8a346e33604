"""`python -m labkit grade` handles lab 03 notebooks like the others (a small, lab-generic run).

Three submissions built from the released notebook and the reference module: one solved, one with
only steps 1 and 2 done and a check cell edited, and one solved whose module SIGSTOPs every process
it can see and then kill(-1)s when the judge's children import it (issue 9's hostile corpus, lab
03's turn: the final check stops and resumes a publisher itself and must not be fooled). The
grader must find the lab from the notebook's metadata, score every step out of the kernel (the
same points `labkit check --seed` gives), restore and flag the edited check cell, and write the
gradebook and the feedback pages.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.grading import gradebook
from labkit.grading.settings import socket_folders
from tests.submissions import corpus, hostile

ROOT = Path(__file__).resolve().parents[1]
SEED = 4242
RELEASE = ROOT / "notebooks" / "03-relay.ipynb"
REFERENCE = ROOT / "solutions" / "relay.py"


def grader_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (tmp / name.lower()).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp / name.lower())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update({"LABKIT_GRADE_NOTEBOOK_TIMEOUT": "180"})
    return env


@pytest.mark.slow
def test_grade_scores_lab_03_notebooks_step_by_step(tmp_path):
    release = nbformat.read(RELEASE, as_version=4)
    assert release.metadata["labkit"]["lab"] == "relay"
    parts = corpus.reference_parts(REFERENCE.read_text())
    subs = tmp_path / "submissions"
    solved = corpus.solved(release, parts, corpus.ALL)
    partial = corpus.solved(release, parts, {"1", "2"})
    edited = next(c for c in partial.cells if c.metadata.get("labkit", {}).get("check") == "3")
    edited.source = "print('all good')"  # the grader restores the released check cell, and flags it
    killer = corpus.solved(release, parts, corpus.ALL)
    hostile._header_first(killer, hostile.in_judged_children(hostile.STOP_ALL + hostile.KILL_ALL))
    corpus.write([corpus.Entry("ada", "03-relay.ipynb", solved, corpus.ALL),
                  corpus.Entry("bo", "my-relay-copy.ipynb", partial, frozenset({"1", "2"})),
                  corpus.Entry("kai", "03-relay.ipynb", killer, corpus.ALL)], subs)
    # A deep output folder: the kernels' unix sockets must not live under it (a socket's path
    # holds 107 bytes; under xdist's tmp_path every notebook once crashed with "File name too long").
    out = tmp_path / ("a-deep-output-folder-" * 6) / "out"
    proc = subprocess.run([sys.executable, "-m", "labkit", "grade", str(subs), "--out", str(out), "--jobs", "2",
                           "--seed", str(SEED)], env=grader_env(tmp_path), capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    check = subprocess.run([sys.executable, "-m", "labkit", "check", "relay", "--solution", str(REFERENCE),
                            "--seed", str(SEED), "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    reference = {str(s["step"]): s["points"] for s in json.loads(check.stdout)["steps"]}
    assert sum(reference.values()) == 13

    keys = [p.stem for p in gradebook.results_dir(out).glob("*.json")]
    assert len(keys) == 3 and not [k for k in keys if socket_folders(out, k)], "socket folders left behind"

    rows = {r["student"]: r for r in json.loads((out / "grades.json").read_text())}
    assert set(rows) == {"ada", "bo", "kai"}
    for row in rows.values():
        assert (row["lab"], row["status"], row["seed"]) == ("relay", "ok", SEED), \
            {k: row.get(k) for k in ("student", "status", "message", "flags", "notes")}
    points = {s: {k.removeprefix("step_"): v for k, v in r.items() if k.startswith("step_") or k == "final"}
              for s, r in rows.items()}
    assert points["ada"] == reference
    assert points["kai"] == reference, "stopping and killing what it can see costs nothing but its own time"
    assert points["bo"] == {k: (v if k in ("1", "2") else 0) for k, v in reference.items()}
    assert rows["ada"]["total"] == 13 and rows["bo"]["total"] == reference["1"] + reference["2"]
    assert any("relay-check-3" in flag for flag in rows["bo"]["flags"]), rows["bo"]["flags"]
    assert not rows["ada"]["flags"] and not rows["kai"]["flags"]

    with open(out / "grades.csv", newline="") as fh:
        header = csv.DictReader(fh).fieldnames
    assert [c for c in header if c.startswith("step_")] == [f"step_{n}" for n in range(1, 9)]
    for student in ("ada", "bo"):
        page = (out / "feedback" / student / "relay.html").read_text()
        assert "Final check" in page and "<script" not in page.lower()
