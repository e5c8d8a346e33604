"""The final check of lab `outbox`: the publisher killed right after the ACK, a lost response, replies
that are not evidence of delivery."""

from __future__ import annotations

from pathlib import Path

from checks.outbox import db
from checks.outbox.common import event, flags_text, listing, name, outcome_text, told
from checks.outbox.dispatch import MARK_BEFORE_SEND
from checks.outbox.send import NETWORK_HINT
from labkit.judge import timeline
from labkit.judge.expect import (
    Miss,
    Plan,
    describe,
    is_module_exception,
    under,
    value_of,
)
from labkit.judge.hooks import KILLED_TEXT, run_to_hook
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome
from labkit.values import same

SNACK = {"id": "snack-7", "sku": "snack", "qty": 7}
FINAL_FAULTS = {
    "wrong_id": ("an ACK naming another id", "final.wrong-id-not-delivery",
                 "Check that the reply is exactly {\"ack\": <this event's id>}."),
    "oversized": ("a 4 KB reply", "final.oversized-not-delivery",
                  "Read at most 1,025 bytes; a longer reply is not evidence: raise DeliveryError."),
    "redirect_302": ("a 302 redirect", "final.redirect-not-delivery",
                     "urllib turns a redirected POST into a GET without the body: refuse redirects (an "
                     "HTTPRedirectHandler whose redirect_request returns None)."),
}


def check_crash(ctx: StepContext) -> list[Case]:
    from labkit.servers.warehouse import WarehouseStartError, spawn_warehouse

    cases: list[Case] = []
    try:
        cases += _killed_after_ack(ctx, spawn_warehouse)
        cases += _lost_response(ctx, spawn_warehouse)
    except WarehouseStartError as exc:
        cases.append(Case("the warehouse runs your receive", Outcome.RAISED, "open_sink + receive in the warehouse "
                          "process", "the warehouse starts with your module",
                          f"the warehouse process could not use your module: {exc}",
                          "The warehouse imports your worker.py and calls your open_sink and receive: steps 2 and 5 "
                          "must work before the crash check can run.", clauses=("final.applied-before-crash",)))
    cases += _bad_replies(ctx)
    return cases


def _timeline_process(ctx, label, run, hook=None):
    def ack(note):
        if note.get("kind") == "hook":
            return "ack", (f"ACK for {told(note.get('id'))} verified; after_delivery reached: "
                           "the judge kills the process there")
        return None

    ctx.evidence.timeline.extend(timeline.process(label, run, ack, killed=hook is not None))


def _timeline_requests(ctx, requests, seen):
    for r in requests[seen:]:
        ctx.evidence.timeline.append(timeline.event(r.get("t_start", 0), "warehouse", r.get("outcome", "?"),
                                                    f"POST {r.get('id')} → {r.get('outcome')}, response: {r.get('response')}"))
    return len(requests)


def _sink_text(sink: Path) -> str:
    if not sink.exists():
        return "no sink file"
    stock, inbox = db.stock(sink), db.inbox_ids(sink)
    if isinstance(stock, db.Broken) or isinstance(inbox, db.Broken):
        return f"the sink could not be read ({stock if isinstance(stock, db.Broken) else inbox})"
    return f"stock {listing([f'{k} {v}' for k, v in stock.items()])}, inbox {listing(inbox)}"


def _snapshot(ctx, t, source, sink, event_id):
    flags = db.sent_flags(source)
    state = flags_text(flags, [event_id]) if isinstance(flags, dict) else str(flags)
    ctx.evidence.timeline.append(timeline.event(t, "source DB", "snapshot", state))
    if sink.exists():
        ctx.evidence.timeline.append(timeline.event(t, "sink DB", "snapshot", _sink_text(sink)))


def _receive_failures(requests: list[dict]) -> str:
    """What the student's receive did wrong inside the warehouse, as the warehouse logged it."""
    bad = [r for r in requests if r.get("outcome") in ("error", "bad_request", "conflict")]
    if not bad:
        return ""
    r = bad[0]
    return (f"; the warehouse ran your open_sink and receive for {r.get('id')}, which ended with {r.get('outcome')}: "
            f"{r.get('error')}")


