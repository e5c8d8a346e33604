"""The student edition as students get it: the zip `python -m labkit release X.zip` writes, unpacked
and installed in a fresh venv exactly as the README's student path says, started, and searched
for reference code (the artifact and the installed tree, hidden files included).

CI builds the zip before the tests (.ci/run) and names it in LABKIT_RELEASE_ZIP; this test then
checks that very file. Without it, the test builds one itself. The reference code it searches
for comes from `solutions/*.py` (not from the lesson sources `labkit release` checks itself):
every function body the student notebooks do not show is looked for, whole and line by line.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import parse_python
import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTINCTIVE = 24  # shorter lines ("return True", "con.commit()") are everyone's, not the reference's
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def student_command() -> str:
    """The README's student install-and-start line (the bash block under "### Students")."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Students", 1)[1]
    return re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()


def shown_to_students() -> set[str]:
    """Every line the student notebooks show anyway (skeletons, provided code, prose)."""
    lines = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            lines |= {line.strip() for line in cell.source.splitlines() if line.strip()}
    return lines


def reference_bodies() -> list[tuple[str, str, list[str]]]:
    """(solutions file:function, body text, its distinctive lines) for each reference function
    whose body the notebooks do not show."""
    public = shown_to_students()
    found = []
    for path in sorted((ROOT / "solutions").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(parse_python.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = node.body[1] if ast.get_docstring(node) and len(node.body) > 1 else node.body[0]
            body = textwrap.dedent("\n".join(source.splitlines()[first.lineno - 1:node.end_lineno]))
            lines = [line.strip() for line in body.splitlines()
                     if len(line.strip()) >= DISTINCTIVE and not line.strip().startswith("#")]
            secret = [line for line in lines if line not in public]
            # A body of one distinctive line is a fact the judge must state too: the checkpoint's
            # SELECT (lab 02's `state`), "an int or a finite float" (lab 03's `_finite`). Two or
            # more is a solution.
            if len(secret) >= 2:
                found.append((f"{path.name}:{node.name}", body, secret))
    return found


def text_files(folder: Path):
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".venv" not in p.relative_to(folder).parts[:1]):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".ipynb":  # a notebook's JSON escapes quotes: search its cells' sources
            try:
                cells = json.loads(text).get("cells", [])
                text += "\n" + "\n".join("".join(c.get("source", "")) for c in cells)  # a str or a list of lines
            except (ValueError, AttributeError):
                pass
        yield path, text


def reference_in(folder: Path, bodies) -> list[str]:
    """Files under `folder` holding a reference body whole, or at least half of its distinctive lines."""
    hits = []
    for path, text in text_files(folder):
        present = {line.strip() for line in text.splitlines()}
        for name, body, secret in bodies:
            if body.strip() in text or sum(line in present for line in secret) >= max(1, (len(secret) + 1) // 2):
                hits.append(f"{path.relative_to(folder)} holds {name}")
    return hits


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    given = os.environ.get("LABKIT_RELEASE_ZIP")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("release") / "delivered-twice-student.zip"
    proc = subprocess.run([sys.executable, "-m", "labkit", "release", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_search_finds_reference_code_where_it_is(tmp_path):
    bodies = reference_bodies()
    names = {name.split(":")[1] for name, _, _ in bodies}
    assert len(bodies) >= 25, len(bodies)
    assert {"dispatch", "claim", "complete", "fail", "relay_once", "parse_line", "normalize_sku"} <= names, names
    shutil.copy(ROOT / "solutions" / "relay.py", tmp_path / "notes.txt")
    assert any("solutions" not in hit and "relay.py:claim" in hit for hit in reference_in(tmp_path, bodies))
    shown = tmp_path / "notebooks"
    shown.mkdir()
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, shown / notebook.name)
    assert reference_in(shown, bodies) == []  # what the notebooks show is not counted as a reference


def test_the_artifact_holds_no_reference_code(artifact, tmp_path):
    with zipfile.ZipFile(artifact) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path)
    top = artifact.stem
    inside = [n.removeprefix(f"{top}/") for n in names]
    assert all(n.startswith(f"{top}/") for n in names)
    assert not [n for n in inside if n.startswith(("solutions/", "notebooks/source/", "tests/", "benchmarks/"))]
    assert {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")} <= set(inside)
    assert reference_in(tmp_path, reference_bodies()) == []


def _serving(log: Path, proc: subprocess.Popen, runtime: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"labkit start exited with {proc.returncode}: {log.read_text()[-3000:]}"
        for info in runtime.glob("jpserver-*.json"):
            try:
                port = json.loads(info.read_text())["port"]
                with opener.open(f"http://127.0.0.1:{port}/api/status?token=release-test", timeout=2) as r:
                    if r.status == 200:
                        return port
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.3)
    raise TimeoutError(log.read_text()[-3000:])


def test_the_readme_student_path_installs_starts_and_holds_no_reference(artifact, tmp_path):
    """The README's student line, run in a fresh folder with a new venv; only its start gets this
    test's port, token and Jupyter dirs (`--no-browser`, an ephemeral port)."""
    command = student_command()
    assert "labkit start" in command and "pip install" in command and artifact.name in command, command
    shutil.copy(artifact, tmp_path / artifact.name)
    base = tmp_path / "jupyter"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LABKIT_WORKSPACE")}
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (base / name.lower()).mkdir(parents=True)
        env[name] = str(base / name.lower())
    python = shutil.which("python3.11") or sys.executable
    command = command.replace("python3.11 ", f"{python} ", 2)
    extra = " --no-browser --ip=127.0.0.1 --port=0 --ServerApp.port_retries=0 --IdentityProvider.token=release-test"
    log = tmp_path / "start.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", command + extra], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _serving(log, proc, base / "jupyter_runtime_dir", timeout=600)
        print(f"student path: installed and serving after {time.monotonic() - started:.1f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
    course = tmp_path / artifact.stem
    workspace = course / "workspace"
    assert {p.name for p in (ROOT / "notebooks").glob("*.ipynb")} <= {p.name for p in workspace.glob("*.ipynb")}
    assert (workspace / "work").is_dir()
    assert not (course / "solutions").exists() and not (course / "notebooks" / "source").exists()
    bodies = reference_bodies()
    assert reference_in(course, bodies) == []  # the unpacked course and the workspace
    # What pip installed for the course (its RECORD: the editable finder, the metadata), searched too.
    site = next((course / ".venv" / "lib").glob("python3*/site-packages"))
    record = next(site.glob("delivered_twice-*.dist-info/RECORD"))
    installed = tmp_path / "installed"
    for line in record.read_text().splitlines():
        name = line.split(",")[0]
        if name and (site / name).is_file():
            (installed / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(site / name, installed / name)
    assert reference_in(installed, bodies) == []
    assert not [n for n in record.read_text().splitlines() if n.startswith(("solutions/", "notebooks/"))]
    # A reveal in the student edition says there is none, and records nothing.
    probe = subprocess.run([str(course / ".venv" / "bin" / "python"), "-c",
                            "from labkit.notebook import reveal; print(reveal.reference('outbox', '3'))"],
                           capture_output=True, text=True, timeout=120, cwd=course, env=env)
    assert probe.stdout.strip() == "None", probe.stderr
