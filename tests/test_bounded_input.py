"""Grading an adversary: what a student's files hold stays that student's problem.

Every byte a student controls that the grader parses goes through `labkit.grading.bounded`
(size, nesting depth by a linear pre-scan, counts) before json.loads; every part the grader
walks is shape-checked; each submission is examined in a containment (`batch.examine_contained`)
that turns any failure into that student's `malformed` row. And students are keyed by their real
folder name: `slug` is injective, so no name can take another student's record or page.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.grading import answers, bounded, nbgrader_layout, reveals
from labkit.grading.batch import examine_contained
from labkit.grading.submissions import (
    SLUG_LIMIT,
    NotANotebook,
    Submission,
    examine,
    find,
    page_name,
    read_notebook,
    releases,
    slug,
)
from labkit.labs import available

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "notebooks" / "00-start-here.ipynb"
LAB = "start-here"
DEEP = 100_000

# --- the pre-scan agrees with json.loads ----------------------------------------------------------


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def counts(value) -> tuple[int, int]:
    """(lists and objects, strings and keys)."""
    if isinstance(value, dict):
        inner = [counts(v) for v in value.values()]
        return 1 + sum(c for c, _ in inner), len(value) + sum(s for _, s in inner)
    if isinstance(value, list):
        inner = [counts(v) for v in value]
        return 1 + sum(c for c, _ in inner), sum(s for _, s in inner)
    return 0, int(isinstance(value, str))


# Strings full of what could fool a scanner: quotes, backslashes, brackets, escapes, non-ASCII.
tricky = st.text(alphabet=st.sampled_from('"\\[]{}/\n\t\x00\x7fé€😀u ab'), max_size=12) | st.text(max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky, children, max_size=4),
    max_leaves=40)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from([None, 0, 1, 2]), st.booleans(), st.booleans())
def test_the_scan_measures_exactly_what_json_loads_builds(value, indent, ascii_only, compact):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only,
                      separators=(",", ":") if compact else None)
    data = text.encode("utf-8")
    assert json.loads(data) == value or value != value  # (a float like -0.0 compares equal anyway)
    shape = bounded.scan(data)
    assert shape.depth == depth(value)
    assert (shape.containers, shape.strings) == counts(value)
    assert bounded.loads(data, bounded.Bounds(len(data), depth(value), shape.containers, shape.strings)) == value


@settings(max_examples=300, deadline=None)
@given(json_values, st.floats(0, 1), st.binary(max_size=30) | st.text(alphabet='[]{}"\\,:1 ', max_size=30).map(str.encode))
def test_the_scan_never_says_less_than_json_loads_reaches(value, where, tail):
    """json.loads reads left to right: where it fails, what it read is a prefix of valid JSON,
    nested exactly as deep as the scan of that prefix says; adding bytes after it never lowers
    the scan's answer (an unclosed string only grows, never hides a bracket before it)."""
    data = json.dumps(value).encode()
    cut = data[: int(len(data) * where)]
    assert bounded.scan(cut + tail).depth >= bounded.scan(cut).depth
    try:
        json.loads(cut + tail)
    except ValueError:
        return
    except RecursionError:  # pragma: no cover
        pytest.fail("json.loads recursed past the limit on 60 bytes")


@pytest.mark.parametrize("data", [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP, b"[" * DEEP])
def test_a_file_nested_100000_deep_is_refused_before_json_loads(data, monkeypatch):
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("json.loads saw deep input"))
    with pytest.raises(bounded.Refused, match="nested 100,000 levels deep"):
        bounded.loads(data, bounded.NOTEBOOK)


def test_the_scan_is_linear_on_quotes_that_never_close():
    import time

    for data in (b'"\\"' * 2_000_000, b'\\"' * 2_000_000, b'"' + b'\\' * 4_000_000):
        started = time.monotonic()
        bounded.scan(data)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b'["\\ud800"]', "lone UTF-16 surrogate"),
    (b"[" + b"1" * 5000 + b"]", "not valid JSON"),  # an int past Python's 4300 digits: ValueError
    (b"[" + b'"",' * 60_000 + b'""]', "strings"),
    (b"[" + b"[]," * 20_000 + b"[]]", "lists and objects"),
    (b"x" * (300 * 1024), "larger than"),
])
def test_side_file_bounds(data, words):
    with pytest.raises(bounded.Refused, match=words):
        bounded.loads(data, bounded.SIDE_FILE)


def test_surrogate_pairs_are_characters_not_refused():
    assert bounded.loads(json.dumps(["😀"], ensure_ascii=True).encode(), bounded.SIDE_FILE) == ["😀"]


