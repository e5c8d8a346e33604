"""Turn what a child reported into cases: expected vs. got, and a hint that names the mistake.

A check declares its cases as `Plan`s. Each plan has a `check` that reads the child's
record and returns None (pass) or a `Miss` saying what happened instead.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labkit.judge.child import ChildRun, died, last_line
from labkit.judge.verdict import Case, Outcome
from labkit.limits import CHILD_MEMORY_BYTES, HANG_CASE_CPU_SECONDS, IMPORT_CPU_SECONDS
from labkit.values import decode, same, show

TRANSACTION_HINT = ("Do every write between one `BEGIN IMMEDIATE` and one `COMMIT`, and `ROLLBACK` "
                    "before re-raising on any error (a `try/except BaseException` around the whole "
                    "transaction), so no transaction is left open.")
SKELETON_HINT = "Replace `raise NotImplementedError` in this step's cell with your code, run the cell, then run this check again."


@dataclass
class Miss:
    got: str
    hint: str = ""
    outcome: Outcome = Outcome.WRONG
    clause: str = ""  # the contract clause this miss violates (see `under`); else the plan's


@dataclass
class Plan:
    name: str
    called: str
    expected: str
    check: Callable[[dict], Miss | None]
    hint: str = ""
    clauses: tuple[str, ...] = ()  # the contract clauses this case exercises (labkit.judge.contract)
    # The clause a hang of this case is evidence about (default: all of `clauses`): a case that
    # only a too-slow solution can hang on names that clause whether the call timed out (a busy
    # machine) or failed otherwise (a quiet one), so the verdict does not depend on the load.
    hang_clause: str = ""


def under(clause: str, check: Callable[[dict], Miss | None]) -> Callable[[dict], Miss | None]:
    """`check`, with any miss it finds attributed to `clause` (one plan can try several)."""

    def tagged(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None and not miss.clause:
            miss.clause = clause
        return miss

    return tagged


def tag(case: Case, plan: Plan, miss: Miss | None = None) -> Case:
    """Stamp a case with the clauses it is evidence about: the one a miss names, else the plan's."""
    case.clauses = (miss.clause,) if miss is not None and miss.clause else tuple(plan.clauses)
    return case


def value_of(record: dict) -> Any:
    return decode(record["outcome"]["value"])


def describe(outcome: dict) -> str:
    kind = outcome.get("kind")
    if kind == "returned":
        return f"returned {show(decode(outcome['value']))}"
    if kind == "raised":
        message = outcome.get("message", "")
        return f"raised {outcome['type']}" + (f": {message}" if message else "")
    if kind == "not_implemented":
        return "still raises NotImplementedError (the skeleton)"
    if kind == "missing":
        return "the function is not defined in your module"
    # the ways an awaited call can end (async probes report these)
    if kind == "hung":
        return f"was still running after {outcome['seconds']:g} s, so the judge cancelled it"
    if kind == "cancelled":
        return "ended with CancelledError"
    if kind == "not_async":
        return f"returned {show(decode(outcome['value']))} at once instead of a coroutine"
    return str(outcome)


def outcome_hint(outcome: dict, hint: str) -> str:
    """A hint for how the call ended, where that says more than the case's own hint."""
    if outcome.get("kind") == "not_async":
        return "Declare it `async def`: the caller awaits it."
    if outcome.get("kind") == "hung" and not hint:
        return "Look for a wait without a timeout."
    return hint


def both(*checks: Callable[[dict], Miss | None]) -> Callable[[dict], Miss | None]:
    """All checks must pass; the first miss is reported."""

    def check(record: dict) -> Miss | None:
        for one in checks:
            miss = one(record)
            if miss is not None:
                return miss
        return None

    return check


def is_module_exception(cls: str, hint: str = "") -> Callable[[dict], Miss | None]:
    """Raised the module's own `cls`, declared as a direct subclass of Exception."""

    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or outcome["type"] != cls:
            return Miss(describe(outcome), outcome_hint(outcome, hint))
        if outcome["bases"] != ["Exception"]:
            return Miss(f"raised {cls}, but {cls} derives from {outcome['bases']}",
                        f"Declare `class {cls}(Exception)`: the contract says a direct subclass of Exception.")
        return None

    return check


def closed_on_error(what: str) -> Callable[[dict], Miss | None]:
    """Opening a file that is not a database: sqlite3's own error, and no connection left open."""

    def check(record: dict) -> Miss | None:
        miss = raises("DatabaseError", "Let sqlite3's own error propagate.")(record)
        if miss is not None:
            return miss
        if record["observed"].get("left_open"):
            return Miss("raised, but left the connection open",
                        f"If {what} fails, close the connection, then re-raise the original error.")
        return None

    return check


