"""Lab `vending`, step 3: apply_event — types, ranges, duplicates, conflicts, gaps, where fault() runs,
and what a failure at each statement leaves behind (the judge looks while fault() waits).
"""

from __future__ import annotations

from checks.outbox import schema as stores
from checks.vending import interference
from checks.vending.hints import BOOL_HINT, CURSOR_HINT, ORDER_HINT, PASS_FAULT_HINT, RANGE_HINT
from checks.vending.inputs import SEQ_MAX, deltas, distinct_history
from checks.vending.outcomes import module_exception
from checks.vending.store import (
    judged,
    make_store,
    no_open_transaction,
    shown,
    state_after,
    store_state,
)
from checks.vending.witness import served_with_witness
from labkit.judge.expect import TRANSACTION_HINT, Miss, Plan, both, describe, raises, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def fault_seen(seq: int, before: dict, delta: int, clause: str | None = None):
    """fault() ran once, inside the one transaction, between the total and the cursor. Misses name
    step 3's clause they break, or `clause` for every miss (step 5: fault was not passed on)."""

    def check(record: dict) -> Miss | None:
        miss = seen(record)
        if miss is not None and clause:
            miss.clause = clause
            if not judged(record).get("faults"):
                miss.hint = PASS_FAULT_HINT
        return miss

    def seen(record: dict) -> Miss | None:
        calls = judged(record).get("faults", [])  # the judge's witness: one entry per fault() call
        if len(calls) != 1:
            return Miss(f"fault() was called {len(calls)} times",
                       "Pass `fault` along and call it exactly once, after updating the total. " + ORDER_HINT,
                       clause="3.order")
        call = calls[0]
        outside = call.get("outside")
        if outside is not None and (outside["last"], outside["total"]) != (before["last"], before["total"]):
            return Miss(f"while fault() ran, the judge's own connection already read last {outside['last']}, "
                       f"total {outside['total']}: part of the event was committed early", CURSOR_HINT,
                       clause="3.one-transaction")
        reported = record["observed"].get("faults", [])
        inside = reported[0].get("inside") if len(reported) == 1 else None  # only the child's connection sees it
        if inside is not None:
            if inside["last"] != before["last"]:
                return Miss(f"when fault() ran, the cursor was already {inside['last']}", CURSOR_HINT,
                           clause="3.order")
            if seq not in inside["seqs"]:
                return Miss("when fault() ran, the ledger row was not inserted yet", ORDER_HINT, clause="3.order")
            if inside["total"] != before["total"] + delta:
                return Miss(f"when fault() ran, the total was {inside['total']}, not yet "
                           f"{before['total'] + delta}", ORDER_HINT, clause="3.order")
        if not call.get("write_locked"):
            return Miss("while fault() ran, the judge could BEGIN IMMEDIATE on the store: no write "
                       "transaction was open", TRANSACTION_HINT, clause="3.one-transaction")
        return None

    return check


def fault_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or outcome["type"] != "RuntimeError" or not record["observed"].get("same_error"):
        return Miss(describe(outcome), "Let fault()'s own exception propagate after the ROLLBACK (a bare `raise`).")
    return None


def interrupt_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or outcome["type"] != "Interrupted" or not record["observed"].get("same_error"):
        return Miss(describe(outcome), "Let it propagate after the ROLLBACK (a bare `raise`).")
    return None


def jam_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or "the cursor is jammed" not in outcome.get("message", ""):
        return Miss(describe(outcome), "Re-raise sqlite3's original error (a bare `raise`), don't wrap it.")
    return None


