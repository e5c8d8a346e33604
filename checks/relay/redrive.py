"""Step 7 of lab `relay`: redrive — quarantined rows back to pending, all or nothing, also
while another publisher claims one of them between any two statements."""

from __future__ import annotations

import string
from pathlib import Path

from checks.outbox import schema as stores
from checks.relay.common import BOOL_HINT, between_statements, calls_on, refused, value
from checks.relay.outbox import copies, make_outbox, name, row, rows_of, same_number, shown
from checks.relay.witness import no_open_transaction
from labkit.judge.expect import Miss, Plan, both, describe, returns, under, value_of
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode


def check_redrive(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000)) + 0.25
    q = [name(rng, "q") for _ in range(3)]
    letters = "".join(rng.sample(string.ascii_lowercase, 2))  # two one-character ids: the bare string's letters
    layout = [
        row(q[0], state="quarantined", attempts=5, fence=31, due=now - 100, last_error="PermanentError: gone"),
        row(q[1], state="quarantined", attempts=2, fence=32, due=now - 50, last_error="Transient: down"),
        row(q[2], state="quarantined", attempts=1, fence=33, last_error="PermanentError: bad sku"),
        row(name(rng, "sent"), state="sent", attempts=1, fence=34),
        row(name(rng, "pend"), state="pending", attempts=1, fence=35, due=now + 9, last_error="Transient: x"),
        row(name(rng, "lease"), state="leased", owner="A", lease_until=now + 9, attempts=1, fence=36),
        row(letters[0], state="quarantined", attempts=3, fence=37, last_error="Transient: down"),
        row(letters[1], state="quarantined", attempts=3, fence=38, last_error="Transient: down"),
    ]
    crowd = [f"crowd-{i:03d}" for i in range(300)]  # more than CPython's cached small ints
    layout += [row(i, state="quarantined", attempts=5, fence=40 + n, last_error="Transient: down")
               for n, i in enumerate(crowd)]
    template = make_outbox(ctx.path("redrive.db"), layout, counter=400)
    ids = {r["id"]: i + 1 for i, r in enumerate(layout)}
    sent_id, pending_id, leased_id = layout[3]["id"], layout[4]["id"], layout[5]["id"]
    cases = [
        ("one quarantined row", [q[0]], 1, "7.requeue"),
        ("a tuple of two", (q[0], q[1]), 2, "7.requeue"),
        ("a set", {q[2]}, 1, "7.ids-shape"),
        ("an empty list", [], 0, "7.ids-shape"),
        ("an empty tuple", (), 0, "7.ids-shape"),
        ("now 0", [q[2]], 1, "7.requeue"),
        ("300 quarantined rows", crowd, 300, "7.requeue"),
        ("now -0.001", [q[0]], ValueError, "7.ids-shape"),
        ("a quarantined and a sent row", [q[0], sent_id], ValueError, "7.all-or-nothing"),
        ("a sent row", [sent_id], ValueError, "7.never-sent"),
        ("a pending row", [pending_id], ValueError, "7.all-or-nothing"),
        ("a leased row", [leased_id], ValueError, "7.all-or-nothing"),
        ("an unknown id", [q[1], name(rng, "ghost")], ValueError, "7.all-or-nothing"),
        ("a bare string", letters, ValueError, "7.ids-shape"),
        ("an id listed twice", [q[0], q[0]], ValueError, "7.ids-shape"),
        ("an id that is not a str", [q[0], 1], ValueError, "7.ids-shape"),
        ("now nan", [q[0]], ValueError, "7.ids-shape"),
        ("now True", [q[0]], ValueError, "7.ids-shape"),
    ]
    hints = {
        "a quarantined and a sent row": "All or nothing: check every id first, change rows only when all are "
                                       "quarantined. A redrive that applies partially leaves the operator guessing.",
        "a sent row": "A sent row is never redriven: it was delivered, and sending it again is a duplicate nobody "
                     "asked for.",
        "a pending row": "Only quarantined rows can be redriven.",
        "a leased row": "Only quarantined rows can be redriven: a leased row belongs to a publisher.",
        "an unknown id": "Every id must name a quarantined row: an unknown one is a ValueError, and nothing changes.",
        "a bare string": f"A bare str is iterable: {letters!r} would redrive the rows {letters[0]!r} and "
                        f"{letters[1]!r}. Refuse it.",
        "an id listed twice": "An id listed twice is a ValueError (the count would lie).",
        "an id that is not a str": "Each id is a str.",
        "now nan": "now is a finite number >= 0, as in claim.",
        "now True": BOOL_HINT,
        "now -0.001": "now is a finite number >= 0, as in claim.",
    }
    paths = copies(template, ctx.workdir, [f"case-{i}" for i in range(len(cases))])
    plans, specs = [], []
    for (label, arg, result, clause), path in zip(cases, paths, strict=True):
        when = {"now nan": float("nan"), "now True": True, "now 0": 0, "now -0.001": -0.001}.get(label, now)
        called = f"redrive(con, {arg!r}, {when!r})"
        if result is ValueError:
            hint = hints[label]
            plans.append(Plan(label, called, "ValueError; nothing changes",
                             refused(hint, clause, path, stores.fingerprint(path), hint), hint, clauses=(clause,)))
        else:
            plans.append(Plan(label, called, f"{result}; each back to pending, attempts 0, due {when:g}, last_error kept",
                             both(under(clause, returns(result, "Return how many rows were redriven (now 0 is a "
                                                                "valid time).")),
                                  under("7.requeue", _requeued(path, [ids[i] for i in arg], when)),
                                  under("7.requeue", no_open_transaction)), clauses=(clause, "7.requeue")))
        ids_arg = {"set": sorted(arg)} if isinstance(arg, set) else value(arg)  # sets do not cross the pipe
        specs.append({"name": label, "fn": "redrive", "db": str(path), "args": [ids_arg, value(when)]})
    more = _redrive_between_statements(ctx, now)
    return calls_on(ctx, plans + more[0], specs + more[1])


