"""Step 3 of lab `relay`, its race: two real processes claim from one file until nothing is
left, and the judge's audit shows who held which row with which token."""

from __future__ import annotations

from pathlib import Path

from checks.relay.common import ONE_TX_HINT
from checks.relay.outbox import audit, claims_in, counter, make_outbox, name, row
from labkit.judge.expect import Miss, Plan, describe
from labkit.judge.run import StepContext, together
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode

RACERS = ("A", "B")
# The racers wait for each other by design (the probe's barriers and turns), so on a loaded
# machine a correct pair takes longer than one step's child limit; a hanging claim costs this once.
RACE_TIME_FACTOR = 2.0


def race(ctx: StepContext) -> list[Case]:
    """Two real processes claim from one file until nothing is left; the audit shows who held what."""
    rng = ctx.rng
    now = float(rng.randint(1_000, 9_000))
    start = rng.randint(10, 60)
    total = rng.randint(20, 28)
    limit = rng.randint(3, 5)
    rows = [row(name(rng, f"r{i:02d}")) for i in range(total)]
    db = make_outbox(ctx.path("race.db"), rows, counter=start)
    sync = ctx.path("race-sync")
    sync.mkdir()
    args = {"db": str(db), "sync": str(sync), "now": now, "lease": 3600.0, "limit": limit,
            "max_rounds": total + 2}
    runs = together([lambda me=me: ctx.child("race", {**args, "owner": me, "peers": [p for p in RACERS if p != me],
                                                      "cases": ["claims"]}, timeout=RACE_TIME_FACTOR * ctx.timeout)
                     for me in RACERS])
    entries = audit(db)
    claims = claims_in(entries)
    case = Case(f"{len(RACERS)} processes race to claim every row", Outcome.PASSED,
                f"claim(con, owner, {now:g}, 3600, {limit}) in a loop, in {len(RACERS)} processes at once, on one "
                f"file of {total} due rows",
                "every row claimed exactly once; tokens strictly increasing from "
                f"{start + 1}; fence_counter.last = {start + total}",
                clauses=("3.one-transaction", "3.tokens-increase", "3.global-counter"))
    miss = _race_miss(runs, claims, db, start, total, RACE_TIME_FACTOR * ctx.timeout)
    if miss is not None:
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
        case.clauses = (miss.clause,)
    return [case]


def _race_miss(runs, claims: list[dict], db: Path, start: int, total: int, timeout: float) -> Miss | None:
    from labkit.judge.expect import judge

    plan = Plan("claims", "claim(...) in a loop", "no error", lambda r: None)
    for owner, run in zip(RACERS, runs, strict=True):
        got = judge(run, [plan], timeout)[0]
        if not got.passed:
            return Miss(f"publisher {owner}: {got.got}", got.hint, got.outcome, "3.one-transaction")
        record = run.cases()["claims"]
        for call in record["observed"]["calls"]:
            if call["kind"] == "returned" and not isinstance(decode(call["value"]), list):
                return Miss(f"publisher {owner}: claim {describe(call)}", "claim returns a list of new dicts "
                                                                         "{seq, id, body, fence}.",
                           clause="3.returns-dicts")
            if call["kind"] != "returned":
                hint = (ONE_TX_HINT if call.get("type") == "OperationalError" else "claim must not fail when "
                       "another publisher claims at the same moment.")
                return Miss(f"publisher {owner}: claim {describe(call)} while the other publisher was claiming too",
                           hint, clause="3.one-transaction")
    holders: dict[int, dict] = {}
    for c in claims:
        if c["seq"] in holders:
            first = holders[c["seq"]]
            return Miss(f"row {c['seq']} was claimed by {first['owner']!r} (token {first['fence']}) and then by "
                       f"{c['owner']!r} (token {c['fence']}) while the first lease (until {first['lease_until']:g}) "
                       "was still live: both publishers would send it", ONE_TX_HINT, clause="3.one-transaction")
        holders[c["seq"]] = c
    fences = [c["fence"] for c in claims]
    for before, after in zip(fences, fences[1:], strict=False):
        if after <= before:
            return Miss(f"in commit order the claims took tokens {fences[:12]}{'…' if len(fences) > 12 else ''}: "
                       f"{after} after {before}", "Every claim takes fence_counter.last + 1 and stores it back, in "
                                                  "the same transaction: one counter for the whole file.",
                       clause="3.tokens-increase")
    if fences and fences[0] != start + 1:
        return Miss(f"the first token was {fences[0]}, but fence_counter.last was {start}",
                   "Take each token from fence_counter (last + 1), never from the row or a Python variable.",
                   clause="3.global-counter")
    if len(holders) != total:
        missing = sorted(set(range(1, total + 1)) - set(holders))
        return Miss(f"rows {missing[:8]} were never claimed", "Claim until nothing is due: each call takes the "
                                                             "next due rows in seq order.", clause="3.seq-order-limit")
    if counter(db) != [(1, start + total)]:
        return Miss(f"fence_counter is {counter(db)} after {total} claims from {start}",
                   "Store each token back into fence_counter.last.", clause="3.global-counter")
    for owner, run in zip(RACERS, runs, strict=True):
        returned = [r for call in run.cases()["claims"]["observed"]["calls"] if call["kind"] == "returned"
                   for r in _as_list(decode(call["value"]))]
        mine = {(c["seq"], c["fence"]) for c in claims if c["owner"] == owner}
        got = {(r.get("seq"), r.get("fence")) for r in returned if isinstance(r, dict)}
        if got != mine:
            wrong = sorted(got - mine)[:4]
            return Miss(f"claim returned (seq, token) {wrong} to {owner}, but the file shows {owner} never held them",
                       "Return exactly the rows this call leased, with the tokens it stored.",
                       clause="3.one-transaction")
    return None


def _as_list(value) -> list:
    return value if isinstance(value, list) else []