def _process_problem(run, expected: str, requests: list[dict] = ()) -> Miss:
    """Why a publisher process did not do what the scenario needed."""
    from labkit.judge.expect import SKELETON_HINT, import_problem

    if not run.imported:
        got, hint, _ = import_problem(run, 10.0)
        return Miss(got, hint)
    record = run.cases().get("dispatch")  # a report is firmer evidence than `timed_out` (set at EOF)
    if record is not None and record["outcome"]["kind"] in ("not_implemented", "missing"):  # open_source or dispatch
        skeleton = record["outcome"]["kind"] == "not_implemented"
        return Miss(describe(record["outcome"]), SKELETON_HINT if skeleton else expected,
                    Outcome.NOT_IMPLEMENTED if skeleton else Outcome.MISSING)
    receive = _receive_failures(list(requests))
    if receive:
        expected = ("Your open_sink or receive (steps 2 and 5) failed inside the warehouse, so it could not ACK: "
                    "make those steps pass first.")
    acked = [r for r in requests if r.get("status") == 200 and r.get("response") == "ack"]
    if (not receive and acked and record is not None and record["outcome"].get("kind") == "raised"
            and record["outcome"].get("type") == "DeliveryError"):
        receive = f"; yet the warehouse had answered 200 with the ACK {{\"ack\": \"{acked[-1].get('id')}\"}}"
        expected = ("Your send_http refused the warehouse's real ACK: parse the reply (json.loads) and compare the "
                    "value with {\"ack\": id}, not the bytes with one particular spelling (step 8).")
    if not receive and record is not None and record["outcome"].get("kind") == "raised" and not requests and (
            "TimeoutError" in record["outcome"].get("mro", []) or "timed out" in record["outcome"].get("message", "")):
        receive = "; the warehouse never answered"
        expected = ("The warehouse answers once your receive (step 5) returns, on a connection your open_sink opened: "
                    "if either hangs or waits on a lock, the publisher's send_http times out. Make step 5 pass first.")
    if record is not None:
        return Miss(f"dispatch {outcome_text(record['outcome'])} (exit code {run.exit_code}){receive}", expected)
    if run.timed_out:
        return Miss("the publisher did not finish in time and was killed", "Look for a wait without a timeout.")
    return Miss(f"the process ended with exit code {run.exit_code} before dispatch returned{receive}", expected)


