"""Differential property tests (`labkit.judge.differential`), on a toy lab.

The toy contract: `parse_count(text)` takes a str of ASCII digits without leading zeros
(except "0" itself) naming 0..1000, and returns that int; anything else is ValueError. The
oracle lives here, in the judge; toy student modules get it right or wrong in one way each.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labkit.judge import differential as differential_module
from labkit.judge.differential import differential
from labkit.judge.run import LabSpec, StepContext, StepSpec, run_lab
from labkit.judge.verdict import Outcome

ROOT = Path(__file__).resolve().parents[1]


def oracle(text):
    if type(text) is not str or not text.isascii() or not text.isdigit():
        raise ValueError("digits only")
    if text != "0" and text.startswith("0"):
        raise ValueError("no leading zeros")
    if int(text) > 1000:
        raise ValueError("0..1000")
    return int(text)


def clause_of(text):
    if type(text) is str and text.isascii() and text.isdigit() and not text.startswith("0"):
        return "1.range", "The count ranges from 0 to 1000."
    return "1.digits", "Only ASCII digits, no sign, no leading zeros."


def check(ctx: StepContext):
    from hypothesis import strategies as st

    # near every clause: both ends of the range, leading zeros, signs and spaces, any short text
    numbers = (st.integers(-3, 12) | st.integers(995, 1005) | st.integers(-20, 2000)).map(str)
    near = st.tuples(st.sampled_from(["0", "+", " ", "-"]), numbers).map("".join)
    return differential(ctx, "parse_count", st.tuples(numbers | near | st.text(max_size=6)), oracle,
                        clause_of, clauses=("1.range", "1.digits"))


def check_mutation(ctx: StepContext):
    from hypothesis import strategies as st

    return differential(ctx, "total", st.tuples(st.lists(st.integers(0, 9), max_size=5)), sum,
                        lambda items: ("2.sum", "Add them up."), clauses=("2.sum",), unchanged="2.no-mutation")


TOY = LabSpec("toy", "toy", "labkit.probe", [StepSpec(1, "parse_count", 1, check),
                                              StepSpec(2, "total", 1, check_mutation)])

CORRECT = '''\
def parse_count(text):
    if type(text) is not str or not text.isascii() or not text.isdigit():
        raise ValueError("digits only")
    if len(text) > 1 and text[0] == "0":
        raise ValueError("no leading zeros")
    value = int(text)
    if value > 1000:
        raise ValueError("too big")
    return value


def total(items):
    return sum(items)
'''


def student(tmp_path: Path, source: str = CORRECT, **replace: str) -> Path:
    for old, new in replace.items():
        assert old in source
        source = source.replace(old, new)
    path = tmp_path / "toy.py"
    path.write_text(source)
    return path


def student_dir(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / str(n)
    folder.mkdir()
    return folder


def judge(path: Path, seed: int = 1, step: int = 1):
    return run_lab(TOY, path, steps=[step], seed=seed).steps[0].cases


def test_a_correct_module_passes_with_one_case_tagged_with_every_clause(tmp_path, nothing_left):
    with nothing_left():
        cases = judge(student(tmp_path))
    assert [(c.outcome, c.clauses) for c in cases] == [(Outcome.PASSED, ("1.range", "1.digits"))]
    assert cases[0].called.startswith("parse_count on ")


def test_a_module_wrong_on_one_input_fails_with_the_shrunk_input_and_its_clause(tmp_path, nothing_left):
    with nothing_left():
        [case] = judge(student(tmp_path, **{"value > 1000": "value > 1001"}))
    assert case.outcome is Outcome.WRONG
    assert case.called == "parse_count('1001')"
    assert (case.expected, case.got) == ("ValueError", "returned 1001")
    assert case.clauses == ("1.range",)
    assert case.hint == "The count ranges from 0 to 1000."


def test_an_unexpected_exception_is_reported_with_the_students_traceback(tmp_path):
    [case] = judge(student(tmp_path, **{'raise ValueError("no leading zeros")': "raise KeyError(text)"}))
    assert case.outcome is Outcome.RAISED
    assert case.called == "parse_count('00')"
    assert case.got.startswith("raised KeyError")
    assert "toy.py" in case.trace and case.clauses == ("1.digits",)


def test_drawn_inputs_are_distinct_follow_the_seed_and_stop_when_the_strategy_runs_out():
    """`drawn` is what the property test asks the child about: `examples` distinct tuples, the
    same for the same seed, others for another; a strategy with fewer values gives all it has
    (after a bounded number of draws), and a filter that refuses a draw costs a draw, not the test."""
    from hypothesis import strategies as st

    from labkit.judge.differential import _no_local_constants, drawn

    _no_local_constants()
    numbers = st.tuples(st.integers(-10**6, 10**6))
    first = [args for args, _ in drawn(numbers, 1, 150)]
    assert len(first) == 150 and len(set(first)) == 150
    assert first == [args for args, _ in drawn(numbers, 1, 150)]
    assert first != [args for args, _ in drawn(numbers, 2, 150)]
    assert sorted(args for args, _ in drawn(st.tuples(st.booleans()), 1, 150)) == [(False,), (True,)]
    odd = [args for args, _ in drawn(st.tuples(st.integers(0, 99).filter(lambda n: n % 2)), 1, 20)]
    assert len(odd) == 20 and all(n % 2 for (n,) in odd)


def test_remembered_inputs_are_the_drawn_ones_kept_as_far_as_a_search_went_and_copied(monkeypatch):
    """A later search of the same test and seed gets what drawing again would give, from the kept
    draws; a search that stopped early drew only that far; a change to a given input stays its own."""
    from hypothesis import strategies as st

    from labkit.judge.differential import _no_local_constants, drawn, remembered

    _no_local_constants()
    monkeypatch.setattr(differential_module, "_DRAWN", {})
    logs = st.tuples(st.lists(st.integers(0, 10**6), min_size=1, max_size=5))
    expected = list(drawn(logs, 3, 40))
    first = remembered(logs, 3, 40, ("toy", "sums"))
    early = [next(first) for _ in range(5)]
    kept = differential_module._DRAWN[(3, 40, ("toy", "sums"))]
    assert len(kept.made) == 5 and early == expected[:5]
    early[0][0][0].append("changed by a caller")
    with ThreadPoolExecutor(3) as pool:
        again = list(pool.map(lambda _: list(remembered(logs, 3, 40, ("toy", "sums"))), range(3)))
    assert again == [expected] * 3
    assert list(remembered(logs, 4, 40, ("toy", "sums"))) == list(drawn(logs, 4, 40))  # another seed: drawn


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_same_seed_gives_the_same_verdict_and_counterexample(tmp_path, seed):
    path = student(tmp_path, **{"not text.isdigit()": "not text.strip('+').isdigit()"})
    first, again = judge(path, seed), judge(path, seed)
    assert first == again
    assert first[0].outcome is Outcome.WRONG and first[0].clauses == ("1.digits",)


def test_a_hanging_function_is_timed_out_at_the_input_that_hung(tmp_path, nothing_left, monkeypatch):
    # 3 s, not 1: the import check shares the step's time, and a child that could not start
    # is started again only while more than 1 s is left (a 1 s step under CI's load once
    # reported that the check's process had ended before it loaded the module).
    monkeypatch.setenv("LABKIT_STEP_TIMEOUT", "3")
    hangs = student(tmp_path, **{"    value = int(text)\n": "    value = int(text)\n    while value == 7:\n        pass\n"})
    with nothing_left():
        started = time.monotonic()
        [case] = judge(hangs)
    assert time.monotonic() - started < 10
    assert case.outcome is Outcome.TIMED_OUT, case.got
    assert case.called == "parse_count('7')"
    assert case.got == "no answer within 3 s; the process was killed"


@pytest.mark.parametrize(("line", "outcome", "got"), [
    ("import os; os._exit(9)", Outcome.DIED, "the process died (exit code 9) before answering"),
    ("import sys; sys.exit(2)", Outcome.RAISED, "ended the process: raised SystemExit: 2"),
], ids=["os._exit", "sys.exit"])
def test_a_function_that_ends_the_child_is_a_named_outcome(tmp_path, nothing_left, line, outcome, got):
    path = student(tmp_path, **{"    value = int(text)\n": f"    value = int(text)\n    if value == 3:\n        {line}\n"})
    with nothing_left():
        [case] = judge(path)
    assert (case.outcome, case.got, case.called) == (outcome, got, "parse_count('3')")


@pytest.mark.parametrize(("source", "outcome"), [
    ("def parse_count(text):\n    raise NotImplementedError\n", Outcome.NOT_IMPLEMENTED),
    ("def other(text):\n    return 1\n", Outcome.MISSING),
    ("raise ImportError('nope')\n", Outcome.IMPORT_FAILED),
], ids=["skeleton", "missing", "does not import"])
def test_grey_and_import_outcomes_are_the_usual_ones(tmp_path, nothing_left, source, outcome):
    """Called directly (run_lab checks the import itself before any step)."""
    path = student(tmp_path, source)
    workdir = student_dir(tmp_path, 0)
    ctx = StepContext(TOY, path, workdir, random.Random(1), 1, 5.0, step=1)
    with nothing_left():
        [case] = check(ctx)
    assert case.outcome is outcome
    assert case.clauses == ("1.range", "1.digits")


def test_a_call_that_modifies_its_input_fails_the_no_mutation_clause(tmp_path):
    path = student(tmp_path, **{"    return sum(items)\n": "    items.append(0)\n    return sum(items)\n"})
    [case] = judge(path, step=2)
    assert case.outcome is Outcome.WRONG and case.clauses == ("2.no-mutation",)
    assert case.called == "total([])" and case.got == "returned 0, and modified its input"


def test_a_function_that_burns_cpu_trips_the_cpu_backstop(tmp_path, monkeypatch):
    """CPU time, not wall time: the verdict is the same on a busy machine."""
    monkeypatch.setattr(differential_module, "PROPERTY_CPU_SECONDS", 0.2)
    slow = student(tmp_path, **{"    value = int(text)\n": "    sum(range(300_000))\n    value = int(text)\n"})
    [case] = judge(slow)
    assert (case.outcome, case.got) == (Outcome.TIMED_OUT, "its calls used more than 0.2 s of CPU in all")


def test_a_function_that_sleeps_trips_the_wall_clock_backstop(tmp_path, monkeypatch):
    monkeypatch.setattr(differential_module, "PROPERTY_SECONDS", 0.5)
    slow = student(tmp_path, **{"    value = int(text)\n": "    import time; time.sleep(0.02)\n    value = int(text)\n"})
    [case] = judge(slow)
    assert (case.outcome, case.got) == (Outcome.TIMED_OUT, "its calls took more than 0.5 s in all")


def test_the_judges_own_time_between_calls_is_not_the_students(tmp_path, monkeypatch):
    """A loaded machine slows the judge's side (generating, the oracle, the round trip); only the
    calls' own time counts against the student, so a correct function still passes."""
    monkeypatch.setattr(differential_module, "PROPERTY_SECONDS", 0.5)
    real_call = differential_module.probe.call

    def slow_oracle(*args, **kwargs):
        time.sleep(0.02)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(differential_module.probe, "call", slow_oracle)
    [case] = judge(student(tmp_path))
    assert case.outcome is Outcome.PASSED, case


