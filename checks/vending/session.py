"""Lab `vending`, step 6: consume_session over real TCP against the judge's feed, and over scripted
I/O on a virtual clock (stalls, resets, hanging drains and close waits, cancellations, bad timeouts).
"""

from __future__ import annotations

from pathlib import Path

from checks.outbox import schema as stores
from checks.vending.feed_looks import (
    acks_seen_committed,
    close_feeds,
    feed_saw_close,
    observe_feed_case,
)
from checks.vending.feed_server import start_feed
from checks.vending.hints import ABORT_HINT, READ_HINT, TIMEOUT_HINT
from checks.vending.inputs import INVALID_TIMEOUTS, distinct_history, script
from checks.vending.outcomes import cancelled, same_error, took, within
from checks.vending.store import committed_last, judge_reads, judged, make_store, store_state
from checks.vending.writer_log import (
    aborted,
    acks_after_commits,
    closed,
    hooked,
    hooks_on_acked_lines,
    seqs_text,
    wrote_acks,
)
from labkit.judge.expect import Miss, Plan, both, is_module_exception, raises, returns, under
from labkit.judge.run import StepContext
from labkit.judge.served import served
from labkit.judge.verdict import Case
from labkit.values import encode, show

# A store that cannot take seq 1: its commit fails, so an ACK 1 reaching the feed can only have
# been written before the commit. The judge sees that in the feed's journal, whatever the timing.
REFUSE_SEQ_1 = """
CREATE TRIGGER store_refuses_seq_1 BEFORE INSERT ON ledger WHEN NEW.seq = 1
    BEGIN SELECT RAISE(ABORT, 'the store refuses seq 1 (a judge trigger)'); END;
"""


