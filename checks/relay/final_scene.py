"""Lab `relay`'s final check: what it observed (`Scene`), its real lease, and how its cases read
a publisher's run (what the runs returned is evidence about return values only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from checks.relay.outbox import claims_in
from labkit.judge.child import ChildRun
from labkit.judge.expect import SKELETON_HINT, Miss, describe, import_problem
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode

LEASE = 0.3  # the final check's real leases, in seconds of wall-clock time


@dataclass
class Scene:
    """What the final check observed, for its cases, its timeline and its ladder."""

    db: Path  # parts 1-2
    pills: Path  # parts 3-4
    ids: dict[str, str] = field(default_factory=dict)  # role → event id (parts 3-4)
    runs: dict[str, ChildRun] = field(default_factory=dict)  # "A #1", "A #2", "B", "C", "D"
    killed: set[str] = field(default_factory=set)  # runs the judge killed at their hook
    stopped_at: float | None = None  # when the judge saw A #2 in state T
    continued_at: float | None = None
    after_death: dict | None = None  # snack-1's row right after A #1 died
    after_b: dict | None = None  # snack-2's row before A #2 was woken
    requests: list[dict] = field(default_factory=list)  # POSTs the warehouse saw
    entries: list[dict] = field(default_factory=list)  # the audit of both files, in time order
    rows: dict[str, dict] = field(default_factory=dict)  # event id → its final row
    seq: dict[str, int] = field(default_factory=dict)  # event id → seq (in its file)
    policy: dict = field(default_factory=dict)
    start: float = 0.0  # the judge's clock for parts 3-4
    b_first_now: float = 0.0  # the `now` of B's first round, inside A's lease
    notes: list[dict] = field(default_factory=list)


COUNTER_START = 100  # the pills' outbox: fence_counter.last before any claim


def report_of(run: ChildRun | None, case: str) -> dict | None:
    return None if run is None else run.cases().get(case)


def relay_rounds(run: ChildRun | None) -> list:
    """What each relay_once call of a publisher returned (or how it failed)."""
    record = report_of(run, "relay")
    if record is None:
        return []
    return [decode(r["outcome"]["value"]) if r["outcome"]["kind"] == "returned" else describe(r["outcome"])
            for r in record["observed"].get("rounds", [])]


def run_problem(run: ChildRun | None, label: str, timeout: float, case: str = "relay") -> Miss | None:
    """Why a publisher process did not run its calls to the end (None: it did)."""
    if run is None:
        return Miss(f"publisher {label} was never started", outcome=Outcome.NOT_REACHED)
    if not run.imported:
        got, hint, _ = import_problem(run, timeout)
        return Miss(got, hint, Outcome.IMPORT_FAILED)
    record = run.cases().get(case)
    if record is None:
        if run.timed_out:
            return Miss(f"publisher {label} did not finish in time and was killed", "Look for a wait without a "
                                                                                     "timeout.", Outcome.TIMED_OUT)
        return Miss(f"publisher {label} ended with exit code {run.exit_code} before its calls returned",
                    "Something ended the interpreter (os._exit, a crash).", Outcome.DIED)
    outcomes = [record["outcome"]] + [r["outcome"] for r in record["observed"].get("rounds", [])]
    for outcome in outcomes:
        if outcome.get("kind") == "not_implemented":
            return Miss(f"publisher {label}: {describe(outcome)}", SKELETON_HINT, Outcome.NOT_IMPLEMENTED)
        if outcome.get("kind") == "missing":
            return Miss(f"publisher {label}: {describe(outcome)}", "Run every step's cell.", Outcome.MISSING)
    if record["outcome"].get("kind") == "raised":
        return Miss(f"publisher {label}: {describe(record['outcome'])}", "It must not raise here: see the steps' "
                                                                         "own checks.", Outcome.RAISED)
    return None


def requests_for(scene: Scene, event_id: str) -> list[dict]:
    return [r for r in scene.requests if r.get("id") == event_id]


def claims_of(scene: Scene, event_id: str) -> list[dict]:
    return [e for e in claims_in(scene.entries) if e["id"] == event_id]


def token_of(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def final_case(label: str, called: str, expected: str, clause: str, miss: Miss | None) -> Case:
    case = Case(label, Outcome.PASSED, called, expected, clauses=(clause,))
    if miss is not None:
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
    return case
