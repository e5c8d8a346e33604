"""What the grader vouches for: only this run's outputs, capped as written, nothing loaded from
outside, no formula in any split of the CSV, nothing raw on the terminal, no kernel output in
the grader's records (issue "Grading an adversary, part two", item 5).

The kernel's attacks are graded once, in one `grade` run (`hostile_run`); the rest are unit tests.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import uuid
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import sandbox
from labkit.grading import execute, feedback, gradebook, report, report_html, terminal
from labkit.grading.settings import Limits

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "notebooks" / "01-outbox.ipynb"
MB = 2**20

# --- the kernel's attacks ---------------------------------------------------------------------------

PRINT_50MB = '''\
import sys
line = "x" * 1023 + "\\n"
for _ in range(50 * 1024):  # 50 MB in 1 KB writes
    sys.stdout.write(line)
'''
IMAGE_40MB = '''\
import base64, os
from IPython.display import display
display({"image/png": base64.b64encode(os.urandom(30 * 2**20)).decode()}, raw=True)  # 40 MB of base64
'''
UPDATES = '''\
from IPython.display import display
handles = [display({"text/plain": "."}, raw=True, display_id=True) for _ in range(300)]
for i in range(10_000):  # each display grows to 1 KB: 300 KB in all if nothing stopped it
    handles[i % 300].update({"text/plain": f"{i:05d}" * 200}, raw=True)
display({"text/plain": "again " * 10_000}, raw=True, display_id=handles[0].display_id)  # reuses an id
'''
PROGRESS = '''\
from IPython.display import clear_output
for i in range(3000):  # a progress bar redrawn 3000 times (6 MB in all): only the last frame is held
    clear_output(wait=True)
    print("frame", i, "#" * 2000)
'''
METADATA = '''\
from IPython.display import display
display({"text/plain": "m"}, metadata={"junk": "z" * (20 * 2**20)}, raw=True)
deep = "leaf"
for _ in range(300):
    deep = {"a": deep}
for _ in range(300):  # tiny data, deep metadata: indentation makes each about 90 KB as written
    display({"text/plain": "d"}, metadata={"deep": deep}, raw=True)
'''
WIDGETS = '''\
from comm import create_comm
state = {"_model_module": "@jupyter-widgets/controls", "_model_name": "IntSliderModel", "value": 0}
comm = create_comm(target_name="jupyter.widget", data={"state": state, "buffer_paths": []})
for i in range(20_000):  # 40 MB of widget state updates
    comm.send({"method": "update", "state": {"value": i, "description": "w" * 2000}, "buffer_paths": []})
try:
    import ipywidgets
    from IPython.display import display
    box = ipywidgets.Output()
    display(box)
    with box:  # what an Output widget captures is output of this cell, capped like any other
        print("captured " + "c" * 300_000)
except ImportError:
    pass
print("widgets done")
'''
# The marker is put together at run time: the source itself never holds it.
FDS = '''\
import glob, os
mark = b"PW" + b"NED"
for fd in range(256):
    try:
        os.write(fd, mark + b"-fd-%d\\n" % fd)
    except OSError:
        pass
for path in glob.glob("/proc/self/fd/*"):
    try:
        with open(path, "ab") as fh:
            fh.write(mark + b"-proc\\n")
    except OSError:
        pass
'''
ATTACKS = {"print": PRINT_50MB, "image": IMAGE_40MB, "updates": UPDATES, "progress": PROGRESS,
           "metadata": METADATA, "widgets": WIDGETS}
STORED = "stored by the student, shown as if the grader had run it"
SIGNS = ("=", "+", "-", "@")


def _external_markdown() -> str:
    return ('<img src="http://example.invalid/a.png"> <img src="//example.invalid/b.png"> '
            '<img src="file:///etc/passwd"> <img src="relative.png"> <a href="https://example.invalid/">link</a>\n\n'
            '<div style="background:url(http://example.invalid/bg.png)">bg</div>'
            '<div style="background:u\\72l(http://example.invalid/esc.png)">esc</div>\n\n'
            '<link rel="stylesheet" href="http://example.invalid/s.css">'
            '<meta http-equiv="refresh" content="0;url=http://example.invalid/">\n\n'
            '<svg><image href="http://example.invalid/i.png"/><use href="//example.invalid/u.svg#a"/>'
            '<a href="http://example.invalid/"><text x="1">t</text></a></svg>')


EXTERNAL_OUTPUT = f'''\
from IPython.display import HTML, display
display({{"text/html": {_external_markdown()!r}}}, raw=True)
'''


def hostile_notebook() -> nbformat.NotebookNode:
    nb = nbformat.read(RELEASE, as_version=4)
    stored = nbformat.v4.new_output("display_data", data={"text/plain": STORED, "text/html": f"<b>{STORED}</b>"})
    cells = [nbformat.v4.new_markdown_cell(_external_markdown()),
             nbformat.v4.new_code_cell(EXTERNAL_OUTPUT),
             nbformat.v4.new_code_cell("", outputs=[stored], execution_count=7),  # never run: empty
             nbformat.v4.new_code_cell("1 + 1", outputs=[stored], execution_count=8,
                                       metadata={"tags": ["skip-execution"]}),  # never run: tagged
             nbformat.v4.new_code_cell("print('ran')", outputs=[stored], execution_count=9)]
    cells += [nbformat.v4.new_code_cell(source) for source in ATTACKS.values()]
    cells.append(nbformat.v4.new_code_cell(FDS))  # last: writing into the kernel's sockets may end it
    nb.cells += cells
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"x": STORED}}}
    return nb


HOSTILE_STUDENT = "ev\x1b[2Jil\r\u202eoops\x07\x9b"
CELL_CAP, NOTEBOOK_CAP = 200 * 1024, 768 * 1024


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    if not RELEASE.exists():
        pytest.skip("no released outbox notebook")
    tmp = tmp_path_factory.mktemp("outputs")
    subs, out = tmp / "subs", tmp / "out"
    (subs / HOSTILE_STUDENT).mkdir(parents=True)
    nbformat.write(hostile_notebook(), subs / HOSTILE_STUDENT / "01-outbox.ipynb")
    (subs / "plain").mkdir()
    (subs / "plain" / "notes\x1b]0;title\x07.ipynb").write_text("not json")  # malformed, its name printed
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LABKIT_GRADE_CELL_TIMEOUT": "60",
           "LABKIT_GRADE_NOTEBOOK_TIMEOUT": "400", "LABKIT_GRADE_CELL_OUTPUT": str(CELL_CAP),
           "LABKIT_GRADE_NOTEBOOK_OUTPUT": str(NOTEBOOK_CAP),
           sandbox.UID_ENV: str(sandbox.uid() + 20_000 + os.getpid() % 50_000)}
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (tmp / name.lower()).mkdir()
        env[name] = str(tmp / name.lower())
    flags = [] if sandbox.support().ok else ["--no-sandbox"]
    proc = subprocess.run([sys.executable, "-m", "labkit", "grade", str(subs), "--out", str(out), "--jobs", "1",
                           "--seed", "5", *flags], env=env, capture_output=True, timeout=900, cwd=tmp)
    executed = next((out / "executed").rglob("outbox.ipynb"))
    page = next((out / "feedback").rglob("outbox.html"))
    return {"proc": proc, "out": out, "executed": executed, "page": page, "subs": subs}


@pytest.mark.slow
def test_the_executed_notebook_stays_under_the_cap_and_says_it_was_cut(hostile_run):
    assert hostile_run["proc"].returncode == 0, hostile_run["proc"].stderr[-2000:]
    path = hostile_run["executed"]
    nb = nbformat.read(path, as_version=4)
    bare = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in bare.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    # The file is its cells' sources plus at most the notebook cap of outputs (the grader's
    # verdicts in the check cells count too here: they are small).
    assert path.stat().st_size <= len(nbformat.writes(bare).encode()) + NOTEBOOK_CAP + 64 * 1024
    assert path.stat().st_size < 2 * MB
    by_source = {cell.source: cell for cell in nb.cells if cell.cell_type == "code"}
    for name, source in ATTACKS.items():
        cell = by_source[source]
        text = json.dumps(cell.outputs)
        assert len(text) < CELL_CAP + 64 * 1024, name
        if name != "progress":  # a redrawn bar holds only its last frame: nothing to cut
            assert "the grader cut" in text or "did not apply an update" in text or "no widget state" in text, name
    assert "no widget state" in json.dumps(by_source[ATTACKS["widgets"]].outputs)
    assert "widgets" not in nb.metadata
    page = hostile_run["page"].read_text()
    assert "was too long and was cut" in page


@pytest.mark.slow
def test_stored_outputs_never_survive_and_check_cells_show_only_the_verdict(hostile_run):
    nb = nbformat.read(hostile_run["executed"], as_version=4)
    assert STORED not in hostile_run["executed"].read_text()
    assert STORED not in hostile_run["page"].read_text()
    ran = next(c for c in nb.cells if c.cell_type == "code" and c.source == "print('ran')")
    assert [o.get("text") for o in ran.outputs] == ["ran\n"]
    assert all(c.execution_count is None for c in nb.cells if c.cell_type == "code" and c.source in ("", "1 + 1"))
    checks = [c for c in nb.cells if c.metadata.get("labkit", {}).get("check") is not None]
    assert checks and all(len(c.outputs) == 1 and c.outputs[0]["data"]["text/plain"].startswith(("Step", "Final"))
                          for c in checks)


class Loads(HTMLParser):
    """Everything in a page that could fetch something, and where the CSP meta is."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self.head: list[str] = []
        self.in_head = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "head":
            self.in_head = True
        elif self.in_head:
            self.head.append(tag if tag != "meta" else f"meta {attrs.get('http-equiv') or 'charset'}")
        if tag in ("link", "image", "use", "iframe", "object", "embed", "script", "base", "form") or \
                (tag == "meta" and (attrs.get("http-equiv") or "").lower() == "refresh"):
            self.found.append(f"<{tag}>")
        for name, value in attrs.items():
            value = value or ""
            if name == "src" and not value.startswith(("data:image/png;", "data:image/jpeg;", "data:image/gif;")):
                self.found.append(f"<{tag} src={value[:40]}>")
            if name in ("href", "xlink:href") and not value.startswith("#"):
                self.found.append(f"<{tag} {name}={value[:40]}>")
            if name == "style" and re.search(r"url|\\|image|@", value, re.I):
                self.found.append(f"<{tag} style={value[:40]}>")

    def handle_endtag(self, tag):
        if tag == "head":
            self.in_head = False


