"""Lab `relay`, steps 4 and 6: complete or fail on a row whose lease ran out, while another
publisher re-claims it between any two of the call's statements."""

from __future__ import annotations

from pathlib import Path

from checks.relay.common import between_statements, policy_arg, value
from checks.relay.outbox import make_outbox, name, row, rows_of, shown
from labkit.judge.expect import Miss, Plan, describe, value_of
from labkit.judge.run import StepContext
from labkit.values import encode

TAKE_OVER_HINT = ("Check the token and change the row in one BEGIN IMMEDIATE transaction: a check made before the "
                 "transaction is stale by the time you write (another publisher took the row over between your check "
                 "and your UPDATE). A deferred BEGIN is not enough: its UPDATE then fails with 'database is locked' "
                 "where BEGIN IMMEDIATE would have waited.")


def token_between_statements(ctx: StepContext, fn: str, now: float, start: int, policy: tuple | None, clause: str,
                             expected: str) -> tuple[list[Plan], list[dict]]:
    """complete or fail on A's row (its lease ran out, nobody re-claimed it yet) while another
    publisher B re-claims the row between any two of its statements."""
    fence = start - 2
    template = make_outbox(ctx.path(f"{fn}-boundaries.db"),
                          [row(name(ctx.rng, "slow"), state="leased", owner="A", lease_until=now - 1, fence=fence,
                               attempts=1)], counter=start)
    take_over = [["UPDATE fence_counter SET last = last + 1 WHERE id = 1", []],
                 ["UPDATE outbox SET state = 'leased', owner = 'B', lease_until = ?, attempts = attempts + 1, "
                 "fence = (SELECT last FROM fence_counter WHERE id = 1) WHERE seq = 1", [encode(now + 60)]]]
    args = [value(1), value(fence)]
    called = f"{fn}(con, 1, {fence}"
    if policy is not None:
        seed = ctx.rng.randrange(2**31)
        args += [{"error": {"kind": "transient", "message": "the warehouse is unreachable"}}, value(now),
                 policy_arg(*policy, seed)]
        called += f", OSError(...), {now!r}, policy"
    called += ")"

    def judge(outcome: dict, path: Path, landed: bool) -> Miss | None:
        r = rows_of(path)[1]
        if landed:
            if outcome.get("kind") != "raised" or "StaleLease" not in outcome.get("mro", [outcome.get("type")]):
                return Miss(f"{fn} {describe(outcome)} and the row B had just claimed is now {shown(r)}",
                           TAKE_OVER_HINT)
            if r["state"] != "leased" or r["owner"] != "B" or r["fence"] != start + 1:
                return Miss(f"{fn} raised StaleLease, but the row B had just claimed is now {shown(r)}", TAKE_OVER_HINT)
            return None
        want = ("returned", None) if fn == "complete" else ("returned", "pending")
        got = (outcome.get("kind"), value_of({"outcome": outcome}) if outcome.get("kind") == "returned" else None)
        if got != want or r["owner"] is not None or r["fence"] != fence:
            return Miss(f"{fn} {describe(outcome)}; the row is {shown(r)}", TAKE_OVER_HINT)
        return None

    return between_statements(ctx, fn, called, template, args, clause, take_over, judge, expected)