def check_session(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = distinct_history(rng, 5)
    total = sum(d for _, d in events)
    every = [s for s, _ in events]
    first = (0, events[0][1])
    plans: list[Plan] = []
    specs: list[dict] = []
    faults: list[str] = []
    dbs: dict[int, Path] = {}  # feed connection → the store its client commits to
    call = "consume_session(reader, writer, con, {t}, before_ack=hook)"

    def scenario(label, called, expected, checks, clauses, setup="", **spec):
        """One case on a store of its own; `checks(db, conn)` builds its checks (conn: its feed connection)."""
        db = make_store(ctx.path(f"s{len(specs)}.db"))
        if setup:
            stores.execute(db, setup)
        conn = None
        if spec["io"] == "feed":
            faults.append(spec.pop("fault"))
            conn = len(faults)
            dbs[conn] = db
        specs.append({"db": str(db), "timeout": encode(spec.pop("timeout")), "conn": conn, **spec})
        plans.append(Plan(label, called, expected, both(*checks(db, conn), db_kept_open,
                                                       hooks_on_acked_lines(spec.get("hook_fails_at"))),
                         clauses=(*clauses, "6.db-left-open")))

    def feed_acked(seqs: list[int], hint: str = "Send exactly one `ACK <seq>\\n` per committed line, and drain it."):
        def check(record: dict) -> Miss | None:
            got = [a["seq"] for a in judged(record).get("acks", [])]
            if got != seqs:
                return Miss(f"the feed received ACKs for {seqs_text(got)}; expected {seqs_text(seqs)}", hint,
                           clause="6.hook-before-ack")
            return None

        return check

    def committed(db: Path, applied: list[tuple[int, int]], hint: str, clause: str):
        return under(clause, judge_reads(db, store_state(applied), hint))

    # Real TCP against the judge's feed: one connection per case, in this order.
    scenario("reads, commits and ACKs every line, then returns the state at EOF", call.format(t=3.0),
             f"{(events[-1][0], total)}; before_ack then ACK for 0–4, each after its commit; writer closed",
             lambda db, conn: [
                 under("6.eof-state", returns((events[-1][0], total), "At EOF (readline returns b\"\"), return "
                                                                    "state(con).")),
                 hooked(every), acks_seen_committed, acks_after_commits, wrote_acks(every), closed,
                 feed_acked(every), committed(db, events, "Commit every line.", "6.eof-state")],
             ("6.eof-state", "6.commit-before-hook", "6.hook-before-ack", "6.drain-bounded"),
             io="feed", fault="none", timeout=3.0, guard=5.0)
    scenario("a stalled feed ends in TimeoutError", call.format(t=0.1) + "; the feed sends nothing",
             "TimeoutError after about 0.1 s; writer closed",
             lambda db, conn: [under("6.read-bounded", raises("TimeoutError", READ_HINT)),
                              within(0.09, 2.0, "about 0.1 s", READ_HINT, "6.read-bounded"), closed,
                              feed_saw_close],
             ("6.read-bounded", "6.close-every-path"), io="feed", fault="stall", timeout=0.1, guard=2.5)
    scenario("the feed drops the connection after one line", call.format(t=3.0),
             f"{first} at EOF; writer closed",
             lambda db, conn: [under("6.eof-state", returns(first, "EOF ends the session: return state(con).")),
                              closed, feed_acked([0])],
             ("6.eof-state", "6.close-every-path"), io="feed", fault="drop_mid_stream", timeout=3.0, guard=5.0)
    scenario("a torn last line is not a command",
             call.format(t=3.0) + "; the feed sends b'EVENT 0 …' without LF and closes",
             "ValueError; nothing applied, no ACK; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", raises("ValueError", "A torn last line (no LF) is not a command: "
                                                                 "parse_line refuses it, and the error propagates.")),
                 wrote_acks([], "Never ACK a torn line.", "6.errors-propagate"), closed,
                 committed(db, [], "Never apply a torn line.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="torn_last_line", timeout=3.0, guard=5.0)
    scenario("a conflicting duplicate", call.format(t=3.0) + "; the feed resends seq 0 with another delta",
             "Conflict; only ACK 0 written; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", is_module_exception("Conflict", "consume_line's Conflict propagates out "
                                                                            "of consume_session.")),
                 wrote_acks([0], clause="6.errors-propagate"), closed, feed_saw_close, feed_acked([0]),
                 committed(db, events[:1], "Apply seq 0 once.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="conflicting_duplicate", timeout=3.0,
             guard=5.0)
    scenario("a skipped seq", call.format(t=3.0) + "; the feed starts at seq 1", "Gap; no ACK; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", is_module_exception("Gap", "consume_line's Gap propagates out of "
                                                                       "consume_session.")),
                 wrote_acks([], clause="6.errors-propagate"), closed, feed_saw_close,
                 committed(db, [], "Apply nothing after a Gap.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="skip_seq", timeout=3.0, guard=5.0)
    scenario("before_ack raises at seq 1", call.format(t=3.0) + " where hook(1) raises RuntimeError",
             "that RuntimeError; seq 1 committed but not ACKed; writer closed",
             lambda db, conn: [
                 same_error("Let before_ack's own exception propagate.", "6.errors-propagate"),
                 wrote_acks([0], "No ACK for a line whose before_ack failed.", "6.hook-before-ack"), closed,
                 feed_saw_close, feed_acked([0]),
                 committed(db, events[:2], "Commit before calling before_ack.", "6.commit-before-hook")],
             ("6.errors-propagate", "6.commit-before-hook", "6.hook-before-ack"),
             io="feed", fault="none", timeout=3.0, guard=5.0, hook_fails_at=1)
    scenario("the store refuses to commit seq 1", call.format(t=3.0) + "; a trigger makes inserting seq 1 fail",
             "sqlite3's IntegrityError; the feed gets ACK 0 and no ACK 1; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", raises("IntegrityError", "Let sqlite3's own error propagate out of "
                                                                     "consume_session.")),
                 feed_acked([0], "An ACK says 'committed': a line whose commit failed gets none. Write the ACK "
                                "only after consume_line returned."),
                 closed, feed_saw_close, committed(db, events[:1], "Apply seq 0 only.", "6.errors-propagate")],
             ("6.hook-before-ack", "6.errors-propagate"), io="feed", fault="none", timeout=3.0, guard=5.0,
             setup=REFUSE_SEQ_1)
    scenario("cancelled while waiting for a line", call.format(t=5.0) + "; the feed stalls; cancelled after 0.02 s",
             "CancelledError propagates; writer closed",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed, feed_saw_close],
             ("6.cancel-propagates", "6.close-every-path"),
             io="feed", fault="stall", timeout=5.0, guard=2.0, cancel_after=0.02)

    # In-process I/O on a virtual clock: a scripted StreamReader and a fake writer.
    line0 = script(events[:1])
    slow = events[:4]
    scenario("lines 0.3 s apart with timeout 0.5 (the session outlasts the timeout)",
             call.format(t=0.5) + "; 4 lines, 0.3 s apart, then EOF",
             f"{(slow[-1][0], sum(d for _, d in slow))}: each read waits at most 0.5 s, the session as long as it must",
             lambda db, conn: [under("6.read-bounded", returns((slow[-1][0], sum(d for _, d in slow)), (
                 "Bound each readline on its own (`wait_for(reader.readline(), timeout)` inside the loop), not "
                 "the whole session."))), wrote_acks([0, 1, 2, 3], clause="6.read-bounded")],
             ("6.read-bounded",), io="script", script=script(slow, 0.3), end_after=0.3, timeout=0.5, guard=30.0)
    scenario("no line ever comes", call.format(t=0.5) + "; the reader gets nothing, not even EOF",
             "TimeoutError after exactly 0.5 s; writer closed",
             lambda db, conn: [under("6.read-bounded", raises("TimeoutError", READ_HINT)),
                              took(0.5, "Bound every readline by `timeout`.", "6.read-bounded"), closed],
             ("6.read-bounded", "6.close-every-path"), io="script", end="open", timeout=0.5, guard=30.0)
    scenario("the connection is reset while reading", call.format(t=0.5) + "; one line, then ConnectionResetError",
             "ConnectionResetError propagates; ACK 0 written; writer closed",
             lambda db, conn: [under("6.errors-propagate", raises("ConnectionResetError",
                                                                 "Let the reader's error propagate.")),
                              wrote_acks([0], clause="6.errors-propagate"), closed],
             ("6.errors-propagate", "6.close-every-path"), io="script", script=line0, end="reset", end_after=0.1,
             timeout=0.5, guard=30.0)
    dup = [events[0], events[0], events[1]]
    scenario("an identical duplicate line is ACKed again", call.format(t=0.5) + "; lines 0, 0 (the same), 1, EOF",
             f"{(1, events[0][1] + events[1][1])}; ACK 0, ACK 0, ACK 1",
             lambda db, conn: [under("6.eof-state", returns((1, events[0][1] + events[1][1]), "Return state(con).")),
                              hooked([0, 0, 1]), wrote_acks([0, 0, 1], "A duplicate is ACKed too (consume_line "
                                                                       "returns its ACK).")],
             ("6.hook-before-ack",), io="script", script=script(dup), timeout=0.5, guard=30.0)
    # Lines that look like nothing: only b"" (readline at EOF) ends the stream; these are bad frames.
    eof_hint = ("Only `b\"\"` (what readline returns at EOF) ends the session. An empty or blank line is a bad "
                "frame: hand it to consume_line, whose parse_line refuses it (`if not line.strip()` or "
                "`if line == b\"\\n\"` takes it for the end).")
    for label, blank in (("an empty line (a lone LF)", "\n"), ("a lone CRLF", "\r\n"), ("a lone space", " \n")):
        scenario(f"{label} between two frames is an error, not the end", call.format(t=0.5)
                 + f"; lines 0, {show(blank.encode())}, 1, EOF", "ValueError after ACK 0; line 1 never applied",
                 lambda db, conn: [under("6.errors-propagate", raises("ValueError", eof_hint)),
                                  wrote_acks([0], eof_hint, "6.errors-propagate"),
                                  committed(db, [first], eof_hint, "6.errors-propagate")],
                 ("6.errors-propagate",), io="script",
                 script=[*script([first]), [0.0, blank], *script([(1, events[1][1])])], timeout=0.5, guard=30.0)
    scenario("timeout 1 (an int) is accepted", call.format(t=1) + "; two lines, EOF",
             f"{(1, events[0][1] + events[1][1])}; both ACKed",
             lambda db, conn: [under("6.timeout", returns((1, events[0][1] + events[1][1]), (
                 "timeout may be an int: test `type(timeout) in (int, float)` and not bool, finite, > 0.")))],
             ("6.timeout",), io="script", script=script(events[:2]), timeout=1, guard=30.0)
    scenario("drain never finishes", call.format(t=0.5) + "; writer.drain() hangs",
             "TimeoutError after 0.5 s; writer closed",
             lambda db, conn: [
                 under("6.drain-bounded", raises("TimeoutError", "Bound every drain: "
                                                                "`await asyncio.wait_for(writer.drain(), timeout)`.")),
                 took(0.5, "Bound the drain by `timeout`.", "6.drain-bounded"), closed],
             ("6.drain-bounded", "6.close-every-path"), io="script", script=line0, drain="hang", timeout=0.5,
             guard=30.0)
    scenario("drain fails", call.format(t=0.5) + "; writer.drain() raises ConnectionResetError",
             "ConnectionResetError propagates; writer closed",
             lambda db, conn: [under("6.errors-propagate", raises("ConnectionResetError",
                                                                 "Let the error from drain propagate.")), closed],
             ("6.errors-propagate", "6.close-every-path"), io="script", script=line0, drain="raise", timeout=0.5,
             guard=30.0)
    scenario("cancelled while draining", call.format(t=5.0) + "; drain hangs; cancelled after 0.05 s",
             "CancelledError propagates; writer closed",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates", "6.close-every-path"), io="script", script=line0, end="open", drain="hang",
             timeout=5.0, guard=30.0, cancel_after=0.05)
    scenario("wait_closed hangs after a normal end",
             call.format(t=0.5) + "; EOF after one line; wait_closed() hangs", f"{first}; abort() after 0.5 s",
             lambda db, conn: [
                 took(0.5, "Bound wait_closed by `timeout`.", "6.close-wait-bounded"),
                 under("6.never-mask", returns(first, "A close wait that times out is handled by abort(): the "
                                                     "session's result stands.")),
                 closed, aborted],
             ("6.close-wait-bounded", "6.abort", "6.never-mask"), io="script", script=line0, wait_closed="hang",
             timeout=0.5, guard=30.0)
    scenario("wait_closed fails after a normal end",
             call.format(t=0.5) + "; EOF after one line; wait_closed() raises ConnectionResetError",
             f"{first}; abort() called",
             lambda db, conn: [under("6.never-mask", returns(first, ABORT_HINT)), closed, aborted],
             ("6.abort", "6.never-mask"), io="script", script=line0, wait_closed="reset", timeout=0.5, guard=30.0)
    scenario("wait_closed fails after an error",
             call.format(t=0.5) + "; a bad line; wait_closed() raises ConnectionResetError",
             "the original ValueError (not masked); abort() called",
             lambda db, conn: [under("6.never-mask", raises("ValueError", ABORT_HINT)), closed, aborted],
             ("6.abort", "6.never-mask"), io="script", script=[[0.0, "EVENT 0 x\n"]], wait_closed="reset",
             timeout=0.5, guard=30.0)
    scenario("wait_closed hangs after an error", call.format(t=0.5) + "; seq 5 first (a gap); wait_closed() hangs",
             "the original Gap (not masked); abort() after 0.5 s",
             lambda db, conn: [took(0.5, "Bound wait_closed by `timeout`.", "6.close-wait-bounded"),
                              under("6.never-mask", is_module_exception("Gap", ABORT_HINT)), closed, aborted],
             ("6.close-wait-bounded", "6.abort", "6.never-mask"), io="script", script=[[0.0, "EVENT 5 1\n"]],
             wait_closed="hang", timeout=0.5, guard=30.0)
    scenario("wait_closed hangs after a cancellation",
             call.format(t=0.5) + "; no data; cancelled after 0.05 s; wait_closed() hangs",
             "CancelledError (not masked by the close wait's TimeoutError); abort() after 0.5 s more",
             lambda db, conn: [took(0.55, "Bound wait_closed by `timeout`, also after a cancellation.",
                                   "6.close-wait-bounded"),
                              cancelled("6.never-mask"), closed, aborted],
             ("6.never-mask", "6.abort", "6.close-wait-bounded"), io="script", end="open", wait_closed="hang",
             timeout=0.5, guard=30.0, cancel_after=0.05)
    scenario("cancelled while reading (virtual clock)", call.format(t=5.0) + "; no data; cancelled after 0.05 s",
             "CancelledError propagates; close() and wait_closed()",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates", "6.close-every-path"), io="script", end="open", timeout=5.0, guard=30.0,
             cancel_after=0.05)
    scenario("cancelled while waiting for wait_closed",
             call.format(t=5.0) + "; EOF after one line; wait_closed() hangs; cancelled after 0.05 s",
             "CancelledError propagates; close() was called first",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates",), io="script", script=line0, wait_closed="hang", timeout=5.0, guard=30.0,
             cancel_after=0.05)
    for bad in INVALID_TIMEOUTS:
        scenario(f"timeout {bad!r} is refused", call.format(t=repr(bad)) + "; wait_closed() hangs",
                 "ValueError; nothing read or written; writer closed with a 1 s close wait, then abort()",
                 lambda db, conn: [
                    under("6.timeout", raises("ValueError", TIMEOUT_HINT)),
                    wrote_acks([], TIMEOUT_HINT, "6.timeout"), closed, aborted,
                    took(1.0, "With an invalid timeout, still close the writer, and bound wait_closed by 1 s.",
                         "6.close-wait-bounded"),
                    committed(db, [], TIMEOUT_HINT, "6.timeout")],
                 ("6.timeout", "6.close-wait-bounded", "6.close-every-path"), io="script", script=line0,
                 wait_closed="hang", timeout=bad, guard=30.0)

    feed = start_feed(events, faults, stall_seconds=3.0, io_timeout=3.0,
                     on_ack=lambda conn, seq: {"last": committed_last(dbs.get(conn))})
    try:
        for spec in specs:
            if spec["io"] == "feed":
                spec.update(host=feed.host, port=feed.port)
        return served(ctx, "session", plans, specs, lambda pid, spec: observe_feed_case(feed, pid, spec))
    finally:
        close_feeds([feed])


def db_kept_open(record: dict) -> Miss | None:
    """The connection it was handed is still open: the judge sees the child still holding the
    store file (the probe keeps that connection until the next case)."""
    if judged(record).get("holds_db") is False:
        return Miss("after consume_session ended, the process no longer held the store open: the DB "
                   "connection it was handed was closed",
                   "Do not close the DB connection: it belongs to the caller (run_client).", clause="6.db-left-open")
    if not record["observed"].get("con_open", True):
        return Miss("the DB connection was closed by consume_session",
                   "Do not close the DB connection: it belongs to the caller (run_client).", clause="6.db-left-open")
    return None