def test_printable_escapes_control_characters_and_cuts():
    assert bounded.printable("a\nb\x1b[2J\u202e", 300) == "a\\nb\\x1b[2J\\u202e"
    assert len(bounded.printable("x" * 1000, 50)) == 50
    assert bounded.describe(RecursionError("deep\n")) == "RecursionError: deep\\n"


# --- a notebook's shape ---------------------------------------------------------------------------


def notebook(**changes) -> dict:
    nb = json.loads(RELEASE.read_text())
    nb.update(changes)
    return nb


def with_cell(cell) -> bytes:
    nb = notebook()
    nb["cells"].append(cell)
    return json.dumps(nb).encode()


@pytest.mark.parametrize("data, words", [
    (json.dumps(notebook(cells={"0": {"cell_type": "code"}})).encode(), "not a notebook"),
    (json.dumps({"nbformat": 3, "nbformat_minor": 0, "worksheets": [{"cells": []}], "metadata": {}}).encode(),
     "not a notebook"),
    (json.dumps(notebook(nbformat=3)).encode(), "old format"),
    (json.dumps(notebook(nbformat_minor="5")).encode(), "nbformat_minor"),
    (json.dumps(notebook(metadata={"labkit": ["start-here"]})).encode(), "metadata.labkit"),
    (json.dumps(notebook(metadata={"labkit": {"lab": ["x"]}})).encode(), "labkit.lab"),
    (json.dumps(notebook(metadata={"language_info": "python"})).encode(), "language_info"),
    (with_cell({"cell_type": "code", "source": 42}), "source is not text"),
    (with_cell({"cell_type": "code", "source": ["a", 1]}), "source is not text"),
    (with_cell({"cell_type": "code", "source": "", "id": ["x"]}), "id is not text"),
    (with_cell({"cell_type": "code", "source": "", "outputs": {"0": 1}}), "outputs are not a list"),
    (with_cell({"cell_type": "code", "source": "", "outputs": [[]]}), "output_type"),
    (with_cell({"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "text": 7}]}),
     "text is not text"),
    (with_cell({"cell_type": "code", "source": "", "outputs": [{"output_type": "display_data", "data": []}]}),
     "data is not a mapping"),
    (with_cell({"cell_type": "code", "source": "", "outputs": [{"output_type": "error", "traceback": "x"}]}),
     "traceback"),
    (with_cell({"cell_type": "code", "source": "", "metadata": {"tags": "skip"}}), "tags"),
    (with_cell({"cell_type": "code", "source": "", "metadata": {"tags": [1]}}), "tags"),
    (with_cell({"cell_type": "raw", "source": "", "metadata": {"raw_mimetype": {}}}), "raw_mimetype"),
    (with_cell({"cell_type": "markdown", "source": "", "attachments": {"a.png": "x"}}), "attachment"),
    (with_cell(["not", "a", "cell"]), "cell_type"),
    (os.urandom(4096), "not"),
    (b"\x00" * 100, "not valid JSON"),
])
def test_a_wrong_shape_is_a_damaged_notebook_not_an_exception(data, words):
    with pytest.raises(NotANotebook, match=words):
        read_notebook(data)


def test_a_notebook_too_deep_or_with_too_many_cells_is_refused():
    deep = notebook()
    deep["cells"][0]["metadata"]["x"] = json.loads("[" * 61 + "]" * 61)  # 4 + 61 levels
    with pytest.raises(NotANotebook, match="nested"):
        read_notebook(json.dumps(deep).encode())
    many = notebook(cells=[{"cell_type": "raw", "source": ""}] * 10_001)
    with pytest.raises(NotANotebook, match="10,001 cells"):
        read_notebook(json.dumps(many).encode())


def test_the_release_reads_and_multiline_strings_are_joined():
    nb = read_notebook(RELEASE.read_bytes())
    assert nb["metadata"]["labkit"]["lab"] == LAB and all(isinstance(c["source"], str) for c in nb["cells"])
    joined = read_notebook(with_cell({"cell_type": "code", "source": ["a\n", "b"], "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["1\n", "2"]},
        {"output_type": "display_data", "metadata": {}, "data": {"text/plain": ["x", "y"], "application/json": [1]}},
    ]}))
    cell = joined["cells"][-1]
    assert cell["source"] == "a\nb" and cell["outputs"][0]["text"] == "1\n2"
    assert cell["outputs"][1]["data"] == {"text/plain": "xy", "application/json": [1]}
    assert cell["execution_count"] is None


# --- each student examined in a containment -------------------------------------------------------


def honest_notebook() -> bytes:
    return RELEASE.read_bytes()


def reveal_output(step) -> dict:
    return {"output_type": "display_data", "data": {"text/plain": "the reference"},
            "metadata": {"labkit": {"lab": LAB, "revealed": step}}}


def put(top: Path, student: str, data: bytes, files: dict[str, bytes] | None = None,
        name: str = "00-start-here.ipynb") -> Path:
    folder = top / student
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    for rel, content in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    return folder / name


DEEP_JSON = b"[" * DEEP + b"]" * DEEP
MALICIOUS = {
    "deep-notebook": (DEEP_JSON, {}, "nested 100,000 levels deep"),
    "deep-notebook-in-a-cell": (honest_notebook().replace(b'"cells": [', b'"cells": [' + b"[" * DEEP + b"]" * DEEP
                                                         + b",", 1), {}, "nested"),
    "deep-quiz": (honest_notebook(), {f"work/quiz-{LAB}.json": DEEP_JSON}, "work/quiz-start-here.json"),
    "deep-revealed": (honest_notebook(), {f"work/revealed-{LAB}.json": b'{"steps":' + DEEP_JSON + b"}"},
                      "work/revealed-start-here.json"),
    "deep-reveal-output": (with_cell({"cell_type": "code", "source": "", "outputs": [
        reveal_output("1")]}).replace(b'"revealed": "1"', b'"revealed": ' + DEEP_JSON), {}, "nested"),
    "reveal-output-shape": (with_cell({"cell_type": "code", "source": "", "outputs": [reveal_output(["1"] * 9)]}),
                            {}, "lab.reveal"),
    "quiz-shape": (honest_notebook(), {f"work/quiz-{LAB}.json": b'{"answers": [1, 2]}'}, "quiz's answers"),
    "quiz-huge-string": (honest_notebook(), {f"work/quiz-{LAB}.json": b'{"answers": {"q": "' + b"x" * 300_000
                                             + b'"}}'}, "larger than"),
    "quiz-not-utf8": (honest_notebook(), {f"work/quiz-{LAB}.json": b'{"answers": "\xff"}'}, "not UTF-8"),
    "revealed-shape": (honest_notebook(), {f"work/revealed-{LAB}.json": b'{"steps": 3}'}, "record of reveals"),
    "cells-a-dict": (json.dumps(notebook(cells={"0": {}})).encode(), {}, "not a notebook"),
    "source-a-number": (with_cell({"cell_type": "code", "source": 3}), {}, "source is not text"),
    "nbformat-3": (json.dumps({"nbformat": 3, "worksheets": [], "metadata": {}}).encode(), {}, "not a notebook"),
    "not-utf8": (b"\xff" + honest_notebook(), {}, "not UTF-8"),
    "garbage": (bytes(range(256)) * 64, {}, "not"),
    "lone-surrogate": (with_cell({"cell_type": "code", "source": "\ud800"}), {}, "surrogate"),
}


def _examined(top: Path) -> dict[str, Submission]:
    found, skipped = find([top])
    assert skipped == []
    known = releases(ROOT / "notebooks")
    for sub in found:
        examine_contained(sub, known, available())
    return {sub.student: sub for sub in found}


def test_each_malicious_file_is_its_students_problem_and_the_neighbour_is_untouched(tmp_path):
    top = tmp_path / "subs"
    put(top, "honest", honest_notebook(), {f"work/quiz-{LAB}.json": b'{"answers": {}}',
                                           f"work/revealed-{LAB}.json": b'{"lab": "start-here", "steps": {"1": {}}}'})
    for student, (data, files, _) in MALICIOUS.items():
        put(top, student, data, files)
    subs = _examined(top)
    honest = subs.pop("honest")
    assert (honest.lab, honest.problem, honest.revealed) == (LAB, "", ["1"])
    for student, sub in subs.items():
        words = MALICIOUS[student][2]
        assert words in sub.problem, (student, sub.problem)
        assert len(sub.problem) < 500 and "\n" not in sub.problem and sub.revealed == []
    # A refused side file keeps the lab it names (its malformed row stands under the lab).
    assert subs["deep-quiz"].lab == LAB and subs["deep-notebook"].lab is None


@pytest.mark.parametrize("exc", [RecursionError("maximum recursion depth exceeded"), MemoryError(),
                                 TypeError("'int' object is not iterable"), UnicodeError("bad\nline")])
def test_any_exception_while_examining_is_that_students_malformed_row(tmp_path, monkeypatch, exc):
    top = tmp_path / "subs"
    put(top, "honest", honest_notebook())
    put(top, "zed", honest_notebook())
    real = examine

    def exploding(sub, known, labs):
        if sub.student == "zed":
            raise exc
        return real(sub, known, labs)

    monkeypatch.setattr("labkit.grading.submissions.examine", exploding)
    subs = _examined(top)
    assert subs["honest"].problem == "" and subs["honest"].lab == LAB
    assert subs["zed"].problem.startswith(f"The grader could not read this submission ({type(exc).__name__}")
    assert "\n" not in subs["zed"].problem


def test_side_file_readers_treat_absent_and_links_as_none(tmp_path):
    nb = put(tmp_path, "ann", honest_notebook())
    assert answers.read(nb, LAB) is None and reveals.read(nb, LAB, {}, ["1"]) == []
    (tmp_path / "ann" / "work").mkdir()
    (tmp_path / "elsewhere.json").write_text('{"answers": {}}')
    (tmp_path / "ann" / "work" / f"quiz-{LAB}.json").symlink_to(tmp_path / "elsewhere.json")
    assert answers.read(nb, LAB) is None
    (tmp_path / "ann" / "work" / f"revealed-{LAB}.json").write_text('{"lab": "outbox", "steps": {"1": {}}}')
    assert reveals.read(nb, LAB, {}, ["1"]) == []  # another lab's record


def test_a_timestamp_never_raises_and_never_names_a_file(tmp_path, monkeypatch):
    import dateutil.tz

    asked = []
    real = dateutil.tz.gettz
    monkeypatch.setattr(dateutil.tz, "gettz", lambda name=None: asked.append(name) or real(name))
    for text in ["2026-03-02 09:00:00.250000 /etc/shadow", "2026-03-02 09:00:00 ../../../etc/passwd",
                 "2026-03-02 09:00:00 Europe/../../../../etc/passwd", "x" * 500, "2026-03-02\x00",
                 "9" * 90, "2026-13-45 99:99:99 UTC", "\udcff", "[" * 50]:
        nbgrader_layout.parse_utc(text)
    assert not [name for name in asked if "/" in name and (name.startswith("/") or ".." in name)], asked
    assert nbgrader_layout.parse_utc("x" * 500) is None
    assert nbgrader_layout.iso(nbgrader_layout.parse_utc("2026-03-02 09:00:00.250000 UTC")) \
        == "2026-03-02T09:00:00.250000Z"
    nb = put(tmp_path / "subs", "ann", honest_notebook())
    (nb.parent / "timestamp.txt").write_bytes(b"[" * 1024)
    assert nbgrader_layout.submitted_at(nb, tmp_path / "subs") is None


# --- students keyed by their real names -----------------------------------------------------------


def unslug(text: str) -> bytes:
    """The inverse of `slug` below its length limit: every `%XX` back to its byte."""
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] == "%":
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(ord(text[i]))
            i += 1
    return bytes(out)


names = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40) \
    | st.text(alphabet=st.sampled_from("-._%~ aA/\n\u00e9e\u0301"), max_size=12) \
    | st.text(alphabet=st.sampled_from("-%a\u00e9"), min_size=30, max_size=120)


def _safe(part: str) -> None:
    assert part and len(part.encode()) <= SLUG_LIMIT
    assert set(part) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%~")
    assert not part.startswith(".") and "--" not in part and not part.endswith("-")


@settings(max_examples=1000, deadline=None)
@given(names, names)
def test_different_names_never_share_a_slug(a, b):
    _safe(slug(a))
    _safe(slug(b))
    assert (slug(a) == slug(b)) == (a == b)


@settings(max_examples=500, deadline=None)
@given(names)
def test_a_slug_is_reversible_below_its_limit_and_hashed_past_it(name):
    raw = name.encode("utf-8", "surrogatepass")
    made = slug(name)
    if made == "~":
        assert name == ""
    elif "~" in made:
        assert made.endswith(hashlib.sha256(raw).hexdigest())
    else:
        assert unslug(made) == raw


lab_or_file = st.one_of(st.sampled_from(sorted(available())).map(lambda lab: (lab, "x.ipynb")),
                        st.tuples(st.none(), names))


@settings(max_examples=1000, deadline=None)
@given(names, lab_or_file, names, lab_or_file)
def test_different_submissions_never_share_a_key_or_a_page(s1, w1, s2, w2):
    one = Submission(s1, Path("/s") / (w1[1] or "x"), lab=w1[0])
    two = Submission(s2, Path("/s") / (w2[1] or "x"), lab=w2[0])
    same = (s1, w1[0] or ("file", one.path.name)) == (s2, w2[0] or ("file", two.path.name))
    assert (one.key == two.key) == same
    assert ((slug(s1), one.page_name) == (slug(s2), two.page_name)) == same


