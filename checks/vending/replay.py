"""Lab `vending`, step 4: replay on fixed logs (each bound, each refusal), then a property test against the oracle."""

from __future__ import annotations

from checks.vending import oracle
from checks.vending.hints import BOOL_HINT, RANGE_HINT, REPLAY_HINTS, RESYNC_HINT
from checks.vending.inputs import SEQ_MAX, deltas
from checks.vending.outcomes import module_exception
from labkit.judge.differential import after_fixed, differential
from labkit.judge.expect import Miss, Plan, both, raises, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import encode, show


def unchanged_input(record: dict) -> Miss | None:
    if record["observed"].get("input_changed"):
        return Miss("the list passed in was modified",
                   "Never modify the input: the caller's log is still theirs. Build a new list.",
                   clause="4.no-mutation")
    return None


def check_replay(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    first = rng.randint(10, 100_000)
    log = [(first + i, d) for i, d in enumerate(deltas(rng, rng.randint(5, 8)))]
    final = log[-1][0]
    long_log = [(i, d) for i, d in enumerate(deltas(rng, 128))]
    top_log = [(SEQ_MAX - 2 + i, d) for i, d in enumerate(deltas(rng, 3))]
    plans, calls = [], []

    def case(label, events, last, limit, expected, check, clauses, hint=""):
        plans.append(Plan(label, f"replay({show(events, 90)}, {show(last)}, {show(limit)})", expected, check, hint,
                         clauses=(*clauses, "4.no-mutation")))
        calls.append({"name": label, "fn": "replay", "args": [encode(events), encode(last), encode(limit)]})

    def answer(expected, clause):
        def check(record):
            miss = under(clause, returns(expected, "Entries with seq > last, in order, at most `limit` of "
                                                  "them."))(record)
            if miss is not None:
                return miss
            if record["observed"].get("returned_input"):
                return Miss("returned the very list it was given",
                           "Return a *new* list, also when it holds every event.", clause="4.new-list")
            if record["observed"].get("returned_earlier"):
                return Miss("returned the very list an earlier call returned (a cache?): a caller that changes "
                           "its answer, e.g. appends to it, changes what the next call returns",
                           "Build a new list on every call: no cache of answers, no shared empty list.",
                           clause="4.new-list")
            return unchanged_input(record)

        return check

    case("a cursor just before the log (it joins)", log, first - 1, 16, show(log), answer(log, "4.resync"),
         ("4.resync", "4.new-list"))
    case("a cursor inside the log", log, first + 1, 16, show(log[2:]), answer(log[2:], "4.after-last"),
         ("4.after-last",))
    case("limit caps the answer", log, first - 1, 2, show(log[:2]), answer(log[:2], "4.limit"), ("4.limit",))
    # Repeated calls, compared by identity as well as value (the log itself built anew).
    case("the same call again: a new list", [tuple(e) for e in log], first - 1, 2, f"{show(log[:2])}, a new list",
         answer(log[:2], "4.limit"), ("4.new-list",))
    case("limit 1 (the smallest)", log, first, 1, show(log[1:2]), answer(log[1:2], "4.limit-range"),
         ("4.limit-range", "4.limit"))
    case("limit 16 (the largest) on 128 events", long_log, -1, 16, "the first 16",
         answer(long_log[:16], "4.limit-range"), ("4.limit-range", "4.limit"))
    case("a cursor at the final event", log, final, 16, "[]", answer([], "4.last-past-final"),
         ("4.last-past-final",))
    case("a cursor at the final event again: a new empty list", log, final, 16, "[], a new list",
         answer([], "4.last-past-final"), ("4.new-list",))
    case("last -1 on a log that starts at 0", long_log, -1, 3, show(long_log[:3]), answer(long_log[:3], "4.last-range"),
         ("4.last-range", "4.resync"))
    case("128 events (the most)", long_log, 125, 16, show(long_log[126:]), answer(long_log[126:], "4.events-list"),
         ("4.events-list",))
    case("a single-event log (the fewest)", log[:1], first - 1, 1, show(log[:1]), answer(log[:1], "4.events-list"),
         ("4.events-list",))
    case("seq 2147483647 at the end of the log, last 2147483647", top_log, SEQ_MAX, 16, "[]",
         answer([], "4.last-range"), ("4.last-range", "4.event-ranges"))
    case("seq 2147483647 at the end of the log", top_log, SEQ_MAX - 3, 16, show(top_log),
         answer(top_log, "4.event-ranges"), ("4.event-ranges",))
    edge = [(first, -1000), (first + 1, 1000)]
    case("deltas -1000 and 1000 (both ends)", edge, first - 1, 16, show(edge), answer(edge, "4.event-ranges"),
         ("4.event-ranges",))
    for label, last in (("a cursor two before the log", first - 2), ("cursor -1, the log starts later", -1)):
        case(label, log, last, 16, "ResyncRequired",
             both(module_exception("ResyncRequired", RESYNC_HINT, "4.resync"), unchanged_input),
             ("4.resync", "4.exception"), RESYNC_HINT)
    gap = log[:2] + log[3:]
    bad_tail = log[:-1] + [(final, 5000)]
    bad_head = [(first, 5000)] + log[1:]
    float_seq = [(float(first), log[0][1])] + log[1:]
    bad = [
        ("an empty log", [], first, 16, "4.events-list", "The log holds 1 to 128 events: an empty one is ValueError."),
        ("129 events (one too many)", long_log + [(128, 1)], -1, 16, "4.events-list", "At most 128 events."),
        ("a tuple instead of a list", tuple(log), first - 1, 16, "4.events-list", "events must be a list."),
        ("events None", None, -1, 16, "4.events-list", "events must be a list."),
        ("an event that is a list", [list(e) for e in log], first - 1, 16, "4.event-shape",
         "Each event is a (seq, delta) tuple."),
        ("an event with three fields", [log[0] + (1,)] + log[1:], first - 1, 16, "4.event-shape",
         "Each event has exactly two fields."),
        ("an event with one field", [log[0][:1]] + log[1:], first - 1, 16, "4.event-shape",
         "Each event has exactly two fields."),
        ("seq True in an event", [(True, 5), (2, 3)], -1, 16, "4.event-shape", BOOL_HINT),
        ("delta True in an event", [(log[0][0], True)] + log[1:], first - 1, 16, "4.event-shape", BOOL_HINT),
        ("an event with a float seq", float_seq, first - 1, 16, "4.event-shape", "seq and delta must be ints."),
        ("delta 1001 in an event", [(log[0][0], 1001)] + log[1:], first - 1, 16, "4.event-ranges", RANGE_HINT),
        ("delta -1001 in an event", [(log[0][0], -1001)] + log[1:], first - 1, 16, "4.event-ranges", RANGE_HINT),
        ("a negative seq", [(-1, 5), (0, 5)], -1, 16, "4.event-ranges", RANGE_HINT),
        ("seq 2147483648 in an event", [(SEQ_MAX, 5), (SEQ_MAX + 1, 5)], SEQ_MAX - 1, 16, "4.event-ranges",
         RANGE_HINT),
        ("a gap in the seqs", gap, first - 1, 16, "4.consecutive", "seqs are consecutive: each is the previous + 1."),
        ("seqs in reverse", log[::-1], first - 1, 16, "4.consecutive", "seqs ascend."),
        ("a repeated seq", log[:2] + [log[1]] + log[2:], first - 1, 16, "4.consecutive",
         "seqs are consecutive: no repeats."),
        ("a repeat and a gap that balance out (the count still fits)", log[:2] + [log[1]] + log[3:], first - 1, 16,
         "4.consecutive", "Compare each seq with the one before it: a count of final - first + 1 can hide a "
                         "repeat next to a gap."),
        ("the last event skips a seq", log[:-1] + [(final + 1, log[-1][1])], first - 1, 16, "4.consecutive",
         "seqs are consecutive up to the last event: each is the previous + 1."),
        ("a bad event past the limit", bad_tail, first - 1, 1, "4.validate-first",
         "Validate all of the input first, also what the limit would cut off."),
        ("a bad event at or below the cursor", bad_head, first + 2, 16, "4.validate-first",
         "Validate all of the input first, also the events the cursor skips."),
        ("a gap below the cursor", gap, final - 1, 16, "4.validate-first",
         "Validate all of the input first, also the events the cursor skips."),
        ("a bad event and an old cursor", bad_tail, -1, 16, "4.validate-first",
         "Validate all of the input before deciding about ResyncRequired."),
        ("an old cursor and limit 0", log, -1, 0, "4.validate-first",
         "Validate all of the input (limit too) before deciding about ResyncRequired."),
        ("last True", log, True, 16, "4.last-range", BOOL_HINT),
        ("last -2", log, -2, 16, "4.last-range", "last ranges from -1 to 2147483647."),
        ("last 2147483648", top_log, SEQ_MAX + 1, 16, "4.last-range", "last ranges from -1 to 2147483647."),
        ("last a float", log, float(first), 16, "4.last-range", "last must be an int."),
        ("last None", log, None, 16, "4.last-range", "last must be an int."),
        ("last one past the final seq", log, final + 1, 16, "4.last-past-final",
         "last greater than the final seq is ValueError."),
        ("limit 0 (one too few)", log, first - 1, 0, "4.limit-range", "limit ranges from 1 to 16."),
        ("limit 17 (one too many)", log, first - 1, 17, "4.limit-range", "limit ranges from 1 to 16."),
        ("limit True", log, first - 1, True, "4.limit-range", BOOL_HINT),
        ("limit 2.0 (a float)", log, first - 1, 2.0, "4.limit-range", "limit must be an int."),
        ("limit None", log, first - 1, None, "4.limit-range", "limit must be an int."),
    ]
    for label, events, last, limit, clause, hint in bad:
        case(label, events, last, limit, "ValueError", both(under(clause, raises("ValueError", hint)), unchanged_input),
             (clause,), hint)
    name = "replay agrees with the contract on generated logs"
    return after_fixed(lambda: ctx.cases("calls", plans, {"calls": calls}, probes="labkit.probe"), name,
                      "replay on generated logs", lambda: differential(
        ctx, "replay", oracle.replay_args(), oracle.replay,
        lambda *args: (oracle.replay_clause(*args), REPLAY_HINTS[oracle.replay_clause(*args)]),
        clauses=tuple(REPLAY_HINTS), unchanged="4.no-mutation", examples=REPLAY_EXAMPLES, name=name,
        show_call=lambda events, last, limit: f"replay({show(events, 120)}, {show(last)}, {show(limit)})"))


# A log costs more to generate, send and compare than a line: fewer examples keep step 4 within
# the property-test budget (every kind of log is still drawn; see oracle.replay_args).
REPLAY_EXAMPLES = 100