def loads(html: str) -> Loads:
    parser = Loads()
    parser.feed(html)
    return parser


@pytest.mark.slow
def test_the_feedback_page_and_report_load_nothing_from_outside(hostile_run):
    for page in [hostile_run["page"], hostile_run["out"] / "report.html"]:
        found = loads(page.read_text())
        assert found.found == [], page
        assert found.head[0] == "meta Content-Security-Policy", found.head
    text = hostile_run["page"].read_text()
    assert feedback.CSP in text and "bg" in text and "esc" in text  # the prose stays, its loads go


@pytest.mark.slow
def test_nothing_the_kernel_writes_to_its_descriptors_reaches_the_graders_records(hostile_run):
    proc, out = hostile_run["proc"], hostile_run["out"]
    holders = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and b"PWNED" in p.read_bytes())
    assert set(holders) <= {str(hostile_run["executed"].relative_to(out)), str(hostile_run["page"].relative_to(out))}
    nb = nbformat.read(hostile_run["executed"], as_version=4)
    for cell in nb.cells:  # where it shows, it is that cell's own output
        if "PWNED" in json.dumps(cell.get("outputs", [])):
            assert cell.source == FDS
    assert b"PWNED" not in proc.stdout and b"PWNED" not in proc.stderr


@pytest.mark.slow
def test_the_terminal_gets_no_control_character_from_a_students_names(hostile_run):
    proc = hostile_run["proc"]
    for stream in (proc.stdout.decode(), proc.stderr.decode()):
        assert not terminal.UNSAFE.search(stream.replace("\n", "")), repr(terminal.UNSAFE.findall(stream))
    assert "ev\\x1b[2Jil\\r\\u202eoops" in proc.stdout.decode()  # shown, escaped
    rows = json.loads((hostile_run["out"] / "grades.json").read_text())
    assert HOSTILE_STUDENT in {r["student"] for r in rows}  # the records keep the real name


