"""Lab `pipeline`, step 2: accept — new, the same, conflicting and invalid events, a failure
between the two inserts, and processes accepting one id at the same moment."""

from __future__ import annotations

from checks.pipeline import schema
from checks.pipeline.common import (
    UNTIL_ANOTHER_WAITS,
    call,
    first_error,
    outcomes,
    query,
    race,
    racing,
    raised_with,
    returned,
    run,
    servers,
)
from labkit.judge.expect import Miss, Plan, both, raises, returns, under
from labkit.judge.run import StepContext, beside
from labkit.judge.verdict import Case
from labkit.values import show

RACE_HINT = ("Two processes accepted the same id at the same moment and one got an error: a SELECT, then an "
             "INSERT, lets both see nothing and both insert. Use `INSERT INTO outbox … ON CONFLICT (id) DO NOTHING "
             "RETURNING seq`: no row back means it was there, then compare the stored body.")
ONE_TX_HINT = ("Write the order and its outbox row inside one `with conn.transaction():` so that a failure of "
               "either leaves neither.")
# The judge makes one insert fail, by content (BEFORE INSERT triggers on the student's tables).
FAILING = ["""CREATE FUNCTION judge_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the judge refuses this row'; END $$""",
           "CREATE TRIGGER judge_fail_outbox BEFORE INSERT ON outbox FOR EACH ROW"
           " WHEN (NEW.body LIKE '%\"sku\":\"refused-outbox\"%') EXECUTE FUNCTION judge_fail()",
           "CREATE TRIGGER judge_fail_orders BEFORE INSERT ON orders FOR EACH ROW"
           " WHEN (NEW.sku = 'refused-order') EXECUTE FUNCTION judge_fail()"]
# In the race's database the first outbox row of all is held once inserted (AFTER: its key is in
# the index, not committed) until another session waits on a lock (at most 2 s): then the other
# racers have looked for the id and wait for this transaction, either in an insert that conflicts
# (right) or in one behind a SELECT that saw nothing, to fail with a duplicate key when this one
# commits. As in step 1, the hold ends on what the judge sees, not after a pause (0.2 s, as this
# was, on every insert). A BEFORE trigger would hold the row before its key exists: nobody waits.
HOLD_FIRST_INSERT = ["CREATE SEQUENCE judge_turn", """CREATE FUNCTION judge_hold_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  polls int := 0;
BEGIN
  IF nextval('judge_turn') = 1 THEN
    """ + UNTIL_ANOTHER_WAITS + """
  END IF;
  RETURN NEW;
END $$""", "CREATE TRIGGER judge_hold_insert AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION judge_hold_insert()"]


EDGE_HINT = ("Lab 01's ranges include their ends: id 1-64 characters, sku 1-32, qty 1-1000, and '.', '_' or '-' "
             "anywhere after the first character.")


def ev(id_, sku="apple", qty=3) -> dict:
    return {"id": id_, "sku": sku, "qty": qty}


def check_accept(ctx: StepContext) -> list[Case]:
    # the race in a child of its own beside the batch, from the step's first moment: its database
    # and process start while the batch's cases are prepared
    with beside(lambda: check_race(ctx)) as raced:
        cases = accept_batch(ctx)
    return cases + raced.result()