def _killed_after_ack(ctx, spawn_warehouse) -> list[Case]:
    source = db.make_source(ctx.path("source.db"), [SNACK])
    sink, log = ctx.path("sink.db"), ctx.path("warehouse.jsonl")
    ctx.evidence.ladder.append(timeline.rung("in orders", "yes: snack-7 accepted before the run", "start"))
    wh = spawn_warehouse(ctx.solution, sink, log, ctx.workdir, marker=ctx.marker())
    try:
        url = wh.url
        # The judge kills publisher #1's whole sandbox when it reports the hook, then reads the files.
        first, hook = run_to_hook(ctx.solution, f"{ctx.lab.probes}:crash_dispatch",
                                  {"source": str(source), "url": url, "kill": True}, workdir=ctx.workdir,
                                  timeout=ctx.timeout, marker=ctx.marker(), module_name=ctx.lab.module_name,
                                  at_hook=lambda r: r.get("kind") == "hook")
        _timeline_process(ctx, "publisher #1", first, hook)
        seen = _timeline_requests(ctx, wh.requests(), 0)
        _snapshot(ctx, first.ended_at, source, sink, "snack-7")
        flags = db.sent_flags(source)
        after_crash = (flags.get("snack-7") if isinstance(flags, dict) else flags,
                       db.stock(sink) if sink.exists() else {}, db.inbox_ids(sink) if sink.exists() else [])
        second = ctx.child("crash_dispatch", {"source": str(source), "url": url, "kill": False})
        _timeline_process(ctx, "publisher #2", second)
        _timeline_requests(ctx, wh.requests(), seen)
        _snapshot(ctx, second.ended_at, source, sink, "snack-7")
        requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    cases = []
    hooked = hook is not None
    died = Case("publisher #1 dies right after the ACK", Outcome.PASSED,
                "dispatch(con, send_http to the warehouse, 16, after_delivery=hook) where the judge kills the "
                "process in the hook", KILLED_TEXT, clauses=("final.dies-at-hook",))
    if not hooked:
        miss = _process_problem(first, "after_delivery must be called after a True ACK, before mark_sent.", requests)
        died.outcome, died.got, died.hint = miss.outcome, miss.got, miss.hint
    else:
        ctx.evidence.faults.append(f"publisher {KILLED_TEXT} in after_delivery")
    cases.append(died)
    flag, stock_after, inbox_after = after_crash
    state = Case("after the crash: pending in the source, applied in the warehouse", Outcome.PASSED,
                 "the judge reads both DB files", "snack-7 pending; stock snack 7; inbox has snack-7",
                 clauses=("final.pending-after-crash", "final.applied-before-crash"))
    ctx.evidence.ladder.append(timeline.rung("pending in outbox", "yes" if flag == 0 else f"no (sent = {flag})",
                                             "after publisher #1 died"))
    applied = isinstance(inbox_after, list) and "snack-7" in inbox_after
    ctx.evidence.ladder.append(timeline.rung("in the warehouse inbox", "yes" if applied else "no",
                                             "after publisher #1 died"))
    ctx.evidence.ladder.append(timeline.rung("ACK returned to the publisher",
                                             "yes: after_delivery ran, and it runs only after a True ACK" if hooked
                                             else "no", "just before the kill"))
    if died.passed:
        if flag != 0:
            state.outcome, state.got, state.hint = Outcome.WRONG, f"snack-7 is {flags_text({'snack-7': flag})}" \
                if not isinstance(flag, db.Broken) else f"the source could not be read: {flag}", MARK_BEFORE_SEND
            state.clauses = ("final.pending-after-crash",)
        elif stock_after != {"snack": 7} or not applied:
            state.outcome, state.got = Outcome.WRONG, f"after the crash the sink holds {_sink_text(sink)}"
            state.hint = "receive must record the id and add the qty in one committed transaction."
            state.clauses = ("final.applied-before-crash",)
    else:
        state.outcome, state.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    cases.append(state)
    resent = Case("a new process re-sends it; the warehouse applies it once", Outcome.PASSED,
                  "dispatch(...) again in a new process on the same files",
                  "returns 1; the server saw two POSTs for snack-7 (applied, duplicate); stock 7; row sent",
                  clauses=("final.resent-once", "final.stock-once", "final.sent-after-resend"))
    final_flags = db.sent_flags(source)
    final_flag = final_flags.get("snack-7") if isinstance(final_flags, dict) else final_flags
    final_stock = db.stock(sink) if sink.exists() else {}
    ctx.evidence.ladder.append(timeline.rung("sent saved", f"after #1: {'no' if flag == 0 else 'yes'}; "
                                             f"after #2: {'yes' if final_flag == 1 else 'no'}", "after each process"))
    record = second.cases().get("dispatch")
    if not died.passed:
        resent.outcome, resent.got = Outcome.NOT_REACHED, "not checked: publisher #1 did not die at the hook"
    elif record is None or record["outcome"]["kind"] != "returned" or not same(value_of(record), 1):
        miss = _process_problem(second, "The second dispatch should find snack-7 pending and deliver it again.",
                                requests)
        resent.outcome, resent.got, resent.hint = Outcome.WRONG, miss.got, miss.hint
        resent.clauses = ("final.resent-once",)
    elif [r.get("id") for r in requests] != ["snack-7", "snack-7"]:
        resent.outcome = Outcome.WRONG
        resent.got = f"the server saw POSTs for {listing([r.get('id') for r in requests])}"
        resent.hint, resent.clauses = "Each dispatch sends each pending event once.", ("final.resent-once",)
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": 7}:
        resent.outcome = Outcome.WRONG
        resent.got = (f"the warehouse answered {listing([r.get('outcome') for r in requests])}; "
                      f"{_sink_text(sink)}")
        resent.hint = "receive must recognise the repeated id in the inbox: delivered twice, applied once."
        resent.clauses = ("final.stock-once",)
    elif final_flag != 1:
        resent.outcome, resent.got = Outcome.WRONG, "snack-7 is still pending"
        resent.hint, resent.clauses = "After the duplicate ACK, mark the row sent.", ("final.sent-after-resend",)
    else:
        ctx.evidence.faults.append("the same event delivered twice — the warehouse's inbox recognised the duplicate")
    cases.append(resent)
    return cases


