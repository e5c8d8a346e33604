"""Step 7 of lab `outbox`: dispatch, with the judge looking at the file from inside every send and
after_delivery."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checks.outbox import db
from checks.outbox.common import (
    Check,
    event,
    flags_text,
    listing,
    name,
    outcome_text,
    told,
    value_text,
)
from labkit.judge.expect import (
    Miss,
    Plan,
    both,
    is_module_exception,
    raises,
    returns,
    under,
)
from labkit.judge.run import StepContext, slices
from labkit.judge.verdict import Case
from labkit.judge.witness import Witness
from labkit.values import encode, same

MARK_BEFORE_SEND = ("The row was marked sent before the warehouse answered: a crash during delivery "
                    "would lose it. Call send first, mark only after a True ACK.")
LOCK_HINT = ("Finish reading the batch (fetchall, and commit any transaction) before the first send: a "
             "write transaction or an unfinished cursor held during a slow send blocks every new order.")
ONLY_TRUE = "Only a return value that `is True` is an ACK; anything else → raise DeliveryError."
ACK_KINDS = [("1", 1), ("1.0", 1.0), ("'True'", "True"), ("'yes'", "yes"), ("[True]", [True]),
             ("(True,)", (True,)), ("{'ack': id}", "ACK_DICT"), ("None", None), ("False", False), ("0", 0),
             ("an object whose == says True", "EQUALS_TRUE")]
SCENARIOS_PER_CHILD = 8  # a scenario runs dispatch on a DB of its own, with the judge looking inside send
ERROR_KINDS = ["OSError", "ConnectionResetError", "TimeoutError", "DeliveryError", "RuntimeError", "KeyError"]


class Dispatches:
    """Step 7: scenarios, each on its own source file. Inside every send the judge reads the
    sent flags and accepts a new order with its own connection; inside every after_delivery
    it reads the flags again. Those sightings, the file afterwards and the return value decide."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self.plans: list[Plan] = []
        self.scenarios: list[dict] = []
        self.paths: dict[str, Path] = {}
        self.replies: dict[str, list[dict]] = {}
        self.counts: dict[str, int] = {}
        self.no_new_orders: set[str] = set()
        self.lock = threading.Lock()
        self.witness = Witness(self._look)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        path = self.paths.get(case)
        if path is None:
            return {}, {}
        if point == "hook":
            return {"flags": db.sent_flags(path)}, {}
        if point != "send":
            return {}, {}
        with self.lock:  # a dispatch may call send from several threads
            n = self.counts[case] = self.counts.get(case, 0) + 1
        flags = db.sent_flags(path)
        replies = self.replies[case]
        answer = replies[n - 1] if n <= len(replies) else {}
        if case in self.no_new_orders:  # a scenario of two calls: the second must see only the first's rows
            return {"flags": flags, "accept": "", "new_order": None}, answer
        fresh = event(f"new-{len(self.paths)}-{n}", "fresh", n)
        locked = any(s.saw.get("accept") for s in self.sends(case))  # seen once is enough: don't wait again
        accepted = "skipped: the lock was seen earlier in this scenario" if locked else db.accept_order(path, fresh)
        return {"flags": flags, "accept": accepted, "new_order": fresh["id"]}, answer

    def batch(self, prefixes: str) -> list[dict]:
        rng = self.ctx.rng
        return [event(name(rng, p), name(rng, "sku", 3), rng.randint(1, 1000)) for p in prefixes]

    def sends(self, case: str) -> list:
        return self.witness.sightings(case, "send")

    def hooks(self, case: str) -> list:
        return self.witness.sightings(case, "hook")

    def add(self, label: str, called: str, expected: str, events: list[dict], limit: Any,
            rules: Callable[[Path, list[dict]], list[tuple[str, Check]]], replies: list = (), hook: bool = False,
            mutate: str | None = None, sent: list[dict] = (), again: bool = False) -> None:
        rows = [*events[:1], *sent, *events[1:]]  # a sent row between pending ones
        path = db.make_source(self.ctx.path(f"s{len(self.scenarios)}.db"), rows, sent={e["id"] for e in sent})
        self.paths[label], self.replies[label] = path, list(replies)
        if again:
            self.no_new_orders.add(label)
        self.scenarios.append({"name": label, "db": str(path), "limit": encode(limit), "hook": hook, "mutate": mutate,
                               "again": again})
        common = [("7.read-before-send", self._no_lock(label)),
                  ("7.mark-after-ack", self._not_marked_early(label, {e["id"] for e in events})),
                  ("7.fresh-copy", self._copies(label, events)), ("7.batch-fixed", self._batch_fixed(label))]
        checks = common + rules(path, events)
        self.plans.append(Plan(label, called, expected, both(*(under(c, k) for c, k in checks)),
                               clauses=tuple(dict.fromkeys(c for c, _ in checks))))

    # what every scenario checks

    def _no_lock(self, case: str) -> Check:
        def check(record):
            for s in self.sends(case):
                if s.saw.get("accept"):
                    return Miss(f"while send ran for {_id_of(s)}, the judge's own connection could not accept a new "
                                f"order: {s.saw['accept']}", LOCK_HINT)
            return None

        return check

    def _not_marked_early(self, case: str, pending: set[str]) -> Check:
        """A row that was pending when the scenario began is never sent = 1 while its send runs."""

        def check(record):
            for s in self.sends(case):
                flags = s.saw.get("flags")
                if _id_of(s) in pending and isinstance(flags, dict) and flags.get(_id_of(s)) == 1:
                    return Miss(f"{_id_of(s)} was already sent = 1 while send was still running", MARK_BEFORE_SEND)
            return None

        return check

    def _copies(self, case: str, events: list[dict]) -> Check:
        by_id = {e["id"]: e for e in events}

        def check(record):
            for s in self.sends(case):
                got = told(s.said.get("event"))
                if s.said.get("not_a_copy"):
                    return Miss(f"send received the very dict that pending returned (for {_id_of(s)})",
                                "Pass a fresh copy (`dict(event)`): the callee may change its argument.")
                want = by_id.get(_id_of(s))
                if want is not None and not same(got, want):
                    return Miss(f"send received {value_text(got)}", "Pass a copy equal to the event as pending "
                                                                    "returned it: the same three keys and values.")
            return None

        return check

    def _batch_fixed(self, case: str) -> Check:
        def check(record):
            fresh = {s.saw.get("new_order") for s in self.sends(case)}
            late = [i for i in _ids(self.sends(case)) if i in fresh]
            if late:
                return Miss(f"send was also called for {listing(late)}, an order the judge accepted while the batch "
                            "was being sent", "Select the batch once, with pending(con, limit), before the first send; "
                                              "orders accepted meanwhile wait for the next dispatch.")
            return None

        return check

    def sent_ids(self, case: str, want: list[str], hint: str) -> Check:
        def check(record):
            misuse = record["observed"].get("send_misuse")
            if misuse:
                return Miss(f"send was called as {misuse[0]}", "Call send with one argument, the event's copy: "
                                                                "`send(dict(event))`.")
            got = _ids(self.sends(case))
            return None if got == want else Miss(f"send was called for {listing(got)}" if got
                                                 else "send was never called", hint)

        return check

    def sent_count(self, case: str, want: list[str], hint: str) -> Check:
        def check(record):
            got = _ids(self.sends(case))
            if len(got) != len(want) or set(got) != set(want):
                return Miss(f"send was called for {len(got)} events ({listing(got)}) where the first {len(want)} "
                            "pending ones were expected", hint)
            return None

        return check

    def none_of(self, case: str, ids: set[str], hint: str) -> Check:
        def check(record):
            wrong = [i for i in _ids(self.sends(case)) if i in ids]
            return Miss(f"send was called for {listing(wrong)}, already sent before this call", hint) if wrong else None

        return check

    def hooked(self, case: str, want: list[str]) -> Check:
        def check(record):
            hooks = self.hooks(case)
            got = [told(h.said.get("event_id")) for h in hooks]
            if got != want:
                return Miss(f"after_delivery was called with {listing(map(repr, got))}",
                            "After each True ACK call after_delivery(event_id) with the id as selected, then mark_sent;"
                            " never for a failed send.")
            for h in hooks:
                flags = h.saw.get("flags")
                if isinstance(flags, dict) and flags.get(told(h.said.get("event_id"))) == 1:
                    return Miss("the row was already marked when after_delivery ran",
                                "Call after_delivery(event_id) after the ACK and before mark_sent.")
            return None

        return check

    def run(self) -> list[Case]:
        with self.witness:
            groups = [(self.plans[part], {"scenarios": self.scenarios[part], "witness": self.witness.url})
                      for part in slices(len(self.plans), SCENARIOS_PER_CHILD)]
            return self.ctx.side_by_side("dispatching", groups)