def test_property_tests_in_parallel_threads_give_the_serial_verdicts(tmp_path):
    """Steps run in threads of one judge process: Hypothesis must not mix their runs up."""
    paths = [student(student_dir(tmp_path, n), **change) for n, change in enumerate([
        {}, {"value > 1000": "value > 1001"}, {"not text.isdigit()": "not text.strip('+').isdigit()"},
        {'text[0] == "0"': 'text[0] == "9"'}])]
    jobs = [(path, seed) for path in paths for seed in (1, 2)]
    serial = [judge(path, seed) for path, seed in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(2):
            assert list(pool.map(lambda job: judge(*job), jobs)) == serial


GENERATE = """
import sys
from hypothesis import strategies as st
from labkit.judge.differential import _no_local_constants, drawn
if sys.argv[1] == "patched":
    _no_local_constants()
if sys.argv[2] == "more":
    import extra_constants  # one more local module, full of constants
print([args for args, _choices in drawn(st.tuples(st.integers(-10**6, 10**6)), 5, 300)])
"""


@pytest.mark.parametrize("patched", [False, True], ids=["Hypothesis as it is", "differential's setting"])
def test_loading_one_more_local_module_changes_nothing_with_differentials_setting(tmp_path, patched):
    """Hypothesis draws ~5% of its values from constants of the local modules in sys.modules;
    the CLI and pytest (and threads of one judge) load different ones. As it is, one more
    module changes what a seed draws; with `_no_local_constants` (what differential uses) it does not."""
    (tmp_path / "generate.py").write_text(GENERATE)
    (tmp_path / "extra_constants.py").write_text("".join(f"C{n} = {v}\n" for n, v in enumerate([777001, -555003, 313131])))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
           "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}
    mode = "patched" if patched else "plain"
    drawn = [subprocess.run([sys.executable, "generate.py", mode, more], cwd=tmp_path, env=env, capture_output=True,
                            text=True, check=True).stdout for more in ("same", "more")]
    assert (drawn[0] == drawn[1]) is patched


ADAPTER = '''\
import random


def call_pick(pick, items, seed):
    """What cannot cross the pipe is built in the child: a Random seeded as the judge says."""
    return pick(items, random.Random(seed))
'''


def check_pick(ctx: StepContext):
    from hypothesis import strategies as st

    args = st.tuples(st.lists(st.integers(0, 99), min_size=1, max_size=5), st.integers(0, 2**32))
    return differential(ctx, "pick", args, lambda items, seed: random.Random(seed).choice(items),
                        lambda items, seed: ("3.seeded", "Draw only from the rng you are given."),
                        clauses=("3.seeded",), adapter="toy_probes:call_pick",
                        show_call=lambda items, seed: f"pick({items}, random.Random({seed}))")


@pytest.mark.parametrize(("body", "passed"), [("return rng.choice(items)", True),
                                               ("return random.choice(items)", False)],
                         ids=["uses the rng it is given", "uses the global random"])
def test_an_adapter_builds_in_the_child_what_cannot_cross_the_pipe(tmp_path, monkeypatch, body, passed):
    probes = student_dir(tmp_path, 1)
    (probes / "toy_probes.py").write_text(ADAPTER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(probes), os.environ.get("PYTHONPATH")])))
    # The sandbox shows a child only the course's own probe modules; this toy adapter lives in
    # tmp_path, so the adapter mechanism is tested without it (tests/test_sandbox.py covers the box).
    monkeypatch.setenv("LABKIT_SANDBOX", "off")
    path = student(tmp_path, f"import random\n\n\ndef pick(items, rng):\n    {body}\n")
    lab = LabSpec("toy", "toy", "labkit.probe", [StepSpec(3, "pick", 1, check_pick)])
    [case] = run_lab(lab, path, seed=1).steps[0].cases
    assert case.passed is passed
    if not passed:
        assert case.called.startswith("pick([") and ", random.Random(" in case.called
        assert case.clauses == ("3.seeded",)


