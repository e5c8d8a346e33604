"""Lab `vending`'s checks: the reference passes, every catalogued mistake fails where it should,
and modules that do not load, hang or die get a clear verdict instead of a traceback.

Each wrong solution (`tests/wrong_solutions/vending.toml`, built by tests/catalogue.py) is
`solutions/client.py` with one realistic mistake (`vending/<name>.patch`), and says in its
docstring which step must fail and what the student must be told.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from catalogue import (
    by_step,
    failures,
    promise,
    step_verdicts,
    touched_definitions,
    wrong_file,
    wrong_files,
)

from labkit import labs
from labkit.judge.run import LabSpec, run_lab
from labkit.judge.verdict import Outcome
from labkit.notebook import build
from labkit.notebook.module_export import assemble
from labkit.sandbox import zygote

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "client.py"
LESSON = ROOT / "notebooks" / "source" / "02-vending.md"
WRONG = wrong_files("vending")
SEED = 1

# The mistakes the lab's issue asks the checks to catch, by the file that makes each one.
REQUIRED = {
    "crlf_accepted", "leading_zeros_accepted", "minus_zero_accepted", "plus_sign_accepted",
    "strip_before_lf", "cursor_before_total", "transaction_left_open", "conflict_returns_false",
    "gap_not_detected", "replay_mutates_input", "replay_without_resync", "ack_before_commit",
    "unbounded_readline", "writer_not_closed_on_error", "no_abort", "resume_minus_one",
    "store_wiped_on_open", "db_not_closed_on_failure",
}


@pytest.fixture(scope="module")
def lab() -> LabSpec:
    return labs.load("vending")


def _line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def dependents(lab: LabSpec, step: str) -> set[str]:
    """Every step that builds on `step`, directly or through another step."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for spec in lab.steps:
            needs = {str(n) for n in spec.requires}
            if str(spec.step) not in found and (step in needs or needs & found):
                found.add(str(spec.step))
                changed = True
    return found


def running_now() -> set[str]:
    """Feed threads and child processes, but the zygotes (kept for the next check, by design)."""
    found = {t.name for t in threading.enumerate() if t.name.startswith("labkit-feed-")}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in zygote.pids():
                found.add(f"child process {proc.pid} ({' '.join(proc.cmdline())[:160]})")
        except psutil.Error:  # ended meanwhile
            continue
    return found


def left_running(before: set[str]) -> list[str]:
    """What runs now and did not before the run. Another module's straggler is not this run's:
    this process is a subreaper, so an orphan of an earlier test's subprocess (seen in CI: a
    python that outlived its module) re-parents to it and counts among its children."""
    return sorted(running_now() - before)


# --- the catalogue ------------------------------------------------------------------------


def test_the_catalogue_is_complete(lab):
    """At least 40 wrong clients, the ones the lab's issue named, and one naming every clause."""
    assert len(WRONG) >= 40
    names = {p.stem for p in WRONG}
    assert REQUIRED <= names, f"missing wrong solutions: {sorted(REQUIRED - names)}"
    named = {promise(path)["clause"] for path in WRONG}
    assert None not in named, [p.name for p in WRONG if promise(p)["clause"] is None]
    declared = {c.id for c in lab.contract}
    assert named <= declared, f"wrong solutions name undeclared clauses: {sorted(named - declared)}"
    assert declared <= named, f"clauses no wrong solution names: {sorted(declared - named)}"


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_is_the_reference_with_one_mistake(path):
    """A patch that changes more than its mistake could fail for reasons of its own."""
    touched = touched_definitions(path, REFERENCE)
    assert len(touched) == 1, (f"{path.name} differs from solutions/client.py in {sorted(touched)}: keep "
                               f"tests/wrong_solutions/vending/{path.stem}.patch to the one mistake")


# --- the reference ------------------------------------------------------------------------


def test_the_reference_is_built_from_the_lesson():
    lesson = build.parse(LESSON)
    assert build.reference_module(lesson) == REFERENCE.read_text(), \
        "solutions/client.py differs from notebooks/source/02-vending.md: run `python -m labkit.notebook.build`"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_passes_every_step(lab, seed):
    before = running_now()
    verdict = run_lab(lab, REFERENCE, seed=seed)
    assert left_running(before) == []
    assert [str(s.step) for s in verdict.steps] == [str(s.step) for s in lab.steps]
    steps = by_step(verdict)
    failing = {s.step: failures(s) for s in verdict.steps if not s.passed and str(s.step) != "final"}
    assert not failing, f"seed {seed}: the reference fails {failing}"
    final = steps["final"]
    assert final.passed, failures(final)
    assert verdict.passed and verdict.score == verdict.max_score == 12


