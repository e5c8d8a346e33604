"""Differential property tests: the student's pure function against an oracle, on generated inputs.

The judge draws argument tuples from a lab's Hypothesis strategy (`drawn`: Hypothesis' own
provider, without its engine); each example is answered by the student's function in ONE child
that stays up (`child.child_session`, ~0.3 ms a call) and by the oracle the lab passes in (its
`checks/<lab>/oracle.py`, never visible to the child). On the first disagreement Hypothesis'
engine shrinks the input, starting from the choices that drew it, and the step gets ONE failing case:
`called` is the shrunk call, `expected` the oracle's outcome, `got` the student's, and `hint`
and `clauses` come from the lab's `clause_of(*shrunk_args)`. Agreement on every example gives
one passing case tagged with `clauses`.

    from hypothesis import strategies as st          # inside the check: the import costs ~0.2 s
    from labkit.judge.differential import differential

    def check_parse(ctx):                            # in a lab's package, beside its oracle
        frames = st.tuples(st.binary(max_size=70) | near_frames())
        return differential(ctx, "parse_line", frames, oracle.parse_line, clause_of=frame_clause,
                            clauses=("1.frame", "1.ranges", "1.leading-zeros"))

Outcomes are compared by class: both return values equal under `labkit.values.same` (True != 1,
tuple != list), or both raise and the student's exception is-a the oracle's class (by name,
as `expect.raises` matches). With `unchanged="4.no-mutation"`, a call that modifies its
arguments disagrees too, attributed to that clause.

Determinism: the drawing and Hypothesis' shrinking are seeded from the verdict seed, the step and
the function name (`hypothesis.seed`); Hypothesis uses no database of its own (only an in-memory
one that hands it the input to shrink), no deadline, no timing health check, no constants from
whatever local modules happen to be loaded (`_no_local_constants`), stops at the first bug,
and the count of examples (`examples`) and of calls while shrinking (`shrink_calls`) are
bounded, so the same module and seed give the same verdict and the same counterexample. Every
answer is cached by input, so a replay never asks the child twice. Two backstops end a test
early, as a timed-out case: the CPU time the student's calls use in the child
(`limits.PROPERTY_CPU_SECONDS`, ~1000x a reference; CPU time hardly moves with load, so this
one trips the same way on a busy machine) and, for a function that sleeps, the calls' own time
on the clock as the child measures it (`limits.PROPERTY_SECONDS`): the judge's own work between
calls (generating, shrinking, the round trip) is not the student's time, and at load 60 it made
150 calls of a correct function take over a minute. A wall-clock backstop on the whole test
(`limits.PROPERTY_WALL_BACKSTOP`) still bounds a child that lies about its times.

A call that hangs (`limits.CALL_TIMEOUT`), kills the child or calls sys.exit() ends the test at
that input, unshrunk, as the named outcome; a skeleton or a missing function is the usual grey
case; a module that does not import is an import failure.

Threads: a lab's steps run in parallel threads in one judge process. Hypothesis supports
running tests from several threads at once since 6.136.9 (its engine constants, build context
and global-random handling are thread-local; before that, separate tests in threads "mostly
worked" but were unsupported). Each call here builds its own test function, so no lock is
needed; tests/test_differential.py runs several at once and compares with the serial verdicts.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labkit import probe
from labkit.judge import expect
from labkit.judge.child import child_session
from labkit.judge.run import StepContext, beside
from labkit.judge.verdict import Case, Outcome
from labkit.limits import (
    CALL_TIMEOUT,
    PROPERTY_CPU_SECONDS,
    PROPERTY_EXAMPLES,
    PROPERTY_SECONDS,
    PROPERTY_WALL_BACKSTOP,
)
from labkit.values import decode, encode, same, show

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

# Hypothesis keeps its Unicode tables here, not in a `.hypothesis/` folder in the judge's cwd
# (a student's folder, the course's checkout). Building them costs ~1.5 s of CPU; a judge in
# its box (a fresh home) reads the grader's copy instead (`warm_unicode_tables`).
CACHE = Path.home() / ".cache" / "delivered-twice" / "hypothesis"
STORAGE_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"
STAMP = "drawn-for"  # in the shown copy: the Hypothesis and Unicode its tables were drawn for
# Calls allowed while shrinking, beyond the examples: enough to shrink the inputs of these
# labs to a minimum (measured: under 200), and a hard stop for determinism and time.
SHRINK_CALLS = 400
UNCHANGED_HINT = "Never modify the input: build and return a new value."
ENDING = ("timed_out", "died", "memory_limit", "aborted", "not_implemented", "missing")


@dataclass
class Finding:
    """One example where the student's function and the oracle disagree."""

    args: tuple
    student: dict  # the child's outcome (probe.call's description, or how the child ended)
    oracle: dict  # the oracle's outcome, described the same way
    mutated: bool = False

    @property
    def ends(self) -> bool:
        """The child cannot answer again (or never will): stop here, don't shrink."""
        return self.student.get("kind") in ENDING