def check_apply(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    history = distinct_history(rng, rng.randint(3, 6))
    k = history[-1][0]
    d0, d1 = deltas(rng, 2)
    d_next, d_far = deltas(rng, 2, start=sum(d for _, d in history))
    other = d0 + 1 if d0 < 1000 else d0 - 1
    old_seq, old_delta = history[rng.randrange(len(history) - 1)]
    old_other = old_delta + 1 if old_delta < 1000 else old_delta - 1
    plans: list[Plan] = []
    specs: list[dict] = []

    def case(label: str, applied: list[tuple[int, int]], args: list, expected: str, outcome_check,
             after: list[tuple[int, int]] | dict, clauses: tuple[str, ...], *, fault: str | None = None,
             extra=None, setup: str = "", hint: str = "", state_hint: str = "", held: bool = False) -> None:
        """One call on a store of its own, prepared by the judge as a correct client would have left it."""
        db = make_store(ctx.path(f"apply{len(plans)}.db"), applied)
        if setup:
            stores.execute(db, setup)
        kept = after if isinstance(after, dict) else store_state(after)
        state_hint = state_hint or ("Change nothing when the call is refused or fails: ROLLBACK, then raise."
                                   if after is applied or isinstance(after, dict) else
                                   "Insert the ledger row, add delta to the total, set last = seq, then COMMIT.")
        main = clauses[0]
        checks = [outcome_check, under("3.no-open-transaction", no_open_transaction)]
        if extra is not None:
            checks.append(extra)
        checks.append(under(main, state_after(kept, state_hint)))
        shown_call = ", ".join(show(a) for a in args)
        on = f"on a store at last {applied[-1][0]}" if applied else "on a new store (last -1)"
        on += ", while another connection is in the middle of a write" if held else ""
        plans.append(Plan(label, f"apply_event(con, {shown_call}{', fault=f' if fault else ''}) {on}", expected,
                         both(*checks), hint, clauses=(*clauses, "3.no-open-transaction")))
        specs.append({"name": label, "db": str(db), "fn": "apply_event", "args": [encode(a) for a in args],
                     "fault": fault, "held": held})

    applies = lambda hint: under("3.apply-next", returns(True, hint))  # noqa: E731
    new_hint = "A new event (seq == last + 1) is applied: return True."
    one = [(0, d0)]
    nothing = "ValueError; nothing changes"

    case("the first event (seq 0)", [], [0, d0], "True; ledger row, total and cursor saved", applies(new_hint), one,
         ("3.apply-next",))
    case("the next event (seq 1)", one, [1, d1], "True; total and cursor moved together", applies(new_hint),
         one + [(1, d1)], ("3.apply-next",))
    case("the next event after a saved cursor", history, [k + 1, d_next], "True; the event applied",
         applies("Read last from the store: seq == last + 1 is new."), history + [(k + 1, d_next)],
         ("3.apply-next",))
    # Types: each of these equals a valid argument in Python (False == 0, True == 1, 1.0 == 1).
    for label, applied, args in (
        ("seq False (a bool equal to 0) on a new store", [], [False, d0]),
        ("seq True (a bool equal to 1)", one, [True, d1]),
        ("delta True (a bool)", one, [1, True]),
        ("delta False (a bool)", one, [1, False]),
        ("seq 1.0 (a float)", one, [1.0, d1]),
        ("seq '1' (a str)", one, [str(1), d1]),
        ("seq None", one, [None, d1]),
        ("delta 2.0 (a float)", one, [1, 2.0]),
        ("delta '5' (a str)", one, [1, "5"]),
    ):
        hint = BOOL_HINT if "bool" in label else "seq and delta must be ints (`type(x) is int`): never convert."
        case(label, applied, args, nothing, under("3.types", raises("ValueError", hint)), applied, ("3.types",),
             hint=hint)
    # Ranges, both ends, and validation before the store is read.
    top = [(SEQ_MAX - 1, d0)]
    in_range = lambda hint: under("3.ranges", returns(True, hint))  # noqa: E731
    case("seq 2147483647 (the largest) after 2147483646", top, [SEQ_MAX, d1], "True; the event applied",
         in_range("seq ranges up to 2147483647, that value included."), top + [(SEQ_MAX, d1)], ("3.ranges",))
    case("delta 1000 (the largest)", one, [1, 1000], "True; the event applied",
         in_range("delta ranges from -1000 to 1000, both included."), one + [(1, 1000)], ("3.ranges",))
    low = [(0, rng.randint(1, 999))]  # so the smallest delta always takes the total below zero
    case("delta -1000 (the smallest), the total going below zero", low, [1, -1000], "True; the event applied",
         in_range("delta ranges from -1000 to 1000, both included."), low + [(1, -1000)], ("3.ranges",),
         state_hint="The total is a plain sum of the deltas: it may go below zero (a refund, a correction), "
                   "so never clamp it. Insert the ledger row, add delta, set last = seq, then COMMIT.")
    for label, args, clause, hint in (
        ("delta 1001", [k + 1, 1001], "3.ranges", RANGE_HINT),
        ("delta -1001", [k + 1, -1001], "3.ranges", RANGE_HINT),
        ("seq -1 on a saved store", [-1, old_delta], "3.validate-first",
         "Validate before looking at the store: seq -1 is ValueError, not a duplicate or a Conflict."),
        ("seq 2147483648 on a saved store", [SEQ_MAX + 1, d_next], "3.validate-first",
         "Validate before looking at the store: out of range is ValueError, not Gap."),
        ("a seen seq with delta 5000", [old_seq, 5000], "3.validate-first",
         "Validate first: an out-of-range delta is ValueError, not Conflict."),
        ("a seen seq with delta True", [old_seq, True], "3.validate-first", BOOL_HINT),
    ):
        case(label, history, args, nothing, under(clause, raises("ValueError", hint)), history,
             tuple(dict.fromkeys((clause, "3.ranges"))), hint=hint)
    # A refused call touches nothing: not even a write lock it would wait for while another writer works.
    busy_hint = ("Check the arguments before `BEGIN IMMEDIATE`: a call that is refused anyway must not wait "
                 "for the write lock (and fail with 'database is locked' when another writer keeps it).")
    for label, args in (("seq True while another connection is writing", [True, d_next]),):
        case(label, history, args, "ValueError at once; nothing changes",
             under("3.validate-first", raises("ValueError", busy_hint)), history, ("3.validate-first",),
             hint=busy_hint, held=True)
    # Duplicates, conflicts, gaps.
    dup_hint = "seq <= last with the same delta in the ledger is a duplicate: return False, change nothing."
    case("the same event again", one, [0, d0], "False (a duplicate); nothing changes",
         under("3.duplicate", returns(False, dup_hint)), one, ("3.duplicate",))
    case("an old seq with its recorded delta", history, [old_seq, old_delta], "False; nothing changes",
         under("3.duplicate", returns(False, "Look the seq up in the ledger: same delta → duplicate → False.")),
         history, ("3.duplicate",))
    case("the cursor's own seq with its delta", history, [k, history[-1][1]], "False; nothing changes",
         under("3.duplicate", returns(False, dup_hint)), history, ("3.duplicate",))
    conflict = "seq <= last with another delta in the ledger (or none at all) is a Conflict: raise it."
    case("seq 0 again with another delta", one, [0, other], "Conflict; nothing changes",
         module_exception("Conflict", conflict, "3.conflict"), one, ("3.conflict", "3.exceptions"))
    case("an old seq with another delta", history, [old_seq, old_other], "Conflict; nothing changes",
         module_exception("Conflict", conflict, "3.conflict"), history, ("3.conflict", "3.exceptions"))
    # Both directions, in every run: a comparison that only catches a larger (or a smaller) delta fails one.
    fixed = [(0, 500)]
    for label, other_delta in (("seq 0 (delta 500) again with delta 501", 501),
                              ("seq 0 (delta 500) again with delta 499", 499),
                              ("seq 0 (delta 500) again with delta -500", -500)):
        case(label, fixed, [0, other_delta], "Conflict; nothing changes",
             module_exception("Conflict", conflict, "3.conflict"), fixed, ("3.conflict",))
    pruned = {**store_state(history), "ledger": [list(e) for e in history[:1] + history[2:]]}
    case("an old seq the ledger does not hold", history, [1, history[1][1]], "Conflict; nothing changes",
         module_exception("Conflict", "seq <= last but no ledger row for it: that is a Conflict too (the "
                                     "lookup finds nothing; don't crash on `None[0]`).", "3.conflict"),
         pruned, ("3.conflict",), setup="DELETE FROM ledger WHERE seq = 1")
    gap = "seq > last + 1 means events are missing: raise Gap, apply nothing."
    case("a gap: seq 2 after 0", one, [2, d1], "Gap; nothing changes", module_exception("Gap", gap, "3.gap"), one,
         ("3.gap", "3.exceptions"))
    case("a gap of one after a saved cursor", history, [k + 2, d_next], "Gap; nothing changes",
         module_exception("Gap", gap, "3.gap"), history, ("3.gap",))
    case("seq 2147483647 on a new store", [], [SEQ_MAX, d_far], "Gap; nothing changes",
         module_exception("Gap", gap, "3.gap"), [], ("3.gap",))
    # fault(): where it runs, and what a failure leaves behind.
    base = store_state(history)
    case("the next event with a fault() that passes", history, [k + 1, d_next],
         f"True; fault() called once, between the total and the cursor; last {k + 1}",
         applies("Read last from the store; seq == last + 1 is new."), history + [(k + 1, d_next)], ("3.order",),
         fault="record", extra=fault_seen(k + 1, base, d_next))
    case("a duplicate with a fault()", history, [old_seq, old_delta], "False; fault() not called",
         under("3.duplicate", returns(False, dup_hint)), history, ("3.order",), fault="raise",
         extra=under("3.order", fault_not_called))
    case("a gap with a fault()", history, [k + 2, d_next], "Gap; fault() not called",
         module_exception("Gap", gap, "3.gap"), history, ("3.order",), fault="raise",
         extra=under("3.order", fault_not_called))
    case("fault() raises inside the transaction", history, [k + 1, d_next],
         "fault()'s own RuntimeError; ledger, total and cursor unchanged; no open transaction",
         under("3.original-error", fault_error), history, ("3.rollback", "3.original-error", "3.one-transaction"),
         fault="raise", extra=fault_seen(k + 1, base, d_next))
    case("fault() raises a BaseException (like KeyboardInterrupt)", history, [k + 1, d_next],
         "that BaseException propagates; ledger, total and cursor unchanged; no open transaction",
         under("3.original-error", interrupt_error), history, ("3.rollback", "3.no-open-transaction"),
         fault="interrupt", extra=fault_seen(k + 1, base, d_next))
    case("updating the cursor fails", history, [k + 1, d_next],
         "sqlite3.IntegrityError 'the cursor is jammed'; nothing changes; no open transaction",
         under("3.original-error", jam_error), history, ("3.rollback", "3.original-error", "3.one-transaction"),
         setup=JAM_CURSOR)
    # Something between two statements, at every statement in turn (checks/vending/interference.py).
    template = make_store(ctx.path("sweep.db"), history)
    applied = store_state(history + [(k + 1, d_next)])
    new_call = f"apply_event(con, {k + 1}, {d_next})"
    dup_call = f"apply_event(con, {old_seq}, {old_delta}) (a duplicate)"
    new_args, dup_args = [encode(k + 1), encode(d_next)], [encode(old_seq), encode(old_delta)]
    for plan, args, modes in (
        (interference.another_writer(k + 1, d_next, base, applied, shown), new_args, ["write"]),
        (interference.faults_between("applying the next event", new_call, base, shown), new_args,
         ["error", "interrupt"]),
        (interference.faults_between("applying a duplicate", dup_call, base, shown), dup_args, ["error", "interrupt"]),
    ):
        plans.append(plan)
        specs.append(interference.spec("apply_event", args, template, f"sweep{len(specs)}", modes))
    return served_with_witness(ctx, plans, specs)


# The checkpoint's cursor cannot change, however the update is spelled (UPDATE, or INSERT OR
# REPLACE, which deletes and inserts).
JAM_CURSOR = """
CREATE TRIGGER cursor_jammed BEFORE UPDATE OF last ON checkpoint
    BEGIN SELECT RAISE(ABORT, 'the cursor is jammed'); END;
CREATE TRIGGER cursor_jammed_insert BEFORE INSERT ON checkpoint
    BEGIN SELECT RAISE(ABORT, 'the cursor is jammed'); END;
"""


def fault_not_called(record: dict) -> Miss | None:
    calls = judged(record).get("faults", [])
    if calls:
        return Miss(f"fault() was called {len(calls)} time(s)",
                   "fault() belongs to applying a new event (between the total and the cursor): a duplicate "
                   "or a Gap applies nothing, so it never calls fault().")
    return None
