"""The second hostile corpus (`tests/submissions/hostile2.py`), graded in ONE batch with honest
neighbours, sandbox on (real bubblewrap), as `tests/test_grading.py` grades the first.

Each entry must get the grade it deserves, and must prove its payload ran inside the sandbox
(`evidence`: text only the payload can have put in `executed/` or in the judge's verdict):
an entry whose evidence is missing fails, it never skips.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest
from catalogue import wrong_file

from labkit import sandbox
from labkit.sandbox import reaper
from tests.submissions import corpus, hostile, hostile2
from tests.test_grading import (
    GRADER_UID,
    ROOT,
    SEED,
    SOURCES,
    check_json,
    grade_cmd,
    grader_env,
    row_points,
    rows_by_student,
    sandbox_uid_processes,
    step_points,
    survivors,
    tree_hash,
    zombie_children,
)

needs_release = pytest.mark.skipif(SOURCES is None, reason="no released lab notebook (run labkit.notebook.build)")
# The batch is graded in the first test's set-up: under CI's load that takes more than the default 300 s.
pytestmark = [needs_release, pytest.mark.slow, pytest.mark.timeout(900)]

UIDS = GRADER_UID + 50  # this batch's block: the first corpus's batch uses the 50 below it
GUARDED = ("checks", "solutions", "notebooks")  # what the deputies aim at (the rest of the tree is others' work)


def _guarded_hash() -> dict[str, str]:
    return {f"{top}/{k}": v for top in GUARDED for k, v in tree_hash(ROOT / top).items()}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):

    if not sandbox.support().ok:
        pytest.fail(f"the hostile corpus must run sandboxed: {sandbox.support().reason}")
    release, reference = SOURCES
    tmp = tmp_path_factory.mktemp("hostile2")
    subs, out, token = tmp / "submissions", tmp / "out", uuid.uuid4().hex
    targets = hostile.Targets(ROOT, subs, out, Path.home(), Path(sys.prefix))
    wrong_mark = wrong_file("outbox", "mark_before_send").read_text()
    entries = hostile2.build(release, reference, targets, wrong_mark=wrong_mark)
    hostile2.write(entries, subs)
    escape_places = [*targets.escape_dirs(), Path(tempfile.gettempdir()), ROOT / "checks", ROOT / "checks" / "outbox"]
    for place in escape_places:
        (place / hostile.ESCAPE).unlink(missing_ok=True)
    guarded_before = _guarded_hash()
    reaper.become_subreaper()
    zombies_before = zombie_children()
    started = time.monotonic()
    env = {**grader_env(tmp, token), sandbox.UID_ENV: str(UIDS)}  # not the first corpus's uids
    proc = subprocess.run(grade_cmd(subs, "--out", out, "--jobs", "2", "--seed", SEED),
                          env=env, capture_output=True, timeout=1200, cwd=tmp)
    seconds = time.monotonic() - started
    running = {"token": survivors(token), "sandbox uids": sandbox_uid_processes(UIDS, 50),
               "zombies handed to this test": sorted(zombie_children() - zombies_before)}
    guarded_after = _guarded_hash()
    points = {}
    for key, source in (("outbox", reference), ("witnessed-wrong", hostile2.witnessed_wrong(release, wrong_mark))):
        module = tmp / f"{key}.py"
        module.write_text(source)
        points[key] = step_points(check_json("outbox", module, SEED))
    print(f"\nhostile2 batch: {len(entries)} entries graded in {seconds:.1f} s", file=sys.stderr)
    return {"entries": entries, "out": out, "proc": proc, "seconds": seconds, "token": token, "subs": subs,
            "points": points, "running": running, "guarded": (guarded_before, guarded_after),
            "escape_places": escape_places}


def _rows(batch) -> dict[str, dict]:
    return rows_by_student(batch["out"])


def _texts(out: Path) -> dict[str, str]:
    """Every executed notebook and feedback page, unescaped (so a quoted message reads as printed)."""
    found = {}
    for top in ("executed", "feedback"):
        for path in (out / top).rglob("*") if (out / top).is_dir() else []:
            if path.is_file():
                text = path.read_text(errors="replace")
                if path.suffix == ".ipynb":
                    text = json.dumps(json.loads(text), ensure_ascii=False)
                    text = text.replace('\\"', '"').replace("\\n", "\n")
                found[str(path)] = html.unescape(text)
    return found


def _said(row: dict | None, feedback: str) -> str:
    """A missing payload's diagnosis: the row's status and what its feedback page says of ends and limits."""
    if row is None:
        return "no row"
    ends = re.findall(r".{0,120}(?:FIRED:|did not|killed|died|budget|could not|ended before|timed out).{0,200}",
                      feedback)
    return f"status {row.get('status')!r} {row.get('message', '')[:200]!r}; feedback: " + " | ".join(ends[:8])


def test_the_batch_finishes_with_a_row_per_student(batch):
    proc = batch["proc"]
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]).decode(errors="replace")
    rows = json.loads((batch["out"] / "grades.json").read_text())
    assert sorted(r["student"] for r in rows) == sorted(e.student for e in batch["entries"])
    assert batch["seconds"] < 600, f"the batch took {batch['seconds']:.0f} s"


def test_each_entry_gets_the_grade_it_deserves(batch):
    rows, wrong = _rows(batch), []
    for entry in batch["entries"]:
        row = rows.get(entry.student)
        if row is None:
            wrong.append(f"{entry.student!r} ({entry.why}): no row")
            continue
        allowed = (entry.status, *entry.alternatives)
        if row["status"] not in allowed:
            wrong.append(f"{entry.student!r} ({entry.why}): status {row['status']!r} not in {allowed} "
                         f"({row.get('message', '')[:300]!r})")
            continue
        if row["status"] in ("malformed", "skipped"):
            if row["total"] != 0:
                wrong.append(f"{entry.student!r}: {row['status']} with {row['total']} points")
            continue
        expected = (batch["points"]["witnessed-wrong"] if entry.earns == "witnessed-wrong"
                    else corpus.deserved(entry, batch["points"]["outbox"]))
        if row_points(row) != expected or row["seed"] != SEED:
            wrong.append(f"{entry.student!r} ({entry.why}):\n  expected {expected}\n  got      {row_points(row)} "
                         f"seed {row['seed']}")
    assert not wrong, "\n".join(wrong)


def test_every_payload_fired_inside_the_sandbox(batch):
    texts, rows, missing = _texts(batch["out"]), _rows(batch), []
    for e in batch["entries"]:
        if rows.get(e.student, {}).get("status") == "malformed" and "malformed" in e.alternatives:
            continue
        own = "\n".join(t for path, t in texts.items() if f"/{e.student}/" in path)
        for item in e.evidence:
            if not any(text in own for text in ((item,) if isinstance(item, str) else item)):
                feedback = "\n".join(t for path, t in texts.items() if f"/feedback/{e.student}/" in path)
                missing.append(f"{e.student!r}: {item!r}; its row says: {_said(rows.get(e.student), feedback)}")
    assert not missing, "no evidence that these payloads ran:\n" + "\n".join(missing)
    rows = _rows(batch)
    for e in batch["entries"]:  # a pipe attack that made its row malformed: the row says why
        if e.status != "malformed" and rows[e.student]["status"] == "malformed":
            assert rows[e.student]["message"], e.student


def test_nothing_is_left_running(batch):
    assert batch["running"] == {"token": [], "sandbox uids": [], "zombies handed to this test": []}
    bwraps = [p for p in os.listdir("/proc") if p.isdigit() and _comm(p) == "bwrap" and _has_token(p, batch["token"])]
    assert bwraps == []
    out = batch["out"]
    assert not (out / ".work").exists() and list((out / ".results").glob("*.running")) == []


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _has_token(pid: str, token: str) -> bool:
    try:
        return token.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_nothing_is_written_outside_out_and_the_course_is_unchanged(batch):
    landed = [str(p / hostile.ESCAPE) for p in batch["escape_places"] if (p / hostile.ESCAPE).exists()]
    assert landed == []
    assert not list(batch["out"].rglob(hostile.ESCAPE))
    before, after = batch["guarded"]
    assert sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)) == []


def test_no_judge_only_secret_reaches_any_page(batch):
    out, texts = batch["out"], _texts(batch["out"])
    honest = "\n".join(t for p, t in texts.items() if "/ada/" in p)
    oracle_lines = {line.strip() for f in (ROOT / "checks").glob("*/oracle.py")
                    for line in f.read_text().splitlines() if len(line.strip()) >= 40}
    oracle_lines = {line for line in oracle_lines if line not in honest}
    shadow = Path("/etc/shadow").read_text().splitlines()[0] if Path("/etc/shadow").exists() else None
    leaks = []
    everything = {**texts, "grades.csv": (out / "grades.csv").read_text(), "report": (out / "report.html").read_text(),
                  "stdout": batch["proc"].stdout.decode(errors="replace"),
                  "stderr": batch["proc"].stderr.decode(errors="replace")}
    for where, text in everything.items():
        leaks += [f"{where}: the test's token (an environment leaked)" for _ in [1] if batch["token"] in text]
        leaks += [f"{where}: /etc/shadow" for _ in [1] if shadow and shadow in text]
        leaks += [f"{where}: oracle line {line[:60]!r}" for line in oracle_lines if line in text]
        leaks += [f"{where}: the reader used the writer's reference" for _ in [1] if "STOLEN AND USED" in text]
    assert leaks == []


def test_terminal_output_carries_no_control_characters(batch):
    for stream in ("stdout", "stderr"):
        text = batch["proc"].__getattribute__(stream).decode(errors="replace")
        bad = sorted({f"U+{ord(c):04X}" for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0
                      or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069})
        assert bad == [], f"{stream}: {bad}"


def test_kernel_stdio_never_reaches_the_grader_or_out(batch):
    out = batch["out"]
    for stream in ("stdout", "stderr"):
        text = getattr(batch["proc"], stream).decode(errors="replace")
        assert hostile2.FDW not in text and hostile2.FLOOD not in text, stream
    own = {"fdw": hostile2.FDW, "flo": hostile2.FLOOD}
    for path in out.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        for student, mark in own.items():
            if mark.encode() in data:
                assert {"executed", "feedback"} & set(path.relative_to(out).parts) and student in path.parts, path
    flo = [p for p in (out / "executed").rglob("*.ipynb") if "flo" in p.parts]
    assert flo and flo[0].stat().st_size < 8 * 2**20, [p.stat().st_size for p in flo]


def test_stored_outputs_never_impersonate_the_verdict(batch):
    olive = Path(batch["subs"] / "olive" / "01-lab.ipynb").read_text()
    assert hostile2.IMPERSONATION in olive  # the forgery was submitted
    found = [str(p) for p in batch["out"].rglob("*") if p.is_file() and hostile2.IMPERSONATION.encode() in p.read_bytes()]
    assert found == []


class _Remote(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self.csp = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "content-security-policy":
            self.csp = True
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "refresh":
            self.found.append("<meta refresh>")
        if tag == "link" and "stylesheet" in (attrs.get("rel") or ""):
            self.found.append(f"<link {attrs.get('href')}>")
        for name, value in attrs.items():
            if value and re.search(r"(https?:)?//", value) and (
                    name in ("src", "srcset", "poster", "background", "data", "content")
                    or (name == "style" and "url(" in value)):
                self.found.append(f"<{tag} {name}={value[:60]}>")


def test_pages_load_nothing_remote_and_carry_a_csp(batch):
    out, problems = batch["out"], {}
    for page in [*(out / "feedback").rglob("*.html"), out / "report.html"]:
        parser = _Remote()
        parser.feed(page.read_text())
        if parser.found or not parser.csp:
            problems[str(page.relative_to(out))] = parser.found + ([] if parser.csp else ["no CSP"])
    assert problems == {}


def test_csv_cells_are_safe_under_comma_semicolon_and_tab(batch):
    text = (batch["out"] / "grades.csv").read_text()
    bad = []
    for line in text.splitlines():
        for sep in (",", ";", "\t"):
            for piece in line.split(sep):
                if piece.lstrip(' "\t\r').startswith(("=", "@", "+")):
                    bad.append(f"{sep!r}: {piece[:50]!r}")
    assert bad == []
    with open(batch["out"] / "grades.csv", newline="") as fh:
        students = [r["student"] for r in csv.DictReader(fh)]
    assert len(students) == len(batch["entries"])


def test_identities_stay_distinct(batch):
    rows = _rows(batch)
    names = ["pat o", "pat_o", "pat?o", "new\nline", "\u202eelif.sh", "L" * 250]
    assert all(n in rows for n in names), sorted(rows)
    assert rows["pat o"]["total"] == sum(batch["points"]["outbox"].values())
    assert rows["pat_o"]["total"] == rows["pat?o"]["total"] == 0
    pages = list((batch["out"] / "feedback").rglob("*.html"))
    assert len(pages) >= len([e for e in batch["entries"] if e.status != "skipped"])