class _Disagree(Exception):  # noqa: N818 - Hypothesis shrinks whatever the test raises
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.args)
        self.finding = finding


class _Stop(BaseException):  # noqa: N818 - a BaseException: Hypothesis lets it through unshrunk
    def __init__(self, finding: Finding | None, slow: str = "") -> None:
        super().__init__()
        self.finding = finding
        self.slow = slow  # which backstop tripped, when there is no finding


def differential(
    ctx: StepContext,
    fn: str,
    strategy: SearchStrategy[tuple],
    oracle: Callable[..., Any],
    clause_of: Callable[..., tuple[str, str]],
    *,
    clauses: tuple[str, ...],
    adapter: str | None = None,
    examples: int = PROPERTY_EXAMPLES,
    shrink_calls: int = SHRINK_CALLS,
    name: str | None = None,
    show_call: Callable[..., str] | None = None,
    unchanged: str | None = None,
) -> list[Case]:
    """Compare the student's `fn` with `oracle` on `examples` argument tuples drawn from `strategy`.

    `strategy` yields a tuple of positional arguments (values `labkit.values` carries); it is
    built the same way under every seed (never from `ctx.rng`): the seed picks the inputs, and
    the warm judge draws a check's inputs ahead from the strategy its last check built.
    `oracle(*args)` returns or raises what the contract says. `clause_of(*args)` returns
    `(clause_id, hint)`: the clause an input belongs to and the hint for a student who got it
    wrong. `clauses` tags the passing case (every clause the strategy reaches). `adapter`
    ("checks.<lab>.probes:function") is called in the child as `adapter(student_fn, *args)`.
    `show_call(*args)` writes the `called` line (default `fn(arg, ...)`). `unchanged` names
    the clause broken by a call that modifies its arguments (None: not checked).
    Returns one Case.
    """
    os.environ.setdefault(STORAGE_ENV, str(CACHE))  # read at Hypothesis' first write
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

    _no_local_constants()
    name = name or f"{fn} agrees with the contract on generated inputs"
    show_call = show_call or (lambda *args: f"{fn}({', '.join(show(a, 80) for a in args)})")
    answers: dict[str, Finding | None] = {}
    budget = {"calls": 0, "limit": examples + shrink_calls, "cpu": 0.0, "wall": 0.0, "deadline": 0.0}
    dropped = getattr(_SPECULATION, "stop", None)  # set: started ahead, and no longer wanted

    started, marker = ctx.first_child()
    with child_session(ctx.solution, workdir=ctx.workdir, timeout=ctx.timeout, marker=marker,
                       started=started, module_name=ctx.lab.module_name, lab=ctx.lab.package) as session:

        def answer(args: tuple) -> Finding | None:
            encoded, key = _encoded(args)
            if key in answers:
                return answers[key]
            if dropped is not None and dropped.is_set():
                raise _Stop(None, "not wanted: a fixed case failed")
            if budget["calls"] >= budget["limit"]:
                return None  # out of calls: shrinking stops improving, the best so far stands
            if budget["cpu"] > PROPERTY_CPU_SECONDS:
                raise _Stop(None, f"its calls used more than {PROPERTY_CPU_SECONDS:g} s of CPU in all")
            if budget["wall"] > PROPERTY_SECONDS:
                raise _Stop(None, f"its calls took more than {PROPERTY_SECONDS:g} s in all")
            if not budget["calls"]:  # from the first call: starting the child or Hypothesis is not the student's time
                budget["deadline"] = time.monotonic() + PROPERTY_WALL_BACKSTOP
            elif time.monotonic() > budget["deadline"]:
                raise _Stop(None, f"its test took more than {PROPERTY_WALL_BACKSTOP:g} s in all")
            budget["calls"] += 1
            reply = session.call({"fn": fn, "args": encoded, "adapter": adapter},
                                 timeout=min(CALL_TIMEOUT, ctx.timeout))
            observed = reply.get("observed", {})
            budget["cpu"] += observed.get("cpu", 0.0)
            budget["wall"] += observed.get("wall", 0.0)
            expected = probe.call(oracle, *copy.deepcopy(args))
            answers[key] = _disagreement(args, reply, expected, unchanged is not None)
            return answers[key]

        def agrees(args: tuple) -> None:
            finding = answer(args)
            if finding is not None and finding.ends:
                raise _Stop(finding)
            if finding is not None:
                raise _Disagree(finding)

        def shrink(choices: tuple) -> Callable[[], None]:
            """Hypothesis' test of `agrees`, starting from the drawn input `choices`: it replays
            them (its database's reuse phase), then shrinks. They are saved as a *secondary*
            example: one in the primary corpus counts as shrunk already, and is not shrunk."""
            from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

            database = InMemoryExampleDatabase()
            test = settings(
                database=database, max_examples=examples, deadline=None, derandomize=False,
                phases=(Phase.reuse, Phase.shrink), report_multiple_bugs=False,
                suppress_health_check=(HealthCheck.too_slow,), verbosity=Verbosity.quiet, print_blob=False,
            )(seed(_seed(ctx, fn))(given(strategy)(agrees)))
            test._hypothesis_internal_database_key = SHRINK_KEY  # where the reuse phase looks
            database.save(SHRINK_KEY + b".secondary", choices_to_bytes(choices))
            return test

        if not session.imported:
            finding = stop = None
        else:
            _known(ctx, fn, name, strategy, examples)
            finding, stop = _run(lambda: _search(strategy, _seed(ctx, fn), examples, answer, shrink,
                                                 drawn_as=(ctx.lab.name, name)))
    if not session.run.imported:
        got, hint, trace = expect.import_problem(session.run, ctx.timeout)
        return [Case(name, Outcome.IMPORT_FAILED, f"import {ctx.lab.module_name}", "the module loads",
                     got, hint, trace, clauses=clauses)]
    if stop is not None and stop.finding is None:
        return [Case(name, Outcome.TIMED_OUT, f"{fn} on generated inputs", "an answer to each in well under a second",
                     stop.slow, f"Each call of {fn} should take well under a millisecond: look for slow loops or sleeps.",
                     clauses=clauses)]
    if stop is not None:
        finding = stop.finding
    if finding is None:
        return [Case(name, Outcome.PASSED, f"{fn} on {budget['calls']} generated inputs",
                     "the contract's outcome for each", clauses=clauses)]
    return [_failing_case(finding, name, show_call, clause_of, unchanged, clauses)]