# --- without a kernel ---------------------------------------------------------------------------------


def test_safe_shows_every_control_and_bidi_character_as_an_escape():
    text = "a\x1b[2Jb\rc\nd\x7f\x9b\u202e\u2066\u200fé✓"
    shown = terminal.safe(text)
    assert shown == "a\\x1b[2Jb\\rc\\nd\\x7f\\x9b\\u202e\\u2066\\u200fé✓"
    assert terminal.safe_lines("x\x1by\nz") == "x\\x1by\nz"


def test_prepare_keeps_nothing_the_student_stored():
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("stream", name="stdout", text=STORED)
    nb.cells = [nbformat.v4.new_code_cell("", outputs=[out], execution_count=3),
                nbformat.v4.new_code_cell("x", outputs=[out], execution_count=4, metadata={"tags": ["skip-execution"]}),
                nbformat.v4.new_markdown_cell("![p](attachment:p.png) ![s](attachment:s.svg)"),
                nbformat.v4.new_raw_cell("r")]
    nb.cells[2]["attachments"] = {"p.png": {"image/png": "AAAA", "text/html": "<b>x</b>"},
                                  "s.svg": {"image/svg+xml": "<svg onload=alert(1)>"}}
    nb.cells[3]["attachments"] = {"r.png": {"image/png": "AAAA"}}
    nb.metadata["widgets"] = {"state": STORED}
    ready = execute.prepare(nb, skip=set())
    assert [c.get("outputs") for c in ready.cells[:2]] == [[], []]
    assert [c.get("execution_count") for c in ready.cells[:2]] == [None, None]
    assert ready.cells[2]["attachments"] == {"p.png": {"image/png": "AAAA"}}
    assert "attachments" not in ready.cells[3] and "widgets" not in ready.metadata
    assert nb.cells[0].outputs  # the submission itself is left as it was