def _redrive_between_statements(ctx: StepContext, now: float) -> tuple[list[Plan], list[dict]]:
    """redrive of two quarantined rows while another operator's redrive and a publisher's claim
    take the second one between any two of its statements; each statement failing; a Ctrl-C."""
    ids = [name(ctx.rng, "q") for _ in range(2)]
    template = make_outbox(ctx.path("redrive-boundaries.db"),
                          [row(i, state="quarantined", attempts=3, fence=20 + n, last_error="Transient: down")
                           for n, i in enumerate(ids)], counter=30)
    taken = [["UPDATE fence_counter SET last = last + 1 WHERE id = 1", []],
             ["UPDATE outbox SET state = 'leased', owner = 'B', lease_until = ?, attempts = 1, "
              "fence = (SELECT last FROM fence_counter WHERE id = 1) WHERE seq = 2", [encode(now + 60)]]]
    hint = ("Check every row and change them in one BEGIN IMMEDIATE transaction: a state read before the "
            "transaction can be stale by the time you write (another publisher claimed the row between your check "
            "and your UPDATE), and a leased row must never be put back to pending.")

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        after = rows_of(path)
        if landed:
            if outcome.get("kind") != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(f"redrive {describe(outcome)}; the rows are now {[shown(r) for r in after.values()]}", hint)
            if after[2]["owner"] != "B" or after[2]["state"] != "leased" or after[1]["state"] != "quarantined":
                return Miss(f"redrive raised ValueError, but the rows are now {[shown(r) for r in after.values()]}",
                           hint)
            return None
        if outcome.get("kind") != "returned" or value_of({"outcome": outcome}) != 2 or \
                [r["state"] for r in after.values()] != ["pending", "pending"]:
            return Miss(f"redrive {describe(outcome)}; the rows are {[shown(r) for r in after.values()]}", hint)
        return None

    return between_statements(ctx, "redrive", f"redrive(con, {ids!r}, {now!r})", template, [value(ids), value(now)],
                             "7.all-or-nothing", taken, judge,
                             "2, or ValueError if the other publisher claimed the second row first (it stays B's)")


def _requeued(path: Path, seqs: list[int], now: float):
    def check(record: dict) -> Miss | None:
        after = rows_of(path)
        for s in seqs:
            r = after[s]
            if r["state"] != "pending" or r["attempts"] != 0 or not same_number(r["due"], now):
                return Miss(f"row {s} is {shown(r)}", "Each goes back to pending with attempts = 0 and due = now.")
            if not r["last_error"]:
                return Miss(f"row {s} lost its last_error", "Keep last_error: the history of what went wrong is "
                                                           "worth more than a clean row.")
        others = [s for s, r in after.items() if s not in seqs and r["state"] == "pending" and r["attempts"] == 0]
        if others:
            return Miss(f"rows {others} were redriven too", "Change only the rows named in ids.")
        return None

    return check
