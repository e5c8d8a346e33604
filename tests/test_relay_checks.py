"""Lab `relay`'s checks: the reference passes under several seeds, every catalogued mistake fails
where it should with the message and the clause it promises, the skeleton is "not implemented"
everywhere, and the final check's evidence is the judge's own.

Each wrong solution (`tests/wrong_solutions/relay.toml`, built by tests/catalogue.py) is
`solutions/relay.py` with one realistic mistake (`relay/<name>.patch`), and says in its
docstring which step must fail, which contract clause catches it and what the student must be
told.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from catalogue import failures, promise, step_verdicts, touched_definitions, verdict, wrong_files

from checks.relay.contract import CLAUSES
from labkit import labs
from labkit.judge.run import LabSpec, run_lab
from labkit.judge.verdict import Outcome
from labkit.notebook import build
from labkit.notebook.module_export import assemble

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "relay.py"
LESSON = ROOT / "notebooks" / "source" / "03-relay.md"
WRONG = wrong_files("relay")
SEED = 1

# Every pitfall the contract says the checks must catch, by the file that makes it.
PITFALLS = {
    "claim_without_transaction", "claim_selects_before_locking", "claim_deferred_begin",  # plain SELECT then UPDATE
    "claim_token_per_row", "claim_token_in_python", "open_resets_counter",  # per-row / restarting tokens
    "complete_ignores_token", "complete_checks_the_clock",  # complete checks the owner/state or the clock
    "fail_ignores_token", "claim_never_reclaims",  # fail ignores the token; a dead owner's row stuck forever
    "backoff_without_cap", "backoff_without_jitter", "backoff_equal_jitter", "backoff_global_random",
    "backoff_overflows", "relay_quarantine_counted_as_sent", "fail_retries_permanent",
    "relay_stops_at_first_failure", "redrive_sent_rows", "redrive_partial", "relay_retries_stale_rows",
}


@pytest.fixture(scope="module")
def lab() -> LabSpec:
    return labs.load("relay")


# --- the catalogue ------------------------------------------------------------------------


def test_the_catalogue_is_complete():
    assert len(WRONG) >= 30
    names = {p.stem for p in WRONG}
    assert PITFALLS <= names, f"missing wrong solutions: {sorted(PITFALLS - names)}"
    known = {c.id for c in CLAUSES}
    for path in WRONG:
        said = promise(path)
        assert said["clause"] in known, f"{path.name} names an unknown clause {said['clause']}"
        assert said["clause"].split(".")[0] == said["step"], f"{path.name}: its clause is not of step {said['step']}"


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_is_the_reference_with_one_mistake(path):
    """A patch that changes more than its mistake could fail for reasons of its own."""
    touched = touched_definitions(path, REFERENCE)
    assert len(touched) == 1, (f"{path.name} differs from solutions/relay.py in {sorted(touched)}: keep "
                               f"tests/wrong_solutions/relay/{path.stem}.patch to the one mistake")


# --- the reference ------------------------------------------------------------------------


def test_the_reference_is_built_from_the_lesson():
    assert build.reference_module(build.parse(LESSON)) == REFERENCE.read_text(), \
        "solutions/relay.py differs from notebooks/source/03-relay.md: run `python -m labkit.notebook.build`"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_passes_every_step(lab, seed):
    result = verdict("relay", REFERENCE, seed)
    assert [str(s.step) for s in result.steps] == [str(s.step) for s in lab.steps]
    failing = {s.step: failures(s) for s in result.steps if not s.passed}
    assert not failing, f"seed {seed}: the reference fails {failing}"
    assert result.passed and result.score == result.max_score == 13


def test_every_clause_is_tried_and_every_case_names_known_clauses(lab):
    reference = verdict("relay", REFERENCE, SEED)
    known = {c.id for c in CLAUSES}
    tried = {clause for s in reference.steps for c in s.cases for clause in c.clauses}
    assert tried <= known, f"cases name clauses the contract does not declare: {sorted(tried - known)}"
    assert known <= tried, f"clauses no case tries: {sorted(known - tried)}"
    untagged = [(s.step, c.name) for s in reference.steps for c in s.cases if not c.clauses]
    assert not untagged, f"cases without a clause: {untagged}"


def test_same_seed_same_cases_same_verdicts(lab):
    """Cases come from the seed: the same seed twice gives the same cases; another seed other cases."""

    def fingerprint(verdict):
        return [(str(s.step), c.name, c.called, c.expected, c.passed) for s in verdict.steps for c in s.cases]

    steps = [3, 5, 6, 8]
    first = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=11))
    again = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=11))
    other = fingerprint(run_lab(lab, REFERENCE, steps=steps, seed=12))
    assert first == again
    assert [f[:4] for f in first] != [f[:4] for f in other]


def test_final_check_shows_both_publishers_the_warehouse_the_outbox_and_the_tokens(lab):
    final = step_verdicts("relay", REFERENCE, ["final"], SEED)["final"]
    assert final.passed, failures(final)
    evidence = final.evidence
    assert evidence is not None
    timeline = evidence.timeline
    # The order-deciding links (labkit.views.timeline_order) are optional; nothing else is there.
    assert all({"t", "actor", "kind", "text"} <= set(e) <= {"t", "actor", "kind", "text", "id", "after", "before"}
               for e in timeline)
    assert [e["t"] for e in timeline] == sorted(e["t"] for e in timeline)
    actors = {e["actor"] for e in timeline}
    assert {"publisher A #1", "publisher A #2", "publisher B", "warehouse", "outbox"} <= actors
    assert any(e["kind"] == "killed" and "killed by the judge at the hook (SIGKILL)" in e["text"] for e in timeline)
    assert any(e["kind"] == "stopped" and "state T" in e["text"] for e in timeline)
    assert any(e["kind"] == "duplicate" and "snack-2" in e["text"] for e in timeline)
    assert sum(1 for e in timeline if e["actor"] == "outbox" and "token" in e["text"]) >= 6
    rungs = [r["rung"] for r in evidence.ladder]
    for rung in ("snack-1: claimed by whom, with which token", "snack-2: sent saved by the current token holder",
                 "failed, retry due at T", "quarantined with error E", "redriven", "delivered out of seq order"):
        assert rung in rungs
    ladder = {r["rung"]: r["observed"] for r in evidence.ladder}
    assert ladder["snack-2: claimed by whom, with which token"].startswith("A with token 2, then B with token")
    assert "duplicate" in ladder["snack-2: sent, with which token"]
    assert ladder["delivered out of seq order"] != "none"
    assert any("killed by the judge at the hook (SIGKILL)" in f for f in evidence.faults)
    assert any("state T observed" in f for f in evidence.faults)


def test_a_fault_that_did_not_happen_is_not_claimed(lab, tmp_path):
    """relay_once that never calls after_claim: nobody dies, nobody is frozen, so nothing may pass."""
    source = REFERENCE.read_text()
    hook = "        if after_claim is not None:\n            after_claim(seq)\n"
    assert source.count(hook) == 1
    module = tmp_path / "relay.py"
    module.write_text(source.replace(hook, ""))
    final = run_lab(lab, module, steps=["final"], seed=SEED).steps[0]
    assert not final.passed
    cases = {c.name: c for c in final.cases}
    dead = cases["A dies right after claiming snack-1"]
    assert dead.outcome is Outcome.WRONG and "exit code 0" in dead.got
    paused = cases["A, restarted, is frozen right after claiming snack-2; B takes it over"]
    assert paused.outcome is Outcome.WRONG and "never saw the restarted A stopped" in paused.got
    assert not any("killed" in f or "SIGSTOP" in f for f in final.evidence.faults)
    assert not any(e["kind"] in ("killed", "stopped") for e in final.evidence.timeline)


# --- the wrong solutions ------------------------------------------------------------------


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_fails_its_step(lab, path):
    said = promise(path)
    step = said["step"]
    control = "2" if step == "1" else "1"  # a step that does not use the broken function
    steps = step_verdicts("relay", path, [step, control], SEED)
    assert not steps[step].passed, f"{path.name}: step {step} passed although it is wrong: {said['mistake']}"
    assert steps[step].status == "failed"
    messages = failures(steps[step])
    assert said["message"] in messages, (f"{path.name}: step {step} fails, but not with the promised message "
                                         f"{said['message']!r}:\n{messages}")
    # Caught by a case that really failed on it: a case not reached proves nothing.
    caught = {clause for c in steps[step].cases if not c.passed and c.outcome is not Outcome.NOT_REACHED
              for clause in c.clauses}
    assert said["clause"] in caught, f"{path.name}: the failing cases name {sorted(caught)}, not {said['clause']}"
    assert steps[control].passed, f"{path.name}: step {control} should not be affected:\n{failures(steps[control])}"


# --- the skeleton and the student notebook --------------------------------------------------


def skeleton_module() -> str:
    lesson = build.parse(LESSON)
    return assemble({b.arg: build.skeleton(b.text) for b in lesson.blocks if b.kind == "step"})


def test_skeleton_is_not_implemented_everywhere(lab, tmp_path):
    module = tmp_path / "relay.py"
    module.write_text(skeleton_module())
    verdict = run_lab(lab, module, seed=SEED)
    assert {str(s.step): s.status for s in verdict.steps} == {str(s.step): "not_implemented" for s in lab.steps}, \
        {s.step: failures(s) for s in verdict.steps if s.status != "not_implemented"}
    assert {str(s.step): s.note for s in verdict.steps} == {str(s.step): "" for s in lab.steps}
    assert verdict.score == 0


# --- student code that breaks the checker's assumptions rather than the contract's ---------------

# Each gets a verdict about itself, in the step named, and never a sentence that blames the course.
HOSTILE = {
    "claim returns a generator": ("3", "returned", """