def _big_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    deep: object = "leaf"
    for _ in range(200):
        deep = {"a": deep}
    nb.cells = [
        nbformat.v4.new_code_cell("a", outputs=[nbformat.v4.new_output("stream", name="stdout", text="\n" * 300_000)]),
        nbformat.v4.new_code_cell("b", outputs=[nbformat.v4.new_output("display_data", data={"text/plain": "x"},
                                                                       metadata={"deep": deep})
                                                for _ in range(40)]),
        nbformat.v4.new_code_cell("c", outputs=[nbformat.v4.new_output("stream", name="stdout", text="y")
                                                for _ in range(30_000)]),
        nbformat.v4.new_code_cell("d", outputs=[nbformat.v4.new_output("display_data", data={
            "image/png": "A" * (3 * MB), "text/plain": "\x00" * 100_000})]),
        nbformat.v4.new_code_cell("verdict", outputs=[nbformat.v4.new_output("display_data",
                                                                             data={"text/plain": "Step 1 " * 90_000})]),
    ]
    return nb


def test_cap_outputs_is_a_guarantee_on_the_written_file():
    nb = _big_notebook()
    keep = {nb.cells[4].id}
    limits = Limits(cell_output_bytes=200 * 1024, notebook_output_bytes=512 * 1024)
    assert execute.outputs_bytes(nb, keep) > 10 * MB
    cut = execute.cap_outputs(nb, limits, keep)
    assert cut == [0, 1, 2, 3]
    assert execute.outputs_bytes(nb, keep) <= limits.notebook_output_bytes
    assert nb.cells[4].outputs[0]["data"]["text/plain"].startswith("Step 1")  # the grader's verdict stays
    for cell in nb.cells[:4]:
        assert "the grader cut" in cell.outputs[-1]["text"]