def _lost_response(ctx, spawn_warehouse) -> list[Case]:
    rng = ctx.rng
    lost = event(name(rng, "lost"), "snack", rng.randint(1, 1000))
    source = db.make_source(ctx.path("lost-source.db"), [lost])
    sink = ctx.path("lost-sink.db")
    wh = spawn_warehouse(ctx.solution, sink, ctx.path("lost.jsonl"), ctx.workdir, faults=["drop_after_commit"],
                         marker=ctx.marker())
    try:
        first = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        flags = db.sent_flags(source)
        flag_after = flags.get(lost["id"]) if isinstance(flags, dict) else flags
        second = ctx.child("crash_dispatch", {"source": str(source), "url": wh.url, "kill": False})
        requests = [r for r in wh.requests() if r.get("method") == "POST"]
    finally:
        wh.close()
    drop = Case("a lost response leaves the row pending", Outcome.PASSED,
                "dispatch(...); the warehouse commits, then closes without answering",
                "an OSError from dispatch; the row still pending", clauses=("final.lost-response-pending",))
    record = first.cases().get("dispatch")
    outcome = record["outcome"] if record else None
    if outcome is None or outcome["kind"] != "raised" or "OSError" not in outcome.get("mro", []):
        miss = _process_problem(first, NETWORK_HINT, requests[:1])
        drop.outcome, drop.got, drop.hint = miss.outcome, miss.got, miss.hint
    elif flag_after != 0:
        drop.outcome, drop.got, drop.hint = Outcome.WRONG, f"{lost['id']} has sent = {flag_after}", MARK_BEFORE_SEND
    else:
        ctx.evidence.faults.append(f"response dropped after commit — publisher raised {outcome['type']}; row stayed pending")
    redo = Case("the re-send gets a duplicate ACK", Outcome.PASSED, "dispatch(...) again",
                "1; the warehouse answers duplicate; stock unchanged; row sent",
                clauses=("final.lost-response-redelivered",))
    record = second.cases().get("dispatch")
    final_stock = db.stock(sink) if sink.exists() else {}
    final_flags = db.sent_flags(source)
    if not drop.passed:
        redo.outcome, redo.got = Outcome.NOT_REACHED, "not checked: the lost response was not handled"
    elif record is None or record["outcome"]["kind"] != "returned" or not same(value_of(record), 1):
        miss = _process_problem(second, "The row is still pending, so the next dispatch must re-send it.", requests)
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, miss.got, miss.hint
    elif [r.get("outcome") for r in requests] != ["applied", "duplicate"] or final_stock != {"snack": lost["qty"]}:
        redo.outcome = Outcome.WRONG
        redo.got = f"the warehouse answered {listing([r.get('outcome') for r in requests])}; {_sink_text(sink)}"
        redo.hint = "The warehouse must recognise the re-sent id and not add its qty again."
    elif not isinstance(final_flags, dict) or final_flags.get(lost["id"]) != 1:
        redo.outcome, redo.got, redo.hint = Outcome.WRONG, "the row is still pending", "Mark it after the duplicate ACK."
    return [drop, redo]


def _bad_replies(ctx) -> list[Case]:
    from labkit.servers.warehouse import close_all, start_warehouse

    rng = ctx.rng
    runs, servers, plans = [], [], []
    try:
        for fault, (label, clause, hint) in FINAL_FAULTS.items():
            e = event(name(rng, fault.replace("_", "-")), "snack", rng.randint(1, 1000))
            src = db.make_source(ctx.path(f"{fault}.db"), [e])
            wh = start_warehouse(ctx.path(f"{fault}.jsonl"), [fault])
            servers.append(wh)
            runs.append({"name": f"{label} is never taken as delivery", "source": str(src), "url": wh.url})
            plans.append(Plan(runs[-1]["name"], f"dispatch(...) against a warehouse answering with {label}",
                              "DeliveryError; the row stays pending", under(clause, _bad_reply_check(src, e["id"], hint,
                                                                                                     label, ctx)),
                              clauses=(clause,)))
        return ctx.cases("bad_replies", plans, {"runs": runs})
    finally:
        close_all(servers)


def _bad_reply_check(source, event_id, hint, label, ctx):
    def check(record):
        miss = is_module_exception("DeliveryError", hint)(record)
        flags = db.sent_flags(source)
        if miss is None and (not isinstance(flags, dict) or flags.get(event_id) != 0):
            miss = Miss(f"the row is {flags_text(flags, [event_id])}", "Only a verified ACK allows mark_sent.")
        if miss is None:
            ctx.evidence.faults.append(f"{label} offered — DeliveryError raised, row stayed pending")
        return miss

    return check


