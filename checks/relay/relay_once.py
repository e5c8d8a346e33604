"""Step 8 of lab `relay`: relay_once — claim, then for each row after_claim, send, after_send
and complete or fail, in scenarios with a scripted send (failures, stale rows, poison bodies,
exceptions that must propagate, arguments refused before claiming)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay import oracle
from checks.relay.common import BOOL_HINT
from checks.relay.outbox import make_outbox, name, row, rows_of, same_number, shown
from checks.relay.witness import judged, look_failed, no_open_transaction, not_seen, watched_cases
from labkit.judge.expect import Miss, Plan, describe, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import decode, encode, show


def check_relay_once(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000)) + 0.5
    lease, base, cap = 30.0, rng.choice((0.5, 1.0, 2.0)), 60.0
    plans: list[Plan] = []
    scenarios: list[dict] = []

    def scenario(label: str, rows: list[dict], check, clauses: tuple[str, ...], *, expected: str, called: str = "",
                 replies: dict | None = None, args: tuple | None = None, policy: tuple | None = None,
                 counter_start: int = 10, **flags) -> Path:
        db = make_outbox(ctx.path(f"s{len(scenarios)}.db"), rows, counter=counter_start)
        seed = rng.randrange(2**31)
        call_args = args or ("A", now, lease, 16)
        fields = dict(zip(("base", "cap", "max_attempts"), policy or (base, cap, 5), strict=True))
        scenarios.append({"name": label, "db": str(db), "args": [encode(a) for a in call_args], "now": now,
                         "policy": {k: encode(v) for k, v in fields.items()}, "seed": seed,
                         "replies": replies or {}, **flags})
        shown_args = ", ".join(repr(a) for a in call_args[:1]) + ", send, " + ", ".join(repr(a) for a in call_args[1:])
        plans.append(Plan(label, called or f"relay_once(con, {shown_args}, policy, after_claim, after_send)", expected,
                         check(db, rows, seed, fields), clauses=clauses))
        return db

    ok = [row(name(rng, "ok"), qty=rng.randint(1, 1000)) for _ in range(3)]
    scenario("delivers every claimed row in order", ok, _delivered_in_order,
             ("8.order-hooks", "8.counts", "8.claim-committed"),
             expected="{'sent': 3, 'retry': 0, 'quarantined': 0, 'stale': 0}; for each row: after_claim(seq), "
                     "send(its event), after_send(seq), then complete")
    mixed = [row(name(rng, p), qty=rng.randint(1, 1000)) for p in ("ok", "down", "odd", "gone", "ok")]
    truthy = rng.choice((1, "yes", "True", {"ack": mixed[2]["id"]}, [True]))  # truthy, yet not True
    scenario("a failure does not stop the batch", mixed, _mixed(truthy, now),
             ("8.no-head-of-line", "8.true-only", "8.exception-fails", "8.counts"),
             expected="{'sent': 2, 'retry': 2, 'quarantined': 1, 'stale': 0}; all five sent; the OSError and the "
                     f"non-True reply ({truthy!r}) retried with backoff, the PermanentError quarantined",
             called=f"relay_once(...) where send raises OSError for row 2, returns {truthy!r} for row 3 and raises "
                   "PermanentError for row 4",
             replies={mixed[1]["id"]: {"raise": "transient"}, mixed[2]["id"]: {"return": encode(truthy)},
                     mixed[3]["id"]: {"raise": "permanent"}})
    poison = [row(name(rng, "bad"), body="not json"), row(name(rng, "list"), body="[1, 2]"), row(name(rng, "ok"))]
    equal = [row(name(rng, "one")), row(name(rng, "float"))]
    scenario("a reply equal to True is not True", equal, _equal_to_true, ("8.true-only",),
             expected="{'sent': 0, 'retry': 2, 'quarantined': 0, 'stale': 0}: 1 == True and 1.0 == True, but "
                     "neither is True",
             called="relay_once(...) where send returns 1, then 1.0",
             replies={equal[0]["id"]: {"return": encode(1)}, equal[1]["id"]: {"return": encode(1.0)}})
    scenario("a stored body that is not a JSON object", poison, _poison_bodies,
             ("8.poison-body", "8.no-head-of-line"),
             expected="{'sent': 1, 'retry': 0, 'quarantined': 2, 'stale': 0}; send called only for the third row")
    for how in ("complete", "fail"):
        pair = [row(name(rng, "taken")), row(name(rng, "ok"))]
        scenario(f"a row taken over during send ({how} is stale)", pair, _stale(how), ("8.stale-skip", "8.counts"),
                 expected="{'sent': 1, 'retry': 0, 'quarantined': 0, 'stale': 1}; the taken row sent once, never "
                         "retried; it stays leased by B",
                 called="relay_once(...) where another publisher B claims row 1 while send runs"
                       + (" and send then raises OSError" if how == "fail" else ""),
                 replies={pair[0]["id"]: {"raise": "transient"}} if how == "fail" else {}, take_over=pair[0]["id"])
    broken = [row(name(rng, "gone")), row(name(rng, "after"))]
    scenario("the outbox table disappears during send (complete fails, not stale)", broken, _not_stale,
             ("8.stale-skip",), expected="sqlite3.OperationalError (no such table) propagates: only StaleLease "
                                         "counts as stale",
             called="relay_once(...) where the outbox table is renamed while send runs", break_outbox=broken[0]["id"])
    for kind, label in (("keyboard", "KeyboardInterrupt"), ("system_exit", "SystemExit")):
        one = [row(name(rng, "ctrl-c")), row(name(rng, "next"))]
        scenario(f"{label} from send propagates", one, _propagates(label), ("8.base-exception",),
                 expected=f"{label}; the row stays leased (its lease will run out); the next row is not sent",
                 called=f"relay_once(...) where send raises {label}", replies={one[0]["id"]: {"raise": kind}})
    again = [row(name(rng, "gone")), row(name(rng, "ok"))]
    scenario("a second call in the same process, after a redrive", again, _again,
             ("8.order-hooks", "8.counts"),
             expected="first {'sent': 1, 'retry': 0, 'quarantined': 1, 'stale': 0}; after the operator's redrive the "
                     "second call sends the redriven row: {'sent': 1, 'retry': 0, 'quarantined': 0, 'stale': 0}, "
                     "a new dict",
             called="relay_once(...) where send raises PermanentError for row 1; the operator lifts the refusal and "
                   "redrives row 1; relay_once(...) again in the same process",
             replies={again[0]["id"]: {"raise": "permanent"}}, again=True)
    hook = [row(name(rng, "hook"))]
    scenario("an exception from after_claim propagates", hook, _hook_error, ("8.hook-errors",),
             expected="LookupError from the hook; send never called", claim_hook_raises=True,
             called="relay_once(...) where after_claim raises LookupError")
    tired = [row(name(rng, "tired"), attempts=2, fence=9, due=now - 1, last_error="Transient: down")]
    scenario("the last attempt is quarantined", tired, _last_attempt, ("8.counts", "6.quarantine-max"),
             expected="{'sent': 0, 'retry': 0, 'quarantined': 1, 'stale': 0}: the claim made attempts 3 = max_attempts",
             called="relay_once(...) with max_attempts 3 on a row claimed twice before; send raises OSError",
             policy=(base, cap, 3), replies={tired[0]["id"]: {"raise": "transient"}})
    for label, call_args, policy, hint, flags in (
            ("lease 0", ("A", now, 0, 16), None, "lease must be more than 0.", {}),
            ("limit 17", ("A", now, lease, 17), None, "limit ranges from 1 to 16.", {}),
            ("owner ''", ("", now, lease, 16), None, "owner has 1-64 characters.", {}),
            ("now nan", ("A", float("nan"), lease, 16), None, "now must be finite.", {}),
            ("a policy without rng", ("A", now, lease, 16), None, "policy needs the four keys base, cap, max_attempts "
                                                                 "and rng.", {"drop_rng": True}),
            ("a policy with base True", ("A", now, lease, 16), (True, cap, 5), BOOL_HINT, {}),
            ("a policy with base 0", ("A", now, lease, 16), (0, cap, 5), "0 < base <= cap, as backoff requires.", {}),
            ("a policy with base > cap", ("A", now, lease, 16), (5.0, 1.0, 5),
             "Check the policy like backoff would (0 < base <= cap) before claiming: otherwise the first failure "
             "raises with the row still leased.", {}),
            ("a policy with max_attempts True", ("A", now, lease, 16), (base, cap, True), BOOL_HINT, {}),
            ("limit True", ("A", now, lease, True), None, BOOL_HINT, {}),
            ("lease True", ("A", now, True, 16), None, BOOL_HINT, {})):
        rows = [row(name(rng, "safe"))]
        scenario(f"{label} is refused before claiming", rows, _refused_first(hint), ("8.args-first",),
                 expected="ValueError; nothing leased; send never called", args=call_args, policy=policy, **flags)
    return watched_cases(ctx, "relaying", plans, {"scenarios": scenarios},
                        {s["name"]: Path(s["db"]) for s in scenarios})


def _log(record: dict, kind: str) -> list[dict]:
    return [e for e in record["observed"].get("log", []) if e["kind"] == kind]


def _counts(expected: dict, hint: str = "Return the counts of this call: {'sent', 'retry', 'quarantined', 'stale'}."):
    return under("8.counts", returns(expected, hint))


def _delivered_in_order(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        sends = judged(record).get("send", [])
        for e in sends:  # the claim first: committed before anything is sent (the judge's own looks)
            failed = look_failed(e, "while send ran", "8.claim-committed")
            if failed is not None:
                return failed
            row_ = e.get("row") or {}
            if row_.get("state") != "leased" or row_.get("owner") != "A":
                seen = {k: row_[k] for k in ("state", "owner", "fence")} if row_ else None
                return Miss(f"while send ran, the judge's own connection saw row {row_.get('seq', e.get('event_id'))} "
                           f"as {seen}", "Claim (and commit the claim) before sending.", clause="8.claim-committed")
            if e.get("can_write") is False:
                return Miss("while send ran, the judge's own connection could not BEGIN IMMEDIATE",
                           "Commit the claim before the first send: a write lock held during a slow send blocks "
                           "every other publisher.", clause="8.claim-committed")
        if len(sends) < len(_log(record, "send")):
            return not_seen("while send ran", "8.claim-committed")
        log = record["observed"].get("log", [])
        kinds = [(e["kind"], decode(e["seq"]) if e["kind"] != "send" else e["seq"]) for e in log]
        want = [(k, s) for s in range(1, len(rows) + 1) for k in ("after_claim", "send", "after_send")]
        if kinds != want:
            return Miss(f"the calls were {kinds[:9]}", "For each claimed row in order: after_claim(seq), then "
                                                      "send(event), then after_send(seq) after a True ACK, then "
                                                      "complete.", clause="8.order-hooks")
        for e in _log(record, "send"):
            sent = decode(e["event"])
            if sent != json.loads(rows[e["seq"] - 1]["body"]):
                return Miss(f"send received {show(sent)}", "Send the event decoded from the row's body (a dict).",
                           clause="8.order-hooks")
        after_sends = judged(record).get("after_send", [])
        for e in after_sends:  # the judge's own looks while after_send ran
            failed = look_failed(e, "while after_send ran", "8.order-hooks")
            if failed is not None:
                return failed
            if (e.get("row") or {}).get("state") != "leased":
                state = (e.get("row") or {}).get("state", "missing")
                return Miss(f"when after_send({e.get('seq')}) ran the row was already {state}",
                           "Call after_send(seq) after the ACK and before complete.", clause="8.order-hooks")
        if len(after_sends) < len(_log(record, "after_send")):
            return not_seen("while after_send ran", "8.order-hooks")
        after = rows_of(db)
        if [r["state"] for r in after.values()] != ["sent"] * len(rows):
            return Miss(f"the rows are {[shown(r) for r in after.values()]}", "complete each row after its ACK.",
                       clause="8.order-hooks")
        return _counts({"sent": len(rows), "retry": 0, "quarantined": 0, "stale": 0})(record) or \
            no_open_transaction(record)

    return check


def _mixed(truthy, now: float):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        rng = random.Random(seed)

        def check(record: dict) -> Miss | None:
            sent = [e["seq"] for e in _log(record, "send")]
            if sent[:2] == [1, 2] and len(sent) < 5:
                return Miss(f"send was called for rows {sent} only",
                           "A failure does not stop the batch: fail that row and go on with the next one. Stopping "
                           "at the first failure is lab 01's contract, not this one's: a poison row would block "
                           "every row behind it.", clause="8.no-head-of-line")
            after = rows_of(db)
            want_states = ["sent", "pending", "pending", "quarantined", "sent"]
            states = [after[s]["state"] for s in range(1, 6)]
            if states[2] == "sent":
                return Miss(f"send returned {truthy!r} for row 3 and the row was completed",
                           "Only a return value that `is True` is an ACK; anything else is a DeliveryError: fail "
                           "the row.", clause="8.true-only")
            for s, kind in ((2, "Transient"), (4, "PermanentError")):
                if (after[s]["last_error"] or "").startswith("DeliveryError"):
                   return Miss(f"row {s}'s last_error is {after[s]['last_error']!r}, although send raised {kind}",
                               "fail the row with the exception send raised (the same object), not a new one: a "
                               "wrapped PermanentError is retried forever.", clause="8.exception-fails")
            if states[3] == "pending":
                return Miss("the PermanentError row went back to pending", "fail quarantines a PermanentError at "
                                                                          "once.", clause="8.exception-fails")
            if states != want_states:
                return Miss(f"the rows ended {states}", "Complete after True; fail with the error otherwise.",
                           clause="8.exception-fails")
            waits = [oracle.backoff(1, policy["base"], policy["cap"], rng) for _ in range(2)]
            for s, wait in zip((2, 3), waits, strict=True):
                if not same_number(after[s]["due"], now + wait):
                   return Miss(f"row {s} is due at {after[s]['due']!r}, expected now + backoff(1, …) = "
                               f"{now + wait!r}", "fail each failed row with backoff drawn from the policy's rng, "
                                                  "in seq order.", clause="8.exception-fails")
            if not (after[3]["last_error"] or "").startswith("DeliveryError: "):
                return Miss(f"row 3's last_error is {after[3]['last_error']!r}",
                           "A non-True return is a DeliveryError: fail the row with DeliveryError(...).",
                           clause="8.true-only")
            return _after_send_only(record, [1, 5]) or \
                _counts({"sent": 2, "retry": 2, "quarantined": 1, "stale": 0},
                       "Count each row once: sent, retry (back to pending), quarantined or stale. Quarantined "
                       "is not sent.")(record)

        return check

    return make


def _after_send_only(record: dict, seqs: list[int]) -> Miss | None:
    """after_send ran for exactly the rows whose send returned True (a hook on every path is wrong)."""
    called = [decode(e["seq"]) for e in _log(record, "after_send")]
    if called != seqs:
        return Miss(f"after_send was called for rows {called}, but send returned True for rows {seqs}: after_send "
                   "ran after a failed send, or not after a True one",
                   "Call after_send(seq) only after send returned True, and before complete: it means 'the "
                   "warehouse has it'. A failed or non-True send goes to fail without it.", clause="8.order-hooks")
    return None


def _again(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        again = record["observed"].get("again") or {}
        first = again.get("first") or record["outcome"]
        want = {"sent": 1, "retry": 0, "quarantined": 1, "stale": 0}
        if first.get("kind") != "returned" or decode(first["value"]) != want:
            return Miss(describe(first), f"The first call quarantines row 1 and sends row 2: {want}.",
                       clause="8.counts")
        log = record["observed"].get("log", [])
        marks = [i for i, e in enumerate(log) if e["kind"] == "again"]
        later = [e["seq"] for e in log[marks[0] + 1:] if e["kind"] == "send"] if marks else []
        if 1 not in later:
            return Miss("in the second call, in the same process, send was never called for row 1, which the "
                       "operator had redriven: relay_once remembered it from the first call",
                       "relay_once keeps nothing between calls: what to send is in the outbox alone. A redriven row "
                       "is pending again and is claimed and sent like any other.", clause="8.order-hooks")
        states = [r["state"] for r in rows_of(db).values()]
        if states != ["sent", "sent"]:
            return Miss(f"after the second call the rows are {[shown(r) for r in rows_of(db).values()]}",
                       "complete the redriven row after its ACK.", clause="8.order-hooks")
        if again.get("same_object"):
            return Miss("the second call returned the very dict object the first call returned",
                       "Build new counts in each call: a caller who kept the first result would see it change.",
                       clause="8.counts")
        return _counts({"sent": 1, "retry": 0, "quarantined": 0, "stale": 0},
                      "Count only what this call did: new counts for each call.")(record) or \
            _after_send_only(record, [2, 1])

    return check


def _equal_to_true(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        after = rows_of(db)
        done = [s for s, r in after.items() if r["state"] == "sent"]
        if done:
            return Miss(f"rows {done} were completed although send returned 1 or 1.0",
                       "Only a return value that `is True` is an ACK: `acked is True`, not `acked == True` "
                       "(1 == True in Python).")
        return _after_send_only(record, []) or _counts({"sent": 0, "retry": 2, "quarantined": 0, "stale": 0})(record)

    return check


def _poison_bodies(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        sent = [e["seq"] for e in _log(record, "send")]
        if sent != [3]:
            return Miss(f"send was called for rows {sent}", "A body that is not a JSON object can never be sent: "
                                                           "fail it with a PermanentError and go on.")
        after = rows_of(db)
        for s in (1, 2):
            if after[s]["state"] != "quarantined" or not (after[s]["last_error"] or "").startswith("PermanentError"):
                return Miss(f"row {s} ({rows[s - 1]['body']!r}) is {shown(after[s])}",
                           "Quarantine it as a PermanentError: `fail(con, seq, fence, PermanentError(...), …)`.")
        return _after_send_only(record, [3]) or _counts({"sent": 1, "retry": 0, "quarantined": 2, "stale": 0})(record)

    return check


def _stale(how: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        def check(record: dict) -> Miss | None:
            sent = [e["seq"] for e in _log(record, "send")]
            if sent.count(1) > 1:
                return Miss(f"send was called {sent.count(1)} times for the taken row",
                           "StaleLease means another publisher owns the row now: count it as stale and never retry "
                           "it.")
            after = rows_of(db)
            if after[1]["owner"] != "B" or after[1]["state"] != "leased":
                return Miss(f"the taken row is {shown(after[1])}", f"{how} must raise StaleLease and change nothing "
                                                                  "on a row B owns now.")
            if after[2]["state"] != "sent":
                return Miss(f"the next row is {shown(after[2])}", "StaleLease is not a reason to stop: go on with "
                                                                 "the next row.")
            if how == "fail" and record["observed"].get("rng_next") != oracle.next_draw(seed, 0):
                return Miss("a random number was drawn for the stale row", "fail checks the token before drawing.",
                           clause="6.rng-only-retry")
            return _counts({"sent": 1, "retry": 0, "quarantined": 0, "stale": 1},
                          "Catch StaleLease from complete and fail, count it as 'stale', and go on.")(record)

        return check

    return make


def _not_stale(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and outcome["type"] == "OperationalError":
            return None
        return Miss(describe(outcome), "Catch `StaleLease` only: another error from complete or fail (here "
                                       "sqlite3's 'no such table') is not another publisher's claim; let it propagate.")

    return check


def _propagates(name_: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        def check(record: dict) -> Miss | None:
            outcome = record["outcome"]
            if outcome["kind"] != "raised" or outcome["type"] != name_:
                return Miss(describe(outcome), f"Catch `Exception` around send, never `BaseException`: {name_} must "
                                              "propagate (the operator stopped the process).")
            after = rows_of(db)
            if after[1]["state"] != "leased" or after[1]["last_error"] is not None:
                return Miss(f"the row is {shown(after[1])}", f"Don't fail or complete the row on {name_}: it stays "
                                                            "leased and its lease will run out.")
            if after[2]["state"] == "sent":
                return Miss("the next row was sent", f"{name_} ends the call at once.")
            return None

        return check

    return make


def _hook_error(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or outcome["type"] != "LookupError":
            return Miss(describe(outcome), "Don't catch exceptions from the hooks: they propagate.")
        if _log(record, "send"):
            return Miss("send was called after after_claim raised", "An exception from after_claim ends the call.")
        return None

    return check


def _last_attempt(db: Path, rows: list[dict], seed: int, policy: dict):
    def check(record: dict) -> Miss | None:
        after = rows_of(db)[1]
        if after["state"] != "quarantined" or after["attempts"] != 3:
            return Miss(f"the row is {shown(after)}", "The claim counts the attempt (3); fail then sees attempts >= "
                                                     "max_attempts and quarantines it.", clause="6.quarantine-max")
        return _counts({"sent": 0, "retry": 0, "quarantined": 1, "stale": 0},
                      "A quarantined row is counted as 'quarantined', never as 'sent' or 'retry'.")(record)

    return check


def _refused_first(hint: str):
    def make(db: Path, rows: list[dict], seed: int, policy: dict):
        before = stores.fingerprint(db)

        def check(record: dict) -> Miss | None:
            outcome = record["outcome"]
            if outcome["kind"] != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(describe(outcome), "Check every argument, the policy too, before claiming: bad input "
                                              "must never leave rows leased. " + hint)
            if stores.fingerprint(db) != before:
                return Miss(f"ValueError, but the row is now {shown(rows_of(db)[1])}",
                           "Check every argument before claiming: bad input must never leave rows leased. " + hint)
            if _log(record, "send"):
                return Miss("send was called", "Check the arguments before anything else.")
            return None

        return check

    return make