_PATCH = threading.Lock()


def _no_local_constants() -> None:
    """Draw no values from the constants of the "local" modules loaded so far.

    Hypothesis (6.1xx) draws about 5% of its values from constants it finds in every local
    (non-library) module in sys.modules. Which of labkit's and the checks' modules are loaded
    differs between the CLI and pytest, and between runs of a lab's steps in threads, so the
    same seed would not give the same inputs (measured: importing one more module changed the
    sequence). Hypothesis has no setting for it, so its private hook is replaced, once, and a
    test fails if an upgrade moves it."""
    from hypothesis.internal.conjecture import providers

    with _PATCH:
        if getattr(providers._get_local_constants, "labkit", False):
            return
        empty = providers.Constants()

        def none() -> providers.Constants:
            return empty

        none.labkit = True
        providers._get_local_constants = none
        providers.CONSTANTS_CACHE.cache.clear()


# Threads that outlive a step, for Hypothesis' engine. Hypothesis gives each thread its own global
# Random and registers it the first time that thread runs a test, with a full gc.collect() and
# gc.get_referrers() over the judge's heap: in a step's own thread (new for every judge run)
# that was 2 ms a step in a small judge and tens of ms in a large one (a test session, a grader
# with a class's verdicts). Created on demand, so steps that run side by side never wait for one.
_RUNNERS: tuple[int, ThreadPoolExecutor] | None = None
_RUNNERS_LOCK = threading.Lock()
RUNNER_THREADS = 32