_TEXT = st.text(alphabet=st.sampled_from(list('a"\\\n\r\t\x00\x1f é€😀<>&')) | st.characters(), max_size=60)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=12)
_OUTPUT = st.one_of(
    st.builds(lambda name, text: nbformat.v4.new_output("stream", name=name, text=text),
              st.sampled_from(["stdout", "stderr"]), _TEXT),
    st.builds(lambda data, meta: nbformat.v4.new_output("display_data", data=data, metadata=meta),
              st.dictionaries(st.sampled_from(["text/plain", "text/html", "image/png", "application/json"]),
                              _TEXT, min_size=1), st.dictionaries(_TEXT, _JSON, max_size=3)),
    st.builds(lambda ename, evalue, tb: nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=tb),
              _TEXT, _TEXT, st.lists(_TEXT, max_size=5)),
)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(_OUTPUT, max_size=4), min_size=1, max_size=4))
def test_the_output_estimate_is_from_above_on_the_written_file(outputs):
    """`cap_outputs` skips writing the notebook when the estimate fits: it must never be below the file."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# lesson\n" * 3)]
    nb.cells += [nbformat.v4.new_code_cell(f"cell {i}", outputs=outs) for i, outs in enumerate(outputs)]
    estimate = sum(execute.output_size(out) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert execute.outputs_bytes(nb, set()) <= estimate


def test_csv_cells_from_the_old_rule_are_still_quoted():
    for cell in ["=1+2", "+SUM(A1)", "-2+3", "@cmd", "\tx", "\rx"]:
        assert gradebook.defuse(cell) == "'" + cell
    assert gradebook.defuse("a;=HYPERLINK(\"http://x\")") == "a;'=HYPERLINK(\"http://x\")"
    assert gradebook.defuse("x\t=1+1") == "x\t'=1+1" and gradebook.defuse('"; -2+3') == '"; \'-2+3'
    assert gradebook.defuse("plain, text - here") == "plain, text - here"
    assert gradebook.defuse(3) == 3


def _fields(line: str, sep: str) -> list[str]:
    return [field.strip('" ') for field in line.split(sep)]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(',;\t\r\n" \'=+-@＝abc\x00\x1f\u3000')) | st.characters(), max_size=40))
def test_no_split_of_a_csv_line_starts_a_field_with_a_formula_sign(text):
    row = gradebook.make_row(student=text, lab="outbox", notebook=text, steps={"1": 1}, max_points=1, status="ok",
                             flags=[text], seed=1, seconds=0.5, message=text)
    written = gradebook.to_csv([row])
    for sep in (",", ";", "\t"):
        for line in re.split(r"[\r\n]", written):
            for field in _fields(line, sep):
                assert not field.startswith(SIGNS), (sep, field, written)
    assert json.loads(json.dumps(row))["student"] == text  # the JSON keeps the real text
    parsed = list(csv.reader(io.StringIO(written, newline="")))[1]
    assert parsed[0].replace("'", "") == text.replace("'", "")  # only quotes were added


def test_the_sanitizer_drops_every_address_that_points_outside():
    html = feedback.clean(_external_markdown() + '<img src="data:image/png;base64,AAAA"><a href="#x">in</a>'
                          '<div style="color:red">c</div>')
    assert loads(html).found == []
    assert 'src="data:image/png;base64,AAAA"' in html and 'href="#x"' in html and "color:red" in html
    assert "example.invalid" not in html


def test_the_report_page_starts_its_head_with_the_csp(tmp_path):
    html = report_html.page(report.build(tmp_path))
    assert loads(html).head[0] == "meta Content-Security-Policy"


def test_the_kernel_never_inherits_the_workers_stdio_or_other_descriptors(tmp_path):
    """The worker's stdout and stderr are its log in --out: a kernel cell writing to every
    descriptor (and reopening /proc/self/fd/*) must not reach it, nor any other open file."""
    from labkit.grading.kernel_box import KernelBox

    log, other = tmp_path / "out" / "worker.log", tmp_path / "out" / "open-record"
    log.parent.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(FDS), nbformat.v4.new_code_cell("print('after')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    uid = sandbox.uid() + 30_000 + os.getpid() % 50_000 if sandbox.support().ok else None
    kernel = KernelBox(tmp_path / "kernel", "outbox", Limits(), f"test-{uuid.uuid4().hex}", uid)
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    record = open(other, "w")  # a file the grader holds open while the kernel runs
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        execute.execute(execute.prepare(nb, set()), kernel, Limits())
        said = kernel.stderr()
    finally:
        kernel.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in (*saved, fd):
            os.close(descriptor)
        record.close()
    assert b"PWNED" not in log.read_bytes() and b"PWNED" not in other.read_bytes()
    assert "PWNED" in said  # what reached the kernel's own stderr: our pipe, kept in memory
    assert len(said.encode()) <= 8192


IGNORES_INTERRUPT = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print('FIRED: ignoring SIGINT', flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_cell_that_ignores_the_interrupt_is_killed_after_the_grace_not_a_second_timeout(tmp_path):
    """A kernel deaf to SIGINT (or whose channels a cell broke) used to hold its job for two
    whole cell timeouts; it is stopped `INTERRUPT_GRACE` after the interrupt, and says so."""
    import dataclasses

    from labkit.grading.kernel_box import KernelBox

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(IGNORES_INTERRUPT), nbformat.v4.new_code_cell("print('after')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    limits = dataclasses.replace(Limits(), cell_timeout=3 * execute.INTERRUPT_GRACE, notebook_timeout=600.0)
    uid = sandbox.uid() + 30_000 + os.getpid() % 50_000 if sandbox.support().ok else None
    kernel = KernelBox(tmp_path / "kernel", "outbox", limits, f"test-{uuid.uuid4().hex}", uid)
    run = execute.prepare(nb, set())
    try:
        result = execute.execute(run, kernel, limits)
    finally:
        kernel.close()
    assert "FIRED: ignoring SIGINT" in "".join(o.get("text", "") for o in run.cells[0].outputs)
    assert result.status == execute.TIMEOUT and result.died_at == 0, result
    assert f"did not stop within {execute.INTERRUPT_GRACE:g} s of an interrupt" in result.message