def test_inputs_drawn_ahead_are_the_ones_the_next_check_draws_and_wait_while_a_check_runs(tmp_path, monkeypatch):
    """The warm judge's `DrawsAhead`: the next seed's inputs are drawn in the pause after a check
    (never while one runs), the next check (without a seed of its own) takes that seed and uses
    them, and its verdict and counterexample are those of the same seed drawn inline."""
    from labkit.judge.ahead import DrawsAhead

    monkeypatch.setattr(differential_module, "_DRAWN", {})
    monkeypatch.setattr(differential_module, "_KNOWN", {})
    path = student(tmp_path, **{"not text.isdigit()": "not text.strip('+').isdigit()"})
    judge(path, seed=1)  # the test is now known to this process
    draws = DrawsAhead()
    try:

        def made(seed: int) -> int:
            key = (differential_module._seed_of(seed, 1, "parse_count"), 150,
                   ("toy", "parse_count agrees with the contract on generated inputs"))
            return len(differential_module._DRAWN[key].made) if key in differential_module._DRAWN else 0

        with draws.checking():
            draws.after("toy", ["1"])
            time.sleep(0.3)
            assert made(draws._next["toy"]) == 0, "it drew while a check ran"
        draws.settle(10)
        seed = draws.seed("toy")
        assert made(seed) == 150
        ahead = judge(path, seed)
        differential_module._DRAWN.clear()
        assert ahead == judge(path, seed)  # drawn inline: the same verdict, the same shrunk input
        assert ahead[0].outcome is Outcome.WRONG and ahead[0].clauses == ("1.digits",)
        assert draws.seed("toy") != seed  # a seed is taken once
    finally:
        draws.close()


@pytest.mark.parametrize(("lab", "step"), [("outbox", 1), ("vending", 1), ("vending", 4), ("relay", 5)])
def test_a_labs_property_test_draws_from_the_same_strategy_under_every_seed(lab, step, monkeypatch):
    """The warm judge draws the next check's inputs from the strategy the last check built
    (`ahead.DrawsAhead`): that is right only if no lab builds it from the seed."""
    from labkit import labs
    from labkit.judge import coverage

    monkeypatch.setattr(differential_module, "_KNOWN", {})
    spec, reference = labs.load(lab), coverage.reference(lab)
    built = []
    for seed in (1, 2):
        assert run_lab(spec, reference, steps=[step], seed=seed).passed
        built.append({name: repr(test.strategy) for name, test in differential_module._KNOWN.items()})
    assert built[0] and built[0] == built[1]