def test_names_that_old_slugs_merged_stay_apart():
    old = f"a_b-{hashlib.sha256(b'a b').hexdigest()[:8]}"  # what the old slug made of "a b"
    pairs = [("a b", old), ("a b", "a_b"), (".ann", "ann"), ("..", "%2E."), ("caf\u00e9", "cafe\u0301"),
             ("a--b", "a-%2D-b"), ("ada", "ada-"), ("x" * 300, "x" * 299 + "y"), ("a/b", "a%2Fb"), ("", "~")]
    for a, b in pairs:
        assert slug(a) != slug(b), (a, b)
    assert slug("..") == "%2E." and slug("a/b") == "a%2Fb" and slug("ada") == "ada"
    assert not any(lab.startswith("file-") for lab in available())  # a lab's page never meets a file's
    assert page_name(None, "outbox") != page_name("outbox", "x.ipynb")


def test_a_long_name_fits_a_file_name_and_its_feedback_folder_can_be_made(tmp_path):
    name = "\u00e9" * 127 + "\n"  # 255 bytes, each escaped to 3 characters
    made = slug(name)
    assert len(made) <= SLUG_LIMIT and made.endswith(hashlib.sha256(name.encode()).hexdigest())
    key = Submission(name, Path("/s") / ("\u00e9" * 120 + ".ipynb")).key
    (tmp_path / made).mkdir()
    (tmp_path / f".{key}.verdict.abcdefgh.tmp").write_text("x")  # the longest name write_atomic makes


