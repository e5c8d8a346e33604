"""Run a lab's checks against a student's module file and return a verdict.

The judge never imports the student's code: each step runs in its own child process
(see `child`), and the judge compares what the child reports with what it observes
itself — the DB files through its own connections, the servers' logs, exit codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit import labs, scratch
from labkit.judge import expect, skeleton
from labkit.judge.ahead import SessionsAhead
from labkit.judge.child import ChildRun, Started, run_child, start
from labkit.judge.contract import Clause
from labkit.judge.verdict import Case, Evidence, LabVerdict, Outcome, StepVerdict
from labkit.limits import CPU_BUDGET_KEY, HANG_CASE_CPU_SECONDS, step_timeout
from labkit.sandbox import reaper


@dataclass
class StepSpec:
    step: int | str
    title: str
    points: int
    run: Callable[[StepContext], list[Case]]
    requires: tuple[int, ...] = ()
    functions: tuple[str, ...] = ()  # the student's functions it calls (the manifest's)


@dataclass
class LabSpec:
    name: str
    module_name: str  # what the student's file is imported as, e.g. "worker"
    probes: str  # the module whose functions run inside the child
    steps: list[StepSpec]
    contract: tuple[Clause, ...] = ()  # the clauses its cases are tagged with
    # What one judge run of the lab shares across its steps (e.g. servers): a context manager
    # factory entered once around every step of `run_lab`, left on every path; its value is
    # each step's `ctx.shared`.
    session: Callable[[], Any] | None = None
    preload: tuple[str, ...] = ()  # what a child imports before its request (the manifest's)

    @property
    def package(self) -> str | None:
        """The lab package its probes are in (`labs.package_of`): what its children are shown."""
        return labs.package_of(self.probes)

    def step(self, number: int | str) -> StepSpec:
        for spec in self.steps:
            if str(spec.step) == str(number):
                return spec
        raise KeyError(number)

    def dependents(self, number: int | str) -> set[str]:
        """Every step that builds on step `number`, directly or through another step."""
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for spec in self.steps:
                needs = {str(n) for n in spec.requires}
                if str(spec.step) not in found and (str(number) in needs or needs & found):
                    found.add(str(spec.step))
                    changed = True
        return found


def lab_spec(package: str, runs: Mapping[int | str, Callable], contract: tuple = (),
             session: Callable[[], Any] | None = None):
    """A lab's `LabSpec` from the manifest beside its checks and its step checks:
    `LAB = lab_spec(__package__, {1: check_1, ...})`.

    The manifest's steps and `runs` must name the same steps: a check without a step, or a step
    without a check, is an error when the checks are imported, not a silent gap."""
    lab = labs.read(Path(sys.modules[package].__path__[0]), package)
    named = {str(s.step) for s in lab.steps}
    if named != {str(k) for k in runs}:
        raise labs.ManifestError(f"{lab.name}: the manifest's steps {sorted(named)} and the checks' "
                            f"{sorted(str(k) for k in runs)} differ")
    by_name = {str(k): run for k, run in runs.items()}
    steps = [StepSpec(s.step, s.title, s.points, by_name[str(s.step)], requires=s.requires, functions=s.functions)
             for s in lab.steps]
    # A lab without probes of its own calls its functions through labkit's generic ones.
    probes = lab.module(lab.probes[0]) if lab.probes else "labkit.probe"
    return LabSpec(lab.name, lab.module_name, probes, steps, contract=contract, session=session,
                   preload=lab.preload)


@dataclass
class SeedUse:
    """Whether a step's check drew anything from its verdict seed: its `rng` (any method) or the
    seed itself (`StepContext.seed_for`). A check that drew nothing gives the same inputs under
    every seed, so its verdict cannot depend on the seed (the catalogue's seed test relies on it)."""

    read: bool = False


class SeededRandom(random.Random):
    """A step's random stream that notes in `use` its first draw. Every draw of `random.Random`
    goes through `random()` or `getrandbits()` (choice, shuffle, randrange and sample too)."""

    def __init__(self, seed: str, use: SeedUse) -> None:
        self.use = use
        super().__init__(seed)

    def random(self) -> float:
        self.use.read = True
        return super().random()

    def getrandbits(self, k: int) -> int:
        self.use.read = True
        return super().getrandbits(k)


@dataclass
class StepContext:
    """What one step's check gets: a temp dir, a seeded RNG, and a way to run a child.

    A check takes what it draws from `rng`, or from `seed_for`; it never reads `seed` itself
    (tests/test_catalogue_seeds.py looks for such reads), so that `seed_use` knows whether the
    verdict could depend on the seed."""

    lab: LabSpec
    solution: Path
    workdir: Path
    rng: random.Random
    seed: int
    timeout: float
    evidence: Evidence = field(default_factory=Evidence)
    markers: list[str] = field(default_factory=list)
    step: int | str = ""  # the step this context runs (seeds what is derived per step)
    folders: list[Path] = field(default_factory=list)  # made by `apart`, removed with the step's
    shared: Any = None  # what the lab's `session` gave this judge run (None without one)
    early: Started | None = None  # the step's first child, started with the step (`start_early`)
    _taking: threading.Lock = field(default_factory=threading.Lock, repr=False)  # children start side by side
    started_apart: list[StepContext] = field(default_factory=list)  # `apart(early=True)` ones, shared
    seed_use: SeedUse = field(default_factory=SeedUse)  # shared with `apart` contexts

    def seed_for(self, purpose: str) -> str:
        """A seed of its own for `purpose` (a property test's function), from the verdict seed
        and the step: what that draws does not depend on what else the check drew."""
        self.seed_use.read = True
        return f"{self.seed}:{self.step}:{purpose}"

    def start_early(self) -> None:
        """Start the step's first child now: it boots while the check prepares its servers and
        files, and the check's first `child`, `cases` or session in this folder takes it."""
        self.early = start(self.solution, workdir=self.workdir, marker=self.marker(), preload=self.lab.preload,
                           lab=self.lab.package)

    def take_early(self, env: dict[str, str] | None = None) -> Started | None:
        """The early child, once, for a child with no environment of its own; else None."""
        with self._taking:
            early, self.early = self.early, None
        if early is not None and env:
            early.close()  # its environment was fixed when it started
            return None
        return early

    def first_child(self, env: dict[str, str] | None = None) -> tuple[Started | None, str]:
        """The early child (if it can serve: `take_early`) and the marker a child gets: the early
        child's own, or a new one registered for the step's clean-up."""
        started = self.take_early(env)
        return started, started.marker if started is not None else self.marker()

    def end_early(self) -> None:
        """Close every early child nobody took (this context's and its `apart` ones')."""
        for ctx in [self, *self.started_apart]:
            early = ctx.take_early()
            if early is not None:
                early.close()

    def apart(self, name: str, early: bool = False) -> StepContext:
        """A context for children run side by side with this step's others: a work folder of its
        own (neither run can touch the other's files) and a random stream of its own (what each
        draws does not depend on which thread came first). Markers, evidence and clean-up are shared.
        `early`: its first child starts now (`start_early`); the step's end closes it if unused."""
        workdir = scratch.folder(f"labkit-{name}-")
        self.folders.append(workdir)
        apart = dataclasses.replace(self, workdir=workdir, rng=SeededRandom(f"{self.seed}:{self.step}:{name}", self.seed_use),
                                    early=None, _taking=threading.Lock())
        if early:
            apart.start_early()
            self.started_apart.append(apart)
        return apart

    def marker(self) -> str:
        """A fresh run marker for a process this step starts; killed when the step ends."""
        marker = reaper.new_marker()
        self.markers.append(marker)
        return marker

    def child(self, probe: str, args: dict, *, timeout: float | None = None,
              env: dict[str, str] | None = None, probes: str | None = None) -> ChildRun:
        """Run `probe` from the lab's probes module (or `probes`) in a fresh child."""
        started, marker = self.first_child(env)
        return run_child(self.solution, f"{probes or self.lab.probes}:{probe}", args, workdir=self.workdir,
                         timeout=timeout or self.timeout, marker=marker, module_name=self.lab.module_name,
                         env=env, started=started, lab=self.lab.package)

    def cases(self, probe: str, plans: list[expect.Plan], args: dict | None = None,
              env: dict[str, str] | None = None, probes: str | None = None) -> list[Case]:
        """The usual shape of a step: one child runs every plan, then each is judged."""
        budgets = {p.name: HANG_CASE_CPU_SECONDS for p in plans if p.hang_clause}
        run = self.child(probe, {"cases": [p.name for p in plans], **(args or {}),
                                 **({CPU_BUDGET_KEY: budgets} if budgets else {})}, env=env, probes=probes)
        return expect.judge(run, plans, self.timeout)

    def side_by_side(self, probe: str, groups: list[tuple[list[expect.Plan], dict]],
                     env: dict[str, str] | None = None) -> list[Case]:
        """Each group of plans in its own child, side by side: each child gets the step's whole
        time budget, so a step with many cases keeps the margin one child had on a busy machine.
        Cases come back in the order of the groups' plans."""
        runs = together([lambda plans=plans, args=args: self.cases(probe, plans, args, env=env) for plans, args in groups])
        found = {case.name: case for cases in runs for case in cases}
        return [found[plan.name] for plans, _ in groups for plan in plans]

    def path(self, name: str) -> Path:
        return self.workdir / name


def together(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Call each at the same time, in its own thread (children racing each other, servers
    closed at once); their results in order. An exception in one is raised once all ended."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


@contextlib.contextmanager
def beside(call: Callable[[], Any]):
    """`call` in a thread of its own while the block runs (a race beside a step's batch, from
    the step's first moment): yields its future; leaving the block waits for it on every path."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(call)


def slices(count: int, size: int) -> list[slice]:
    """`count` items cut into runs of at most `size`, as even as possible: one child per run, so a
    long step keeps on a busy machine the margin a short one has (each child gets the step's
    whole time budget, and the runs share the cores)."""
    parts = max(1, -(-count // size))
    bounds = [round(k * count / parts) for k in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a] or [slice(0, 0)]


def _run_step(lab: LabSpec, spec: StepSpec, solution: Path, seed: int, timeout: float,
              shared: Any = None, skeletons: frozenset[str] = frozenset()) -> StepVerdict:
    started = time.monotonic()
    untouched = skeleton.skeleton_cases(spec.functions, skeletons)
    if untouched is not None:  # nothing of the student's to run: the verdict every case would give
        return StepVerdict(spec.step, spec.title, spec.points, cases=untouched, seconds=time.monotonic() - started)
    workdir = scratch.folder("labkit-")
    use = SeedUse()
    ctx = StepContext(lab, solution, workdir, SeededRandom(f"{seed}:{spec.step}", use), seed, timeout, step=spec.step,
                      shared=shared, seed_use=use)
    verdict = StepVerdict(spec.step, spec.title, spec.points)
    try:
        ctx.start_early()
        verdict.cases = spec.run(ctx)
    except Exception as exc:  # a bug in a check must still give a verdict, not a traceback
        verdict.cases = [Case("check", Outcome.RAISED, got=f"the checker itself failed: {exc!r}",
                              hint="This is a bug in the course, not in your code: please report it.")]
    finally:
        ctx.end_early()
        reaper.kill_all_marked(ctx.markers)
        for folder in [workdir, *ctx.folders]:
            shutil.rmtree(folder, ignore_errors=True)
    if verdict.waiting:
        # A scenario that never ran (the steps it needs are still the skeleton or missing): a
        # timeline and a ladder would show a crash that did not happen. Faults are only listed
        # once seen to take effect, so they stay.
        ctx.evidence.timeline.clear()
        ctx.evidence.ladder.clear()
    if ctx.evidence.timeline or ctx.evidence.ladder or ctx.evidence.faults:
        verdict.evidence = ctx.evidence
    verdict.seed_read = use.read
    verdict.seconds = time.monotonic() - started
    return verdict


# Modules whose import check passed in this process, by lab and content: the next run of the
# same bytes (another step's check from a warm judge, the next seed in the tests) skips that
# child. Passes only: a failure is checked again every time, and a module that stops loading
# after a pass is still caught by each step's own children, which import it too. Runs of the
# same bytes side by side (the tests judge three seeds at once) wait for the one check running.
_LOADED: set[tuple[str, str, str]] = set()
_CHECKING: dict[tuple[str, str, str], threading.Event] = {}
_LOADED_LOCK = threading.Lock()


def _loaded_key(lab: LabSpec, solution: Path) -> tuple[str, str, str] | None:
    try:
        return lab.name, lab.module_name, hashlib.sha256(solution.read_bytes()).hexdigest()
    except OSError:
        return None


def _import_failure(lab: LabSpec, solution: Path, timeout: float) -> tuple[str, str, str] | None:
    """Load the module once before any step: a module that can't load fails every step once."""
    key = _loaded_key(lab, solution)
    if key is None:
        return _check_import(lab, solution, timeout)
    with _LOADED_LOCK:
        if key in _LOADED:
            return None
        running = _CHECKING.get(key)
        if running is None:
            _CHECKING[key] = threading.Event()
    if running is not None:
        running.wait(timeout + 10.0)  # the other check is bounded by the same timeout
        with _LOADED_LOCK:
            if key in _LOADED:
                return None
        return _check_import(lab, solution, timeout)  # it failed (or is wedged): this run checks its own
    try:
        problem = _check_import(lab, solution, timeout)
        if problem is None:
            with _LOADED_LOCK:
                _LOADED.add(key)
        return problem
    finally:
        with _LOADED_LOCK:
            _CHECKING.pop(key).set()


def _check_import(lab: LabSpec, solution: Path, timeout: float) -> tuple[str, str, str] | None:
    workdir = scratch.folder("labkit-")
    marker = reaper.new_marker()
    try:
        run = run_child(solution, "labkit.probe:noop", {}, workdir=workdir, timeout=timeout,
                        marker=marker, module_name=lab.module_name, lab=lab.package)
    finally:
        reaper.kill_marked(marker)
        shutil.rmtree(workdir, ignore_errors=True)
    return None if run.imported else expect.import_problem(run, timeout)


def run_lab(lab: LabSpec, solution: Path, steps: Sequence[int | str] | None = None,
            seed: int | None = None, jobs: int = 2, timeout: float | None = None,
            explain: bool = True, ahead: SessionsAhead | None = None) -> LabVerdict:
    """Judge `solution`'s `steps` (all by default). `explain`: a failing step whose required
    steps were not among those run gets them run too, for its note (`_explain_dependencies`).
    `ahead`: the lab's session comes from there, made while the previous check was judged."""
    started = time.monotonic()
    reaper.become_subreaper()
    seed = random.randrange(1, 2**31) if seed is None else seed
    timeout = timeout or step_timeout()
    chosen = [lab.step(s) for s in steps] if steps else list(lab.steps)
    verdict = LabVerdict(lab.name, seed)
    skeletons = skeleton.of_file(solution)
    if all(skeleton.skeleton_cases(s.functions, skeletons) is not None for s in chosen):
        session = contextlib.nullcontext()  # no step runs a case: no servers to start for them
    elif ahead is not None:
        session = ahead.session(lab)
    else:
        session = lab.session() if lab.session is not None else contextlib.nullcontext()
    with session as shared:
        return _run_steps(lab, chosen, solution, seed, timeout, explain, verdict, started, shared, jobs, skeletons)


def _run_steps(lab: LabSpec, chosen: list[StepSpec], solution: Path, seed: int, timeout: float, explain: bool,
               verdict: LabVerdict, started: float, shared: Any, jobs: int,
               skeletons: frozenset[str] = frozenset()) -> LabVerdict:
    # The import check runs beside the steps, not before them: a module that loads (the usual
    # case) should not wait a process start for it. If it does not load, steps still queued
    # never start, and each running one ends within its own limit.
    with ThreadPoolExecutor(max_workers=max(1, jobs) + 1) as pool:
        check = pool.submit(_import_failure, lab, solution, timeout)
        # The final check first: it is a lab's longest step (a sequence of processes and kills),
        # so the steps share the other workers beside it instead of all running before it.
        # Verdicts keep the lab's order.
        first = sorted(range(len(chosen)), key=lambda i: str(chosen[i].step) != "final")
        submitted = {i: pool.submit(_run_step, lab, chosen[i], solution, seed, timeout, shared, skeletons)
                     for i in first}
        futures = [submitted[i] for i in range(len(chosen))]
        problem = check.result()
        if problem is not None:
            for future in futures:
                future.cancel()
        results = None if problem is not None else [f.result() for f in futures]
    if problem is not None:
        got, hint, trace = problem
        for spec in chosen:
            step = StepVerdict(spec.step, spec.title, spec.points)
            step.cases = [Case("import", Outcome.IMPORT_FAILED, f"import {lab.module_name}", "the module loads", got, hint, trace)]
            # The time the panel shows is the import's (10.6 s of waiting is not "0 ms").
            step.seconds = time.monotonic() - started
            verdict.steps.append(step)
        verdict.seconds = time.monotonic() - started
        return verdict
    if explain:
        _explain_dependencies(lab, results, solution, seed, timeout, shared, skeletons)
    verdict.steps = results
    verdict.seconds = time.monotonic() - started
    return verdict


def _explain_dependencies(lab: LabSpec, results: list[StepVerdict], solution: Path, seed: int,
                          timeout: float, shared: Any = None, skeletons: frozenset[str] = frozenset()) -> None:
    """A step that fails because a step it builds on fails should say so, and name it."""
    known = {str(v.step): v for v in results}
    for verdict in results:
        spec = lab.step(verdict.step)
        if verdict.passed or verdict.not_implemented or not spec.requires:
            continue
        failing = []
        for number in spec.requires:
            if str(number) not in known:  # run only on demand: passing code never pays for this
                known[str(number)] = _run_step(lab, lab.step(number), solution, seed, timeout, shared, skeletons)
            if not known[str(number)].passed:
                failing.append(known[str(number)])
        if failing:
            names = " and ".join(f"step {v.step} ({v.title})" for v in failing)
            verb = "does" if len(failing) == 1 else "do"
            verdict.note = (f"This step builds on {names}, which {verb} not pass yet. "
                            f"Fix that first; this step's failures may follow from it.")
