"""`python -m labkit grade`: restore, execute, score out of the kernel, contain, record, resume.

The corpus (`tests/submissions/corpus.py`) is built from the released notebook and the
reference module; each submission says which grade it deserves. The reference's own points
come from `python -m labkit check --seed` on the same seed, which also shows that a grade
replays exactly.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from catalogue import wrong_file

from labkit import sandbox
from labkit.grading import answers, gradebook
from labkit.grading.restore import restore
from labkit.grading.settings import MAX_NOTEBOOK_BYTES
from labkit.grading.submissions import (
    NotANotebook,
    Release,
    Submission,
    find,
    identify,
    one_per_lab,
    page_name,
    read_capped,
    read_notebook,
    slug,
)
from labkit.notebook.module_export import assemble, parts_from_notebook
from labkit.sandbox import reaper
from tests.submissions import corpus, hostile

# The corpus is graded in the first test's set-up: under CI's load that takes more than the
# default 300 s.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]
SEED = 4242
TOKEN_VAR = "LABKIT_GRADING_TEST_TOKEN"
SOURCES = corpus.default_sources(ROOT)
needs_release = pytest.mark.skipif(SOURCES is None, reason="no released lab notebook with a labelled "
                                   "reference module yet (run `python -m labkit.notebook.build`)")


# The grader's sandbox uids in these tests (base + 1 + slot): this test process's own, so that
# sandboxed processes of other runs on a shared machine are never counted as ours.
# A block of 100 uids per test process (xdist worker): the grader gives each submission a uid
# of its own, from the base up, so two workers' batches never share one.
GRADER_UID = sandbox.uid() + 10_000 + (os.getpid() % 500) * 100


def grader_env(tmp: Path, token: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (tmp / name.lower()).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp / name.lower())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update({
        TOKEN_VAR: token,  # inherited by every process the grader starts: leftovers are found by it
        sandbox.UID_ENV: str(GRADER_UID),
        "LABKIT_GRADE_CELL_TIMEOUT": "5",
        "LABKIT_GRADE_NOTEBOOK_TIMEOUT": "90",
        "LABKIT_GRADE_KERNEL_MEMORY": str(1200 * 2**20),
    })
    return env


def grade_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "labkit", "grade", *map(str, args)]


def survivors(token: str, wait: float = 5.0) -> list[str]:
    """Command lines of processes still carrying the test's token (waits a little for exits)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes()
                if needle in env:
                    found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def rows_by_student(out: Path) -> dict[str, dict]:
    rows = json.loads((out / "grades.json").read_text())
    return {row["student"]: row for row in rows}


def check_json(lab: str, module: Path, seed: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "labkit", "check", lab, "--solution", str(module),
                           "--seed", str(seed), "--json"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    return json.loads(proc.stdout)


def step_points(verdict: dict) -> dict[str, int]:
    return {str(s["step"]): s["points"] for s in verdict["steps"]}


def row_points(row: dict) -> dict[str, int]:
    return {k.removeprefix("step_"): v for k, v in row.items() if k.startswith("step_") or k == "final"}


# --- the corpus, graded once: honest neighbours and attackers in one batch ---------------------

SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
             ".hypothesis"}  # Hypothesis' example database: other tests write it meanwhile
# At the top of the checkout only: the browser tests' screenshots, written meanwhile by another worker.
SKIP_TOP = {"artifacts"}


def tree_hash(top: Path) -> dict[str, str]:
    """Every path below `top` (never through a link) → its content's hash, or what it is."""
    found = {}
    for root, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (root == str(top) and d in SKIP_TOP)]
        for name in files + [d for d in dirs if Path(root, d).is_symlink()]:
            path = Path(root, name)
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                found[str(path.relative_to(top))] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path.relative_to(top))] = f"mode {info.st_mode:o}"
    return found


def zombie_children() -> set[str]:
    """Zombies among this process's children. Whatever the grader fails to collect re-parents,
    when it exits, to this test process (a subreaper once a test ran the judge in-process)."""
    import psutil

    found = set()
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.add(f"{child.pid} ({child.name()})")
        except psutil.NoSuchProcess:
            continue
    return found