def _runners() -> ThreadPoolExecutor:
    global _RUNNERS
    with _RUNNERS_LOCK:
        if _RUNNERS is None or _RUNNERS[0] != os.getpid():  # a forked judge has none of its parent's threads
            _RUNNERS = (os.getpid(), ThreadPoolExecutor(RUNNER_THREADS, thread_name_prefix="labkit-hypothesis"))
        return _RUNNERS[1]


def _run(search: Callable[[], tuple[Finding | None, _Stop | None]]) -> tuple[Finding | None, _Stop | None]:
    return _runners().submit(search).result()


def _search(strategy: SearchStrategy, seed_value: int, examples: int, answer: Callable[[tuple], Finding | None],
            shrink: Callable[[tuple], Callable[[], None]], drawn_as: tuple) -> tuple[Finding | None, _Stop | None]:
    """Ask `answer` about drawn inputs until one disagrees, then let Hypothesis shrink that one.

    The inputs are drawn directly from the strategy with Hypothesis' own provider (`drawn`), not
    by its engine: the engine's bookkeeping (mutating earlier inputs, a tree of every choice)
    cost ~4x the drawing itself, ~0.1 s of the judge's CPU per test, on the path of every
    check. Shrinking, where that machinery pays, still runs in the engine, from the drawn choices."""
    try:
        for args, choices in remembered(strategy, seed_value, examples, drawn_as):
            finding = answer(args)
            if finding is None:
                continue
            if finding.ends:
                return None, _Stop(finding)
            shrunk, stop = _run_here(shrink(choices))
            if shrunk is None and stop is None:  # the engine did not reproduce it: the drawn input stands
                shrunk = finding
            return shrunk, stop
    except _Stop as stop:  # a budget ran out (`answer`)
        return None, stop
    return None, None


def _encoded(args: tuple) -> tuple[list, str]:
    """The arguments as they cross the pipe, and as one string: what answers are cached and draws told apart by."""
    encoded = [encode(a) for a in args]
    return encoded, json.dumps(encoded)


# Draws per wanted input: a strategy with few distinct values (a small range) draws repeats,
# which are dropped; this bounds the drawing (the engine stopped when it had seen every value).
DRAW_ATTEMPTS = 3
SHRINK_KEY = b"labkit-differential"


