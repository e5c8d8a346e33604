"""A property test started beside its fixed cases gives the verdict it gives after them.

`differential.after_fixed` starts a step's property test ahead, beside the fixed cases, when a
core is idle, and drops it when a fixed case fails. Which way a run goes depends on the
machine's load, so both must give the same verdict: here each step that has a property test
is judged both ways (`idle_core` forced) for the reference (the result taken), a wrong
solution that fails a fixed case (the test started, then dropped), and one that only the
property test catches, where the catalogue has one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from catalogue import promise, run_steps, wrong_files

from labkit import labs
from labkit.judge import differential
from labkit.judge.differential import NOT_JUDGED
from labkit.judge.verdict import Outcome

ROOT = Path(__file__).resolve().parents[1]
# The steps whose check is fixed cases, then a property test (`after_fixed`).
PROPERTY_STEPS = [("outbox", "1"), ("vending", "1"), ("vending", "4"), ("relay", "5")]
SCANNED = 8  # wrong solutions of the step looked at for each kind


def fingerprint(step) -> tuple:
    return step.passed, sorted((c.name, str(c.outcome), c.clauses) for c in step.cases if not c.passed)


def judged(monkeypatch, lab: str, path, step: str, *, ahead: bool) -> tuple[tuple, int]:
    """The step's fingerprint, and how many property-test sessions it started."""
    sessions = []
    real = differential.child_session

    def counted(*args, **kwargs):
        sessions.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(differential, "idle_core", lambda: ahead)
    monkeypatch.setattr(differential, "child_session", counted)
    verdict = run_steps(lab, path, [step], seed=1)[0]
    return fingerprint(verdict), len(sessions)


def property_case(step):
    return next(c for c in step.cases if c.name.endswith(("generated inputs", "generated events", "generated logs",
                                                          "generated lines")))


def examples(lab: str, step: str):
    """The reference, the first wrong solution of `step` that fails a fixed case, and the first
    that fails only the property test (by their verdict run the usual way)."""
    from catalogue import verdict

    reference = ROOT / "solutions" / labs.manifest(lab).module_file
    found = {"reference": reference}
    for path in [p for p in wrong_files(lab) if promise(p)["step"] == step][:SCANNED]:
        v = verdict(lab, path, steps=[step]).steps[0]
        kind = "property only" if all(c.passed for c in v.cases if c is not property_case(v)) else "fixed"
        found.setdefault(kind, path)
        if len(found) == 3:
            break
    return found


@pytest.mark.parametrize(("lab", "step"), PROPERTY_STEPS, ids=[f"{lab}:{step}" for lab, step in PROPERTY_STEPS])
def test_the_property_test_ahead_gives_the_verdict_it_gives_after(monkeypatch, lab, step):
    found = examples(lab, step)
    assert {"reference", "fixed"} <= set(found), f"{lab} step {step}: the catalogue lacks {found}"
    for kind, path in found.items():
        after, _ = judged(monkeypatch, lab, path, step, ahead=False)
        ahead, sessions = judged(monkeypatch, lab, path, step, ahead=True)
        assert ahead == after, f"{kind} ({path.name}): ahead {ahead} != after {after}"
        assert sessions >= 1, f"{kind}: the property test never started"
        if kind == "fixed":  # started ahead, then dropped: the verdict says it was not judged
            assert after[0] is False and any(name.endswith(("inputs", "events", "logs", "lines")) for name, *_ in after[1])


def test_a_property_test_dropped_ahead_reads_as_not_judged(monkeypatch):
    lab, step = PROPERTY_STEPS[0]
    path = examples(lab, step)["fixed"]
    monkeypatch.setattr(differential, "idle_core", lambda: True)
    verdict = run_steps(lab, path, [step], seed=1)[0]
    case = property_case(verdict)
    assert case.outcome is Outcome.NOT_REACHED and NOT_JUDGED in case.got, case