def sandbox_uid_processes(first: int = GRADER_UID, count: int = 50) -> list[str]:
    """Processes running as one of a batch's sandbox uids (one per submission, from the base up)."""
    uids = {first + n for n in range(count)}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    release, reference = SOURCES
    tmp = tmp_path_factory.mktemp("grading")
    subs, out, token = tmp / "submissions", tmp / "out", uuid.uuid4().hex
    targets = hostile.Targets(ROOT, subs, out, Path.home(), Path(sys.prefix))
    entries = corpus.build(release, reference)
    victim = next(e for e in entries if e.student == hostile.VICTIM)
    victim.nb.cells.append(nbformat.v4.new_markdown_cell(f"My notes: {hostile.SECRET}"))
    wrong_lock = wrong_file("outbox", "write_lock_during_send").read_text()
    entries += hostile.build(release, reference, targets, wrong_lock=wrong_lock,
                             vending=corpus.default_sources(ROOT, "vending"))
    corpus.write(entries, subs, outside=tmp / "outside")
    for place in [*targets.escape_dirs(), Path(tempfile.gettempdir())]:
        for name in (corpus.ESCAPE_FILE, hostile.ESCAPE):
            (place / name).unlink(missing_ok=True)
    course_before, subs_before = tree_hash(ROOT), tree_hash(subs)
    reaper.become_subreaper()  # so that what the grader leaves uncollected comes here, to be seen
    zombies_before = zombie_children()
    started = time.monotonic()
    proc = subprocess.run(grade_cmd(subs, "--out", out, "--jobs", "2", "--seed", SEED),
                          env=grader_env(tmp, token), capture_output=True, text=True, timeout=1200, cwd=tmp)
    seconds = time.monotonic() - started
    running = {"token": survivors(token), "sandbox uids": sandbox_uid_processes(),
               "zombies handed to this test": sorted(zombie_children() - zombies_before)}
    gradebook_after = tree_hash(out)
    course_after, subs_after = tree_hash(ROOT), tree_hash(subs)
    points: dict[str, dict[str, int]] = {}
    sources = {"outbox": reference, "vending": corpus.default_sources(ROOT, "vending")[1]}
    for lab, source in sources.items():
        module = tmp / f"reference-{lab}.py"
        module.write_text(source)
        points[lab] = step_points(check_json(lab, module, SEED))
    for n, entry in enumerate(e for e in entries if e.earns):
        module = tmp / f"earns-{n}.py"
        module.write_text(entry.earns)
        points[f"earns:{entry.student}"] = step_points(check_json(entry.lab, module, SEED))
    return {"entries": entries, "out": out, "proc": proc, "seconds": seconds, "token": token,
            "subs": subs, "tmp": tmp, "points": points, "reference": points["outbox"], "lab": "outbox",
            "targets": targets, "running": running, "course": (course_before, course_after),
            "submissions": (subs_before, subs_after), "gradebook_after": gradebook_after}


def deserved_points(entry: corpus.Entry, points: dict) -> dict[str, int]:
    if entry.earns:
        return points[f"earns:{entry.student}"]
    return corpus.deserved(entry, points[entry.lab])


def grade_problems(graded, entries) -> list[str]:
    rows = rows_by_student(graded["out"])
    wrong = []
    for entry in entries:
        row = rows.get(entry.student)
        if row is None:
            wrong.append(f"{entry.student} ({entry.why}): no row")
            continue
        got = {"status": row["status"], "flags": sorted(row["flags"])}
        expected = {"status": entry.status, "flags": sorted(entry.flags)}
        if entry.status not in ("malformed", "skipped"):
            got["points"] = row_points(row)
            expected["points"] = deserved_points(entry, graded["points"])
            got["seed"], expected["seed"] = row["seed"], SEED
        if entry.quiz is not None:
            got["quiz"], expected["quiz"] = row.get("quiz"), entry.quiz
        if got != expected:
            wrong.append(f"{entry.student} ({entry.why}):\n  expected {expected}\n  got      {got}")
    return wrong


