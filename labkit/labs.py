"""The labs the course knows, found through their manifests: `checks/<package>/manifest.toml`.

A manifest is data only, read without importing anything: the lab's name, the student's module
file, its steps (number, title, points, the steps each builds on), the package's modules that
hold the checks, the child-side probes and the quiz. The kernel, the grader and the sandbox's
policies read manifests; only the judge imports a lab's checks (`load`), and the checks take
their step table from the manifest (`labkit.judge.run.lab_spec`), so a title or a point is
written once.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[1] / "checks"


class ManifestError(ValueError):
    """A manifest that does not say what a lab needs (a course bug, found by the test suite)."""


@dataclass(frozen=True)
class Step:
    step: int | str
    title: str
    points: int
    requires: tuple[int, ...] = ()
    # The student's functions the step's check calls. When every one of them is still the
    # skeleton, the judge says "not implemented yet" without running a case (labkit.judge.skeleton).
    functions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    name: str  # what students and instructors type: `labkit check outbox`
    package: str  # the lab's dotted package, e.g. "checks.outbox"
    folder: Path
    module_file: str  # the student's module, e.g. "worker.py" (imported as its stem)
    steps: tuple[Step, ...]
    checks: str = "lab"  # the package's module that holds LAB
    probes: tuple[str, ...] = ("probes",)  # child-side modules: the only ones a child can read
    preload: tuple[str, ...] = ()  # what a child imports before its request (the student's heavy imports)
    quiz: str | None = None  # the package's module that holds QUIZ
    when_done: str = "Every step passed. This notebook has no quiz: go on to the next notebook."

    @property
    def module_name(self) -> str:
        return Path(self.module_file).stem

    def module(self, part: str) -> str:
        """The dotted name of one of the package's modules: `module("probes")`."""
        return f"{self.package}.{part}"

    def path(self, part: str) -> Path:
        return self.folder / f"{part}.py"

    def step(self, number: int | str) -> Step:
        for step in self.steps:
            if str(step.step) == str(number):
                return step
        raise KeyError(number)


def read(folder: Path, package: str) -> Manifest:
    """The manifest in `folder`, the lab package importable as `package`."""
    with open(folder / "manifest.toml", "rb") as fh:
        data = tomllib.load(fh)
    try:
        steps = tuple(Step(s["step"], s["title"], int(s["points"]), tuple(s.get("requires", ())),
                           tuple(s.get("functions", ()))) for s in data["steps"])
        # The final scenario runs the whole lab: unless it says otherwise, it calls every function.
        every = tuple(dict.fromkeys(f for s in steps for f in s.functions))
        steps = tuple(dataclasses.replace(s, functions=every) if str(s.step) == "final" and not s.functions else s
                      for s in steps)
        fields = {k: data[k] for k in ("checks", "quiz", "when_done") if k in data}
        for key in ("probes", "preload"):
            if key in data:
                fields[key] = tuple(data[key])
        return Manifest(data["name"], package, folder, data["module_file"], steps, **fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{folder / 'manifest.toml'}: {exc!r}") from None


@functools.cache
def manifests() -> dict[str, Manifest]:
    """Every lab, by name, in the order of their folders (the course's order)."""
    found: dict[str, Manifest] = {}
    for path in sorted(CHECKS.glob("*/manifest.toml"), key=_course_order):
        manifest = read(path.parent, f"checks.{path.parent.name}")
        found[manifest.name] = manifest
    return found


def package_of(module: str) -> str | None:
    """The lab package a dotted module belongs to ("checks.outbox.probes:step" → "checks.outbox"),
    if it is one of the course's labs: whose probes a child of that module needs to see."""
    name = module.partition(":")[0]
    packages = {m.package for m in manifests().values()}
    return next((p for p in packages if name == p or name.startswith(p + ".")), None)


def _course_order(path: Path) -> tuple[int, str]:
    with open(path, "rb") as fh:
        return int(tomllib.load(fh).get("order", 99)), path.parent.name


def manifest(lab: str) -> Manifest:
    """The manifest of lab `lab`; KeyError when the course has no such lab."""
    return manifests()[lab]


def available() -> list[str]:
    return list(manifests())


def load(lab: str):
    """The lab's checks (a `LabSpec`): imports its checks module, on the judge's side only."""
    return importlib.import_module(manifest(lab).module(manifest(lab).checks)).LAB
