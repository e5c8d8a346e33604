"""Lab `vending`, final check: client #1 is killed between commit 1 and ACK 1, client #2 recovers; each
case claims only what the judge observed (the store file, the feed's journal, the exit codes).
"""

from __future__ import annotations

import time

from checks.vending.crash_scenario import (
    KILL,
    NOT_REACHED_KILL,
    RECOVERY,
    conns_during,
    killed_by_judge,
)
from checks.vending.evidence import ladder, timeline_feed, timeline_process
from checks.vending.feed_looks import acks_on, close_feeds, resumes_on, sent_on
from checks.vending.feed_server import start_feed
from checks.vending.inputs import deltas
from checks.vending.store import shown, snapshot, store_state
from checks.vending.writer_log import seqs_text
from labkit.judge import timeline as evidence
from labkit.judge.expect import SKELETON_HINT, Miss, describe, import_problem
from labkit.judge.hooks import KILLED_TEXT, run_to_hook
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode, encode, same


def check_crash(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = list(enumerate(deltas(rng, rng.randint(4, 7))))
    db = ctx.path("vending.db")
    timeline = ctx.evidence.timeline
    timeline.append(evidence.event(time.time(), "judge", "setup",
                                   f"feed with {len(events)} events {events}; no store file yet; kill at seq {KILL}"))
    # Generous waits: nothing in this scenario stalls on purpose, so they only bound a client that
    # hangs, and a correct client on a machine at load 45 (3 s to start a sandboxed child) fits:
    # the client's read timeout and the feed's wait for a line or an ACK, and one client process.
    io_seconds, child_seconds = ctx.timeout / 2, 2 * ctx.timeout
    args = {"db": str(db), "timeout": io_seconds, "guard": 2 * io_seconds}
    feed = start_feed(events, io_timeout=io_seconds)
    second = None
    try:
        args.update(host=feed.host, port=feed.port)
        # On before_ack(KILL)'s report the judge kills client #1's whole sandbox, then reads the store.
        first, hook = run_to_hook(ctx.solution, f"{ctx.lab.probes}:crash_client", {**args, "kill": KILL},
                                 workdir=ctx.workdir, timeout=child_seconds, marker=ctx.marker(),
                                 module_name=ctx.lab.module_name,
                                 at_hook=lambda r: r.get("kind") == "before_ack" and r.get("seq") == encode(KILL))
        feed.wait_idle(2.0)
        after_kill, t_kill = snapshot(db), time.time()
        died = died_after_commit(first, after_kill, feed.journal(), child_seconds, hook)
        if died.passed:  # only a real crash between commit and ACK has anything to recover from
            second = ctx.child("crash_client", {**args, "kill": None}, timeout=child_seconds)
            feed.wait_idle(2.0)
        after_all, t_end = snapshot(db), time.time()
    finally:
        close_feeds([feed])
    journal = feed.journal()
    j1 = [e for e in journal if e["conn"] in conns_during(journal, first)]
    j2 = [e for e in journal if second is not None and e["conn"] in conns_during(journal, second)]
    later = recovery_cases(events, after_kill, after_all, j2, second, child_seconds) if died.passed else [
        Case(name, Outcome.NOT_REACHED, called, expected, NOT_REACHED_KILL, clauses=(clause,))
        for name, called, expected, clause in RECOVERY]
    recognised = all(c.passed for c in later[1:3])
    timeline_process(timeline, "client #1", first, KILL, child_seconds, hook)
    if second is not None:
        timeline_process(timeline, "client #2", second, None, child_seconds)
    timeline_feed(timeline, journal, conns_during(journal, first),
                  conns_during(journal, second) if second is not None else set(), KILL if recognised else None)
    timeline.append(evidence.event(t_kill, "store", "snapshot", "after client #1: " + shown(after_kill)))
    if second is not None:
        timeline.append(evidence.event(t_end, "store", "snapshot", "after client #2: " + shown(after_all)))
    timeline.sort(key=lambda e: e["t"])
    if died.passed:
        ctx.evidence.faults.append(f"client #1 killed in before_ack at seq {KILL} — {KILLED_TEXT}, "
                                  f"seq {KILL} committed, no ACK {KILL} at the feed")
    if died.passed and recognised:
        ctx.evidence.faults.append(f"seq {KILL} delivered twice (committed by client #1, resent to client #2) — "
                                  f"ACKed and counted once")
    ctx.evidence.ladder.extend(ladder(events, died, after_kill, j1, j2, after_all, second is not None))
    return [died, *later]


def died_after_commit(first, after_kill: dict | None, journal: list[dict], timeout: float,
                     hook: dict | None = None) -> Case:
    """Client #1 really died in before_ack(1): the judge killed its sandbox there (`hook`: the
    report it acted on), seq 1 in the file (the judge's read), and no ACK 1 at the feed (the
    feed's journal). Each claim observed, or it fails."""
    case = Case(f"client #1 dies in before_ack({KILL}), after commit {KILL} and before ACK {KILL}", Outcome.PASSED,
                f"run_client(feed, new store, 3.0, before_ack=hook) where the judge kills the process in hook({KILL})",
                f"{KILLED_TEXT}; seq {KILL} in the store; no ACK {KILL} at the feed",
                clauses=("final.dies-after-commit",))
    hooked_at_kill = hook is not None
    acked = [e for e in journal if e["kind"] == "ack" and e["seq"] == KILL and e["conn"] in conns_during(journal, first)]
    seqs = [s for s, _ in after_kill["ledger"]] if after_kill else []
    if not hooked_at_kill:
        miss = _process_problem(first, "Call before_ack(seq) after each commit, before the ACK; run_client "
                                      "passes before_ack on to consume_session.", timeout)
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
    elif KILL not in seqs or after_kill["last"] < KILL:
        case.outcome = Outcome.WRONG
        case.got = (f"client #1 was killed by the judge in before_ack({KILL}), but the judge then read "
                   f"{shown(after_kill)}: seq {KILL} was not committed")
        case.hint = ("before_ack(seq) runs after the COMMIT of that seq: call consume_line first, then "
                    "before_ack(seq), then write the ACK.")
    elif acked:
        case.outcome = Outcome.WRONG
        case.got = (f"the feed received ACK {KILL} from client #1 before it died in before_ack({KILL}): "
                   f"the ACK went out before before_ack")
        case.hint = "Call before_ack(seq) after the commit and before writing the ACK."
    return case


def recovery_cases(events, after_kill, after_all, j2, second, timeout) -> list[Case]:
    """The four cases after a real crash: each claims only what the judge observed."""
    total = sum(d for _, d in events)
    survived, resume, once, finished = (Case(name, Outcome.PASSED, called, expected, clauses=(clause,))
                                       for name, called, expected, clause in RECOVERY)
    committed = store_state(events[: KILL + 1])
    survived.expected = shown(committed)
    if after_kill != committed:
        survived.outcome, survived.got = Outcome.WRONG, f"the judge read {shown(after_kill)}"
        survived.hint = "Commit the ledger row, the total and the cursor together, once per event."
    resumes2 = resumes_on(j2)
    if resumes2 != [KILL]:
        if resumes2:
            resume.outcome = Outcome.WRONG
            resume.got = "the feed received " + " then ".join(f"RESUME {n}" for n in resumes2) + " from client #2"
        else:
            miss = _process_problem(second, "Send `RESUME <last>` with the last the store saved.", timeout)
            resume.outcome, resume.got = miss.outcome, f"the feed received no RESUME from client #2 ({miss.got})"
        resume.hint = ("the feed saw RESUME -1 from the new process: read `last` from the store, never reset it."
                      if resumes2 == [-1] else "Send `RESUME <last>` with the last the store saved.")
    sent2, acks2 = sent_on(j2), acks_on(j2)
    counted = after_all["total"] if after_all else None
    if KILL not in sent2:
        once.outcome = Outcome.WRONG
        once.got = (f"the feed did not send seq {KILL} to client #2 (it sent " + (seqs_text(sent2) or "nothing")
                   + ")" + (f", after RESUME {resumes2[0]}" if resumes2 else ", as no RESUME came"))
        once.hint = resume.hint if not resume.passed else "Send `RESUME <last>` with the last the store saved."
    elif KILL not in acks2:
        once.outcome = Outcome.WRONG
        once.got = f"client #2 ACKed {seqs_text(acks2)}, not {KILL}"
        once.hint = "An identical duplicate is ACKed too: apply_event returns False, consume_line still ACKs."
    elif counted != total:
        once.outcome = Outcome.WRONG
        twice = counted is not None and counted - total == events[KILL][1]
        once.got = f"the total is {counted}, expected {total}" + (
            f": seq {KILL}'s delta {events[KILL][1]} was counted twice" if twice else "")
        once.hint = "Look seq up in the ledger: seq <= last with the same delta is a duplicate, not a new event."
    expected_end = (events[-1][0], total)
    finished.expected = f"{expected_end} returned; the store holds {shown(store_state(events))}"
    outcome = second.cases().get("run_client", {}).get("outcome")
    if outcome is None or outcome.get("kind") != "returned" or not same(decode(outcome["value"]), expected_end):
        miss = _process_problem(second, "run_client returns state(con) at EOF.", timeout)
        finished.outcome, finished.got, finished.hint = miss.outcome, miss.got, miss.hint
    elif after_all != store_state(events):
        finished.outcome, finished.got = Outcome.WRONG, f"the judge read {shown(after_all)}"
        finished.hint = "Each event once in the ledger, the total their sum, last the final seq."
    return [survived, resume, once, finished]


def _process_problem(run, expected: str, timeout: float) -> Miss:
    """Why a client process did not do what the scenario needed."""
    if not run.imported:
        got, hint, _ = import_problem(run, timeout)
        return Miss(got, hint, Outcome.IMPORT_FAILED)
    record = run.cases().get("run_client")  # a report beats run.timed_out, which can race with a normal exit
    if record is not None:
        outcome = record["outcome"]
        if outcome.get("kind") == "not_implemented":
            return Miss("run_client still raises NotImplementedError (the skeleton)", SKELETON_HINT,
                       Outcome.NOT_IMPLEMENTED)
        if outcome.get("kind") == "missing":
            return Miss("run_client is not defined in your module", "Run every step's cell.", Outcome.MISSING)
        return Miss(f"run_client {describe(outcome)} (exit code {run.exit_code})", expected,
                   Outcome.RAISED if outcome.get("kind") == "raised" else Outcome.WRONG)
    if killed_by_judge(run, timeout):
        return Miss("the client did not finish in time and was killed", "Look for a wait without a timeout.",
                   Outcome.TIMED_OUT)
    return Miss(f"the process ended with exit code {run.exit_code} before run_client returned", expected,
                Outcome.DIED)
