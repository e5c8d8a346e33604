"""Lab `pipeline`, step 1: open_db on new, existing and locked-down databases, and two processes
opening one new database at the same moment."""

from __future__ import annotations

from checks.pipeline import schema
from checks.pipeline.common import (
    UNTIL_ANOTHER_WAITS,
    call,
    first_error,
    idle_killed,
    one,
    outcomes,
    race,
    racing,
    run,
    servers,
)
from labkit.judge.expect import Miss, Plan, describe
from labkit.judge.run import StepContext, beside
from labkit.judge.verdict import Case

LOCK_HINT = ("Two processes ran `CREATE TABLE IF NOT EXISTS` at the same moment and one failed in PostgreSQL's "
             "catalog: `IF NOT EXISTS` does not see a table another transaction is still creating. Create the "
             "schema in one `with conn.transaction():` that first takes `SELECT pg_advisory_xact_lock(<a fixed "
             "number>)`, so the second process waits and then finds everything there.")
IDLE_HINT = ("Your connection sat idle inside an open transaction after open_db returned, holding its locks "
             "until it commits (the server ends such a connection after 5 s). Connect with `autocommit=True` and "
             "run every write inside `with conn.transaction():`.")

# The first table a session creates is held, created and not yet committed, until another session
# of the database waits on a lock (an event trigger at ddl_command_end; at most 2 s): the other
# racer then either waits for the student's lock (right) or already tried to create the same table
# and waits for this transaction, to fail with a duplicate key when it commits (no lock). A pause
# before the CREATE, as this was, left a window of one transaction's length: a loaded machine
# started the second racer later than that, and the missing lock passed under one seed in CI.
SLOW_DDL = ["""CREATE FUNCTION judge_hold_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
  polls int := 0;
BEGIN
  IF current_setting('judge.held', true) IS DISTINCT FROM 'yes'
     AND EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()) THEN
    PERFORM set_config('judge.held', 'yes', false);
    """ + UNTIL_ANOTHER_WAITS + """
  END IF;
END $$""", "CREATE EVENT TRIGGER judge_hold_ddl ON ddl_command_end WHEN TAG IN ('CREATE TABLE')"
           " EXECUTE FUNCTION judge_hold_ddl()"]
ROWS = [("INSERT INTO orders VALUES ('keep-1', 'apple', 3)",),
        ("INSERT INTO outbox(id, body) VALUES ('keep-1', '{\"id\":\"keep-1\",\"qty\":3,\"sku\":\"apple\"}')",),
        ("INSERT INTO inbox(id, body, stream_id) VALUES ('keep-0', '{}', '1-0')",),
        ("INSERT INTO stock VALUES ('apple', 7)",)]


def is_connection(record: dict) -> Miss | None:
    seen = record["observed"]
    if record["outcome"]["kind"] != "returned":
        return Miss(describe(record["outcome"]))
    if seen.get("closed"):
        return Miss("a closed connection", "Return the open connection: `with psycopg.connect(...) as conn:` "
                    "closes it when the block ends.")
    if seen.get("type") != "psycopg.Connection":
        return Miss(f"returned a {seen.get('type')}", "Return the psycopg.Connection that open_db opened.")
    if not seen.get("autocommit"):
        return Miss("a connection with autocommit=False", "Connect with `psycopg.connect(dsn, autocommit=True)`: "
                    "without it the first statement opens a transaction that stays open, holding locks.",
                    clause="1.no-idle-transaction")
    if seen.get("status") != "IDLE":
        return Miss(f"a connection whose transaction status is {seen.get('status')}", IDLE_HINT,
                    clause="1.no-idle-transaction")
    return None


def check_open(ctx: StepContext) -> list[Case]:
    # the race in a child of its own beside the batch, from the step's first moment: its database
    # and process start while the batch's cases are prepared
    with beside(lambda: check_concurrent_open(ctx)) as raced:
        cases = open_batch(ctx)
    return cases + raced.result()


