"""Lab `outbox`'s checks: the reference passes, every catalogued mistake fails where it should.

Each file in `wrong_solutions/outbox/` is a copy of `solutions/worker.py` with one realistic
mistake, and says in its docstring which step must fail and what the student must be told.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest

from labkit import labs
from labkit.judge import run_lab
from labkit.verdict import LabVerdict, StepVerdict

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "worker.py"
WRONG = sorted((ROOT / "tests" / "wrong_solutions" / "outbox").glob("*.py"))
DOCSTRING = re.compile(r'\A"""Wrong: (?P<mistake>.+?)\. Fails step (?P<step>\d+|final)\. '
                       r'Message: (?P<message>.+?)"""\n', re.S)
SEED = 1

SKELETON = '''\
import json
import sqlite3


class Conflict(Exception):
    """Same business ID, different content."""


class DeliveryError(Exception):
    """A reply that is not evidence of delivery."""


def validate_event(event):
    raise NotImplementedError


def open_source(path):
    raise NotImplementedError


def open_sink(path):
    raise NotImplementedError


def accept(con, event):
    raise NotImplementedError


def pending(con, limit):
    raise NotImplementedError


def receive(con, event):
    raise NotImplementedError


def mark_sent(con, event_id):
    raise NotImplementedError


def dispatch(con, send, limit, after_delivery=None):
    raise NotImplementedError


def send_http(url, event, timeout=2.0):
    raise NotImplementedError
'''


@pytest.fixture(scope="module")
def lab():
    return labs.load("outbox")


def promise(path: Path) -> dict[str, str]:
    """What a wrong solution's docstring says: the mistake, the failing step, the message."""
    match = DOCSTRING.match(path.read_text())
    assert match, f"{path.name} must start with '\"\"\"Wrong: ... Fails step N. Message: ...\"\"\"'"
    return match.groupdict()


def failures(step: StepVerdict) -> str:
    return "\n\n".join(f"[{c.name}]\n{c.message}" for c in step.cases if not c.passed)


def by_step(verdict: LabVerdict) -> dict[str, StepVerdict]:
    return {str(s.step): s for s in verdict.steps}


def test_the_catalogue_is_complete():
    assert len(WRONG) >= 18
    for path in WRONG:
        promise(path)


def touched_definitions(path: Path) -> set[str]:
    """The top-level definitions of the reference that a wrong solution changes."""
    reference = REFERENCE.read_text()
    spans = []
    for node in ast.parse(reference).body:
        label = getattr(node, "name", None) or ast.unparse(getattr(node, "targets", [node])[0])
        spans.append((node.lineno, node.end_lineno, label))
    body = DOCSTRING.sub("", path.read_text(), count=1).lstrip("\n").splitlines()
    touched = set()
    matcher = difflib.SequenceMatcher(None, reference.splitlines(), body, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for line in range(i1 + 1, i2 + 1) if i2 > i1 else [i1]:  # 1-based; an insertion follows line i1
            touched |= {label for first, last, label in spans if first <= line <= last} or {f"line {line}"}
    return touched


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_is_the_reference_with_one_mistake(path):
    """A stale copy could fail for reasons of its own: then copy solutions/worker.py again."""
    touched = touched_definitions(path)
    assert len(touched) == 1, (f"{path.name} differs from solutions/worker.py in {sorted(touched)}: copy the "
                               "reference again and re-apply the one mistake")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_passes_every_step(lab, seed):
    verdict = run_lab(lab, REFERENCE, seed=seed)
    assert [str(s.step) for s in verdict.steps] == [str(s.step) for s in lab.steps]
    failing = {s.step: failures(s) for s in verdict.steps if not s.passed}
    assert not failing, f"seed {seed}: the reference fails {failing}"
    assert verdict.passed and verdict.score == verdict.max_score


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_fails_its_step(lab, path):
    said = promise(path)
    step = said["step"]
    control = "2" if step == "1" else "1"  # a step that does not use the broken function
    steps = by_step(run_lab(lab, path, steps=[step, control], seed=SEED))
    assert not steps[step].passed, f"{path.name}: step {step} passed although it is wrong: {said['mistake']}"
    assert steps[step].status == "failed"
    messages = failures(steps[step])
    assert said["message"] in messages, f"{path.name}: step {step} fails, but not with the promised message"
    assert steps[control].passed, f"{path.name}: step {control} should not be affected:\n{failures(steps[control])}"


def test_skeleton_is_not_implemented_everywhere(lab, tmp_path):
    skeleton = tmp_path / "worker.py"
    skeleton.write_text(SKELETON)
    verdict = run_lab(lab, skeleton, seed=SEED)
    assert {str(s.step): s.status for s in verdict.steps} == {str(s.step): "not_implemented" for s in lab.steps}, \
        {s.step: failures(s) for s in verdict.steps if s.status != "not_implemented"}
    assert {str(s.step): s.note for s in verdict.steps} == {str(s.step): "" for s in lab.steps}
    assert verdict.score == 0