# --- one batch, end to end ------------------------------------------------------------------------

TWINS = ("a b", f"a_b-{hashlib.sha256(b'a b').hexdigest()[:8]}")  # one slug, under the old rule


@pytest.mark.skipif(not RELEASE.exists(), reason="no released start-here notebook")
def test_a_batch_with_malicious_students_grades_the_honest_one_and_keeps_twins_apart(tmp_path):
    top = tmp_path / "subs"
    reference = (ROOT / "solutions" / "warmup.py").read_text()
    from tests.submissions import corpus

    solved = corpus.solved(nbformat.reads(RELEASE.read_text(), as_version=4), corpus.reference_parts(reference),
                           corpus.ALL)
    put(top, "honest", nbformat.writes(solved).encode())
    for twin in TWINS:  # the old slugs collided: one of them vanished from the gradebook
        put(top, twin, b"{}", name="lab.ipynb")
    for student in ("deep-notebook", "deep-quiz", "cells-a-dict", "deep-reveal-output"):
        data, files, _ = MALICIOUS[student]
        put(top, student, data, files)
    out = tmp_path / "out"
    env = {**os.environ, "LABKIT_SANDBOX": "off", "LABKIT_GRADE_CELL_TIMEOUT": "20",
           "LABKIT_GRADE_NOTEBOOK_TIMEOUT": "120",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "labkit", "grade", str(top), "--out", str(out), "--no-sandbox",
                           "--jobs", "1", "--seed", "7"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["student"]: r for r in json.loads((out / "grades.json").read_text())}
    assert set(rows) == {"honest", *TWINS, "deep-notebook", "deep-quiz", "cells-a-dict", "deep-reveal-output"}
    honest = rows["honest"]
    assert (honest["status"], honest["lab"]) == ("ok", LAB) and honest["total"] == honest["max"] > 0, honest
    for student in ("deep-notebook", "deep-quiz", "cells-a-dict", "deep-reveal-output"):
        assert rows[student]["status"] == "malformed" and rows[student]["total"] == 0, rows[student]
        assert MALICIOUS[student][2] in rows[student]["message"], rows[student]
    assert rows["deep-quiz"]["lab"] == LAB  # its lab is known: the row stands under it
    pages = {p.relative_to(out / "feedback").as_posix() for p in (out / "feedback").rglob("*.html")}
    assert {f"{slug(t)}/file-lab.ipynb.html" for t in TWINS} <= pages
    assert f"honest/{LAB}.html" in pages and (out / "executed" / "honest" / f"{LAB}.ipynb").exists()
    keys = {json.loads(p.read_text())["key"] for p in (out / ".results").glob("*.json")}
    assert len(keys) == len(rows)