def waited_for_lock(check: Callable[[dict], Miss | None], clause: str, hint: str) -> Callable[[dict], Miss | None]:
    """`check` of a call made while another connection held the write lock for a moment: a
    "database is locked" miss is the busy timeout's (`clause`, told with `hint`); any other miss
    keeps the clause `check` gave it (a failure that has nothing to do with the lock)."""

    def waited(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None and "database is locked" in miss.got:
            miss.clause, miss.hint = clause, hint
        return miss

    return waited


INTERRUPT_HINT = ("A Ctrl-C (KeyboardInterrupt) is not an `Exception`: `except Exception:` lets it through "
                  "and the connection stays open. Close it on every path: `except BaseException:` "
                  "(close, then `raise`), or `try/finally`.")


def closed_when_interrupted(fn: str) -> Callable[[dict], Miss | None]:
    """`probe.interrupted_opens`: a Ctrl-C before any statement of `fn` comes out of it as
    itself, and leaves no connection open."""

    def check(record: dict) -> Miss | None:
        tries = record["observed"].get("interrupted")
        if not isinstance(tries, list) or not tries:
            return Miss(f"{fn} ran no statement the check could interrupt", INTERRUPT_HINT)
        for t in tries:
            if not isinstance(t, dict):
                return Miss("an unreadable report", INTERRUPT_HINT)
            where = f"a Ctrl-C just before statement {t.get('k')} of {fn} (`{str(t.get('sql'))[:80]}`)"
            if t.get("left_open"):
                return Miss(f"{where} left {t.get('left_open')} connection(s) open", INTERRUPT_HINT)
            if t.get("ended") == "returned":
                return Miss(f"{where}: {fn} returned as if nothing happened; the KeyboardInterrupt was swallowed",
                            "Close the connection, then re-raise: the caller must see the Ctrl-C.")
            if t.get("ended") != "interrupted":
                return Miss(f"{where}: {fn} raised {str(t.get('ended'))[:60]} instead of the KeyboardInterrupt",
                            "Re-raise the original exception (a bare `raise`), not another one.")
        return None

    return check


def returns(expected: Any, hint: str = "") -> Callable[[dict], Miss | None]:
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "returned" and same(value_of(record), expected):
            return None
        return Miss(describe(outcome), outcome_hint(outcome, hint))

    return check


def raises(name: str, hint: str = "") -> Callable[[dict], Miss | None]:
    """The call must raise `name` or a subclass of it (matched by class name)."""

    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and name in outcome.get("mro", []):
            return None
        return Miss(describe(outcome), outcome_hint(outcome, hint))

    return check


def _special(record: dict, plan: Plan) -> Case | None:
    return grey_case(record["outcome"], plan.name, plan.called, plan.expected)


def grey_case(outcome: dict, name: str, called: str, expected: str) -> Case | None:
    """Skeleton and missing functions are reported the same way in every check (None otherwise)."""
    kind = outcome.get("kind")
    if kind == "not_implemented":
        return Case(name, Outcome.NOT_IMPLEMENTED, called, expected, "not implemented yet", SKELETON_HINT)
    if kind == "missing":
        return Case(name, Outcome.MISSING, called, expected,
                    "the function is not defined in your module",
                    "Run the step's cell (it writes your code into the module), and keep the function's name.")
    return None


def judge(run: ChildRun, plans: list[Plan], timeout: float) -> list[Case]:
    """One Case per plan, also when the child hung, died or never imported the module."""
    if run.import_error is not None or not run.imported:
        return import_cases(run, plans, timeout)
    reported = run.cases()
    stuck = run.unfinished_case()
    cases = []
    for plan in plans:
        record = reported.get(plan.name)
        if record is None:
            case = tag(_unreported(run, plan, stuck, timeout), plan)
            if case.outcome is Outcome.TIMED_OUT and plan.hang_clause:
                case.clauses = (plan.hang_clause,)
            cases.append(case)
            continue
        special = _special(record, plan)
        if special is not None:
            cases.append(tag(special, plan))
            continue
        miss = plan.check(record)
        if miss is None:
            cases.append(tag(Case(plan.name, Outcome.PASSED, plan.called, plan.expected), plan))
            continue
        outcome, hint, trace = miss.outcome, miss.hint or plan.hint, ""
        if record["outcome"].get("kind") == "raised" and outcome is Outcome.WRONG:
            outcome = Outcome.RAISED
            trace = record["outcome"].get("trace", "")
            if record["outcome"].get("type") == "MemoryError":
                hint = f"Each check process may use {CHILD_MEMORY_BYTES // 2**20} MiB: something here allocates far more."
        cases.append(tag(Case(plan.name, outcome, plan.called, plan.expected, miss.got, hint, trace), plan, miss))
    return cases


def _unreported(run: ChildRun, plan: Plan, stuck: str | None, timeout: float) -> Case:
    if plan.name != stuck:  # say what happened to the case that stopped the child, never more
        what = "hung" if run.timed_out else "ended the process"
        return Case(plan.name, Outcome.NOT_REACHED, plan.called, plan.expected,
                    f"not run: an earlier case in this step {what}" + (f" ({stuck})" if stuck else ""))
    if run.timed_out:
        ended = {"kind": "timed_out", "seconds": timeout, **({"cpu": HANG_CASE_CPU_SECONDS} if run.cpu_limit else {})}
    elif run.aborted is not None:
        ended = {"kind": "aborted", "error": run.aborted}
    else:
        ended = died(run.exit_code, run.memory_limit)
    return ended_case(ended, plan.name, plan.called, plan.expected)


AFTERMATH_HINT = ("The check's own code stopped on this error after your code had run: look for something in "
                  "your code that closes, removes, replaces or locks what the check uses (its connection, its "
                  "files), or patches a module.")


def ended_case(ended: dict, name: str, called: str, expected: str) -> Case:
    """A call that never answered because the child hung ("timed_out"), left through SystemExit
    or another BaseException ("aborted") or died ("died"): the kinds `child` reports."""
    kind = ended["kind"]
    if kind == "timed_out" and ended.get("cpu"):
        return Case(name, Outcome.TIMED_OUT, called, expected,
                    f"still computing after {ended['cpu']:g} s of CPU time; the process was killed",
                    "Look for a loop that never ends, or work that grows with the size of a number: a loop up "
                    "to it, or an exact 2 ** n.")
    if kind == "timed_out":
        return Case(name, Outcome.TIMED_OUT, called, expected,
                    f"no answer within {ended['seconds']:g} s; the process was killed",
                    "Look for a loop that never ends or a wait without a timeout.")
    if kind == "aborted":
        error = ended["error"]
        # Every call of a lab function is wrapped in `except Exception`: an Exception that ended
        # the process escaped the check's own code, after the student's had run.
        hint = (AFTERMATH_HINT if "Exception" in (error.get("mro") or [])
                else "Don't call sys.exit() or raise BaseException subclasses from lab functions.")
        return Case(name, Outcome.RAISED, called, expected, f"ended the process: {describe(error)}", hint,
                    error.get("trace", ""))
    if kind == "memory_limit":
        return Case(name, Outcome.MEMORY_LIMIT, called, expected,
                    f"killed by the memory limit ({CHILD_MEMORY_BYTES // 2**20} MiB per check process) before answering",
                    "Something here holds far more in memory than it needs: a list that keeps growing, "
                    "a whole file or stream read at once, a cache without a bound.")
    code = ended.get("exit_code")
    how = f"killed by {signal_name(-code)}" if isinstance(code, int) and code < 0 else f"exit code {code}"
    return Case(name, Outcome.DIED, called, expected, f"the process died ({how}) before answering",
                "Something in your code ended the interpreter (os._exit, a crash, a signal).")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def import_cases(run: ChildRun, plans: list[Plan], timeout: float) -> list[Case]:
    """Every case fails the same way when the module itself cannot be loaded."""
    got, hint, trace = import_problem(run, timeout)
    return [tag(Case(p.name, Outcome.IMPORT_FAILED, p.called, p.expected, got, hint, trace), p) for p in plans]


def import_problem(run: ChildRun, timeout: float) -> tuple[str, str, str]:
    error = run.import_error
    if error is not None:
        return (f"importing your module failed: {describe(error)}",
                "Fix the error above; run every step cell from the top so the module is complete.",
                error.get("trace", ""))
    if not run.reached_module:  # only the course's code had run: never the student's fault
        if run.timed_out:
            return (f"the check's process did not get as far as loading your module within {timeout:g} s",
                    "This machine is too busy to check in time; not your code. Run the check again.", "")
        again = f", after a first start that ended the same way ({run.restarted})" if run.restarted else ""
        return (f"the check's process ended before it loaded your module (exit code {run.exit_code}; "
                f"it said: {last_line(run.stderr)}){again}",
                "Not your code: the checker itself failed to start. Run the check again; if this "
                "persists, please report it with the line above.", "")
    if run.timed_out:
        spots = [r for r in run.records if r.get("event") == "importing_at" and isinstance(r.get("line"), int)]
        within = f"{IMPORT_CPU_SECONDS:g} s of CPU time" if run.cpu_limit else f"{timeout:g} s"
        if not spots:
            return (f"importing your module did not finish within {within}",
                    "Code at the top level of a cell runs on import: move experiments out of step cells.", "")
        line, code = spots[-1]["line"], str(spots[-1].get("code", ""))[:200]
        # "line N of worker.py" is turned into the student's cell and line by the kernel
        # (`module_export.in_cell_terms`), which knows which step cell each module line came from.
        return (f"importing your module did not finish within {within}: it was running "
                f"line {line} of {str(spots[-1].get('file', 'your module'))[:100]}" + (f": `{code}`" if code else ""),
                "Code at the top level of a step cell runs every time your module is imported: keep loops "
                "and waits inside functions.", "")
    if run.memory_limit:
        return (f"killed by the memory limit ({CHILD_MEMORY_BYTES // 2**20} MiB) while importing your module",
                "Code at the top level of a step cell builds something huge: keep it inside functions.", "")
    return (f"the process died while importing your module (exit code {run.exit_code})",
            "Code at the top level of a step cell ran os._exit or crashed the interpreter.", "")
