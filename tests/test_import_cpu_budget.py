"""Top-level code that computes without end (a loop at the top of a step cell) is ended by the
import's CPU budget (`limits.IMPORT_CPU_SECONDS`, `probe.budget_import`: a CPU-time timer while
the module imports), not held for the step's whole time limit in every child: the verdict names
the budget and the line, the same on an idle machine and a busy one. A loop that sleeps is still
ended by the clock, and the budget is gone once the import is done."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from labkit import labs
from labkit.judge.run import run_lab
from labkit.judge.verdict import Outcome
from labkit.limits import IMPORT_CPU_SECONDS, TIMEOUT_ENV

ROOT = Path(__file__).resolve().parents[1]
STEP_SECONDS = 30  # the clock's limit here: a verdict well before it came from the CPU budget


def reference_with(tmp_path: Path, lab: str, tail: str) -> Path:
    path = tmp_path / labs.manifest(lab).module_file
    path.write_text((ROOT / "solutions" / labs.manifest(lab).module_file).read_text() + "\n\n" + tail + "\n")
    return path


@pytest.mark.parametrize(("lab", "step"), [("outbox", "1"),  # a property test: a child that stays up
                                           ("outbox", "3")])  # one-shot children
def test_a_module_that_computes_at_import_is_ended_by_the_import_cpu_budget(tmp_path, monkeypatch, lab, step):
    monkeypatch.setenv(TIMEOUT_ENV, str(STEP_SECONDS))
    module = reference_with(tmp_path, lab, "_n = 0\nwhile True:\n    _n += 1")
    began = time.monotonic()
    verdict = run_lab(labs.load(lab), module, steps=[step], seed=1).steps[0]
    took = time.monotonic() - began
    [case] = [c for c in verdict.cases if c.outcome is not Outcome.NOT_REACHED]
    assert case.outcome is Outcome.IMPORT_FAILED, case
    assert case.got.startswith(f"importing your module did not finish within {IMPORT_CPU_SECONDS:g} s of CPU time: "
                               "it was running line "), case.got
    assert "_n += 1" in case.got or "while True" in case.got, case.got
    assert took < STEP_SECONDS, f"{took:.1f} s: the clock ended it, not the CPU budget"


def test_a_module_that_sleeps_at_import_is_still_ended_by_the_clock(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    module = reference_with(tmp_path, "outbox", "import time\ntime.sleep(60)")
    [case] = [c for c in run_lab(labs.load("outbox"), module, steps=["3"], seed=1).steps[0].cases
              if c.outcome is not Outcome.NOT_REACHED]
    assert case.outcome is Outcome.IMPORT_FAILED
    assert case.got.startswith("importing your module did not finish within 3 s: it was running line "), case.got


def test_the_budget_ends_with_the_import(tmp_path, monkeypatch):
    """A case may compute for longer than the import's budget: the reference, made to burn more
    CPU than the budget allows in the first call of a child, still passes step 1's fixed cases
    (which share one child; the property test has a CPU budget of its own)."""
    monkeypatch.setenv(TIMEOUT_ENV, str(STEP_SECONDS))
    module = reference_with(tmp_path, "outbox", f"""
_validate = validate_event
_burned = []
def validate_event(event):
    if not _burned:
        _burned.append(1)
        _end = __import__("time").process_time() + {IMPORT_CPU_SECONDS + 0.5}
        while __import__("time").process_time() < _end:
            pass
    return _validate(event)""")
    cases = run_lab(labs.load("outbox"), module, steps=["1"], seed=1).steps[0].cases
    fixed = [c for c in cases if "generated" not in c.name]
    assert len(fixed) > 10 and all(c.passed for c in fixed), [c for c in fixed if not c.passed]
