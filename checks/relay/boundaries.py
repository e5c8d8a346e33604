"""Lab `relay`, judge side: a function run once per SQL statement, with something happening
between two statements (`labkit.probe.boundaries` does it in the child).

- "write": another publisher commits a competing change just before statement k, if it can
  take the write lock at once. Right code holds the lock from BEGIN IMMEDIATE to COMMIT, so the
  change lands only before its transaction (and the code must then see it) or after it. A
  check made before the transaction and acted on inside it, or a deferred BEGIN, shows here on
  every run, not once in a thousand races.
- "error": statement k fails (sqlite3.OperationalError 'interrupted'; SQLite rolls back a
  transaction whose write was interrupted). The original error must propagate, no transaction
  may stay open, and the file must be as before or as after the whole call.
- "interrupt": a KeyboardInterrupt right after statement k. The same three rules.

Each run has its own copy of the file (run 0 undisturbed, run k + 1 with the event at k); the
judge reads every copy itself and looks at each while the child still holds its connection.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay.outbox import copies, counter, rows_of, shown
from checks.relay.witness import judged, look_failed, not_seen
from labkit.judge.expect import Miss, describe

RUNS = 12  # files per mode: the undisturbed run and statements 1-11 (the reference runs at most 8)
MODES = ("write", "error", "interrupt")
WRITER_TABLE = "CREATE TABLE judge_writer(k INTEGER)"  # the competing writer leaves its mark here
MARK = ["INSERT INTO judge_writer(k) VALUES (1)", []]
ROLLBACK_HINT = ("When a statement fails, SQLite may already have rolled the transaction back: `ROLLBACK` only "
                 "`if con.in_transaction`, then re-raise the original error unchanged (the provided "
                 "`write_transaction` does both). Catch only the errors you mean to handle.")
INTERRUPT_HINT = ("Roll back on every exception, KeyboardInterrupt included: `except BaseException:` around the "
                  "whole transaction (as `write_transaction` does), then re-raise it.")
PART_WAY_HINT = ("Make the whole change in one transaction, committed once at the end: a failure part-way must "
                 "leave every row as it was.")
FAULTS = {"error": "sqlite3.OperationalError('interrupted')", "interrupt": "KeyboardInterrupt"}


def files(template: Path, folder: Path) -> dict[str, list[Path]]:
    """RUNS copies of a closed outbox file per mode (with the competing writer's table)."""
    stores.execute(template, WRITER_TABLE)
    return {mode: copies(template, folder, [f"{template.stem}-{mode}-{i}" for i in range(RUNS)]) for mode in MODES}


def spec(name: str, fn: str, args: list, dbs: dict[str, list[Path]], writer: list | dict) -> dict:
    """A call spec for `probes.on_outbox` that runs `fn` once per statement in each mode.
    `writer`: the competing publisher's SQL statements, or {"call": fn, "args": [...], "landed":
    the encoded return value that means it wrote} to run the student's own function."""
    plan = []
    for mode in MODES:
        entry = {"mode": mode, "dbs": [str(d) for d in dbs[mode]]}
        if mode == "write":
            entry["writer"] = writer if isinstance(writer, dict) else {"sql": [*writer, MARK]}
        plan.append(entry)
    return {"name": name, "fn": fn, "db": str(dbs["write"][0]), "args": args, "boundaries": plan}


def watched(name: str, plan: list[dict]) -> dict[str, Path]:
    """The witness's paths for such a case: "<name>#<mode>.<run>"."""
    return {f"{name}#{entry['mode']}.{i}": Path(db) for entry in plan for i, db in enumerate(entry["dbs"])}


def wrote(path: Path) -> bool:
    """Did the competing writer commit in this copy? (Its mark, read by the judge.)"""
    return bool(stores.rows(path, "SELECT count(*) FROM judge_writer")[0][0])


def state(path: Path) -> tuple:
    return rows_of(path), counter(path)


def _where(run: dict) -> str:
    return f"statement {run['k'] + 1} ({run['fired']})"


def _left_open(record: dict, run: dict, what: str, hint: str, clause: str) -> Miss | None:
    if run.get("in_transaction"):
        return Miss(f"{what}, the call returned with its transaction still open", hint, clause=clause)
    saw = judged(record).get("runs", {}).get(f"{run.get('mode')}.{run.get('i')}")
    if saw is None:
        return not_seen(f"after {what}", clause)
    failed = look_failed(saw, f"after {what}", clause)
    if failed is not None:
        return failed
    if saw.get("can_write") is False:
        return Miss(f"{what}, the judge's own connection could not BEGIN IMMEDIATE: a write lock was still held",
                    hint, clause=clause)
    return None


def between(fn: str, dbs: dict[str, list[Path]], clause: str,
            judge: Callable[[dict, Path, bool], Miss | None]) -> Callable[[dict], Miss | None]:
    """One case, three modes. "write": every run is judged by `judge(outcome, file, whether the
    other publisher's commit landed)`. "error" and "interrupt": every run with a fault raised
    that very fault, left no transaction open, and left the file as before the call or as the
    undisturbed run left it. A Miss from `judge` may name a clause of its own."""
    before = state(dbs["error"][0])  # read when the plan is made, before the child runs: as prepared

    def check(record: dict) -> Miss | None:
        runs = [r for r in (record["observed"].get("runs") or []) if isinstance(r, dict)]
        if not runs:
            return Miss(describe(record["outcome"]), f"{fn} must run on the connection it is given.", clause=clause)
        # The faults first: a change committed in pieces is named as such ("part-way"), not by
        # the competing commit that lands between the pieces.
        for run in sorted(runs, key=lambda r: r.get("mode") == "write"):
            miss = (_competed if run.get("mode") == "write" else _faulted)(record, run, fn, dbs, before, clause, judge)
            if miss is not None:
                return miss
        return None

    return check


def _competed(record, run, fn, dbs, before, clause, judge) -> Miss | None:
    path = dbs["write"][run["i"]]
    landed = wrote(path)
    when = (f"another publisher committed just before {_where(run)}" if landed else
            "with no other publisher writing" if run.get("fired") is None else
            f"another publisher tried to commit just before {_where(run)} and had to wait")
    miss = judge(run.get("outcome") or {}, path, landed)
    if miss is not None:
        return Miss(f"{when}: {miss.got}", miss.hint, clause=miss.clause or clause)
    return _left_open(record, run, when, "Commit or roll back before returning.", clause)


def _faulted(record, run, fn, dbs, before, clause, judge) -> Miss | None:
    if run.get("fired") is None:
        return None
    mode, path = run["mode"], dbs[run["mode"]][run["i"]]
    out, where = run.get("outcome") or {}, _where(run)
    whole = state(dbs[mode][0])
    if mode == "error":
        if out.get("kind") == "returned" and state(path) == whole:
            return None  # SQLite finished the statement before it saw the interrupt (or the code retried)
        what = f"when {where} failed with {FAULTS[mode]}"
        ok = out.get("kind") == "raised" and out.get("type") == "OperationalError" and \
            "interrupted" in out.get("message", "")
        hint = ROLLBACK_HINT
    else:
        what = f"after a KeyboardInterrupt right after {where}"
        ok = out.get("kind") == "raised" and out.get("type") == "KeyboardInterrupt"
        hint = INTERRUPT_HINT
    if not ok:
        return Miss(f"{what}, {fn} {describe(out)}", hint, clause=clause)
    miss = _left_open(record, run, what, hint, clause)
    if miss is not None:
        return miss
    now = state(path)
    if now != before and now != whole:
        return Miss(f"{what}, {fn} left the file part-way changed: {_changes(before[0], now[0])}", PART_WAY_HINT,
                    clause=clause)
    return None


def _changes(before: dict, after: dict) -> str:
    changed = [s for s in sorted(set(before) | set(after)) if before.get(s) != after.get(s)]
    parts = [f"row {s} {shown(before.get(s))} → {shown(after.get(s))}" for s in changed[:2]]
    return "; ".join(parts) + ("; …" if len(changed) > 2 else "") if parts else "the counter changed"
