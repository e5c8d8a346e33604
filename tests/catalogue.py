"""Reading the catalogues of wrong solutions (`tests/wrong_solutions/<lab>/*.py`), and running them once.

Each file is a copy of the lab's reference with one realistic mistake, and starts with
`\"\"\"Wrong: <mistake>. Fails step <N>. Clause: <id>. Message: <text the student must be told>\"\"\"`
(the clause is the contract clause, `labkit.judge.contract`, whose case must catch it;
`labkit.judge.coverage.DOCSTRING` is the one parser of that line).

Running the catalogue is the expensive part of the suite, so every test that needs a verdict
asks `step_verdicts` (or `verdict`): ONE cache for the whole pytest session (per xdist worker),
keyed by (lab, file, seed, step), that runs only the steps it has not run yet. A step's verdict
does not depend on which other steps ran beside it, so tests that want different step sets
still share what they have in common. Treat the returned verdicts as read-only.
"""

from __future__ import annotations

import ast
import difflib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from labkit import labs
from labkit.judge.coverage import DOCSTRING
from labkit.judge.run import run_lab
from labkit.judge.verdict import LabVerdict, StepVerdict

_STEPS: dict[tuple[str, str, int, str], StepVerdict] = {}
_LOCK = threading.Lock()

# The seeds under which every catalogue verdict must be the same (issue 8 item 2).
SEEDS = (1, 2, 3, 4, 5)
# Which steps of a wrong solution the seed and no-blame tests run: "promised" (the step its
# docstring names: the default, within CI's budget) or "reached" (that step and every step that
# builds on it: all the code the mistake can reach; about 4x the time, for a full run).
STEPS_ENV = "LABKIT_CATALOGUE_STEPS"


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
        for step in run_lab(labs.load(lab), Path(file), steps=missing, seed=seed).steps:
            with _LOCK:
                _STEPS[(lab, file, seed, str(step.step))] = step
    with _LOCK:
        return {s: _STEPS[(lab, file, seed, s)] for s in wanted}


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