@dataclass
class _Draws:
    """The inputs drawn so far for one (seed, strategy, count), and the draw that goes on."""

    source: Iterator[tuple[tuple, tuple]]
    made: list[tuple[tuple, tuple]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


# Draws kept for the next run of the same step at the same seed in this process (the tests judge
# each wrong solution at the same five seeds; a draw set is 35-60 ms of CPU). The same seed gives
# the same inputs, so a kept input is the one drawing again would give; filled as far as a
# search went, never further (a search that stops at its first input drew one).
_DRAWN: dict[tuple, _Draws] = {}
_DRAWN_LOCK = threading.Lock()
MAX_DRAWN = 64


def _draws(strategy: SearchStrategy, seed_value: int, examples: int, name: tuple) -> tuple[tuple, _Draws]:
    key = (seed_value, examples, name)
    with _DRAWN_LOCK:
        draws = _DRAWN.get(key)
        if draws is None:
            if len(_DRAWN) >= MAX_DRAWN:
                _DRAWN.pop(next(iter(_DRAWN)))
            draws = _DRAWN[key] = _Draws(drawn(strategy, seed_value, examples))
    return key, draws


def _draw_one(key: tuple, draws: _Draws, index: int) -> tuple[tuple, tuple] | None:
    """The `index`th input of `draws`, drawn now if no one has yet (None: there are no more)."""
    with draws.lock:
        if index == len(draws.made):
            try:
                found = next(draws.source, None)
            except BaseException:  # a strategy that raised: never kept as a short set of inputs
                with _DRAWN_LOCK:
                    _DRAWN.pop(key, None)
                raise
            if found is None:
                return None
            draws.made.append(found)
        return draws.made[index]


def remembered(strategy: SearchStrategy, seed_value: int, examples: int, name: tuple) -> Iterator[tuple[tuple, tuple]]:
    """`drawn`, from what an earlier search (or `draw_ahead`) drew where it can: the same `name`
    (the lab and the test, whose strategy its code builds the same way every time; its repr,
    ~15 ms, is not the key) and seed. Each input is a copy: the oracle or the comparison must
    not change a kept one."""
    key, draws = _draws(strategy, seed_value, examples, name)
    index = 0
    while (found := _draw_one(key, draws, index)) is not None:
        index += 1
        args, choices = found
        yield copy.deepcopy(args), choices


@dataclass(frozen=True)
class _Test:
    """What a differential test of a lab draws from, as its last run built it."""

    step: int | str
    fn: str
    strategy: SearchStrategy
    examples: int


# Each lab's differential tests seen in this process, by (lab, test name): what `draw_ahead` draws for.
_KNOWN: dict[tuple[str, str], _Test] = {}


def _known(ctx: StepContext, fn: str, name: str, strategy: SearchStrategy, examples: int) -> None:
    with _DRAWN_LOCK:
        _KNOWN[(ctx.lab.name, name)] = _Test(ctx.step, fn, strategy, examples)


def draw_ahead(lab: str, seed: int, steps: list[str] | None, go_on: Callable[[], bool]) -> int:
    """Draw the inputs of lab `lab`'s differential tests (of `steps` first; None: all) for the
    verdict seed `seed`, as those tests will ask for them: a warm judge does it while the
    student reads a verdict, for the seed of the next check (`serve.py`). `go_on()` is asked
    before each input: it waits while a check runs (the drawing must not take a check's CPU)
    and says False once these draws are no longer wanted. Returns how many inputs it drew."""
    with _DRAWN_LOCK:
        tests = [(name, test) for (owner, name), test in _KNOWN.items() if owner == lab]
    if tests:
        _no_local_constants()  # as the tests draw (already so: they ran)
    wanted = {str(s) for s in steps} if steps else None
    tests.sort(key=lambda item: wanted is not None and str(item[1].step) not in wanted)
    count = 0
    for name, test in tests:
        key, draws = _draws(test.strategy, _seed_of(seed, test.step, test.fn), test.examples, (lab, name))
        for index in range(test.examples):
            if not go_on():
                return count
            try:
                if _draw_one(key, draws, index) is None:
                    break
            except Exception:  # noqa: BLE001 - the check itself will draw, and say what failed
                break
            count += 1
    return count


def start_drawing_ahead(lab: str, seed: int, steps: list[str] | None, go_on: Callable[[], bool]) -> Future:
    """`draw_ahead` in one of the threads Hypothesis already knows (`_runners`)."""
    return _runners().submit(draw_ahead, lab, seed, steps, go_on)


def drawn(strategy: SearchStrategy, seed_value: int, examples: int) -> Iterator[tuple[tuple, tuple]]:
    """Up to `examples` distinct argument tuples drawn from `strategy` (with the choices that made
    each), the same ones for the same seed: a fresh `ConjectureData` per input, its provider
    driven by one `random.Random(seed_value)`, each draw in a build context as `given`'s are."""
    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest, UnsatisfiedAssumption
    from hypothesis.internal.conjecture.data import ConjectureData

    rng, seen = random.Random(seed_value), set()
    for _ in range(examples * DRAW_ATTEMPTS):
        if len(seen) >= examples:
            return
        data = ConjectureData(random=rng)
        try:
            with BuildContext(data, is_final=False, wrapped_test=drawn):
                args = data.draw(strategy)
        except (StopTest, UnsatisfiedAssumption):  # too large, or filtered out: draw again
            continue
        _, key = _encoded(args)
        if key in seen:
            continue
        seen.add(key)
        yield args, tuple(data.choices)


def _run_here(test: Callable[[], None]) -> tuple[Finding | None, _Stop | None]:
    try:
        test()
    except _Stop as stop:
        return None, stop
    except _Disagree as disagree:
        return disagree.finding, None
    return None, None


def _seed(ctx: StepContext, fn: str) -> int:
    """One seed per verdict seed, step and function, independent of what else the check draws."""
    return _hashed(ctx.seed_for(fn))


def _seed_of(seed: int, step: int | str, fn: str) -> int:
    """`_seed` for a verdict seed without a step's context (inputs drawn ahead)."""
    return _hashed(f"{seed}:{step}:{fn}")


def _hashed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _disagreement(args: tuple, reply: dict, expected: dict, check_unchanged: bool) -> Finding | None:
    got = reply["outcome"]
    if check_unchanged and reply.get("observed", {}).get("input_changed"):
        return Finding(args, got, expected, mutated=True)
    return None if agree(got, expected) else Finding(args, got, expected)


def agree(got: dict, expected: dict) -> bool:
    """The same outcome class: equal return values (typed), or an exception that is-a the expected one."""
    if expected.get("kind") == "returned":
        return got.get("kind") == "returned" and same(decode(got["value"]), decode(expected["value"]))
    if expected.get("kind") == "raised":
        return got.get("kind") == "raised" and expected["type"] in got.get("mro", ())
    return False


def _expected_text(outcome: dict) -> str:
    if outcome.get("kind") == "returned":
        return show(decode(outcome["value"]))
    if outcome.get("kind") == "raised":
        return outcome["type"]
    return expect.describe(outcome)


def _failing_case(finding: Finding, name: str, show_call: Callable[..., str],
                  clause_of: Callable[..., tuple[str, str]], unchanged: str | None,
                  clauses: tuple[str, ...]) -> Case:
    called, expected = show_call(*finding.args), _expected_text(finding.oracle)
    student = finding.student
    grey = expect.grey_case(student, name, called, expected)
    if grey is not None:
        grey.clauses = clauses
        return grey
    clause, hint = clause_of(*finding.args)
    if student.get("kind") in ("timed_out", "died", "memory_limit", "aborted"):
        case = expect.ended_case(student, name, called, expected)
        case.clauses = (clause,)
        return case
    if finding.mutated:
        return Case(name, Outcome.WRONG, called, expected, f"{expect.describe(student)}, and modified its input",
                    UNCHANGED_HINT, clauses=(unchanged,))
    outcome = Outcome.RAISED if student.get("kind") == "raised" else Outcome.WRONG
    return Case(name, outcome, called, expected, expect.describe(student), hint,
                student.get("trace", "") if outcome is Outcome.RAISED else "", clauses=(clause,))


NOT_JUDGED = "not judged: the fixed cases above fail; fix them first"
NOT_JUDGED_HINT = "The generated inputs are tried once every fixed case above passes: fix those first."


def after_fixed(fixed: list[Case] | Callable[[], list[Case]], name: str, called: str,
                run: Callable[[], list[Case]]) -> list[Case]:
    """The fixed cases, then the property test `run` only if they all pass.

    Generated inputs would find again, under some seeds and not others, a mistake the fixed
    cases find under every seed: the same submission must get the same verdict for any seed.

    `fixed` may be the call that judges them: then, when a core is idle (`idle_core`), the
    property test starts beside it rather than after it, and is stopped at its next call and
    dropped if a fixed case fails. The verdict is the same either way (the test draws from its
    own seed); only the wait is shorter: ~0.35 s instead of ~0.5 s for outbox's step 1 here.
    """
    if not callable(fixed):
        return _after(fixed, name, called, run)
    if not idle_core():
        return _after(fixed(), name, called, run)
    stop = threading.Event()

    def ahead() -> list[Case]:
        _SPECULATION.stop = stop
        try:
            return run()
        finally:
            _SPECULATION.stop = None

    with beside(ahead) as property_test:
        try:
            cases = fixed()
        except BaseException:
            stop.set()  # leaving the block waits for the test: let it end at its next call
            raise
        if not all(case.passed for case in cases):
            stop.set()
        return _after(cases, name, called, property_test.result)


def _after(fixed: list[Case], name: str, called: str, run: Callable[[], list[Case]]) -> list[Case]:
    if all(case.passed for case in fixed):
        return fixed + run()
    return fixed + [Case(name, Outcome.NOT_REACHED, called, "the contract's outcome for each", NOT_JUDGED,
                         NOT_JUDGED_HINT)]


# The stop of a property test started ahead of its fixed cases (`after_fixed`), for its thread.
_SPECULATION = threading.local()


def idle_core() -> bool:
    """Whether a core is free right now for one more thread: fewer runnable threads on the
    machine, besides the caller (which then mostly waits for a child), than cores this process
    may use (the kernel's count in /proc/loadavg includes the caller). Work that only saves
    waiting runs beside other work only then: on a busy machine it would cost CPU."""
    try:
        with open("/proc/loadavg") as fh:
            runnable = int(fh.read().split()[3].partition("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return runnable - 1 < len(os.sched_getaffinity(0))


def warm_unicode_tables() -> Path | None:
    """Build Hypothesis' Unicode tables (once per machine) and show a copy to judges that can only read them.

    The tables the labs' strategies need (the category map and `text()`'s UTF-8 alphabet) are
    drawn once through the public API, then copied (`unicode_tables`). Returns the copy, or None
    when the tables could not be built. Measured: outbox's step 1 took 2.4 s in a judge box
    without them, 0.8 s with them.
    """
    os.environ.setdefault(STORAGE_ENV, str(CACHE))
    made, stamp = _tables_stamp(), _shown(_storage()) / STAMP
    if made is not None and stamp.is_file() and stamp.read_text() == made:
        return unicode_tables()  # drawn for this Hypothesis and Unicode: no need to import it (0.07 s)
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    @settings(database=None, max_examples=1, phases=[Phase.generate], deadline=None)
    @given(st.text(min_size=1), st.characters())
    def draw(_text, _char):
        pass

    try:
        draw()
        _show_tables(_storage())
        if made is not None:
            tmp = stamp.with_name(f".{STAMP}.{os.getpid()}")
            tmp.write_text(made)
            tmp.chmod(0o644)
            tmp.replace(stamp)
    except Exception:  # noqa: BLE001 - a cold cache only costs time
        return None
    return unicode_tables()


def _tables_stamp() -> str | None:
    """What the shown tables were drawn for: Hypothesis' version and Python's Unicode version
    (read without importing Hypothesis); None when it cannot be told."""
    import unicodedata
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"hypothesis {version('hypothesis')}, unicode {unicodedata.unidata_version}\n"
    except PackageNotFoundError:
        return None


def _storage() -> Path:
    return Path(os.environ.get(STORAGE_ENV) or CACHE).resolve()


def _shown(storage: Path) -> Path:
    return storage.with_name(storage.name + "-shown")


def _show_tables(storage: Path) -> None:
    """Copy the tables, readable by all, to a folder no Hypothesis process writes to.

    Hypothesis (6.170) writes its codec table again after every process that uses it, through
    mkstemp (mode 0600): one run as root between two batches (an in-process check, `grade
    --no-sandbox`) left the boxed judges a file they could not read, and each rebuilt it (1.5 s
    of CPU in each of outbox's steps 1, 3 and final). The copy is made once and replaced only
    when Hypothesis adds a table; a new one goes in by rename, so a judge never sees half of it."""
    tables = sorted(p.relative_to(storage) for p in (storage / "unicode_data").rglob("*.json.gz"))
    shown = _shown(storage)
    if tables == sorted(p.relative_to(shown) for p in (shown / "unicode_data").rglob("*.json.gz")):
        return
    fresh = Path(tempfile.mkdtemp(prefix=".shown-", dir=shown.parent))
    for name in tables:
        (fresh / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(storage / name, fresh / name)
    for path in [fresh, *fresh.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    old = shown.with_name(fresh.name + "-old")
    with contextlib.suppress(FileNotFoundError):
        shown.rename(old)
    try:
        fresh.rename(shown)
    except OSError:  # another grader's copy went in first: the same tables
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def unicode_tables() -> Path | None:
    """The readable copy of Hypothesis' Unicode tables (resolved, as a sandbox binds it), if made:
    a boxed judge's `STORAGE_ENV`, bound read-only (`warm_unicode_tables`)."""
    shown = _shown(_storage())
    return shown if (shown / "unicode_data").is_dir() else None