def test_same_seed_same_cases_same_verdicts(lab):
    """Cases come from the seed: the same seed twice gives the same cases and verdicts; another seed
    gives other cases."""
    def fingerprint(verdict):
        return [(str(s.step), c.name, c.called, c.expected, c.passed) for s in verdict.steps for c in s.cases]

    steps = [1, 3, 4, 6, 7, "final"]
    first = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=11))
    again = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=11))
    other = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=12))
    assert first == again
    assert [f[:3] for f in first] != [f[:3] for f in other]


def test_final_check_keeps_evidence(lab):
    verdict = run_lab(lab, REFERENCE, steps=["final"], seed=SEED)
    final = verdict.steps[0]
    evidence = final.evidence
    assert evidence is not None
    assert evidence.timeline and all(set(e) == {"t", "actor", "kind", "text"} for e in evidence.timeline)
    assert [e["t"] for e in evidence.timeline] == sorted(e["t"] for e in evidence.timeline)
    actors = {e["actor"] for e in evidence.timeline}
    assert {"client #1", "client #2", "feed", "store"} <= actors
    assert any(e["kind"] == "killed" and "killed by the judge at the hook (SIGKILL)" in e["text"] for e in evidence.timeline)
    assert [r["rung"] for r in evidence.ladder] == ["committed", "ACK sent", "ACK seen by the feed", "resent",
                                                    "recognised as duplicate"]
    assert all(set(r) == {"rung", "observed", "when"} for r in evidence.ladder)
    assert evidence.ladder[0]["observed"].startswith("yes")
    assert evidence.ladder[1]["observed"].startswith("no")
    assert any(f.startswith("client #1 killed in before_ack at seq ") and "killed by the judge at the hook (SIGKILL)" in f
               for f in evidence.faults)


def test_a_fault_that_did_not_happen_is_not_claimed(lab, tmp_path):
    """run_client that never passes before_ack on: the kill never happens, so nothing may pass."""
    source = REFERENCE.read_text()
    handover = "return await consume_session(reader, writer, con, timeout, before_ack)"
    assert source.count(handover) == 1
    module = tmp_path / "client.py"
    module.write_text(source.replace(handover, "return await consume_session(reader, writer, con, timeout)"))
    final = run_lab(lab, module, steps=["final"], seed=SEED).steps[0]
    assert not final.passed
    assert final.cases[0].outcome is Outcome.WRONG and "exit code 0" in final.cases[0].got
    assert all(c.outcome is Outcome.NOT_REACHED for c in final.cases[1:])
    assert final.evidence.faults == []


@pytest.mark.parametrize("name", ["resume_minus_one", "store_wiped_on_open"])
def test_final_exposes_a_client_that_forgets_its_cursor(lab, name):
    final = run_lab(lab, wrong_file("vending", name), steps=["final"], seed=SEED).steps[0]
    resume = next(c for c in final.cases if c.name == "client #2 resumes from the saved cursor")
    assert not resume.passed
    assert "the feed saw RESUME -1 from the new process: read `last` from the store, never reset it" in resume.hint


# --- the wrong solutions ------------------------------------------------------------------


# Which steps run each top-level definition of the reference (what the check of that step calls,
# directly or through the student's other functions). A step that runs none of the definitions
# a wrong solution changes runs the reference's own code: its verdict is the reference's.
ALL_STEPS = {"1", "2", "3", "4", "5", "6", "7", "final"}
USES = {
    "FRAME": {"1", "5", "6", "7", "final"}, "parse_line": {"1", "5", "6", "7", "final"},
    "open_store": {"2", "7", "final"}, "state": {"2", "6", "7", "final"},
    "Gap": {"3", "5", "6", "7", "final"}, "Conflict": {"3", "5", "6", "7", "final"},
    "apply_event": {"3", "5", "6", "7", "final"}, "ResyncRequired": {"4"}, "replay": {"4"},
    "consume_line": {"5", "6", "7", "final"}, "consume_session": {"6", "7", "final"},
    "run_client": {"7", "final"},
}


def independent_steps(lab: LabSpec, step: str) -> list[str]:
    """The steps a mistake promised for `step` must leave passing. The final check integrates
    steps 2, 5, 6 and 7 (and what they build on): every mistake it catches also shows in one of
    them, so only the steps it does not build on must pass."""
    if step == "final":
        needed = set(requires_all(lab, "final"))
        return [str(s.step) for s in lab.steps if str(s.step) not in needed]
    return [str(s.step) for s in lab.steps if str(s.step) not in dependents(lab, step)]


def requires_all(lab: LabSpec, step: str) -> set[str]:
    """Every step `step` builds on, directly or through another step, and itself."""
    found, todo = set(), [step]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        todo += [str(n) for n in lab.step(current).requires]
    return found


