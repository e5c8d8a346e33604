"""Verdicts as plain data. Rendering (text, HTML, widget) lives elsewhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

# What the judge says when a fault is the course's own, not the student's: an exception that
# escaped a check (run.py), a check blaming its own server (a feed that does not resend), a
# server that failed to start (servers/warehouse.py's WarehouseStartError), a path into the
# course's code. A verdict about a student's code must contain none of them (issue 8 item 7;
# tests/test_no_course_blame.py, benchmarks/mutation_score.py).
COURSE_FAULT = ("the checker itself failed", "bug in the course", "please report it", "warehouse failed",
                "warehouse process exited", "was not ready within", "the machine is too busy", "labkit/")


def course_faults(steps: list[StepVerdict]) -> list[str]:
    """'step: case: phrase' for every COURSE_FAULT phrase in these steps' failing cases and notes."""
    found = []
    for step in steps:
        texts = [(c.name, c.message) for c in step.cases if not c.passed] + [("note", step.note)]
        found += [f"{step.step}: {name}: {phrase!r}" for name, text in texts for phrase in COURSE_FAULT if phrase in text]
    return found


class Outcome(StrEnum):
    """The named ways a case can end; each is rendered the same way everywhere."""

    PASSED = "passed"
    WRONG = "wrong"  # returned or did something other than the contract says
    RAISED = "raised"  # an exception the contract does not call for
    NOT_IMPLEMENTED = "not_implemented"  # still the skeleton
    MISSING = "missing"  # the function is not defined in the module
    TIMED_OUT = "timed_out"
    DIED = "died"  # the process ended without reporting
    MEMORY_LIMIT = "memory_limit"  # the sandbox's memory limit was hit and the kernel killed the process
    IMPORT_FAILED = "import_failed"
    NOT_REACHED = "not_reached"  # an earlier case hung or died


@dataclass
class Case:
    name: str
    outcome: Outcome
    called: str = ""
    expected: str = ""
    got: str = ""
    hint: str = ""
    trace: str = ""
    clauses: tuple[str, ...] = ()  # contract clause IDs (labkit.judge.contract); a failure names the one it caught

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    @property
    def message(self) -> str:
        if self.passed:
            return "ok"
        parts = [
            ("called", self.called),
            ("expected", self.expected),
            ("got", self.got),
            ("hint", self.hint),
        ]
        lines = [f"{label}: {text}" for label, text in parts if text]
        if self.trace:
            lines.append("your traceback:\n" + self.trace.rstrip())
        return "\n".join(lines)

    def to_json(self) -> dict:
        data = {"name": self.name, "passed": self.passed, "message": self.message}
        data.update(outcome=str(self.outcome), called=self.called, expected=self.expected,
                    got=self.got, hint=self.hint, trace=self.trace, clauses=list(self.clauses))
        return data


@dataclass
class Evidence:
    """What a crash scenario observed: timeline events, ladder rungs, faults that took effect."""

    timeline: list[dict] = field(default_factory=list)
    ladder: list[dict] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


@dataclass
class StepVerdict:
    step: int | str
    title: str
    max_points: int
    cases: list[Case] = field(default_factory=list)
    note: str = ""  # e.g. "this step relies on step 1, which fails"
    evidence: Evidence | None = None
    seconds: float = 0.0
    # Set by the kernel (`Lab.check`), not the judge: which saved version was judged
    # ("judged: step 6 as saved at 14:02:31"), and a warning when the step's cell did not save
    # at its last run or changed since (`labkit.notebook.attempts`).
    judged: str = ""
    warning: str = ""
    # Whether the check drew from the verdict seed (`run.SeedUse`); not part of the JSON. A step
    # judged elsewhere (or rebuilt from JSON) is taken to have drawn.
    seed_read: bool = True

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def points(self) -> int:
        return self.max_points if self.passed else 0

    @property
    def waiting(self) -> bool:
        """Nothing the student wrote has run and broken a rule yet: every failing case is the
        skeleton, a missing function, or not reached because of those (not all merely not
        reached: that is a hang or a death, which is red). The grey "waiting for your steps" of
        a final check (`labkit.views.standing`): its scenario never ran, so it has no timeline
        and no ladder (`labkit.judge.run`)."""
        failing = [c for c in self.cases if not c.passed]
        calm = (Outcome.NOT_IMPLEMENTED, Outcome.MISSING, Outcome.NOT_REACHED)
        return (bool(failing) and all(c.outcome in calm for c in failing)
                and not all(c.outcome is Outcome.NOT_REACHED for c in failing))

    @property
    def not_implemented(self) -> bool:
        failing = [c for c in self.cases if not c.passed]
        return bool(failing) and all(
            c.outcome in (Outcome.NOT_IMPLEMENTED, Outcome.MISSING, Outcome.NOT_REACHED) for c in failing
        ) and any(c.outcome is Outcome.NOT_IMPLEMENTED for c in failing)

    @property
    def status(self) -> str:
        if self.passed:
            return "passed"
        return "not_implemented" if self.not_implemented else "failed"

    def to_json(self) -> dict:
        data = {
            "step": self.step,
            "title": self.title,
            "passed": self.passed,
            "points": self.points,
            "max_points": self.max_points,
            "cases": [c.to_json() for c in self.cases],
            "status": self.status,
            "note": self.note,
            "seconds": round(self.seconds, 3),
        }
        if self.evidence is not None:
            data["evidence"] = asdict(self.evidence)
        data.update({k: v for k, v in (("judged", self.judged), ("warning", self.warning)) if v})
        return data


@dataclass
class LabVerdict:
    lab: str
    seed: int
    steps: list[StepVerdict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(s.passed for s in self.steps)

    @property
    def score(self) -> int:
        return sum(s.points for s in self.steps)

    @property
    def max_score(self) -> int:
        return sum(s.max_points for s in self.steps)

    def to_json(self) -> dict:
        return {
            "lab": self.lab,
            "passed": self.passed,
            "score": self.score,
            "max_score": self.max_score,
            "seconds": round(self.seconds, 3),
            "seed": self.seed,
            "steps": [s.to_json() for s in self.steps],
        }


def from_json(data: dict) -> LabVerdict:
    """Rebuild a verdict from `--json` output (the notebook side reads it this way)."""
    steps = []
    for s in data.get("steps", []):
        cases = [
            Case(
                name=c["name"],
                outcome=Outcome(c.get("outcome") or ("passed" if c["passed"] else "wrong")),
                called=c.get("called", ""),
                expected=c.get("expected", ""),
                got=c.get("got", "" if c.get("outcome") else c.get("message", "")),
                hint=c.get("hint", ""),
                trace=c.get("trace", ""),
                clauses=tuple(c.get("clauses", ())),
            )
            for c in s.get("cases", [])
        ]
        ev = s.get("evidence")
        steps.append(
            StepVerdict(
                step=s["step"],
                title=s["title"],
                max_points=s["max_points"],
                cases=cases,
                note=s.get("note", ""),
                evidence=Evidence(**ev) if ev else None,
                seconds=s.get("seconds", 0.0),
                judged=s.get("judged", ""),
                warning=s.get("warning", ""),
            )
        )
    return LabVerdict(lab=data["lab"], seed=data["seed"], steps=steps, seconds=data.get("seconds", 0.0))