@needs_release
@pytest.mark.slow
def test_each_submission_gets_the_grade_it_deserves(graded):
    """Honest neighbours keep every point; every attack gets exactly what its own code earns."""
    proc = graded["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrong = grade_problems(graded, [e for e in graded["entries"] if not e.known_gap])
    assert not wrong, "\n".join(wrong)
    assert len(rows_by_student(graded["out"])) == len(graded["entries"])


@needs_release
@pytest.mark.slow
def test_the_batch_leaves_nothing_running(graded):
    assert graded["running"] == {"token": [], "sandbox uids": [], "zombies handed to this test": []}
    out = graded["out"]
    assert not (out / ".work").exists()
    assert list((out / ".results").glob("*.running")) == []
    assert list((out / ".results").glob("*.verdict")) == []
    time.sleep(9)  # otto's grandchildren would rewrite the gradebook after 8 s
    assert tree_hash(out) == graded["gradebook_after"]


@needs_release
@pytest.mark.slow
def test_the_course_tree_and_the_submissions_are_unchanged(graded):
    """(Editing the checkout while this module runs fails this test, rightly.)"""
    before, after = graded["course"]
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == set()
    before, after = graded["submissions"]
    assert before == after


@needs_release
@pytest.mark.slow
def test_nothing_is_written_outside_the_sandboxes(graded):
    places = [*graded["targets"].escape_dirs(), Path(tempfile.gettempdir())]
    landed = [str(p / name) for p in places for name in (corpus.ESCAPE_FILE, hostile.ESCAPE) if (p / name).exists()]
    assert landed == []
    assert hostile.GHOST not in rows_by_student(graded["out"])
    assert not list(graded["out"].rglob(hostile.ESCAPE)) and not list(graded["out"].rglob(corpus.FORGED_RESULT))


@needs_release
@pytest.mark.slow
def test_no_feedback_page_shows_what_its_student_could_not_read(graded):
    feedback = graded["out"] / "feedback"
    leaks = [str(p) for p in feedback.rglob("*.html")
             if hostile.SECRET in p.read_text() and p.parent.name != hostile.VICTIM]
    assert leaks == []
    for thief in ("rex", "vex"):
        page = next((feedback / thief).glob("*.html")).read_text()
        # The reference's code, the judge's checks: not a line of either. (Its kernel does read
        # the labs' manifests: the steps' titles and points, as the notebook shows.)
        assert "_NoRedirect" not in page and "def check_" not in page and "read refused" in page


@needs_release
@pytest.mark.slow
def test_every_skipped_path_is_listed_with_its_reason(graded):
    rows = rows_by_student(graded["out"])
    reasons = {"thief": "symbolic link", "wanderer": "link to a folder", "fifo": "not a regular file",
               "huge": "larger than"}
    for student, words in reasons.items():
        assert rows[student]["status"] == "skipped" and words in rows[student]["message"], rows[student]
    assert rows[hostile.VICTIM]["total"] == rows[hostile.VICTIM]["max"]  # the thief took nothing
    assert rows[".dotty"]["status"] == "ok"


@needs_release
@pytest.mark.slow
def test_csv_cells_cannot_run_as_formulas(graded):
    with open(graded["out"] / "grades.csv", newline="") as fh:
        students = [r["student"] for r in csv.DictReader(fh)]
    assert "'=1+2" in students and "=1+2" not in students
    assert "=1+2" in rows_by_student(graded["out"])  # the JSON keeps the real name


class ActiveContent(HTMLParser):
    """Collects what could run in a browser: script/iframe/object tags, on* handlers, js: URLs."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "base", "form"):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name in ("href", "src", "action", "formaction", "xlink:href") and value and \
                    value.strip().lower().startswith(("javascript:", "vbscript:", "data:text")):
                self.found.append(f"<{tag} {name}={value[:40]}>")


def active_content(html: str) -> list[str]:
    parser = ActiveContent()
    parser.feed(html)
    return parser.found


@needs_release
@pytest.mark.slow
def test_feedback_pages_carry_no_script_and_no_javascript_url(graded):
    found = {str(p): active_content(p.read_text()) for p in (graded["out"] / "feedback").rglob("*.html")}
    assert {page: what for page, what in found.items() if what} == {}
    assert "alert(6)" in (graded["out"] / "feedback" / "xena" / "outbox.html").read_text()  # shown, as text


def test_the_active_content_finder_finds_what_it_looks_for():
    html = ('<p>ok</p><script>x</script><img src=x onerror=alert(1)><a href=" JavaScript:alert(2)">a</a>'
            '<span>connectionerror javascript: as text</span>')
    assert active_content(html) == ["<script>", "<img onerror=...>", "<a href= JavaScript:alert(2)>"]


@needs_release
@pytest.mark.slow
def test_gradebook_csv_and_json_have_one_row_per_student_and_lab(graded, monkeypatch):
    out = graded["out"]
    with open(out / "grades.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        header, rows = reader.fieldnames, list(reader)
    steps = [c for c in header if c.startswith("step_")]
    assert header[:2] == ["student", "lab"] and steps == [f"step_{n}" for n in range(1, len(steps) + 1)]
    assert header[2 + len(steps):2 + len(steps) + 7] == ["final", "total", "max", "status", "flags", "seed", "seconds"]
    assert sorted(r["student"] for r in rows) == sorted(gradebook.defuse(e.student) for e in graded["entries"])
    assert header[2 + len(steps) + 7:2 + len(steps) + 10] == ["notebook", "message", "sandbox"]
    by_student = {r["student"]: r for r in rows}
    first = corpus.quiz_key("outbox")[0]["id"]
    right = "abcdefgh"[next(i for i, o in enumerate(corpus.quiz_key("outbox")[0]["options"]) if o["correct"])]
    assert by_student["cleo"][f"quiz_{first}"] == right and by_student["cleo"][f"quiz_{first}_correct"] == "true"
    assert by_student["cleo"]["quiz_answered"] == "1" and by_student["ada"][f"quiz_{first}"] == ""
    monkeypatch.setenv(sandbox.UID_ENV, str(GRADER_UID))  # the uid the graded batch ran as
    assert {r["sandbox"] for r in rows} == {sandbox.support().describe}
    assert by_student["max"]["flags"].count("deleted:") == len([c for c in header if c.startswith("step_")]) + 1
    assert by_student["lou"]["status"] == "malformed" and by_student["lou"]["total"] == "0"
    assert "not valid JSON" in by_student["lou"]["message"]
    ada = rows_by_student(out)["ada"]
    assert ada["total"] == sum(graded["reference"].values()) and ada["max"] >= ada["total"]


@needs_release
@pytest.mark.slow
def test_feedback_pages_show_verdicts_and_the_executed_notebook_without_scripts(graded):
    out, lab = graded["out"], graded["lab"]
    for entry in graded["entries"]:
        if entry.status == "skipped":
            continue
        name = page_name(entry.lab if entry.status != "malformed" else None, Path(entry.filename).name)
        page = (out / "feedback" / slug(entry.student) / f"{name}.html").read_text()
        assert page.startswith("<!DOCTYPE html>")
        assert "<script>alert" not in page
        if entry.status != "malformed":
            assert f"lab {entry.lab} —" in page and "as the grader ran it" in page
            assert f"--seed {SEED}" in page
    dan = (out / "feedback" / "dan" / f"{lab}.html").read_text()
    assert "was edited; the original was put back" in dan


@needs_release
@pytest.mark.slow
def test_check_cells_show_the_graders_verdict_not_what_the_kernel_printed(graded):
    nb = nbformat.read(graded["out"] / "executed" / "dan" / f"{graded['lab']}.ipynb", as_version=4)
    checks = [c for c in nb.cells if c.metadata.get("labkit", {}).get("check") is not None]
    texts = ["".join(o.get("data", {}).get("text/plain", "") for o in c.outputs) for c in checks]
    assert all(t.startswith(("Step", "Final")) for t in texts), texts
    assert "PASS" not in "".join(texts)
    assert all("print(" not in c.source for c in checks)


@needs_release
@pytest.mark.slow
def test_huge_output_is_cut_in_the_saved_notebook(graded):
    path = graded["out"] / "executed" / "kim" / f"{graded['lab']}.ipynb"
    assert path.stat().st_size < 2 * 2**20
    assert "the grader cut this cell's output" in path.read_text()


@needs_release
@pytest.mark.slow
def test_memory_hog_hits_the_kernel_limit_and_a_dead_kernel_is_marked(graded):
    hog = (graded["out"] / "executed" / "ivy" / f"{graded['lab']}.ipynb").read_text()
    assert "MemoryError" in hog
    dead = (graded["out"] / "executed" / "gus" / f"{graded['lab']}.ipynb").read_text()
    assert "[grader] The kernel died while running cell" in dead


@needs_release
@pytest.mark.slow
def test_check_with_the_recorded_seed_replays_a_partial_grade(graded):
    row = rows_by_student(graded["out"])["cleo"]
    nb = nbformat.read(graded["subs"] / "cleo" / "Untitled3.ipynb", as_version=4)
    module = graded["tmp"] / "cleo.py"
    module.write_text(assemble(parts_from_notebook(nb)))
    assert step_points(check_json(row["lab"], module, row["seed"])) == row_points(row)


@needs_release
@pytest.mark.slow
def test_a_rerun_regrades_nothing(graded):
    out = graded["out"]
    before = {p.name: p.read_text() for p in (out / ".results").glob("*.json")}
    proc = subprocess.run(grade_cmd(graded["subs"], "--out", out, "--jobs", "2"), capture_output=True,
                          text=True, timeout=120, env=grader_env(graded["tmp"], graded["token"]))
    assert proc.returncode == 0, proc.stderr
    assert "grading 0 notebook(s)" in proc.stdout and f"{len(before)} already graded" in proc.stdout
    assert {p.name: p.read_text() for p in (out / ".results").glob("*.json")} == before


# --- interrupted and resumed ---------------------------------------------------------------------


def _finished(out: Path) -> dict[str, float]:
    done = {}
    for path in (out / ".results").glob("*.json") if (out / ".results").is_dir() else []:
        data = gradebook.read_result(path)
        if data is not None:
            done[path.stem] = data["graded_at"]
    return done


@needs_release
@pytest.mark.slow
def test_sigkill_halfway_then_rerun_keeps_every_grade_once(tmp_path, request):
    release, reference = SOURCES
    parts = corpus.reference_parts(reference)
    steps = [p for p in parts if p != "header"]
    names = [f"s{n}" for n in range(4)]
    for n, student in enumerate(names):  # cheap notebooks: each solves a different prefix of steps
        nb = corpus.solved(release, parts, set(steps[: n % 3]))
        path = tmp_path / "subs" / student / "lab.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    out, token = tmp_path / "out", uuid.uuid4().hex
    env = grader_env(tmp_path, token)
    cmd = grade_cmd(tmp_path / "subs", "--out", out, "--jobs", "2", "--seed", SEED)
    # A SIGKILLed grader cannot remove multiprocessing's folder (pymp-*, the forkserver's socket):
    # its temp dir is one of the test's, short enough for a socket's path.
    own_tmp = tempfile.mkdtemp(prefix="lk-killed-")
    os.chmod(own_tmp, 0o711)
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    first = subprocess.Popen(cmd, env={**env, "TMPDIR": own_tmp}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while len(_finished(out)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)  # the grader only: its workers must notice by themselves
    first.wait()
    before = _finished(out)
    assert 2 <= len(before) < len(names), "the grader was not stopped halfway"

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    after = _finished(out)
    assert sorted(after) == sorted(f"{s}--{release.metadata['labkit']['lab']}" for s in names)
    assert {k: after[k] for k in before} == before, "a finished grade was graded again"
    rows = json.loads((out / "grades.json").read_text())
    assert sorted(r["student"] for r in rows) == names
    # The rerun's kernels must not meet what the killed run left (they once shared a socket folder).
    assert [(r["student"], r["status"], r["message"]) for r in rows if r["status"] != "ok"] == []
    took = re.search(r"feedback in .* \(([\d.]+) s\)", second.stdout)
    assert took and float(took.group(1)) < 300, second.stdout  # the rerun's own time, not the clock's
    with open(out / "grades.csv", newline="") as fh:
        assert sorted(r["student"] for r in csv.DictReader(fh)) == names
    assert survivors(token) == []
    assert list((out / ".results").glob("*.running")) == [] and not (out / ".work").exists()
    reap_orphans()


def reap_orphans() -> None:
    """The grader was SIGKILLed on purpose: what it had started re-parents to this test process
    (a subreaper once any test ran the judge in-process) and must be collected here."""
    import psutil

    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


# --- the command line -------------------------------------------------------------------------------


def test_usage_errors_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    for args in ([tmp_path / "missing", "--out", tmp_path / "o"],
                 [tmp_path / "empty", "--out", tmp_path / "o"],
                 [tmp_path / "empty", "--out", tmp_path / "o", "--jobs", "0"],
                 [tmp_path / "empty"]):
        proc = subprocess.run(grade_cmd(*args), capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "error" in proc.stderr


def test_a_batch_of_broken_files_completes_with_exit_0(tmp_path):
    unknown = nbformat.writes(nbformat.v4.new_notebook(metadata={"labkit": {"lab": "nope"}})).encode()
    broken = {"a": b"", "b": b"[1, 2]", "c": b"\xff\xfe\x00", "d": b'{"cells": []}', "e": unknown}
    for student, data in broken.items():
        (tmp_path / "subs" / student).mkdir(parents=True)
        (tmp_path / "subs" / student / "lab.ipynb").write_bytes(data)
    out = tmp_path / "out"
    proc = subprocess.run(grade_cmd(tmp_path / "subs", "--out", out), capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "grades.json").read_text())
    assert [(r["student"], r["status"], r["total"]) for r in rows] == [(s, "malformed", 0) for s in "abcde"]
    assert all(r["message"] for r in rows) and "does not know" in rows[-1]["message"]
    assert all((out / "feedback" / s / "file-lab.ipynb.html").exists() for s in "abcde")


def test_one_notebook_per_student_and_lab_the_one_named_like_the_release(tmp_path):
    paths = []
    for name in ("01-outbox.ipynb", "01-outbox-Copy1.ipynb"):
        paths.append(tmp_path / name)
        paths[-1].write_text("{}")
    subs = [Submission("ann", p, lab="outbox") for p in paths]
    os.utime(paths[0], (1, 1))  # older, but named like the release
    release = Release("outbox", Path("notebooks/01-outbox.ipynb"), {"cells": []})
    chosen = one_per_lab(subs, {"outbox": release})
    assert [(c.path.name, c.flags) for c in chosen] == [("01-outbox.ipynb", ["ignored:01-outbox-Copy1.ipynb"])]


# --- restore, identify, read: no kernel needed -------------------------------------------------


def _lab_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(metadata={"labkit": {"lab": "outbox"}})

    def cell(kind, gid, source, locked=True, markdown=False):
        make = nbformat.v4.new_markdown_cell if markdown else nbformat.v4.new_code_cell
        c = make(source, id=gid)
        c.metadata = {"nbgrader": {"grade_id": gid, "locked": locked}}
        if kind == "check":
            c.metadata["labkit"] = {"check": gid.rsplit("-", 1)[1]}
        return c

    nb.cells = [cell("md", "lab-md-0", "# Lab", markdown=True),
                cell("setup", "lab-setup", "lab = Lab('outbox')"),
                cell("step", "lab-code-1", "%%step 1\ndef f(): raise NotImplementedError", locked=False),
                cell("check", "lab-check-1", "lab.check(1)"),
                cell("step", "lab-code-2", "%%step 2\ndef g(): raise NotImplementedError", locked=False),
                cell("check", "lab-check-2", "lab.check(2)")]
    return nb


def _sources(nb) -> list[str]:
    return [c.source for c in nb.cells]


def test_restore_puts_back_edited_deleted_and_copied_check_cells_and_flags_them():
    release = _lab_notebook()
    sub = _lab_notebook()
    sub.cells[3].source = "print('PASS')"  # edited
    copy = nbformat.from_dict(json.loads(json.dumps(sub.cells[3])))
    sub.cells.insert(5, copy)  # duplicated (after step 2)
    del sub.cells[6]  # check 2 deleted
    sub.cells.insert(2, nbformat.v4.new_code_cell("print('scratch')", id="mine"))  # unknown: stays
    sub.cells[3].source = "%%step 1\ndef f(): return 1"  # the student's step code: stays
    done = restore(sub, release)
    assert done.flags == ["edited:lab-check-1", "duplicated:lab-check-1", "deleted:lab-check-2"]
    assert _sources(done.nb) == ["# Lab", "lab = Lab('outbox')", "print('scratch')", "%%step 1\ndef f(): return 1",
                                 "lab.check(1)", "%%step 2\ndef g(): raise NotImplementedError", "lab.check(2)"]
    ids = [c.id for c in done.nb.cells]
    assert len(set(ids)) == len(ids) and {"lab-check-1", "lab-check-2"} <= done.released_ids


def test_restore_leaves_an_untouched_notebook_alone_and_takes_the_kernel_from_the_release():
    release, sub = _lab_notebook(), _lab_notebook()
    sub.metadata["kernelspec"] = {"name": "evil", "display_name": "evil", "language": "python"}
    release.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    done = restore(sub, release)
    assert done.flags == [] and _sources(done.nb) == _sources(release)
    assert done.nb.metadata["kernelspec"]["name"] == "python3"


def test_a_student_cell_never_keeps_a_released_id():
    release, sub = _lab_notebook(), _lab_notebook()
    sub.cells.append(nbformat.v4.new_code_cell("x = 1", id="lab-check-1"))
    done = restore(sub, release)
    assert [c.id for c in done.nb.cells].count("lab-check-1") == 1


def test_the_lab_comes_from_metadata_or_released_cells_never_the_file_name():
    nb = json.loads(nbformat.writes(_lab_notebook()))
    release = Release("outbox", Path("01-outbox.ipynb"), json.loads(json.dumps(nb)))
    assert identify(nb, {"outbox": release}) == "outbox"
    nb["metadata"].pop("labkit")
    assert identify(nb, {"outbox": release}) == "outbox"  # by its cells' grade ids
    for cell in nb["cells"]:
        cell["metadata"] = {}
    assert identify(nb, {"outbox": release}) is None


@pytest.mark.parametrize("data, words", [
    (b"", "not valid JSON"), (b"{oops", "not valid JSON"), (b"\xff\xfe", "not UTF-8"),
    (b'{"a": 1}', "not a notebook"), (b'{"cells": [], "nbformat": 3}', "old format"),
    (b'{"cells": [{"cell_type": "spam"}], "nbformat": 4}', "damaged"),
])
def test_unreadable_files_say_why(data, words):
    with pytest.raises(NotANotebook, match=words):
        read_notebook(data)


def test_csv_orders_steps_numerically_and_flattens_quiz_answers():
    quiz = {"lab": "x", "answers": {"q1": {"choice": 2, "correct": False}}}
    rows = [gradebook.make_row(student="a", lab="x", notebook="a.ipynb",
                               steps={"1": 1, "2": 0, "10": 2, "final": 3}, max_points=9, status="ok",
                               flags=["edited:x-check-1"], seed=1, seconds=1.234, quiz=quiz),
            gradebook.make_row(student="b", lab="", notebook="b.ipynb", steps={}, max_points=0,
                               status="malformed", flags=[], seed=None, seconds=0, message="not JSON")]
    text = gradebook.to_csv(rows)
    header = text.splitlines()[0].split(",")
    assert header == ["student", "lab", "step_1", "step_2", "step_10", "final", "total", "max", "status",
                      "flags", "seed", "seconds", "notebook", "message", "sandbox", "quiz_q1", "quiz_q1_correct"]
    assert text.splitlines()[1] == "a,x,1,0,2,3,6,9,ok,edited:x-check-1,1,1.23,a.ipynb,,,c,false"


# --- discovery, answers, CSV: no kernel needed ------------------------------------------------


def test_discovery_never_follows_links_and_lists_what_it_leaves_out(tmp_path):
    subs = tmp_path / "subs"
    for student in ("ann", ".dot", "bob"):
        (subs / student).mkdir(parents=True)
    (subs / "ann" / "lab.ipynb").write_text("{}")
    (subs / ".dot" / "lab.ipynb").write_text("{}")
    (subs / "bob" / "lab.ipynb").symlink_to(subs / "ann" / "lab.ipynb")
    os.mkfifo(subs / "bob" / "pipe.ipynb")
    (subs / "bob" / "big.ipynb").write_bytes(b" " * (MAX_NOTEBOOK_BYTES + 1))
    (subs / "ann" / ".ipynb_checkpoints").mkdir()
    (subs / "ann" / ".ipynb_checkpoints" / "lab-checkpoint.ipynb").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.ipynb").write_text("{}")
    (subs / "bob" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    found, skipped = find([subs])
    assert sorted((s.student, s.path.name) for s in found) == [(".dot", "lab.ipynb"), ("ann", "lab.ipynb")]
    reasons = {(s.student, s.path.name): s.reason for s in skipped}
    assert "symbolic link" in reasons[("bob", "lab.ipynb")]
    assert "not a regular file" in reasons[("bob", "pipe.ipynb")]
    assert "larger than" in reasons[("bob", "big.ipynb")]
    assert "link to a folder" in reasons[("bob", "linked")]
    assert "autosave" in reasons[("ann", ".ipynb_checkpoints")]


def test_a_hard_link_under_two_students_is_graded_for_both_and_flagged(tmp_path):
    (tmp_path / "ann").mkdir()
    (tmp_path / "bob").mkdir()
    (tmp_path / "ann" / "lab.ipynb").write_text("{}")
    os.link(tmp_path / "ann" / "lab.ipynb", tmp_path / "bob" / "lab.ipynb")
    found, _ = find([tmp_path])
    assert sorted((s.student, s.flags) for s in found) == [("ann", ["same-file:bob"]), ("bob", ["same-file:ann"])]


def test_read_capped_refuses_links_fifos_and_files_past_the_cap_without_blocking(tmp_path):
    (tmp_path / "ok").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    os.mkfifo(tmp_path / "fifo")
    assert read_capped(tmp_path / "ok", 5) == b"12345"
    for name, words in (("link", "symbolic link"), ("fifo", "not a regular file")):
        with pytest.raises(OSError, match=words):
            read_capped(tmp_path / name, 100)
    with pytest.raises(OSError, match="larger than"):
        read_capped(tmp_path / "ok", 4)


def test_quiz_correctness_comes_from_the_key_not_the_file():
    key = corpus.quiz_key("outbox")
    q = key[0]
    wrong = next(i for i, o in enumerate(q["options"]) if not o["correct"])
    raw = {"answers": {q["id"]: {"choice": wrong, "correct": True, "first_choice": wrong, "first_correct": True},
                       "invented": {"choice": 0, "correct": True},
                       key[1]["id"]: {"choice": 99, "correct": True}}, "answered": 9}
    scored = answers.score("outbox", raw)
    assert scored["answers"] == {q["id"]: {"choice": wrong, "option": q["options"][wrong]["text"], "correct": False,
                                           "first_choice": wrong, "first_correct": False, "attempts": 1}}
    assert (scored["answered"], scored["correct_first_time"], scored["questions"]) == (1, 0, len(key))


@pytest.mark.parametrize("cell", ["=1+2", "+SUM(A1)", "-2+3", "@cmd", "\tx", "\rx"])
def test_a_csv_cell_that_starts_like_a_formula_is_quoted(cell):
    row = gradebook.make_row(student=cell, lab="x", notebook=cell, steps={"1": 1}, max_points=1, status="ok",
                             flags=[], seed=1, seconds=0.0, message=cell)
    line = list(csv.reader(io.StringIO(gradebook.to_csv([row]), newline="")))[1]
    assert line[0] == "'" + cell and line[-2] == "'" + cell  # student, message
    assert line[2] == "1"  # numbers stay numbers


def test_the_sanitizer_keeps_text_and_pictures_and_drops_what_runs():
    from labkit.grading.feedback import clean

    html = ('<p class="x">hi</p><script>alert(1)</script><a href="javascript:alert(2)">j</a>'
            '<img src="data:image/png;base64,AAAA"><img src="data:image/svg+xml,<svg onload=alert(3)>">'
            '<div onclick="alert(4)" style="color:red;position:fixed">d</div><svg><text x="1">t</text></svg>')
    out = clean(html)
    assert active_content(out) == []
    assert '<p class="x">hi</p>' in out and 'data:image/png;base64,AAAA' in out and "<text" in out
    assert "position" not in out and "color:red" in out


def test_grade_refuses_without_a_sandbox_unless_told(tmp_path):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    (tmp_path / "subs" / "ann" / "lab.ipynb").write_text("{}")
    env = {**os.environ, "LABKIT_SANDBOX": "off"}
    refused = subprocess.run(grade_cmd(tmp_path / "subs", "--out", tmp_path / "o"), capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=env)
    assert refused.returncode == 2 and "--no-sandbox" in refused.stderr and not (tmp_path / "o").exists()
    allowed = subprocess.run(grade_cmd(tmp_path / "subs", "--out", tmp_path / "o", "--no-sandbox"),
                             capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert [r["sandbox"] for r in json.loads((tmp_path / "o" / "grades.json").read_text())] == ["none (--no-sandbox)"]


# --- interop with nbgrader --------------------------------------------------------------------------


def _nbgrader_python() -> str | None:
    for python in (sys.executable, os.environ.get("LABKIT_NBGRADER_PYTHON")):
        if python and subprocess.run([python, "-c", "import nbgrader"], capture_output=True).returncode == 0:
            return python
    return None


@needs_release
@pytest.mark.slow
def test_nbgrader_generate_assignment_and_autograde_complete_on_the_release(tmp_path):
    python = _nbgrader_python()
    if python is None:
        pytest.skip("nbgrader is not installed (pip install nbgrader, or set LABKIT_NBGRADER_PYTHON "
                    "to an interpreter that has it)")
    release, reference = SOURCES
    course = tmp_path / "course"
    (course / "source" / "lab").mkdir(parents=True)
    (course / "submitted" / "ada" / "lab").mkdir(parents=True)
    nbformat.write(release, course / "source" / "lab" / "lab.ipynb")
    nbformat.write(corpus.solved(release, corpus.reference_parts(reference), corpus.ALL),
                   course / "submitted" / "ada" / "lab" / "lab.ipynb")
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'dtao'\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{course}/gradebook.db'\n"
        "c.Execute.timeout = 300\n")
    env = grader_env(tmp_path, uuid.uuid4().hex)
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env["PATH"]])  # alembic
    for step in (["generate_assignment", "lab", "--create", "--force"], ["autograde", "lab", "--create"]):
        proc = subprocess.run([python, "-m", "nbgrader", *step], cwd=course, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    score = subprocess.run(
        [python, "-c", "from nbgrader.api import Gradebook\n"
                       f"with Gradebook('sqlite:///{course}/gradebook.db') as gb:\n"
                       "    s = gb.find_submission('lab', 'ada'); print(s.score, s.max_score)"],
        capture_output=True, text=True, env=env, timeout=120)
    got, most = map(float, score.stdout.split()[-2:])
    assert most == sum(c.metadata["nbgrader"].get("points", 0) for c in release.cells
                       if c.metadata.get("nbgrader", {}).get("grade"))
    # The reference passes every check cell, so nbgrader must give it every point (it used to
    # accept any score above 0, which a single passing cell would have met).
    assert got == most, _failed_grade_cells(course / "autograded" / "ada" / "lab" / "lab.ipynb")
    shutil.rmtree(course / "autograded", ignore_errors=True)


def _failed_grade_cells(path: Path) -> dict[str, str]:
    """The graded cells of nbgrader's autograded copy that raised: what the check showed (its
    failing cases, not the traceback's ANSI colours), then the error's last line."""
    nb = nbformat.read(path, as_version=4)
    found = {}
    for cell in nb.cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not cell.metadata.get("nbgrader", {}).get("grade") or not errors:
            continue
        shown = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)
        lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", shown).splitlines() if line.strip()]
        found[cell.metadata["nbgrader"].get("grade_id", "?")] = "\n".join(lines[:12] + [
            f"{errors[0].get('ename')}: {errors[0].get('evalue')}"])
    return found


# --- a kernel that fails to start ------------------------------------------------------------


def _flaky_client(failures: int):
    """A GradingClient whose first `failures` starts fail before any cell runs."""
    from labkit.grading import execute as execute_mod

    calls = {"n": 0}

    class Flaky(execute_mod.GradingClient):
        def execute(self, **kwargs):
            calls["n"] += 1
            if calls["n"] <= failures:
                raise RuntimeError("Kernel didn't respond in 60 seconds")
            return super().execute(**kwargs)

    return Flaky, calls


@pytest.mark.parametrize("failures, status", [(1, "ok"), (2, "crashed")])
def test_a_kernel_that_fails_to_start_gets_one_fresh_try(tmp_path, monkeypatch, failures, status):
    from labkit.grading import execute as execute_mod
    from labkit.grading.kernel_box import KernelBox
    from labkit.grading.settings import Limits

    flaky, calls = _flaky_client(failures)
    monkeypatch.setattr(execute_mod, "GradingClient", flaky)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('ran')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    uid = sandbox.uid() + 1 if sandbox.support().ok else None
    kernel = KernelBox(tmp_path / "kernel", "outbox", Limits(), f"test-{uuid.uuid4().hex}", uid)
    try:
        result = execute_mod.execute(nb, kernel, Limits())
    finally:
        kernel.close()
    assert result.status == status, result.message
    assert calls["n"] == 2 and result.start_retries == 1
    if status == "ok":
        assert "ran" in nb.cells[0].outputs[0]["text"]
    else:
        assert "Kernel didn't respond" in result.message


def test_a_rerun_never_shares_a_work_or_socket_folder_with_a_killed_run(tmp_path):
    """A killed grader's worker may still be cleaning up when the rerun grades the same
    submission: its folders are its run's own, so its clean-up cannot take the rerun's files
    (seen in CI: the rerun's module vanished mid-grade, FileNotFoundError, row crashed)."""
    from labkit.grading.settings import socket_folder, work_folder

    key, killed, rerun = "s3--outbox", reaper.new_marker(), reaper.new_marker()
    for folder_of in (work_folder, socket_folder):
        old, new = folder_of(tmp_path, key, killed), folder_of(tmp_path, key, rerun)
        new.mkdir(parents=True)
        (new / "worker.py").write_text("kept")
        shutil.rmtree(old, ignore_errors=True)  # the killed run's worker, cleaning up late
        assert (new / "worker.py").read_text() == "kept"
        shutil.rmtree(new)
