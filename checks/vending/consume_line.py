"""Lab `vending`, step 5: consume_line — the ACK only once the commit is visible, errors propagate, fault passed on."""

from __future__ import annotations

from checks.vending.apply import fault_error, fault_seen
from checks.vending.hints import ACK_AFTER_COMMIT
from checks.vending.inputs import SEQ_MAX, deltas, distinct_history
from checks.vending.store import (
    judged,
    make_store,
    no_open_transaction,
    shown,
    state_after,
    store_state,
)
from checks.vending.witness import served_with_witness
from labkit.judge.expect import (
    Miss,
    Plan,
    both,
    is_module_exception,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def visible_ack(seq: int, expected: dict, clause: str):
    """Returned b"ACK seq\\n", and another connection saw the commit right after."""

    def check(record: dict) -> Miss | None:
        ack = b"ACK %d\n" % seq
        outcome = record["outcome"]
        if outcome["kind"] == "returned" and isinstance(value_of(record), bytes | bytearray | str):
            miss = under("5.ack-format", returns(ack, f"Return the bytes `{ack!r}`: ASCII, one space, one LF."))(
                record)
        else:
            miss = under(clause, returns(ack, f"Return the bytes `{ack!r}` (ASCII, one LF)."))(record)
        if miss is not None:
            return miss
        have = judged(record).get("after")
        if have is None or have["last"] < seq:
            return Miss(f"returned {ack!r}, but right then the judge's own connection read {shown(have)}",
                       ACK_AFTER_COMMIT, clause="5.visible-at-ack")
        return under(clause, state_after(expected, "Apply each event exactly once."))(record)

    return check


def check_consume_line(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    history = distinct_history(rng, 3)
    k = history[-1][0]
    d0, d1, d2 = deltas(rng, 3)
    other = d0 + 1 if d0 < 1000 else d0 - 1
    plans, specs = [], []
    one = [(0, d0)]

    def case(label: str, applied: list[tuple[int, int]], line, expected: str, check, clauses: tuple[str, ...],
             after: list[tuple[int, int]], hint: str = "", fault: str | None = None) -> None:
        """One call on a store of its own; the judge reads that file again after the child ended."""
        db = make_store(ctx.path(f"line{len(plans)}.db"), applied)
        kept = store_state(after)
        on = f"on a store at last {applied[-1][0]}" if applied else "on a new store"
        plans.append(Plan(label, f"consume_line(con, {show(line)}{', fault=f' if fault else ''}) {on}", expected,
                         both(check, under(clauses[0], state_after(kept, "Commit before returning the ACK; change "
                                                                         "nothing on a refused line."))),
                         hint, clauses=clauses))
        specs.append({"name": label, "db": str(db), "fn": "consume_line", "args": [encode(line)], "fault": fault})

    no_ack = "A refused line gets no ACK: let the exception propagate."
    case("a new frame", [], b"EVENT 0 %d\n" % d0, "b'ACK 0\\n'; the commit visible to another connection",
         both(visible_ack(0, store_state(one), "5.ack-format"), under("5.ack-format", no_open_transaction)),
         ("5.ack-format", "5.visible-at-ack"), one)
    case("the largest seq", [(SEQ_MAX - 1, d0)], b"EVENT %d %d\n" % (SEQ_MAX, d1), "b'ACK 2147483647\\n'",
         visible_ack(SEQ_MAX, store_state([(SEQ_MAX - 1, d0), (SEQ_MAX, d1)]), "5.ack-format"), ("5.ack-format",),
         [(SEQ_MAX - 1, d0), (SEQ_MAX, d1)])
    case("the same frame again", one, b"EVENT 0 %d\n" % d0,
         "b'ACK 0\\n' again (a duplicate is ACKed too); nothing changes",
         both(visible_ack(0, store_state(one), "5.duplicate-acked"), no_open_transaction), ("5.duplicate-acked",), one,
         "An identical duplicate is ACKed: apply_event returned False, that is fine.")
    case("an old frame again", history, b"EVENT 1 %d\n" % history[1][1], "b'ACK 1\\n'; nothing changes",
         visible_ack(1, store_state(history), "5.duplicate-acked"), ("5.duplicate-acked",), history,
         "An identical duplicate is ACKed: apply_event returned False, that is fine.")
    case("seq 0 again with another delta", one, b"EVENT 0 %d\n" % other, "Conflict, no ACK",
         both(under("5.errors-propagate", is_module_exception("Conflict", "A Conflict is not delivered: no ACK, "
                                                                         "let it propagate.")),
              under("5.errors-propagate", state_after(store_state(one), no_ack))),
         ("5.errors-propagate",), one)
    case("a gap", one, b"EVENT 2 %d\n" % d2, "Gap, no ACK",
         both(under("5.errors-propagate", is_module_exception("Gap", "A Gap is not delivered: no ACK, let it "
                                                                    "propagate.")),
              under("5.errors-propagate", state_after(store_state(one), no_ack))),
         ("5.errors-propagate",), one)
    parse_hint = "Call parse_line first; its ValueError propagates."
    for label, line in (("a CRLF frame", b"EVENT 1 %d\r\n" % d1), ("a torn frame", b"EVENT 1 %d" % d1),
                       ("a frame with a leading zero", b"EVENT 01 %d\n" % d1),
                       ("a str line", f"EVENT 1 {d1}\n"), ("a bytearray line", bytearray(b"EVENT 1 %d\n" % d1))):
        case(label, one, line, "ValueError, no ACK, nothing applied",
             both(under("5.parse-first", raises("ValueError", parse_hint)),
                 under("5.parse-first", state_after(store_state(one), no_ack))),
             ("5.parse-first",), one)
    case("the next frame, with a fault() that passes", one, b"EVENT 1 %d\n" % d1,
         "fault() called once inside the transaction; b'ACK 1\\n'; the commit visible",
         both(visible_ack(1, store_state(one + [(1, d1)]), "5.fault-passed"), no_open_transaction,
              fault_seen(1, store_state(one), d1, "5.fault-passed")),
         ("5.fault-passed", "5.visible-at-ack"), one + [(1, d1)], fault="record")
    base = store_state(history)
    case("the business step fails", history, b"EVENT %d %d\n" % (k + 1, d2),
         "fault()'s own RuntimeError; no ACK; nothing changes",
         both(fault_seen(k + 1, base, d2, "5.fault-passed"), under("5.fault-passed", fault_error),
              under("5.fault-passed", no_open_transaction), under("5.fault-passed", state_after(base, no_ack))),
         ("5.fault-passed",), history,
         "Pass `fault` on to apply_event: consume_line(con, line, fault) → apply_event(con, seq, delta, fault).",
         fault="raise")
    return served_with_witness(ctx, plans, specs)
