"""Step 6 of lab `relay`: fail — a retry with backoff or a quarantine, last_error, the token
checked before anything else, the policy and the arguments checked before the row is touched."""

from __future__ import annotations

import random

from checks.relay import oracle
from checks.relay.common import BOOL_HINT, calls_on, no_sql, policy_arg, value
from checks.relay.outbox import TOKEN_HINT, make_outbox, name, row, row_is, rows_of, shown
from checks.relay.takeover import token_between_statements
from checks.relay.witness import no_open_transaction
from labkit.judge.expect import Miss, Plan, both, is_module_exception, raises, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case


def check_fail(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    tok = rng.randint(20, 400)
    now = float(rng.randint(1_000, 9_000)) + 0.5
    base, cap, max_attempts = rng.choice((0.5, 1.0, 2.0)), 60.0, 4
    long = "é" * 150 + "x" * 100  # 250 characters, 400 bytes in UTF-8

    def leased(fence: int, attempts: int = 1, **extra) -> dict:
        return row(name(rng, "r"), state="leased", owner="A", lease_until=now + 30, fence=fence, attempts=attempts,
                  **extra)

    layout = [
        ("bool seq", leased(tok)),
        ("transient", leased(tok + 2, attempts=1)),
        ("second attempt", leased(tok + 3, attempts=2)),
        ("last attempt", leased(tok + 4, attempts=max_attempts)),
        ("permanent", leased(tok + 5, attempts=1)),
        ("permanent subclass", leased(tok + 6, attempts=1)),
        ("stale", row(name(rng, "r"), state="leased", owner="B", lease_until=now + 30, fence=tok + 20, attempts=2)),
        ("pending", row(name(rng, "r"), state="pending", fence=tok + 8, attempts=1, due=now + 4,
                       last_error="Transient: x")),
        ("long message", leased(tok + 9, attempts=1)),
        ("float fence", leased(tok + 10)),
        ("bool fence", leased(1)),  # what True would mean
        ("bool now", leased(tok + 11)),
        ("past max", leased(tok + 12, attempts=max_attempts + 2)),
        ("policy checks", leased(tok + 13, attempts=1)),
        ("max_attempts 1", leased(tok + 15, attempts=1)),
        ("base equals cap", leased(tok + 16, attempts=2)),
        ("now 0", leased(tok + 17, attempts=1)),
        ("extra key", leased(tok + 18, attempts=1)),
        ("negative now", leased(tok + 14)),
        ("sent", row(name(rng, "r"), state="sent", fence=tok + 21, attempts=1)),
        ("quarantined", row(name(rng, "r"), state="quarantined", fence=tok + 22, attempts=2,
                           last_error="PermanentError: gone")),
    ]
    db = make_outbox(ctx.path("fail.db"), [r for _, r in layout], counter=tok + 30)
    seq = {label: i + 1 for i, (label, _) in enumerate(layout)}
    before = rows_of(db)
    plans, specs = [], []

    def add(label: str, s, fence, error: dict, expected: str, check, clauses: tuple[str, ...], seed: int,
            hint: str = "", policy_fields: tuple = (base, cap, max_attempts), when=now,
            extra_policy: dict | None = None) -> None:
        rng_text = f"rng Random({seed})" if seed is not None else "no rng"
        plans.append(Plan(label, f"fail(con, {s!r}, {fence!r}, {error['kind'].replace('_', ' ')} error "
                                f"{error['message'][:30]!r}, {when!r}, {{base {policy_fields[0]!r}, cap "
                                f"{policy_fields[1]!r}, max_attempts {policy_fields[2]!r}, {rng_text}}})",
                         expected, check, hint, clauses=clauses))
        specs.append({"name": label, "fn": "fail", "db": str(db),
                     "args": [value(s), value(fence), {"error": error}, value(when),
                              policy_arg(*policy_fields, seed, **(extra_policy or {}))]})

    def draws(seed: int, n: int, clause: str, hint: str):
        def check(record: dict) -> Miss | None:
            if record["observed"].get("rng_next") != oracle.next_draw(seed, n):
                used = "drew from rng" if n == 0 else f"did not draw exactly {n} time"
                return Miss(f"fail {used}", hint, clause=clause)
            return None

        return check

    def untouched(label: str, hint: str, clause: str):
        def check(record: dict) -> Miss | None:
            if rows_of(db)[seq[label]] != before[seq[label]]:
                return Miss(f"row {seq[label]} became {shown(rows_of(db)[seq[label]])}", hint, clause=clause)
            return None

        return check

    transient = {"kind": "transient", "message": "the warehouse is unreachable"}
    for label, attempts in (("transient", 1), ("second attempt", 2)):
        seed = rng.randrange(2**31)
        due = now + oracle.backoff(attempts, base, cap, random.Random(seed))
        add(f"a transient failure on attempt {attempts}", seq[label], before[seq[label]]["fence"], transient,
            f"'pending'; due = now + backoff({attempts}, {base}, {cap}, rng) = {due:.6g}; owner and lease cleared; "
            "last_error 'Transient: the warehouse is unreachable'",
            both(under("6.returns-state", returns("pending", "Return the new state: 'pending' for a retry.")),
                 under("6.retry", row_is(db, seq[label], f"A transient failure with attempts ({attempts}) < "
                                                        "max_attempts goes back to pending, due at now + backoff("
                                                        "attempts, base, cap, rng): attempts counts claims.",
                                        state="pending", due=due)),
                 under("6.clears-lease", row_is(db, seq[label], "Clear owner and lease_until; keep fence and "
                                                              "attempts.", owner=None, lease_until=None,
                                               attempts=attempts, fence=before[seq[label]]["fence"])),
                 under("6.last-error", row_is(db, seq[label], "last_error is f\"{type(error).__name__}: {error}\".",
                                             last_error="Transient: the warehouse is unreachable")),
                 draws(seed, 1, "6.retry", "Draw the wait once, with backoff(attempts, base, cap, rng)."),
                 under("6.retry", no_open_transaction)),
            ("6.retry", "6.clears-lease", "6.last-error", "6.returns-state"), seed)
    seed = rng.randrange(2**31)
    add(f"a transient failure on attempt {max_attempts} of {max_attempts}", seq["last attempt"],
        before[seq["last attempt"]]["fence"], transient, "'quarantined'; no random number drawn",
        both(under("6.quarantine-max", returns("quarantined", f"attempts ({max_attempts}) >= max_attempts "
                                                           f"({max_attempts}): quarantine it.")),
             under("6.quarantine-max", row_is(db, seq["last attempt"], "attempts >= max_attempts → quarantined.",
                                             state="quarantined", owner=None, lease_until=None)),
             draws(seed, 0, "6.rng-only-retry", "A quarantine draws no random number: call backoff only for a "
                                               "retry.")),
        ("6.quarantine-max", "6.rng-only-retry"), seed)
    seed = rng.randrange(2**31)
    add(f"attempt {max_attempts + 2} of {max_attempts} (max_attempts was lowered)", seq["past max"],
        before[seq["past max"]]["fence"], transient, "'quarantined'",
        both(under("6.quarantine-max", returns("quarantined", "attempts >= max_attempts: also when attempts is past "
                                                             "it, not only equal to it.")),
             under("6.quarantine-max", row_is(db, seq["past max"], "attempts >= max_attempts → quarantined.",
                                             state="quarantined"))),
        ("6.quarantine-max",), seed)
    checked = seq["policy checks"]
    for label, fields, hint in (
            ("a policy without rng", (base, cap, max_attempts), "policy needs base, cap, max_attempts and rng."),
            ("a policy with base True", (True, cap, max_attempts), BOOL_HINT),
            ("a policy with base 0", (0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base 0.0", (0.0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base -1", (-1.0, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with base > cap", (cap + 1, cap, max_attempts), "0 < base <= cap, as backoff requires."),
            ("a policy with max_attempts 0", (base, cap, 0), "max_attempts is an int of at least 1."),
            ("a policy with max_attempts True", (base, cap, True), BOOL_HINT)):
        seed = None if "without rng" in label else rng.randrange(2**31)
        # A PermanentError: the quarantine path never calls backoff, so only fail's own check can refuse.
        add(f"{label} is refused", checked, before[checked]["fence"],
            {"kind": "permanent", "message": "sku snack is discontinued"}, "ValueError; nothing changes",
            both(under("6.token-check", raises("ValueError", "Check the policy before touching the row: " + hint)),
                 untouched("policy checks", "A refused call changes nothing.", "6.token-check")),
            ("6.token-check",), seed, hint, policy_fields=fields)
    for label, fields, when, state, extra in (
            ("max_attempts 1", (base, cap, 1), now, "quarantined", {}),
            ("base equals cap", (cap, cap, max_attempts), now, "pending", {}),
            ("now 0", (base, cap, max_attempts), 0, "pending", {}),
            ("extra key", (base, cap, max_attempts), now, "pending", {"note": "other keys are ignored"})):
        seed = rng.randrange(2**31)
        attempts = before[seq[label]]["attempts"]
        due = {} if state == "quarantined" else {"due": when + oracle.backoff(attempts, fields[0], fields[1],
                                                                              random.Random(seed))}
        add(f"{label} is accepted", seq[label], before[seq[label]]["fence"], transient, f"{state!r}",
            both(under("6.returns-state", returns(state, "This policy and this now are inside the contract: "
                                                        "max_attempts >= 1, 0 < base <= cap, now >= 0; other keys "
                                                        "of the policy are ignored.")),
                 under("6.retry", row_is(db, seq[label], "Apply the policy as given.", state=state, **due))),
            ("6.returns-state", "6.retry"), seed, policy_fields=fields, when=when, extra_policy=extra)
    for label, kind in (("permanent", "permanent"), ("permanent subclass", "permanent_subclass")):
        seed = rng.randrange(2**31)
        message = "sku snack is discontinued"
        type_name = "PermanentError" if kind == "permanent" else "Discontinued"
        add(f"a {label.replace('permanent', 'PermanentError')} on attempt 1", seq[label], before[seq[label]]["fence"],
            {"kind": kind, "message": message},
            f"'quarantined' at once; last_error '{type_name}: {message}'; no random number drawn",
            both(under("6.quarantine-permanent", returns("quarantined", "A PermanentError is never retried: "
                                                                       "`isinstance(error, PermanentError)` → "
                                                                       "quarantine, whatever attempts says.")),
                 under("6.quarantine-permanent", row_is(db, seq[label], "Quarantine a PermanentError at once.",
                                                       state="quarantined", owner=None, lease_until=None)),
                 under("6.last-error", row_is(db, seq[label], "last_error is f\"{type(error).__name__}: {error}\": "
                                                            "the error's own class name.",
                                             last_error=f"{type_name}: {message}")),
                 draws(seed, 0, "6.rng-only-retry", "A quarantine draws no random number.")),
            ("6.quarantine-permanent", "6.last-error"), seed)
    seed = rng.randrange(2**31)
    add("a stale token", seq["stale"], tok + 7, transient, "StaleLease; nothing changes; no random number drawn",
        both(under("6.token-check", is_module_exception("StaleLease", "Check the token as complete does, before "
                                                                     "anything else: " + TOKEN_HINT)),
             untouched("stale", "fail must not touch a row another publisher owns now.", "6.token-check"),
             draws(seed, 0, "6.rng-only-retry", "Check the token first, then draw: a stale call consumes no random "
                                               "number."),
             under("6.token-check", no_open_transaction)),
        ("6.token-check", "6.rng-only-retry"), seed)
    seed = rng.randrange(2**31)
    add("a pending row", seq["pending"], before[seq["pending"]]["fence"], transient, "StaleLease; nothing changes",
        both(under("6.token-check", is_module_exception("StaleLease", "Only a leased row with this token can fail.")),
             untouched("pending", "fail must not touch a row that is not leased.", "6.token-check")),
        ("6.token-check",), seed)
    seed = rng.randrange(2**31)
    add("an unknown seq", len(layout) + 7, tok, transient, "KeyError",
        under("6.token-check", raises("KeyError", "A seq without a row is a KeyError.")), ("6.token-check",), seed)
    seed = rng.randrange(2**31)
    add("a 250-character message", seq["long message"], before[seq["long message"]]["fence"],
        {"kind": "transient", "message": long}, "last_error cut to 200 characters (not bytes)",
        under("6.last-error", row_is(db, seq["long message"], "Cut the text to 200 characters: `text[:200]` on the "
                                                             "str, not on its bytes.",
                                    last_error=f"Transient: {long}"[:200])), ("6.last-error",), seed)
    for label, s, fence, hint, when in (
            ("bool seq", True, tok, BOOL_HINT + " fail(con, True, …) must not fail row 1.", now),
            ("float fence", seq["float fence"], float(tok + 10), "fence must be an int.", now),
            ("bool fence", seq["bool fence"], True, BOOL_HINT + " True is not token 1.", now),
            ("bool now", seq["bool now"], tok + 11, BOOL_HINT + " now is a number, never a bool.", True),
            ("negative now", seq["negative now"], tok + 14, "now is a finite number >= 0, as in claim.", -0.001)):
        seed = rng.randrange(2**31)
        add(f"{label} is refused", s, fence, transient, "ValueError; nothing changes; no SQL run",
            both(under("6.token-check", raises("ValueError", hint)), untouched(label, hint, "6.token-check"),
                 draws(seed, 0, "6.rng-only-retry", "Validate before drawing."),
                 under("6.token-check", no_sql(hint))), ("6.token-check",), seed, hint,
            when=when)
    for label in ("sent", "quarantined"):
        seed = rng.randrange(2**31)
        add(f"a {label} row with its own token", seq[label], before[seq[label]]["fence"], transient,
            "StaleLease; nothing changes",
            both(under("6.token-check", is_module_exception("StaleLease", f"Only a leased row with this token can "
                                                                         f"fail: look the row up by seq whatever its "
                                                                         f"state (a {label} row is not unknown).")),
                 untouched(label, f"fail must not touch a {label} row.", "6.token-check")),
            ("6.token-check",), seed)
    more = token_between_statements(ctx, "fail", now, tok + 40, (base, cap, max_attempts), "6.one-transaction",
                                    "'pending', or StaleLease if the other publisher took the row over first (the "
                                    "row stays B's)")
    return calls_on(ctx, plans + more[0], specs + more[1])
