"""Reading the catalogues of wrong solutions (`tests/wrong_solutions/<lab>/*.py`), and running them once.

Each file is a copy of the lab's reference with one realistic mistake, and starts with
`\"\"\"Wrong: <mistake>. Fails step <N>. Clause: <id>. Message: <text the student must be told>\"\"\"`
(the clause is the contract clause, `labkit.judge.contract`, whose case must catch it;
`labkit.judge.coverage.DOCSTRING` is the one parser of that line).

Running the catalogue is the expensive part of the suite, so every test that needs a verdict
asks `step_verdicts` (or `verdict`): ONE cache for the whole pytest session, keyed by (lab,
file, seed, step), that runs only the steps it has not run yet. A step's verdict does not
depend on which other steps ran beside it, so tests that want different step sets still share
what they have in common. Treat the returned verdicts as read-only.

The cache is in memory and, for the course's own files, on disk in a directory that the
session's controller makes and hands to every xdist worker (tests/conftest.py: CACHE_ENV):
a (lab, file, seed) runs once in the whole session, whichever worker asks first; the others
wait for its lock (bounded) and read the pickled verdicts. Files outside the repository (the
toy lab's, in tmp_path) stay in memory: their tests patch the checks, not the files.
"""

from __future__ import annotations

import ast
import difflib
import fcntl
import hashlib
import os
import pickle
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from labkit import labs
from labkit.judge.coverage import DOCSTRING
from labkit.judge.run import run_lab
from labkit.judge.verdict import LabVerdict, StepVerdict

_STEPS: dict[tuple[str, str, int, str], StepVerdict] = {}
_LOCK = threading.Lock()
ROOT = Path(__file__).resolve().parents[1]
CACHE_ENV = "LABKIT_TEST_VERDICT_CACHE"  # the session's shared directory (tests/conftest.py)
LOCK_WAIT = 900.0  # s: the longest a worker waits for another's run of the same file and seed

# The seeds under which every catalogue verdict must be the same (issue 8 item 2).
SEEDS = (1, 2, 3, 4, 5)
# Which steps of a wrong solution the seed and no-blame tests run: "promised" (the step its
# docstring names: the default, within CI's budget) or "reached" (that step and every step that
# builds on it: all the code the mistake can reach; about 4x the time, for a full run).
STEPS_ENV = "LABKIT_CATALOGUE_STEPS"
# Whether a failing step also runs the steps it builds on, for its note ("This step builds on
# step 4 ..."). No catalogue test reads that note (tests/test_display.py checks it), and it
# costs about as much again as the step itself (28 files: 20 s of CPU with it, 12 s without).
EXPLAIN = False


def promise(path: Path) -> dict[str, str]:
    """What a wrong solution's docstring says: the mistake, the failing step, the message."""
    match = DOCSTRING.match(path.read_text())
    assert match, f"{path.name} must start with '\"\"\"Wrong: ... Fails step N. Message: ...\"\"\"'"
    return match.groupdict()


def step_verdicts(lab: str, path: Path, steps: Iterable[int | str], seed: int = 1) -> dict[str, StepVerdict]:
    """Step → its verdict for `path` at `seed`, running (in one judge run) only what is not cached."""
    wanted = [str(s) for s in steps]
    file = str(Path(path).resolve())
    with _LOCK:
        missing = [s for s in wanted if (lab, file, seed, s) not in _STEPS]
    if missing:
        for step in _shared_run(lab, Path(file), missing, seed):
            with _LOCK:
                _STEPS[(lab, file, seed, str(step.step))] = step
    with _LOCK:
        return {s: _STEPS[(lab, file, seed, s)] for s in wanted}


def run_steps(lab: str, file: Path, steps: list[str], seed: int) -> list[StepVerdict]:
    """One judge run of `steps`, outside every cache, as the catalogue's runs are made."""
    return run_lab(labs.load(lab), Path(file).resolve(), steps=steps, seed=seed, explain=EXPLAIN).steps


def _shared_run(lab: str, file: Path, steps: list[str], seed: int) -> list[StepVerdict]:
    """Run `steps` of `file`, or read them from the session's disk cache, which this run fills."""
    folder = os.environ.get(CACHE_ENV)
    if not folder or not file.is_relative_to(ROOT):
        return run_steps(lab, file, steps, seed)
    digest = hashlib.sha256(f"{lab}\0{file}\0{seed}\0".encode() + file.read_bytes()).hexdigest()[:32]
    base = Path(folder) / digest
    with open(f"{base}.lock", "w") as lock:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another worker held the run of {file.name} (seed {seed}) "
                                       f"over {LOCK_WAIT:g} s") from None
                time.sleep(0.05)
        try:
            found = {s: base.with_name(f"{digest}-{s}.pickle") for s in steps}
            todo = [s for s, path in found.items() if not path.exists()]
            if todo:
                for step in run_steps(lab, file, todo, seed):
                    tmp = found[str(step.step)].with_suffix(".tmp")
                    tmp.write_bytes(pickle.dumps(step))
                    tmp.replace(found[str(step.step)])
            return [pickle.loads(found[s].read_bytes()) for s in steps]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def verdict(lab: str, path: Path, seed: int = 1, steps: Iterable[int | str] | None = None) -> LabVerdict:
    """A whole verdict (every step, or `steps`) assembled from the cache."""
    chosen = [str(s.step) for s in labs.load(lab).steps] if steps is None else [str(s) for s in steps]
    cached = step_verdicts(lab, path, chosen, seed)
    return LabVerdict(lab, seed, [cached[s] for s in chosen])


def steps_to_run(lab: str, path: Path) -> list[str]:
    """The steps of `path` the seed and no-blame tests judge (see STEPS_ENV), in the lab's order."""
    step = promise(path)["step"]
    spec = labs.load(lab)
    reached = {step} | (spec.dependents(step) if os.environ.get(STEPS_ENV) == "reached" else set())
    return [str(s.step) for s in spec.steps if str(s.step) in reached]


def failures(step: StepVerdict) -> str:
    return "\n\n".join(f"[{c.name}]\n{c.message}" for c in step.cases if not c.passed)


def by_step(verdict: LabVerdict) -> dict[str, StepVerdict]:
    return {str(s.step): s for s in verdict.steps}


def touched_definitions(path: Path, reference: Path) -> set[str]:
    """The top-level definitions of the reference that a wrong solution changes."""
    text = reference.read_text()
    spans = []
    for node in ast.parse(text).body:
        label = getattr(node, "name", None) or ast.unparse(getattr(node, "targets", [node])[0])
        spans.append((node.lineno, node.end_lineno, label))
    body = DOCSTRING.sub("", path.read_text(), count=1).lstrip("\n").splitlines()
    touched = set()
    matcher = difflib.SequenceMatcher(None, text.splitlines(), body, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for line in range(i1 + 1, i2 + 1) if i2 > i1 else [i1]:  # 1-based; an insertion follows line i1
            touched |= {label for first, last, label in spans if first <= line <= last} or {f"line {line}"}
    return touched