def reached(path: Path) -> set[str]:
    """The steps that run what `path` changes (every step for a change outside a known definition)."""
    return set().union(*(USES.get(name, ALL_STEPS) for name in touched_definitions(path, REFERENCE)))


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_fails_its_step(lab, path):
    """The promised step fails, with the promised message and a case naming the promised clause;
    the steps that do not build on it and run the changed code still pass. (Runs share
    tests/catalogue.py's cache with the seed, coverage and no-blame tests.)"""
    said = promise(path)
    step = said["step"]
    others = sorted(set(independent_steps(lab, step)) & reached(path) - {step})
    steps = step_verdicts("vending", path, [step, *others], SEED)
    assert not steps[step].passed, f"{path.name}: step {step} passed although it is wrong: {said['mistake']}"
    assert steps[step].status == "failed"
    messages = failures(steps[step])
    assert said["message"] in messages, (f"{path.name}: step {step} fails, but not with the promised "
                                         f"message {said['message']!r}:\n{messages}")
    caught = {clause for c in steps[step].cases if not c.passed for clause in c.clauses}
    assert said["clause"] in caught, f"{path.name}: no failing case names clause {said['clause']}: {sorted(caught)}"
    broken = {s: failures(v) for s, v in steps.items() if s != step and not v.passed}
    assert not broken, f"{path.name}: steps that do not build on step {step} fail too: {broken}"


def test_every_definition_a_wrong_solution_changes_has_known_uses():
    """USES must name every definition the catalogue touches (else the test above runs every step)."""
    unknown = {name for path in WRONG for name in touched_definitions(path, REFERENCE)} - set(USES)
    assert not unknown, f"add the steps that run {sorted(unknown)} to USES"


# --- modules that do not load, hang, or never return -----------------------------------------


def skeleton_module() -> str:
    lesson = build.parse(LESSON)
    return assemble({b.arg: build.skeleton(b.text) for b in lesson.blocks if b.kind == "step"})


def test_skeleton_is_not_implemented_everywhere(lab, tmp_path):
    module = tmp_path / "client.py"
    module.write_text(skeleton_module())
    verdict = run_lab(lab, module, seed=SEED)
    assert {str(s.step): s.status for s in verdict.steps} == {str(s.step): "not_implemented" for s in lab.steps}, \
        {s.step: failures(s) for s in verdict.steps if s.status != "not_implemented"}
    assert {str(s.step): s.note for s in verdict.steps} == {str(s.step): "" for s in lab.steps}
    assert verdict.score == 0


BROKEN = {
    "syntax_error": ("def parse_line(line)\n    return 1\n", "importing your module failed: raised SyntaxError"),
    "hangs_on_import": ("import time\n\nwhile True:\n    time.sleep(0.1)\n",
                        "importing your module did not finish within 2 s"),
    "exits_on_import": ("import os\n\nos._exit(7)\n", "the process died while importing your module (exit code 7)"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_module_that_does_not_load_gets_a_verdict(kind, tmp_path):
    source, got = BROKEN[kind]
    module = tmp_path / "client.py"
    module.write_text(source)
    env = {**os.environ, "LABKIT_STEP_TIMEOUT": "2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "labkit", "check", "vending", "--solution", str(module),
                           "--json", "--seed", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["lab"] == "vending" and verdict["passed"] is False and verdict["score"] == 0
    assert len(verdict["steps"]) == 8
    for step in verdict["steps"]:
        assert [c["outcome"] for c in step["cases"]] == ["import_failed"]
        assert "labkit" not in step["cases"][0]["trace"]
    for step in verdict["steps"]:
        assert got in step["cases"][0]["got"]


NEVER_RETURNS = '''async def consume_session(reader, writer, con, timeout, before_ack=None):
    """Never returns, and never reads."""
    while True:
        await asyncio.sleep(0.05)
'''


def test_a_consume_session_that_never_returns_gets_a_verdict(lab, tmp_path):
    source = REFERENCE.read_text()
    start = source.index("async def consume_session(")
    end = source.index("# --- step 7")
    module = tmp_path / "client.py"
    module.write_text(source[:start] + NEVER_RETURNS + "\n\n" + source[end:])
    before = running_now()
    verdict = run_lab(lab, module, steps=[5, 6, 7, "final"], seed=SEED, timeout=2.0)
    assert left_running(before) == []
    steps = by_step(verdict)
    assert steps["5"].passed, failures(steps["5"])
    for step in ("6", "7", "final"):
        assert steps[step].status == "failed"
        first = next(c for c in steps[step].cases if not c.passed)
        assert first.outcome in (Outcome.TIMED_OUT, Outcome.WRONG, Outcome.RAISED), first
        assert re.search(r"still running after|no answer within|did not finish in time", first.got), first.got
        assert all("labkit" not in c.trace for c in steps[step].cases)
