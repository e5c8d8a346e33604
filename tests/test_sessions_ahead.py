"""`labkit.judge.ahead.SessionsAhead`: the warm judge enters a lab's next session while the student
reads the last verdict. Each run still gets a session of its own, one that failed to start
ahead is replaced by the run's own, and closing leaves nothing: no server, no folder."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

import psutil
import toylab.lab

from labkit import labs
from labkit.judge.ahead import SessionsAhead
from labkit.judge.run import LabSpec, StepSpec, run_lab

ROOT = Path(__file__).resolve().parents[1]


def _toy(session, seen: list) -> LabSpec:
    def check(ctx):
        seen.append(ctx.shared)
        return toylab.lab.check_cases(ctx, toylab.lab.CASES[:1])

    return LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "half", 1, check)], contract=toylab.lab.CLAUSES,
                   session=session)


def _counting_session(events: list):
    numbers = itertools.count(1)

    @contextlib.contextmanager
    def session():
        number = next(numbers)
        events.append(("entered", number))
        try:
            yield number
        finally:
            events.append(("left", number))

    return session


def _two_checks(session, folder: Path, events: list) -> list:
    """Two runs of a toy lab with `session`, as the warm judge makes them; what each run got."""
    solution = folder / "toy.py"
    solution.write_text(toylab.REFERENCE)
    seen: list = []
    lab = _toy(session, seen)
    ahead = SessionsAhead()
    try:
        assert run_lab(lab, solution, seed=1, ahead=ahead).passed
        events.append(("made ahead", ahead.session_ready("toy")))
        assert run_lab(lab, solution, seed=1, ahead=ahead).passed
    finally:
        ahead.close()
    return seen


def test_each_run_gets_its_own_session_and_the_next_is_made_ahead(tmp_path):
    events: list = []
    seen = _two_checks(_counting_session(events), tmp_path, events)
    assert seen == [1, 2], "a session serves one run"
    made = events.index(("made ahead", True))  # the second, entered before the second run began
    assert events.index(("left", 1)) < events.index(("entered", 2)) < made
    entered = {n for kind, n in events if kind == "entered"}
    assert entered == {n for kind, n in events if kind == "left"}, "every session made is left, also on close"


def test_a_session_that_failed_ahead_is_replaced_by_the_runs_own(tmp_path):
    events: list = []
    numbers = itertools.count(1)
    counting = _counting_session(events)

    @contextlib.contextmanager
    def session():
        if next(numbers) == 2:  # the one made ahead
            raise RuntimeError("could not start ahead")
        with counting() as value:
            yield value

    seen = _two_checks(session, tmp_path, events)
    assert ("made ahead", False) in events
    assert seen == [1, 2] and events.count(("entered", 2)) == 1 and ("left", 2) in events


def test_lab_04s_servers_are_up_for_the_next_check_and_closing_leaves_nothing(judge_tmp):
    private, created = judge_tmp
    lab = labs.load("pipeline")
    ahead = SessionsAhead()
    reference = ROOT / "solutions" / "pipeline.py"
    try:
        assert run_lab(lab, reference, steps=["5"], seed=1, ahead=ahead).passed
        assert ahead.session_ready("pipeline", timeout=60)
        made = ahead._ready["pipeline"].result()[1]
        assert made.pg is not None and made.vk is not None, "both servers started ahead"
        pids = {made.pg.pid, made.vk.pid}
        assert all(psutil.pid_exists(p) for p in pids if p)
        assert run_lab(lab, reference, steps=["5"], seed=2, ahead=ahead).passed
    finally:
        ahead.close()
    assert not [p for p in pids if p and psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    places = [str(private), *created]
    left = []
    for proc in psutil.process_iter(["cwd"]):
        with contextlib.suppress(psutil.Error):
            if any((proc.info["cwd"] or "").startswith(place) for place in places):
                left.append(proc.info)
    assert left == []
    assert [path for path in created if os.path.exists(path)] == []