def accept_batch(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    db = srv.database(ctx.step)
    schema.create(db)
    db.setup(*FAILING)

    def stored(id_: str):
        order = query(db, "SELECT id, sku, qty FROM orders WHERE id = %s", (id_,))
        box = query(db, "SELECT body, fence, claimed_by, claim_until, published_at, stream_id FROM outbox"
                        " WHERE id = %s", (id_,))
        return order, box

    def holds(event: dict, clause: str, hint: str = ""):
        def check(record: dict) -> Miss | None:
            order, box = stored(event["id"])
            want_order = [(event["id"], event["sku"], event["qty"])]
            if order != want_order:
                return Miss(f"orders holds {show(order)} for {event['id']}", hint or "Insert the order with the "
                            "outbox row, in the same transaction.", clause=clause)
            if box != [(schema.canonical(event), 0, None, None, None, None)]:
                return Miss(f"outbox holds {show(box)} for {event['id']}", hint or "The outbox row holds the "
                            "canonical body (keys sorted, no spaces), fence 0, no claim, unpublished.", clause=clause)
            return None
        return check

    def nothing(id_: str, clause: str, hint: str):
        def check(record: dict) -> Miss | None:
            order, box = stored(id_)
            if order or box:
                return Miss(f"orders has {len(order)} and outbox {len(box)} row(s) for {id_}: half-written", hint,
                            clause=clause)
            return None
        return check

    new, same, other = ev("new-1"), ev("same-1", "pear", 2), ev("conf-1", "plum", 5)
    changed, below = dict(other, qty=6), dict(other, id="conf-2", qty=4)  # bodies sorting after and before
    invalid = [("qty is a bool", ev("bad-1", qty=True)), ("qty is 0", ev("bad-2", qty=0)),
               ("an extra key", {**ev("bad-3"), "note": "x"}), ("no qty", {"id": "bad-10", "sku": "apple"}),
               ("id with a space", ev("bad 4")),
               ("not a dict", [("id", "bad-5")]), ("qty is 1001", ev("bad-6", qty=1001)),
               ("id has 65 characters", ev("b" * 65)), ("sku has 33 characters", ev("bad-7", "s" * 33)),
               ("id starts with '.'", ev(".bad-8")), ("sku is not ASCII", ev("bad-9", "p\u00e9ar"))]
    # Lab 01's ranges include their ends: these are accepted like any event.
    edges = [("the longest names, qty 1000", ev("A._-" + "x" * 59 + "9", "S" * 31 + "-", 1000)),
             ("one-character names, qty 1", ev("7", "k", 1))]
    plans = [
        Plan("a new event", f"accept(conn, {show(new)})", "True; its order and outbox row",
             both(under("2.new-true", returns(True)), holds(new, "2.new-true")), clauses=("2.new-true",)),
        Plan("the same event twice", f"accept(conn, {show(same)}) twice", "True, then False; nothing changed",
             both(under("2.same-false", returns(False, "The same id and content again is False.")),
                  under("2.same-false", first_error), holds(same, "2.same-false")), clauses=("2.same-false",)),
        Plan("the same id with other content", f"accept {show(other)}, then qty 6", "Conflict; nothing changed",
             both(under("2.conflict", raises("Conflict", "Compare the stored body with this one: different → "
                                                         "raise Conflict.")), holds(other, "2.conflict")),
             clauses=("2.conflict",)),
        Plan("the same id, a new body that sorts before the stored one",
             f"accept {show(dict(below, qty=5))}, then qty 4", "Conflict; nothing changed",
             both(under("2.conflict", raises("Conflict", "Compare the stored body with this one for equality: "
                                                         "different → raise Conflict, whichever sorts first.")),
                  holds(dict(below, qty=5), "2.conflict")), clauses=("2.conflict",)),
    ]
    specs = [{"name": plans[0].name, "ops": [call("accept", "$conn", new)]},
             {"name": plans[1].name, "ops": [call("accept", "$conn", same), call("accept", "$conn", same)]},
             {"name": plans[2].name, "ops": [call("accept", "$conn", other), call("accept", "$conn", changed)]},
             {"name": plans[3].name, "ops": [call("accept", "$conn", dict(below, qty=5)),
                                             call("accept", "$conn", below)]}]
    for label, event in edges:
        plans.append(Plan(f"valid at the edges: {label}", f"accept(conn, {show(event)})", "True; its order and "
                          "outbox row", both(under("2.validate", returns(True, EDGE_HINT)), holds(event, "2.validate")),
                          clauses=("2.validate",)))
        specs.append({"name": plans[-1].name, "ops": [call("accept", "$conn", event)]})
    for label, event in invalid:
        id_ = event["id"] if isinstance(event, dict) else "bad-5"
        plans.append(Plan(f"invalid: {label}", f"accept(conn, {show(event)})", "ValueError, nothing written",
                          both(raises("ValueError", "Validate with lab 01's rules before writing "
                                                    "(`validate_event`)."),
                               nothing(id_, "2.validate", "Validate before writing anything.")),
                          clauses=("2.validate",)))
        specs.append({"name": plans[-1].name, "ops": [call("accept", "$conn", event)]})
    for label, event in (("the outbox insert fails", ev("half-1", "refused-outbox")),
                         ("the order insert fails", ev("half-2", "refused-order"))):
        raised = raised_with("the judge refuses this row", "Let the database's error propagate.")
        plans.append(Plan(label, f"accept(conn, {show(event)}) while the judge refuses one of the two rows",
                          "the error propagates; neither the order nor the outbox row is there",
                          both(under("2.one-transaction", raised), nothing(event["id"], "2.one-transaction",
                                                                           ONE_TX_HINT)),
                          clauses=("2.one-transaction",)))
        specs.append({"name": plans[-1].name, "ops": [call("accept", "$conn", event)]})
    for spec in specs:
        spec["dsn"] = db.dsn(ctx.workdir)
    return run(ctx, plans, specs)


RACERS = 3


def check_race(ctx: StepContext) -> list[Case]:
    where = racing(ctx)  # its child starts while the database is made
    srv = servers(ctx)
    db = srv.database(ctx.step)
    schema.create(db)
    db.setup(*HOLD_FIRST_INSERT, f"GRANT USAGE ON SEQUENCE judge_turn TO {db.name}")
    event = ev("race-1", "fig", 4)

    def one_true(records: list[dict]) -> Miss | None:
        errors = [r for r in records if r["outcome"]["kind"] == "raised" and "Conflict" not in r["outcome"]["mro"]]
        if errors:
            return Miss("; ".join(outcomes(errors)), RACE_HINT)
        trues = sum(1 for r in records if r["outcome"]["kind"] == "returned" and returned(r) is True)
        order = query(db, "SELECT count(*) FROM orders WHERE id = %s", (event["id"],))[0][0]
        box = query(db, "SELECT count(*) FROM outbox WHERE id = %s", (event["id"],))[0][0]
        if trues != 1 or (order, box) != (1, 1):
            return Miss(f"{trues} True answer(s) ({'; '.join(outcomes(records))}), {order} order(s), {box} outbox "
                        "row(s)", RACE_HINT)
        return None

    return race(where, db, f"{RACERS} processes accept one id at once", f"accept(conn, {show(event)}) in {RACERS} "
                "processes at the same moment", "one True, the others False (or Conflict); never an error; one "
                "order, one outbox row", ("2.concurrent-accept",), RACERS,
                lambda i: [call("accept", "$conn", event)], one_true)
