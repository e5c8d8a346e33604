"""Lab `vending`: every case sends what its name says, every verdict rests on what the judge saw.

- the cases' inputs, as the child received them (exact types and lengths), and their clauses
  as the judge's oracle names them;
- the judge's own observations hold when the student's code fools the child's (a probe
  patched from the student's module, a connection opened behind the probe's back, a witness
  request patched away), and the witness looks only at the stores the judge registered;
- the code that closes what it was given, or returns a closed connection, gets a verdict;
- the refused-connection case cannot race with a feed;
- the final check claims only what it observed (an ACK before before_ack, a before_ack
  before the commit), and never blames the course's feed.
"""

from __future__ import annotations

import random
import re
import socket
import sys
import time
from pathlib import Path
from unittest.mock import patch

import pytest
from catalogue import failures, wrong_file
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.vending import open_store, oracle, parse, replay
from checks.vending import witness as fault_witness
from checks.vending.feed_looks import close_feeds
from checks.vending.feed_server import start_feed
from checks.vending.store import make_store
from labkit import labs, probe
from labkit.judge.child import run_child
from labkit.judge.ports import refusing_port
from labkit.judge.run import run_lab
from labkit.judge.verdict import Outcome
from labkit.judge.witness import Witness
from labkit.sandbox import reaper
from labkit.values import decode

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "client.py"
COURSE_BLAME = re.compile(r"checker itself failed|bug in the course|labkit/feed|course's feed", re.I)


@pytest.fixture(scope="module")
def lab():
    return labs.load("vending")


def load_reference():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_client", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Capture:
    """A stand-in StepContext for the pure steps: keeps the plans and calls instead of running them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"{seed}:1")
        self.plans: list = []
        self.args: dict = {}

    def cases(self, probe, plans, args=None, env=None, probes=None):
        self.plans, self.args = plans, args
        return []


def captured(check, seed: int = 1) -> Capture:
    """Run a pure step's check on a stand-in context: its plans and calls, no child, no property test."""
    ctx = Capture(seed)
    with patch.object(sys.modules[check.__module__], "differential", lambda *args, **kwargs: []):
        check(ctx)
    return ctx


def step_cases(check, seed: int = 1) -> list[tuple]:
    ctx = captured(check, seed)
    return [(p, [decode(a) for a in c["args"]]) for p, c in zip(ctx.plans, ctx.args["calls"], strict=True)]


# --- what the cases send -----------------------------------------------------------------


def test_every_step_1_case_sends_what_its_name_says(tmp_path):
    """Run the step's own calls in a real child and read what each call received there."""
    ctx = captured(parse.check_parse)
    marker = reaper.new_marker()
    try:
        run = run_child(REFERENCE, "labkit.probe:calls", ctx.args, workdir=tmp_path, timeout=20, marker=marker,
                        module_name="client")
    finally:
        reaper.kill_marked(marker)
    received = {name: record["observed"]["received"][0] for name, record in run.cases().items()}
    assert len(received) == len(ctx.plans) > 80
    kinds = {"a str": "str", "a bytearray": "bytearray", "None": "NoneType", "an int": "int"}
    for plan, call in zip(ctx.plans, ctx.args["calls"], strict=True):
        line = decode(call["args"][0])
        got = received[plan.name]
        assert got["type"] == type(line).__name__, plan.name
        for prefix, kind in kinds.items():
            if plan.name.startswith(prefix):
                assert got["type"] == kind, f"{plan.name!r} sent a {got['type']}"
        size = re.search(r"(\d+)-byte", plan.name)
        if size:
            assert got["len"] == int(size.group(1)) == len(line), f"{plan.name!r} sent {got['len']} bytes"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_step_1_cases_name_the_clause_the_oracle_names_and_agree_with_it(seed):
    """Each case's first clause is the rule the judge's oracle says the line is about; the oracle
    and the reference give the same outcome for every case line."""
    reference = load_reference()
    for plan, (line,) in step_cases(parse.check_parse, seed):
        expected = outcome_of(oracle.parse_line, line)
        assert outcome_of(reference.parse_line, line) == expected, plan.name
        if plan.expected == "ValueError":
            assert expected == ("raised", "ValueError"), plan.name
            assert oracle.line_clause(line) == plan.clauses[0], plan.name


