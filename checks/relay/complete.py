"""Step 4 of lab `relay`: complete — the token decides, not the clock: the current token sends
the row, a stale or foreign one is StaleLease, an unknown seq KeyError, a non-int ValueError."""

from __future__ import annotations

from checks.relay.common import BOOL_HINT, calls_on, no_sql, value
from checks.relay.outbox import TOKEN_HINT, make_outbox, name, row, row_is, rows_of, shown
from checks.relay.takeover import token_between_statements
from checks.relay.witness import no_open_transaction
from labkit.judge.expect import Miss, Plan, both, is_module_exception, raises, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case


def check_complete(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    base = rng.randint(20, 400)
    now = float(rng.randint(1_000, 9_000))
    layout = [  # seq 1 and 2 are what True would mean
        ("bool seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base, attempts=1)),
        ("bool fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=1, attempts=1)),
        ("main", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 2, attempts=2,
                    due=now - 7.5, last_error="Transient: the warehouse is unreachable")),
        ("expired", row(name(rng, "r"), state="leased", owner="A", lease_until=1.0, fence=base + 3, attempts=1)),
        ("taken over", row(name(rng, "r"), state="leased", owner="B", lease_until=now + 30, fence=base + 9,
                          attempts=2)),
        ("newer token", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 5,
                           attempts=1)),
        ("pending", row(name(rng, "r"), state="pending", fence=base + 6, attempts=1, due=now + 3,
                       last_error="Transient: x")),
        ("sent", row(name(rng, "r"), state="sent", fence=base + 7, attempts=1)),
        ("quarantined", row(name(rng, "r"), state="quarantined", fence=base + 8, attempts=4,
                           last_error="PermanentError: y")),
        ("float seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 10,
                         attempts=1)),
        ("str seq", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 11,
                       attempts=1)),
        ("float fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 12,
                           attempts=1)),
        ("None fence", row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=base + 13,
                          attempts=1)),
    ]
    db = make_outbox(ctx.path("complete.db"), [r for _, r in layout], counter=base + 20)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    before = rows_of(db)
    plans, specs = [], []

    def add(label: str, call_args: tuple, expected: str, check, clauses: tuple[str, ...], hint: str = "") -> None:
        plans.append(Plan(label, f"complete(con, {', '.join(repr(a) for a in call_args)})", expected, check, hint,
                         clauses=clauses))
        specs.append({"name": label, "fn": "complete", "db": str(db), "args": [value(a) for a in call_args]})

    def untouched(label: str, hint: str, clause: str):
        def check(record: dict) -> Miss | None:
            have = rows_of(db)[seq[label]]
            if have != before[seq[label]]:
                return Miss(f"row {seq[label]} became {shown(have)}", hint, clause=clause)
            return None

        return check

    def stale(label: str, fence: int, hint: str, clause: str = "4.stale"):
        return both(under(clause, is_module_exception("StaleLease", hint)), untouched(label, hint, clause),
                   under(clause, no_open_transaction))

    m = before[seq["main"]]
    add("the current token", (seq["main"], base + 2), "None; the row is sent, owner and lease cleared; fence, "
        "attempts, due and last_error unchanged",
        both(under("4.token-decides", returns(None, "complete returns None.")),
             under("4.token-decides", row_is(db, seq["main"], "Set state = 'sent' and clear owner and lease_until.",
                                            state="sent", owner=None, lease_until=None)),
             under("4.keeps-fields", row_is(db, seq["main"], "complete changes only state, owner and lease_until: the "
                                           "fence shows which token delivered the row.",
                                           fence=base + 2, attempts=m["attempts"], due=m["due"],
                                           last_error=m["last_error"])),
             under("4.token-decides", no_open_transaction)),
        ("4.token-decides", "4.keeps-fields"))
    add("an expired lease nobody re-claimed", (seq["expired"], base + 3),
        "None; sent (expiry alone does not make a token stale)",
        both(under("4.expiry-not-stale", returns(None, "Don't look at the clock: a lease that ran out but was not "
                                                      "claimed again still belongs to its token. The token decides, "
                                                      "not the clock.")),
             under("4.expiry-not-stale", row_is(db, seq["expired"], "The token decides, not the clock.",
                                               state="sent"))),
        ("4.expiry-not-stale",))
    add("another publisher took the row over", (seq["taken over"], base + 4),
        f"StaleLease (the row is leased by 'B' with token {base + 9}); nothing changes",
        stale("taken over", base + 4, TOKEN_HINT), ("4.stale",))
    add("a token newer than the row's", (seq["newer token"], base + 6), "StaleLease; nothing changes",
        stale("newer token", base + 6, "Only exactly the row's token completes it, not a larger one."), ("4.stale",))
    for label in ("pending", "sent", "quarantined"):
        fence = before[seq[label]]["fence"]
        add(f"a {label} row with its own token", (seq[label], fence), "StaleLease; nothing changes",
            stale(label, fence, f"Only a leased row can be completed: a {label} row's token is not a lease."),
            ("4.stale",))
    unknown = len(layout) + rng.randint(5, 50)
    add("an unknown seq", (unknown, base), "KeyError",
        both(under("4.unknown-keyerror", raises("KeyError", "A seq without a row is a KeyError, not StaleLease.")),
             under("4.unknown-keyerror", no_open_transaction)), ("4.unknown-keyerror",))
    for label, call_args, hint in (
            ("bool seq", (True, base), BOOL_HINT + " complete(con, True, …) must not complete row 1."),
            ("bool fence", (seq["bool fence"], True), BOOL_HINT + " True is not token 1."),
            ("float seq", (float(seq["float seq"]), base + 10), "seq must be an int: 10.0 == 10 for SQLite too."),
            ("str seq", (str(seq["str seq"]), base + 11), "seq must be an int: SQLite turns '11' into 11 for you."),
            ("float fence", (seq["float fence"], float(base + 12)), "fence must be an int."),
            ("None fence", (seq["None fence"], None), "fence must be an int.")):
        add(f"{label} is refused before the DB is touched", call_args, "ValueError; no SQL run; nothing changes",
            both(under("4.int-args", raises("ValueError", hint)), untouched(label, hint, "4.int-args"),
                 under("4.int-args", no_sql(hint))), ("4.int-args",), hint)
    more = token_between_statements(ctx, "complete", now, base + 30, None, "4.one-transaction",
                                    "None (the row sent), or StaleLease if the other publisher took the row over "
                                    "first (the row stays B's)")
    return calls_on(ctx, plans + more[0], specs + more[1])
