"""Lab `pipeline`'s checks: the reference passes, every catalogued mistake fails where it should
with the message and the clause it promises, the skeleton is "not implemented", and nothing of
either server is left behind.

Each wrong solution (`tests/wrong_solutions/pipeline.toml`, built by tests/catalogue.py) is
`solutions/pipeline.py` with one realistic mistake (`pipeline/<name>.patch`), and says in its
docstring which step must fail, which contract clause catches it and what the student must be
told. The checks start one real PostgreSQL and one real Valkey per judge run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from catalogue import failures, promise, step_verdicts, touched_definitions, wrong_files

from checks.pipeline.contract import CLAUSES
from labkit import labs
from labkit.judge.run import LabSpec, run_lab
from labkit.judge.verdict import Outcome
from labkit.notebook import build
from labkit.notebook.module_export import assemble

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "pipeline.py"
LESSON = ROOT / "notebooks" / "source" / "04-pipeline.md"
WRONG = wrong_files("pipeline")
SEED = 1
STEPS = ["1", "2", "3", "4", "5", "6", "7", "8", "final"]

# Every pitfall labs/pipeline.md says the checks must catch, by the file that makes it.
PITFALLS = {
    "open_db_no_advisory_lock",  # CREATE TABLE IF NOT EXISTS racing
    "open_db_autocommit_off", "open_db_select_outside_transaction",  # idle in a transaction
    "accept_select_then_insert",  # UniqueViolation under a race
    "claim_without_skip_locked", "claim_without_for_update", "claim_callers_clock", "claim_max_fence_plus_one",
    "publish_saves_before_xadd", "publish_ignores_fence", "publish_trims_maxlen",
    "group_at_dollar",
    "consume_acks_before_commit", "consume_stock_own_transaction", "consume_new_entries_only",
    "consume_acks_poison_first", "consume_noack",
    "reclaim_ignores_delivery_counts", "reclaim_one_xautoclaim_page",
    "lag_none_when_empty",
}


@pytest.fixture(scope="module")
def lab() -> LabSpec:
    return labs.load("pipeline")


def test_the_catalogue_is_complete():
    assert len(WRONG) >= 35
    names = {p.stem for p in WRONG}
    assert PITFALLS <= names, f"missing wrong solutions: {sorted(PITFALLS - names)}"
    known = {c.id for c in CLAUSES}
    for path in WRONG:
        said = promise(path)
        assert said["clause"] in known, f"{path.name} names an unknown clause {said['clause']}"
        assert said["clause"].split(".")[0] == said["step"], f"{path.name}: its clause is not of step {said['step']}"


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_is_the_reference_with_one_mistake(path):
    touched = touched_definitions(path, REFERENCE)
    assert len(touched) == 1, (f"{path.name} differs from solutions/pipeline.py in {sorted(touched)}: keep "
                               f"tests/wrong_solutions/pipeline/{path.stem}.patch to the one mistake")


def test_the_reference_is_built_from_the_lesson():
    assert build.reference_module(build.parse(LESSON)) == REFERENCE.read_text()


@pytest.mark.parametrize("seed", [1, 2])
def test_reference_passes_every_step(lab, seed):
    steps = step_verdicts("pipeline", REFERENCE, STEPS, seed)
    failing = {s: failures(v) for s, v in steps.items() if not v.passed}
    assert not failing, f"seed {seed}: the reference fails {failing}"
    # labs/pipeline.md's budget is 0.5 s per non-crash step and 6 s for the lab on a quiet machine;
    # here only a bound that a loaded one keeps
    assert all(v.seconds < 20 for v in steps.values()), {s: v.seconds for s, v in steps.items()}


def test_every_clause_is_tried_and_every_case_names_known_clauses(lab):
    steps = step_verdicts("pipeline", REFERENCE, STEPS, SEED)
    known = {c.id for c in CLAUSES}
    tried = {clause for s in steps.values() for c in s.cases for clause in c.clauses}
    assert tried <= known, f"cases name clauses the contract does not declare: {sorted(tried - known)}"
    assert known <= tried, f"clauses no case tries: {sorted(known - tried)}"
    untagged = [(n, c.name) for n, s in steps.items() for c in s.cases if not c.clauses]
    assert not untagged, f"cases without a clause: {untagged}"


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_solution_fails_its_step(lab, path):
    said = promise(path)
    step = said["step"]
    control = "5" if step != "5" else "8"  # ensure_group uses nothing of the other steps' code
    steps = step_verdicts("pipeline", path, [step, control], SEED)
    assert not steps[step].passed, f"{path.name}: step {step} passed although it is wrong: {said['mistake']}"
    assert steps[step].status == "failed"
    messages = failures(steps[step])
    assert said["message"] in messages, (f"{path.name}: step {step} fails, but not with the promised message "
                                         f"{said['message']!r}:\n{messages}")
    caught = {clause for c in steps[step].cases if not c.passed and c.outcome is not Outcome.NOT_REACHED
              for clause in c.clauses}
    assert said["clause"] in caught, f"{path.name}: the failing cases name {sorted(caught)}, not {said['clause']}"
    assert steps[control].passed, f"{path.name}: step {control} should not be affected:\n{failures(steps[control])}"


def skeleton_module() -> str:
    lesson = build.parse(LESSON)
    return assemble({b.arg: build.skeleton(b.text) for b in lesson.blocks if b.kind == "step"})


def test_skeleton_is_not_implemented_in_every_step(lab, tmp_path):
    module = tmp_path / "pipeline.py"
    module.write_text(skeleton_module())
    result = run_lab(lab, module, steps=STEPS, seed=SEED)
    assert {str(s.step): s.status for s in result.steps} == dict.fromkeys(STEPS, "not_implemented"), \
        {s.step: failures(s) for s in result.steps if s.status != "not_implemented"}
    assert result.score == 0


def test_nothing_of_the_servers_is_left(lab, judge_tmp, tmp_path):
    """A run leaves no server process, socket or folder: on a pass, and on a step that fails.
    (In a temp dir of this test's own: other tests run servers beside it.)"""
    import psutil

    private, created = judge_tmp

    def ours() -> list:  # PostgreSQL's data, and its processes' cwd, may be in a folder it made elsewhere
        places = [str(private), *created]
        found = []
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            try:
                if any((proc.info["cwd"] or "").startswith(place) for place in places):
                    found.append(proc.info)
            except psutil.Error:
                pass
        return found

    run_lab(lab, REFERENCE, steps=["1", "6"], seed=SEED)
    broken = tmp_path / "pipeline.py"  # outside `private`, whose emptiness is asserted
    broken.write_text(REFERENCE.read_text() + "\ndef consume(*a, **k):\n    raise SystemExit(3)\n")
    assert not run_lab(lab, broken, steps=["6"], seed=SEED).passed
    assert ours() == []
    assert list(private.iterdir()) == []
    assert [path for path in created if os.path.exists(path)] == []


def test_final_check_shows_the_processes_the_servers_their_kills_and_the_ladder(lab):
    final = step_verdicts("pipeline", REFERENCE, ["final"], SEED)["final"]
    assert final.passed, failures(final)
    evidence = final.evidence
    actors = {e["actor"] for e in evidence.timeline}
    assert {"publisher #1", "publisher #2", "consumer A", "consumer B", "Valkey", "PostgreSQL"} <= actors
    assert any(e["actor"] == "Valkey" and e["kind"] == "killed" for e in evidence.timeline)
    assert any(e["actor"] == "PostgreSQL" and e["kind"] == "killed" for e in evidence.timeline)
    assert any("os._exit(75)" in e["text"] for e in evidence.timeline)
    assert [e["t"] for e in evidence.timeline] == sorted(e["t"] for e in evidence.timeline)
    rungs = [r["rung"] for r in evidence.ladder]
    for name in ("accepted in PostgreSQL", "claimed with fence F", "in the stream as entry E",
                 "published saved by the fence holder", "delivered to consumer C (count k)",
                 "applied in the inbox", "acknowledged (PEL empty)"):
        assert name in rungs


def test_the_judges_kept_connection_survives_a_restart_and_closes_with_the_servers():
    """`Db.look` reads on one kept connection: a server killed and restarted under it (the final
    check does so) costs one reconnection, not a failed read; the servers' close closes it."""
    from checks.pipeline.servers import Servers
    from labkit.servers import postgres

    with Servers() as srv:
        db = srv.database("t")
        db.setup("CREATE TABLE kept(x int)", ("INSERT INTO kept VALUES (%s)", (1,)))
        assert db.look("SELECT x FROM kept") == [(1,)]
        first = db._look
        postgres.stop_immediately(srv.pg)
        postgres.restart(srv.pg)
        assert db.look("SELECT x, 'a%' FROM kept") == [(1, "a%")]
        assert first.closed and db._look is not first
        kept = db._look
    assert kept.closed


@pytest.mark.parametrize("ending, said", [("os._exit(7)", "exit code 7"), ("os.kill(os.getpid(), 9)", "SIGKILL")])
def test_a_racer_that_dies_is_read_as_a_lone_child_would_be(lab, tmp_path, ending, said):
    """The racers are forked from one child (`probes.race`): one that dies in the student's code
    ends that child the same way, and the race's case says how, as it would of its own process."""
    source = REFERENCE.read_text()
    head = "def accept(conn, event):\n"
    assert source.count(head) == 1
    module = tmp_path / "pipeline.py"
    module.write_text(source.replace(head, head + "    if isinstance(event, dict) and event.get('id') == 'race-1':\n"
                                             f"        import os\n        {ending}\n"))
    step = run_lab(lab, module, steps=["2"], seed=SEED).steps[0]
    raced = [c for c in step.cases if "processes accept one id at once" in c.name]
    assert len(raced) == 1 and raced[0].outcome is Outcome.DIED, raced
    assert said in raced[0].got, raced[0].got
    others = [c for c in step.cases if c is not raced[0]]
    assert all(c.passed for c in others), [c.name for c in others if not c.passed]