def outcome_of(fn, *args):
    try:
        return ("returned", fn(*args))
    except ValueError:
        return ("raised", "ValueError")
    except Exception as exc:  # ResyncRequired of either module
        return ("raised", type(exc).__name__)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_step_4_cases_agree_with_the_oracle(seed):
    reference = load_reference()
    for plan, args in step_cases(replay.check_replay, seed):
        assert outcome_of(reference.replay, *args) == outcome_of(oracle.replay, *args), plan.name


FRAME_BYTES = st.one_of(
    st.binary(max_size=30),
    st.builds(lambda s, d, tail: b"EVENT %d %d" % (s, d) + tail, st.integers(-2, 2**31 + 2),
              st.integers(-1002, 1002), st.sampled_from([b"\n", b"\r\n", b"", b"\n\n", b" \n", b"\t\n"])),
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(FRAME_BYTES)
def test_the_oracle_parses_exactly_as_the_reference(line):
    """Two implementations written apart: a difference is a bug in one of them."""
    assert outcome_of(oracle.parse_line, line) == outcome_of(REF.parse_line, line)


EVENT_LOGS = st.builds(lambda first, ds: [(first + i, d) for i, d in enumerate(ds)],
                       st.integers(0, 20), st.lists(st.integers(-1001, 1001), min_size=0, max_size=20))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(EVENT_LOGS, st.integers(-3, 30), st.integers(-1, 18))
def test_the_oracle_replays_exactly_as_the_reference(events, last, limit):
    assert outcome_of(oracle.replay, events, last, limit) == outcome_of(REF.replay, events, last, limit)


REF = load_reference()


# --- the judge's own observations ----------------------------------------------------------


def mutate(tmp_path: Path, name: str, old: str, new: str, prefix: str = "") -> Path:
    source = REFERENCE.read_text()
    assert source.count(old) == 1, old
    path = tmp_path / "client.py"
    path.write_text(prefix + source.replace(old, new))
    return path


def test_a_connection_opened_behind_the_probes_back_is_still_seen_left_open(lab, tmp_path):
    """`from sqlite3 import connect` escapes the child's tracking; the judge still sees the file held."""
    module = mutate(tmp_path, "client", "    con = sqlite3.connect(path, isolation_level=None, timeout=1.0)\n    try:\n"
                    "        con.executescript", "    con = CONNECT(path, isolation_level=None, timeout=1.0)\n    try:\n"
                    "        con.executescript", prefix="from sqlite3 import connect as CONNECT\n")
    module.write_text(module.read_text().replace("    except BaseException:\n        con.close()\n        raise\n"
                                                 "    return con", "    except BaseException:\n        raise\n"
                                                 "    return con"))
    step = run_lab(lab, module, steps=[2], seed=1).steps[0]
    failing = {c.name: c for c in step.cases if not c.passed}
    case = failing["open_store on a file that is not a database"]
    assert "the judge saw the process still holding the file" in case.got and case.clauses == ("2.init-failure",)


CHEAT = '''import checks.vending.probes as _probes

_probes.peek = lambda db: {"last": 10**9, "total": 0, "ledger": []}  # "everything is always committed"
'''


def test_an_ack_before_the_commit_is_caught_by_the_feed_even_when_the_child_is_fooled(lab, tmp_path):
    """The student's module patches the probe's own view of the store; the feed's own journal still
    shows an ACK for a line whose commit the judge made impossible."""
    source = wrong_file("vending", "ack_before_commit").read_text().split('"""\n', 1)[1]
    module = tmp_path / "client.py"
    module.write_text(CHEAT + source)
    step = run_lab(lab, module, steps=[6], seed=1).steps[0]
    case = next(c for c in step.cases if c.name == "the store refuses to commit seq 1")
    assert not case.passed
    assert "the feed received ACKs for 0 and 1; expected 0" in case.got
    assert case.clauses == ("6.hook-before-ack",)


BLIND = '''import checks.vending.probes as _probes

_probes._inside = lambda con: None  # "nothing to see inside": the order check is skipped
'''


def test_a_fault_outside_the_transaction_is_caught_by_the_judge_even_when_the_child_is_fooled(lab, tmp_path):
    """fault() runs before BEGIN IMMEDIATE, and the module blinds the probe's own views of the
    transaction; the judge, looking at the store while fault() waits, finds no write lock."""
    module = mutate(tmp_path, "client", '    con.execute("BEGIN IMMEDIATE")\n    try:\n        (last,)',
                    '    if fault is not None and seq == con.execute("SELECT last FROM checkpoint").fetchone()[0] + 1:\n'
                    '        fault()\n        fault = None\n'
                    '    con.execute("BEGIN IMMEDIATE")\n    try:\n        (last,)', prefix=BLIND)
    step = run_lab(lab, module, steps=[3], seed=1).steps[0]
    case = next(c for c in step.cases if c.name == "the next event with a fault() that passes")
    assert not case.passed
    assert "the judge could BEGIN IMMEDIATE on the store" in case.got
    assert "3.one-transaction" in case.clauses


SILENT = '''import checks.vending.probes as _probes

_probes.tell_witness = lambda url, case: None  # "the judge has looked": no request is ever made
'''


def test_a_fault_the_judge_never_saw_fails_whatever_the_child_reports(lab, tmp_path):
    """The module patches away the probe's request to the judge's witness: the judge has no
    sighting of fault(), so the case fails although the child's own views look right."""
    module = tmp_path / "client.py"
    module.write_text(SILENT + REFERENCE.read_text())
    step = run_lab(lab, module, steps=[3], seed=1).steps[0]
    case = next(c for c in step.cases if c.name == "the next event with a fault() that passes")
    assert not case.passed and "fault() was called 0 times" in case.got


def test_the_fault_witness_looks_only_at_the_stores_the_judge_registered(tmp_path):
    """The child names a case, never a file: any other name, even a store's own path, opens nothing."""
    db = make_store(tmp_path / "case.db", [(0, 5)])
    with Witness(fault_witness.look_at({"a case": db})) as witness:
        assert probe.see(witness.url, "a case", "fault") == {}
        for case in (str(db), "/etc/passwd", "another case"):
            assert "refused" in probe.see(witness.url, case, "fault")
        assert probe.see(witness.url, "a case", "after") == fault_witness.REFUSED
        assert fault_witness.faults_seen(witness, "a case") == [
            {"write_locked": False, "outside": {"last": 0, "total": 5, "ledger": [[0, 5]]}}]
        assert len([s for s in witness.sightings() if s.saw == fault_witness.REFUSED]) == 4


def test_closing_the_connection_it_was_given_is_a_verdict_not_a_probe_crash(lab, tmp_path):
    """The probe reads `con.in_transaction` after the call: on a closed connection that raised and
    the child ended with 'don't call sys.exit()'. Now every case is judged, and the session that
    needs the connection afterwards fails with a message about the code."""
    module = mutate(tmp_path, "client", '        con.execute("COMMIT")\n        return True',
                    '        con.execute("COMMIT")\n        con.close()  # done with it\n        return True')
    verdict = run_lab(lab, module, steps=[3, 6], seed=1)
    for step in verdict.steps:
        text = failures(step)
        assert "sys.exit" not in text and not COURSE_BLAME.search(text)
        assert all(c.outcome is not Outcome.NOT_REACHED for c in step.cases), text
    session = verdict.steps[1]
    assert not session.passed and "Cannot operate on a closed database" in failures(session)


def test_a_closed_connection_from_open_store_is_named(lab):
    step = run_lab(lab, wrong_file("vending", "store_closed_before_return"), steps=[2], seed=1).steps[0]
    text = failures(step)
    assert "returned a connection that was already closed" in text
    assert "sys.exit" not in text and not COURSE_BLAME.search(text)


def test_the_refusing_port_refuses_and_no_feed_gets_it_while_held():
    held = refusing_port()
    try:
        port = held.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        feeds = [start_feed([(0, 1)]) for _ in range(20)]
        try:
            assert port not in {f.port for f in feeds}
        finally:
            close_feeds(feeds)
    finally:
        held.close()


# --- the final check claims only what it observed ----------------------------------------------


def test_before_ack_before_the_commit_fails_the_kill_and_stops_there(lab):
    """Issue 10: the ladder printed '{kill}', 'dies after the commit' passed with nothing
    committed, and the timeline claimed a duplicate the ledger never held."""
    final = run_lab(lab, wrong_file("vending", "hook_before_commit"), steps=["final"], seed=1).steps[0]
    first, *later = final.cases
    assert first.outcome is Outcome.WRONG and "seq 1 was not committed" in first.got
    assert first.clauses == ("final.dies-after-commit",)
    assert all(c.outcome is Outcome.NOT_REACHED and "client #1 did not die between commit 1 and ACK 1" in c.got
               for c in later)
    evidence = final.evidence
    assert not any("{" in r["observed"] for r in evidence.ladder), evidence.ladder
    rungs = {r["rung"]: r["observed"] for r in evidence.ladder}
    assert rungs["committed"].startswith("no") and rungs["recognised as duplicate"].startswith("not reached")
    assert not any(e["kind"] == "duplicate" for e in evidence.timeline)
    assert {e["actor"] for e in evidence.timeline} >= {"client #1", "feed"}
    assert "client #2" not in {e["actor"] for e in evidence.timeline}
    assert evidence.faults == []


def test_an_ack_before_before_ack_is_the_clients_fault_not_the_feeds(lab):
    final = run_lab(lab, wrong_file("vending", "hook_after_ack"), steps=["final"], seed=1).steps[0]
    first = final.cases[0]
    assert "the feed received ACK 1 from client #1 before it died in before_ack(1)" in first.got
    assert not COURSE_BLAME.search(failures(final))
    rungs = {r["rung"]: r["observed"] for r in final.evidence.ladder}
    assert rungs["ACK seen by the feed"].startswith("yes")


@pytest.mark.parametrize("seed", [1, 7, 123456])
def test_the_final_check_always_kills_at_seq_1(lab, seed):
    final = run_lab(lab, REFERENCE, steps=["final"], seed=seed).steps[0]
    assert final.passed, failures(final)
    assert final.cases[0].name == "client #1 dies in before_ack(1), after commit 1 and before ACK 1"
    assert any(f.startswith("client #1 killed in before_ack at seq 1") for f in final.evidence.faults)


def test_got_lines_print_no_python_lists(lab):
    """Issue 10: 'the feed sent [0]' → readable text."""
    for name, steps in (("old_lines_skipped", ["final"]), ("ack_before_commit", [6]), ("before_ack_not_passed", [7])):
        verdict = run_lab(lab, wrong_file("vending", name), steps=steps, seed=1)
        for step in verdict.steps:
            for case in step.cases:
                assert not re.search(r"(sent|ACKs? for|ACKed) \[", case.got), case.got


def test_the_judges_own_looks_do_not_spend_the_students_step_budget(lab, monkeypatch):
    """On a loaded machine the judge's observations between cases are slow; they must not make a
    correct solution run out of its step budget (the budget counts the child's calls only)."""
    looked = open_store.observe_store

    def slow_look(pid, spec):
        time.sleep(1.5)
        return looked(pid, spec)

    monkeypatch.setattr(open_store, "observe_store", slow_look)
    step = run_lab(lab, REFERENCE, steps=[2], seed=1).steps[0]
    assert len(step.cases) * 1.5 > 10, "the looks alone must outlast the step budget"
    assert step.passed, failures(step)


@pytest.mark.parametrize("slow", ["    _t = time.process_time()\n    while time.process_time() - _t < 0.25:\n        pass\n",
                                  "    time.sleep(0.5)\n"], ids=["burns-cpu", "sleeps"])
def test_slow_code_still_runs_out_of_its_step_budget(lab, tmp_path, slow):
    """The budget is the child's CPU time, within a wall bound of WALL_FACTOR budgets: code that
    burns CPU (10 s in all), and code that only waits (20 s in all), both end as a timeout (step
    budget 4 s here: 16 s of waiting at most)."""
    module = mutate(tmp_path, "client", '    """Apply one event exactly once: True if applied, False if an identical duplicate."""\n',
                    '    """Apply one event exactly once: True if applied, False if an identical duplicate."""\n' + slow,
                    prefix="import time\n")
    step = run_lab(lab, module, steps=[3], seed=1, timeout=4.0).steps[0]
    assert not step.passed
    assert any("no answer within" in c.got for c in step.cases if not c.passed), failures(step)
