"""Labs are packages of content found through data-only manifests (labkit/labs.py).

The kernel, the grader and the sandbox read manifests; only the judge imports a lab's checks,
and the checks take their step table from the manifest, so the two cannot disagree."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import import_graph
import pytest

from labkit import labs
from labkit.judge.run import lab_spec

ROOT = Path(__file__).resolve().parents[1]
LABS = labs.available()


def test_every_lab_under_checks_is_found_in_the_course_order():
    folders = sorted(p.parent.name for p in (ROOT / "checks").glob("*/lab.py"))
    assert sorted(labs.manifest(name).package.split(".")[1] for name in LABS) == folders
    assert LABS[:2] == ["start-here", "outbox"]


@pytest.mark.parametrize("lab", LABS)
def test_a_labs_checks_follow_its_manifest_and_its_files_exist(lab):
    manifest, spec = labs.manifest(lab), labs.load(lab)
    assert [(str(s.step), s.title, s.points, tuple(s.requires)) for s in spec.steps] == \
        [(str(s.step), s.title, s.points, s.requires) for s in manifest.steps]
    assert spec.module_name == manifest.module_name
    for part in manifest.probes:
        assert manifest.path(part).is_file(), part
    if manifest.quiz:
        assert manifest.path(manifest.quiz).is_file()
    assert (ROOT / "solutions" / manifest.module_file).is_file()


def test_a_check_without_a_step_or_a_step_without_a_check_fails_on_import(monkeypatch):
    import toylab.lab

    with pytest.raises(labs.ManifestError, match="differ"):
        lab_spec("toylab", {1: toylab.lab.check_half, 2: toylab.lab.check_half})
    with pytest.raises(labs.ManifestError, match="differ"):
        lab_spec("toylab", {})


def test_a_malformed_manifest_names_its_file(tmp_path):
    (tmp_path / "manifest.toml").write_text('name = "x"\n[[steps]]\nstep = 1\n')
    with pytest.raises(labs.ManifestError, match="manifest.toml"):
        labs.read(tmp_path, "x")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(import_graph.parse(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # a submodule, maybe
    return {name for name in found if name.split(".")[0] != "checks"
            or (ROOT / (name.replace(".", "/") + ".py")).is_file() or (ROOT / name.replace(".", "/")).is_dir()}


def test_labkit_never_imports_a_lab_and_a_lab_imports_no_other_labs_checks():
    """labkit is machinery: no lab's code in it. A lab may build on an earlier lab's data (lab 03
    uses lab 01's schema), never on another lab's checks or probes."""
    in_labkit = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.split(".")[0] == "checks")
                 for p in (ROOT / "labkit").rglob("*.py")}
    assert {p: m for p, m in in_labkit.items() if m} == {}
    shared = {"checks.outbox.schema"}
    crossing = {}
    for lab in LABS:
        package = labs.manifest(lab).package
        for path in labs.manifest(lab).folder.glob("*.py"):
            other = {m for m in _imports(path) if m.startswith("checks.") and not m.startswith(package + ".")
                     and m not in shared and (ROOT / (m.replace(".", "/") + ".py")).is_file()}
            if other:
                crossing[str(path.relative_to(ROOT))] = sorted(other)
    assert crossing == {}


def test_the_kernel_reads_no_checks_module():
    """The grading kernel is shown the manifests and its quiz, not a lab's checks: the course's
    kernel-side code must not need them (progress, step titles, the module file)."""
    import subprocess
    import sys

    code = ("import sys, tempfile\nfrom labkit import labs\nfrom labkit.notebook import Lab, progress, quiz\n"
            "for lab in labs.available():\n    progress.blank(lab).text(); quiz.load(lab)\n"
            "    with tempfile.TemporaryDirectory() as workspace:\n        Lab(lab, workspace, show=False)\n"
            "print(sorted(m for m in sys.modules if m.count('.') > 1 and m.startswith('checks.') and not m.endswith('.quiz')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert importlib.util.find_spec("checks") is not None
