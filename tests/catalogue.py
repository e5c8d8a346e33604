"""The catalogues of wrong solutions as files to run, and running them once.

A wrong solution is the lab's reference with one realistic mistake, stored as a patch against
the reference with its metadata in a data file (`tests/wrong_solutions/<lab>.toml` and
`<lab>/<name>.patch`, read by `labkit.judge.catalogue`). The judge runs files, so `wrong_files(lab)`
and `wrong_file(lab, name)` write each source to `build/wrong_solutions/<lab>/<name>.py` (gitignored):
the line `\"\"\"Wrong: <mistake>. Fails step <N>. Clause: <id>. Message: <text the student must be
told>\"\"\"` (the clause is the contract clause, `labkit.judge.contract`, whose case must catch
it), then the patched reference. Several xdist workers build them at once at collection time:
a file is written only when its content differs, to a temporary name renamed into place.

To add a wrong solution: copy the reference (or a built file) with that first line, make the
mistake, and run `python tests/catalogue.py add <lab> <copy.py>`: it writes the patch and the
data file's entry (the same name again replaces it).

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
import functools
import hashlib
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import parse_python

from labkit import labs
from labkit.judge import catalogue, coverage
from labkit.judge.run import run_lab
from labkit.judge.verdict import LabVerdict, StepVerdict

_STEPS: dict[tuple[str, str, int, str], StepVerdict] = {}
_LOCK = threading.Lock()
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "wrong_solutions"  # where the sources are written to be run (gitignored)
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


def labs_with_wrong_solutions() -> list[str]:
    """The registered labs that have a catalogue (a data file in `coverage.CATALOGUE`)."""
    return [lab for lab in labs.available() if catalogue.data_file(coverage.CATALOGUE, lab).is_file()]


def wrong_files(lab: str) -> list[Path]:
    """Every wrong solution of `lab` as a file to run, in the data file's (name) order."""
    return _build(lab)


def wrong_file(lab: str, name: str) -> Path:
    """The wrong solution `name` (the stem: "bool_qty") of `lab` as a file to run."""
    found = _build(lab, name)
    assert found, f"{coverage.CATALOGUE / lab}.toml has no wrong solution named {name!r}"
    return found[0]


def every_wrong_file() -> list[tuple[str, Path]]:
    """(lab, file) of every wrong solution of every lab."""
    return [(lab, file) for lab in labs_with_wrong_solutions() for file in wrong_files(lab)]


def _build(lab: str, only: str | None = None) -> list[Path]:
    wrong = catalogue.read(coverage.CATALOGUE, lab)
    reference = coverage.reference(lab).read_text()
    built = []
    for one in wrong.entries:
        if only in (None, one.name):
            built.append(_write(BUILD / lab / f"{one.name}.py", wrong.source(one, reference).encode()))
    return built


def _write(target: Path, data: bytes) -> Path:
    """Write `data` to `target` unless it is there already; readers never see half a file."""
    if target.is_file() and target.read_bytes() == data:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def entry(path: Path) -> catalogue.Wrong:
    """The data file's entry of a file that `wrong_files` or `wrong_file` wrote (<lab>/<name>.py)."""
    lab, name = path.parent.name, path.stem
    data = catalogue.data_file(coverage.CATALOGUE, lab)
    found = _entries(data, data.stat().st_mtime_ns if data.is_file() else 0).get(name)
    assert found, f"{path} is not a wrong solution of {coverage.CATALOGUE / lab}.toml"
    return found


@functools.cache
def _entries(data: Path, _version: int) -> dict[str, catalogue.Wrong]:
    """A data file's entries by name, read once per version of the file (~4 ms a read, and
    every catalogue test asks for its file's promise)."""
    return {e.name: e for e in catalogue.read(data.parent, data.stem).entries} if data.is_file() else {}


def promise(path: Path) -> dict[str, str]:
    """What a wrong solution promises: the mistake, the failing step, the clause, the message."""
    return entry(path).promise()


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
    for node in parse_python.parse(text).body:
        label = getattr(node, "name", None) or ast.unparse(getattr(node, "targets", [node])[0])
        spans.append((node.lineno, node.end_lineno, label))
    body = path.read_text().split("\n", 1)[1].lstrip("\n").splitlines()  # after the docstring line
    touched = set()
    matcher = difflib.SequenceMatcher(None, text.splitlines(), body, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for line in range(i1 + 1, i2 + 1) if i2 > i1 else [i1]:  # 1-based; an insertion follows line i1
            touched |= {label for first, last, label in spans if first <= line <= last} or {f"line {line}"}
    return touched


def add(lab: str, copy: Path) -> Path:
    """Turn `copy` (the docstring line, then the reference with one mistake) into `lab`'s patch
    `<stem>.patch` and data-file entry, replacing an entry of that name; returns the patch."""
    mistake, code = catalogue.parse(copy.stem, copy.read_text())
    folder, reference = coverage.CATALOGUE, coverage.reference(lab)
    data = catalogue.data_file(folder, lab)
    old = catalogue.read(folder, lab) if data.is_file() else catalogue.Catalogue(folder, lab, [])
    new = catalogue.Catalogue(folder, lab, [e for e in old.entries if e.name != mistake.name] + [mistake],
                              old.blank_line)
    patch = new.patch_path(mistake.name)
    patch.parent.mkdir(parents=True, exist_ok=True)
    diff = catalogue.make_patch(reference.read_text(), code.lstrip("\n"), str(reference.relative_to(coverage.ROOT)))
    if not diff:
        raise ValueError(f"{copy} is the reference unchanged: no mistake to add")
    patch.write_text(diff)
    data.write_text(catalogue.dumps(new))
    return patch


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python tests/catalogue.py", description="Add a wrong solution.")
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="write COPY's patch and its entry in tests/wrong_solutions/LAB.toml")
    adding.add_argument("lab")
    adding.add_argument("copy", type=Path, help="the reference with one mistake, first line the docstring")
    args = parser.parse_args()
    try:
        patch = add(args.lab, args.copy)
    except (OSError, ValueError) as error:  # no such file, no docstring line, nothing changed
        parser.exit(1, f"{parser.prog}: {error}\n")
    print(f"wrote {patch} and its entry in {catalogue.data_file(coverage.CATALOGUE, args.lab)}", file=sys.stderr)