_real_claim = claim
def claim(con, owner, now, lease, limit):
    return (row for row in _real_claim(con, owner, now, lease, limit))
"""),
    "open_outbox returns None": ("final", "publisher", """
_real_open = open_outbox
def open_outbox(path):
    _real_open(path).close()
"""),
    "relay_once closes the caller's connection": ("8", "Cannot operate on a closed database", """
_real_relay_once = relay_once
def relay_once(con, *args, **kwargs):
    con.close()
    return _real_relay_once(con, *args, **kwargs)
"""),
    "relay_once never returns": ("final", "did not finish in time", """
import time as _time
def relay_once(con, *args, **kwargs):
    while True:
        _time.sleep(0.05)
"""),
    # Lies: the grade rests on what the judge observes, so hiding the evidence earns nothing.
    "open_outbox drops the judge's audit trigger": ("final", "was never claimed", """
_real_open_outbox = open_outbox
def open_outbox(path):
    con = _real_open_outbox(path)
    con.execute("DROP TRIGGER IF EXISTS judge_audit_update")
    return con
"""),
    "relay_once sends nothing and forges the warehouse's log file": ("final", "applied per event", """
import glob as _glob
import os as _os
def _forge(event):
    line = json.dumps({"method": "POST", "path": "/events", "id": event["id"], "outcome": "applied",
                       "response": "ack", "status": 200})
    for log in _glob.glob(_os.path.join(_os.path.dirname(_os.getcwd()), "**", "*.jsonl"), recursive=True):
        try:
            with open(log, "a") as f:
                f.write(line + "\\n")
        except OSError:
            pass