def _id_of(sighting) -> Any:
    got = told(sighting.said.get("event"))
    return got.get("id") if isinstance(got, dict) else None


def _ids(sightings) -> list:
    return [_id_of(s) for s in sightings]


def flags_are(path: Path, want: dict[str, int], hint: str) -> Check:
    def check(record):
        have = db.sent_flags(path)
        if isinstance(have, db.Broken) or any(have.get(k) != v for k, v in want.items()):
            return Miss(f"afterwards: {flags_text(have, list(want))}", hint)
        return None

    return check


def same_error(kind: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or outcome["type"] != kind:
            return Miss(outcome_text(outcome), "Let send's exception propagate unchanged: no `except` that wraps, "
                                               "replaces or swallows it.")
        if not record["observed"].get("same_error"):
            return Miss(f"raised a {kind}, but not the object send raised",
                        "Re-raise the same exception (a bare `raise`), not a copy of it.")
        return None

    return check


def check_dispatch(ctx: StepContext) -> list[Case]:
    d = Dispatches(ctx)
    ok = {"return": encode(True)}
    order_hint = "Send each selected event once, in outbox (seq) order."
    mark_hint = "Mark every acknowledged row sent (mark_sent after after_delivery)."

    def delivered(label, n_marked, size_clause=None, hook_ids=True):
        def rules(path, events):
            ids = [e["id"] for e in events]
            size = ([(size_clause, d.sent_count(label, ids[:n_marked], "Select at most `limit` events with "
                                                "pending(con, limit); send only those."))] if size_clause else [])
            return [*size,
                    ("7.batch-order", d.sent_ids(label, ids[:n_marked], order_hint)),
                    *([("7.hook-after-ack", d.hooked(label, ids[:n_marked]))] if hook_ids else []),
                    ("7.marks-acked", flags_are(path, {i: int(k < n_marked) for k, i in enumerate(ids)}, mark_hint)),
                    ("7.returns-count", returns(n_marked, "Return how many rows this call marked sent."))]

        return rules

    three, skipped = d.batch("zam"), d.batch("b")
    d.add("sends every pending event in seq order, then marks it", "dispatch(con, send, 16, after_delivery=hook) "
          "with a sent row between the pending ones", "3; send called for each pending event in seq order; the hook "
          "after each ACK; all marked", three, 16,
          lambda path, events: [("7.batch-unsent", d.none_of("sends every pending event in seq order, then marks it",
                                                             {e["id"] for e in skipped},
                                                             "Only pending rows (sent = 0) are sent."))]
          + delivered("sends every pending event in seq order, then marks it", 3)(path, events),
          [ok] * 3, hook=True, sent=skipped)
    for limit, pending_n in ((1, 3), (2, 5), (16, 17)):
        label = f"limit {limit} with {pending_n} pending"
        d.add(label, f"dispatch(con, send, {limit})", f"{limit}; only the first {limit} sent and marked",
              d.batch("qwertyuiopasdfghj"[:pending_n]), limit, delivered(label, limit, "7.batch-size", hook_ids=False))
    d.add("nothing pending", "dispatch(con, send, 16) on an outbox with no pending row", "0; send never called",
          [], 16, lambda path, events: [("7.returns-count", returns(0, "Nothing pending: return 0.")),
                                        ("7.batch-unsent", d.sent_ids("nothing pending", [], "Send nothing."))],
          sent=d.batch("n"))

    def stops(label, error, first_fails=False):
        def rules(path, events):
            ids = [e["id"] for e in events]
            n = 0 if first_fails else 1
            failed = ids[n]
            outcome = (is_module_exception("DeliveryError", ONLY_TRUE) if error == "DeliveryError!" else same_error(error))

            def not_taken(record):
                flags = db.sent_flags(path)
                if isinstance(flags, dict) and flags.get(failed) == 1:
                    return Miss(f"{outcome_text(record['outcome'])}; the row whose send did not return True was "
                                "marked sent", ONLY_TRUE)
                return None

            first = [("7.ack-is-true", not_taken), ("7.ack-is-true", outcome)] if error == "DeliveryError!" else []
            return first + [
                ("7.stop-on-failure", d.sent_ids(label, ids[:n + 1], "Stop at the first failure: the rest wait for "
                                                                     "the next dispatch, in order.")),
                *([] if error == "DeliveryError!" else [("7.send-error-same", outcome)]),
                ("7.hook-after-ack", d.hooked(label, ids[:n])),
                ("7.keep-marked", flags_are(path, {i: int(k < n) for k, i in enumerate(ids)},
                                            "Keep rows marked before the failure; leave the failed one and the rest "
                                            "pending.")),
            ]

        return rules

    for shown, value in ACK_KINDS:
        label = f"send returns {shown} for the second event"
        reply = ({"special": "equals_true"} if value == "EQUALS_TRUE" else
                 {"return": encode({"ack": "the-id"} if value == "ACK_DICT" else value)})
        d.add(label, f"dispatch(con, send, 16, after_delivery=hook) where send returns True, then {shown}",
              "DeliveryError; the first marked, the rest pending, the third never sent", d.batch("cde"), 16,
              stops(label, "DeliveryError!"), [ok, reply, ok], hook=True)
    for kind in ERROR_KINDS:
        label = f"send raises {kind} for the second event"
        d.add(label, f"dispatch(con, send, 16, after_delivery=hook) where the second send raises {kind}",
              f"that same {kind} object; the first marked, the rest pending, the third never sent", d.batch("fgh"), 16,
              stops(label, kind), [ok, {"raise": {"type": kind, "message": "warehouse unreachable"}}, ok], hook=True)
    d.add("the first send fails", "dispatch(con, send, 16, after_delivery=hook) where the first send raises OSError",
          "that same OSError; nothing marked, nothing else sent", d.batch("ijk"), 16,
          stops("the first send fails", "OSError", first_fails=True),
          [{"raise": {"type": "OSError", "message": "connection refused"}}], hook=True)
    pair = d.batch("uv")

    def as_selected(path, events):
        return [("7.returns-count", returns(1)),
                ("7.hook-after-ack", d.hooked("the callee changes its copy", [events[0]["id"]])),
                ("7.mark-as-selected", flags_are(path, {events[0]["id"]: 1, events[1]["id"]: 0},
                                                 "send changed its argument and you marked the changed id: send a copy "
                                                 "(`dict(event)`) and mark the id as selected."))]

    d.add("the callee changes its copy", "dispatch(con, send, 1, after_delivery=hook) where send sets event['id'] "
          "to the next row's id", f"1; {pair[0]['id']} marked, {pair[1]['id']} still pending", pair, 1, as_selected,
          hook=True, mutate=pair[1]["id"])
    # a second call after a failure, in the same process: dispatch keeps nothing between calls, so
    # the failed event is still the oldest pending row and is sent first
    retried = d.batch("rst")
    label = "the next call after a failure sends the failed event again first"
    again_hint = ("dispatch keeps nothing between calls (no set of failed ids, no mutable default): each call "
                  "sends pending(con, limit) in seq order, and the failed event is still the oldest pending row.")

    def next_call(path, events):
        ids = [e["id"] for e in events]

        def first_failed(record):
            first = record["observed"].get("first_call") or {}
            if first.get("kind") != "raised":
                return Miss(f"the first call {outcome_text(first) if first else 'was not made'}, where send raised "
                            "OSError for the second event", "Let send's exception propagate unchanged.")
            return None

        return [("7.send-error-same", first_failed),
                ("7.batch-order", d.sent_ids(label, [ids[0], ids[1], ids[1], ids[2]], again_hint)),
                ("7.returns-count", returns(2, "The second call marks the two events left: return 2.")),
                ("7.marks-acked", flags_are(path, {i: 1 for i in ids}, mark_hint))]

    d.add(label, "dispatch(con, send, 16) where the second send raises OSError, then dispatch(con, send, 16) again "
          "in the same process where every send returns True",
          f"the first call raises; the second sends {retried[1]['id']} then {retried[2]['id']}, marks both, returns 2",
          retried, 16, next_call, [ok, {"raise": {"type": "OSError", "message": "warehouse unreachable"}}, ok, ok],
          again=True)
    for bad, clause in ((0, "7.limit-range"), (-1, "7.limit-range"), (17, "7.limit-range"), (True, "7.limit-type"),
                        (2.0, "7.limit-type"), ("3", "7.limit-type"), (None, "7.limit-type")):
        label = f"limit {bad!r} is refused before sending"

        def refused(path, events, label=label, clause=clause):
            return [(clause, raises("ValueError", "Validate limit (an int 1–16, not bool) before sending anything.")),
                    (clause, d.sent_ids(label, [], "Validate limit first: nothing may be sent with a bad limit."))]

        d.add(label, f"dispatch(con, send, {bad!r})", "ValueError; send never called", d.batch("l"), bad, refused)
    return d.run()