def open_batch(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    new, idle, kept, locked, cut = (srv.database(ctx.step) for _ in range(5))
    schema.create(kept)
    kept.setup(*(sql for (sql,) in ROWS), *["SELECT nextval('fence_seq')"] * 41)
    kept_rows = {t: schema.rows(kept, t) for t in ("orders", "outbox", "inbox", "stock")}
    # the role may not create anything: open_db must fail, and clean up
    locked.setup("ALTER SCHEMA public OWNER TO judge", "REVOKE CREATE ON SCHEMA public FROM PUBLIC")

    def new_schema(record: dict) -> Miss | None:
        miss = is_connection(record)
        if miss is not None:
            return miss
        with new.judge() as judge:
            problems = schema.schema_problems(judge)
        if problems:
            return Miss("the schema differs: " + "; ".join(problems[:4]), "Create exactly the contract's tables.",
                        clause="1.schema")
        return None

    def not_idle(record: dict) -> Miss | None:
        status = record["observed"].get("status")
        if idle_killed(srv, idle) or status in ("INTRANS", "INERROR"):
            return Miss(f"the connection open_db returned was idle in a transaction (status {status})", IDLE_HINT)
        return is_connection(record)

    def keeps(record: dict) -> Miss | None:
        miss = first_error(record)
        if miss is not None:
            return miss
        for table, before in kept_rows.items():
            after = schema.rows(kept, table)
            if after != before:
                return Miss(f"{table} had {len(before)} row(s) before open_db and {len(after)} after",
                            "Create only what is missing (`IF NOT EXISTS`); never drop, truncate or insert.")
        last = one(kept, "SELECT last_value FROM fence_seq")
        if last != 41:
            return Miss(f"fence_seq's last value went from 41 to {last}",
                        "`CREATE SEQUENCE IF NOT EXISTS fence_seq`: a fence that restarts lets a stale publisher "
                        "look current.")
        return None

    def cleaned_up(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or "InsufficientPrivilege" not in outcome.get("mro", []):
            return Miss(describe(outcome), "Let the error from CREATE TABLE propagate: do not catch it.")
        if record["observed"].get("connections_open"):
            return Miss("raised, but the connection it opened is still open",
                        "On any failure after connecting, close the connection, then re-raise "
                        "(`except BaseException: conn.close(); raise`).")
        return None

    def interrupted(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] != "raised" or "KeyboardInterrupt" not in outcome.get("mro", []):
            return Miss(describe(outcome), "Let the KeyboardInterrupt propagate: do not catch it.",
                        clause="1.init-failure")
        if record["observed"].get("connections_open"):
            return Miss("a KeyboardInterrupt propagated, but the connection open_db opened is still open",
                        "A Ctrl-C is no Exception: `except Exception` misses it. Close the connection in "
                        "`except BaseException: conn.close(); raise` (or a finally that closes it on failure).",
                        clause="1.init-failure")
        return None

    plans = [
        Plan("a new database", "open_db(dsn) on an empty database", "a psycopg.Connection in autocommit mode, "
             "the contract's schema created", new_schema, clauses=("1.connection", "1.schema")),
        Plan("the connection after open_db is not idle in a transaction", "open_db(dsn), then 0.5 s of nothing",
             "no transaction open: the server does not end the connection", not_idle,
             clauses=("1.no-idle-transaction",)),
        Plan("an existing database with rows", "open_db(dsn) on a database with the schema, rows and fence_seq at 41",
             "every row kept, fence_seq still at 41", keeps, clauses=("1.reopen-keeps",)),
        Plan("the schema cannot be created", "open_db(dsn) where the role may not create tables",
             "InsufficientPrivilege propagates and the connection is closed", cleaned_up, clauses=("1.init-failure",)),
        Plan("a KeyboardInterrupt while the schema is created", "open_db(dsn) where a KeyboardInterrupt is raised "
             "at its second statement", "the KeyboardInterrupt propagates and the connection is closed", interrupted,
             clauses=("1.init-failure",)),
    ]
    specs = [
        {"name": plans[0].name, "dsn": new.dsn(ctx.workdir), "ops": [call("open_db", "$dsn", keep="db", inspect=True)]},
        {"name": plans[1].name, "dsn": idle.dsn(ctx.workdir),
         "ops": [{"sleep": 0.01}, call("open_db", "$dsn", keep="db", inspect=True), {"sleep": 0.5}]},
        {"name": plans[2].name, "dsn": kept.dsn(ctx.workdir), "ops": [call("open_db", "$dsn", keep="db")]},
        {"name": plans[3].name, "dsn": locked.dsn(ctx.workdir), "ops": [call("open_db", "$dsn", keep_error=True)]},
        {"name": plans[4].name, "dsn": cut.dsn(ctx.workdir),
         "ops": [call("open_db", "$dsn", keep_error=True, interrupt_at=2)]},
    ]
    return run(ctx, plans, specs)


def check_concurrent_open(ctx: StepContext) -> list[Case]:
    where = racing(ctx)  # its child starts while the database is made
    srv = servers(ctx)
    db = srv.database(ctx.step)
    db.setup(*SLOW_DDL)

    def both_open(records: list[dict]) -> Miss | None:
        failed = [r for r in records if r["outcome"]["kind"] != "returned"]
        if failed:
            return Miss("; ".join(outcomes(failed)), LOCK_HINT)
        with db.judge() as judge:
            problems = schema.schema_problems(judge)
        if problems:
            return Miss("the schema differs: " + "; ".join(problems[:3]), "Create exactly the contract's tables.")
        return None

    return race(where, db, "two processes open one new database at once", "open_db(dsn) in two processes at the "
                "same moment", "both get a connection, the schema is created once", ("1.concurrent-open",), 2,
                lambda i: [call("open_db", "$dsn", keep="db")], both_open)