_real_relay_once = relay_once
def relay_once(con, owner, send, now, lease, limit, policy, after_claim=None):
    def forged_send(event):
        _forge(event)
        return True
    return _real_relay_once(con, owner, forged_send, now, lease, limit, policy, after_claim=after_claim)
"""),
}


@pytest.mark.parametrize("label", list(HOSTILE))
def test_hostile_code_gets_a_verdict_about_itself(lab, tmp_path, label):
    from labkit.judge.verdict import course_faults

    step, fragment, code = HOSTILE[label]
    module = tmp_path / "relay.py"
    module.write_text(REFERENCE.read_text() + "\n" + code)
    result = run_lab(lab, module, steps=[step], seed=SEED, timeout=3.0)
    verdict_step = result.steps[0]
    assert not verdict_step.passed
    assert fragment in failures(verdict_step), failures(verdict_step)
    assert course_faults(result.steps) == []
    assert verdict_step.seconds < 30, f"{label}: the step took {verdict_step.seconds:.0f} s"


# --- lies from beside the probe -------------------------------------------------------------
# "Could another publisher write while send ran / right after the call?" is the judge's own
# BEGIN IMMEDIATE, tried while the probe waits (checks/relay/witness.py): student code in the
# child can patch the probe's helpers or sqlite3 itself, and that must change nothing.

HOLDS_THE_LOCK_DURING_SEND = """
_real_relay_once = relay_once
def relay_once(con, owner, send, now, lease, limit, policy, after_claim=None, after_send=None):
    def locked_send(event):
        con.execute("BEGIN IMMEDIATE")  # a write lock held while the warehouse is slow
        try:
            return send(event)
        finally:
            con.execute("COMMIT")
    return _real_relay_once(con, owner, locked_send, now, lease, limit, policy,
                            after_claim=after_claim, after_send=after_send)
