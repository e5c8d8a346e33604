"""Lab `outbox`'s checks: the reference passes, every catalogued mistake fails where it should.

Each file in `wrong_solutions/outbox/` is a copy of `solutions/worker.py` with one realistic
mistake, and says in its docstring which step must fail and what the student must be told.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from catalogue import by_step, failures, promise, touched_definitions

from labkit import labs
from labkit.judge.run import run_lab

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "worker.py"
WRONG = sorted((ROOT / "tests" / "wrong_solutions" / "outbox").glob("*.py"))
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


def test_the_catalogue_is_complete():
    assert len(WRONG) >= 18
    for path in WRONG:
        promise(path)


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_is_the_reference_with_one_mistake(path):
    """A stale copy could fail for reasons of its own: then copy solutions/worker.py again."""
    touched = touched_definitions(path, REFERENCE)
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
