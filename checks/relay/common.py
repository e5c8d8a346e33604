"""Lab `relay`: what several step checks share — the hints they repeat, how an argument and a
policy cross to the child, and the two ways a case runs: a call watched by the judge's witness,
and a call run once per SQL statement with something happening between two of them."""

from __future__ import annotations

from pathlib import Path

from checks.relay import boundaries
from checks.relay.outbox import unchanged
from checks.relay.witness import watched_cases
from labkit.judge.expect import Miss, Plan, both, raises, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."
ONE_TX_HINT = ("Select and update in one `BEGIN IMMEDIATE` transaction (`with write_transaction(con):` "
               "around both): the write lock must be taken before the SELECT, so a second publisher waits "
               "and then sees your claims.")


def value(item) -> dict:
    return {"value": encode(item)}


def calls_on(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """One child calls each spec's function on its file; right after each call, while the probe
    still holds the connection, the judge tries BEGIN IMMEDIATE itself (`witness.py`). A spec
    run once per statement (`boundaries.py`) is looked at after every run."""
    paths = {s["name"]: Path(s["db"]) for s in specs}
    for s in specs:
        if "boundaries" in s:
            paths.update(boundaries.watched(s["name"], s["boundaries"]))
    return watched_cases(ctx, "on_outbox", plans, {"calls": specs}, paths)


def between_statements(ctx: StepContext, fn: str, called: str, template: Path, args: list, clause: str,
                      writer: list | dict, judge, expected: str,
                      clauses: tuple[str, ...] = ()) -> tuple[list[Plan], list[dict]]:
    """One case that runs `fn` once per statement, three ways (`boundaries.py`): another
    publisher committing just before that statement, that statement failing, and a
    KeyboardInterrupt right after it."""
    dbs = boundaries.files(template, ctx.workdir)
    name = f"{fn} between any two statements: another publisher's commit, a failure, a Ctrl-C"
    plan = Plan(name, f"{called}, once per statement: another publisher committing just before it; then it failing "
                     "with sqlite3.OperationalError('interrupted'); then a KeyboardInterrupt right after it",
                f"{expected}; a failure or KeyboardInterrupt propagates, leaves no transaction open and the file as "
                "before or as after the whole call", boundaries.between(fn, dbs, clause, judge),
                clauses=(clause, *clauses))
    return [plan], [boundaries.spec(name, fn, args, dbs, writer)]


def refused(hint: str, clause: str, path: Path, before: list, untouched_hint: str | None = None):
    """ValueError, and nothing in the file changed."""
    return both(under(clause, raises("ValueError", hint)),
                under(clause, unchanged(path, before, untouched_hint or "Validate the arguments before "
                                                                      "touching the outbox.")))


def no_sql(hint: str):
    def check(record: dict) -> Miss | None:
        words = record["observed"].get("statements", [])
        if words:
            return Miss(f"ValueError, but only after running {words[:4]}", "Check the types before touching the "
                                                                            "database. " + hint)
        return None

    return check


def policy_arg(base, cap, max_attempts, seed: int | None, **extra) -> dict:
    """A policy as it crosses to the child, which builds its rng as Random(seed) (none without a seed)."""
    fields = {"base": encode(base), "cap": encode(cap), "max_attempts": encode(max_attempts),
              **{k: encode(v) for k, v in extra.items()}}
    return {"policy": {"fields": fields, **({"seed": seed} if seed is not None else {})}}