"""
LIES = {
    "patches labkit.probe.other_can_write": """
import labkit.probe as _probe
_probe.other_can_write = lambda db: True  # the probe's lock test, as it was, now always says "free"
""",
    "hides BEGIN from every new sqlite3 connection": """
import sqlite3 as _sqlite3
class _HidesBegin(_sqlite3.Connection):
    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith(("BEGIN", "ROLLBACK")):
            return self.cursor()
        return super().execute(sql, *args)
_real_connect = _sqlite3.connect
def _connect(*args, **kwargs):
    kwargs.setdefault("factory", _HidesBegin)
    return _real_connect(*args, **kwargs)
_sqlite3.connect = _connect
_sqlite3.Connection = _HidesBegin  # sqlite3.Connection's own execute cannot be set: swap the class and connect
""",
}
LOCK_CASE = "delivers every claimed row in order"
# The lock test a child-side probe ran until the judge did it itself (labkit.probe.other_can_write).
CHILD_SIDE_LOCK_TEST = """
import importlib.util, sqlite3, sys
import labkit.probe
def other_can_write(db):
    other = sqlite3.connect(db, isolation_level=None, timeout=0.05)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()
labkit.probe.other_can_write = other_can_write
db, module = sys.argv[1], sys.argv[2]
holder = sqlite3.connect(db, isolation_level=None)
holder.execute("CREATE TABLE t(x)")
holder.execute("BEGIN IMMEDIATE")
spec = importlib.util.spec_from_file_location("relay", module)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(labkit.probe.other_can_write(db))
"""


def _lock_case(lab, module: Path):
    step = run_lab(lab, module, steps=["8"], seed=SEED).steps[0]
    return {c.name: c for c in step.cases}[LOCK_CASE]


@pytest.fixture(scope="module")
def honest_lock_holder(lab, tmp_path_factory):
    """The module that holds the write lock across send, without any lie: how step 8 fails it."""
    module = tmp_path_factory.mktemp("holder") / "relay.py"
    module.write_text(REFERENCE.read_text() + HOLDS_THE_LOCK_DURING_SEND)
    case = _lock_case(lab, module)
    assert case.outcome is Outcome.WRONG and case.clauses == ("8.claim-committed",), (case.outcome, case.got)
    assert "the judge's own connection could not BEGIN IMMEDIATE" in case.got
    return module, case


def _fooled_in_the_child(module: Path, db: Path) -> str:
    """What the child-side lock test says, in a process that imported `module`, while another
    connection holds the write lock (the payload ran iff it says True)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CHILD_SIDE_LOCK_TEST, str(db), str(module)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("label", list(LIES))
def test_a_lie_from_beside_the_probe_changes_nothing(lab, tmp_path, label, honest_lock_holder):
    honest, honest_case = honest_lock_holder
    module = tmp_path / "relay.py"
    module.write_text(REFERENCE.read_text() + HOLDS_THE_LOCK_DURING_SEND + LIES[label])
    # The payload works: in a process that imported it, the child-side lock test says "free"
    # while the lock is held (and without the lie it says "locked").
    assert _fooled_in_the_child(honest, tmp_path / "honest.db") == "False"
    assert _fooled_in_the_child(module, tmp_path / "lied.db") == "True"
    # ... and the verdict is the one the honest lock holder gets, from the judge's own look.
    case = _lock_case(lab, module)
    assert (case.outcome, case.clauses, case.got, case.hint) == \
        (honest_case.outcome, honest_case.clauses, honest_case.got, honest_case.hint)
    assert "Commit the claim before the first send" in case.hint
