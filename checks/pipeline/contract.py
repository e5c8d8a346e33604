"""Lab `pipeline`'s contract (shared/labs/pipeline.md) as clauses: every rule the checks try and
every pitfall the lab lists. Each case of the step checks (one module per step, listed in
`checks/pipeline/lab.py`) names the clauses it tries; a failing case names the one it caught.
"""

from labkit.judge.contract import Clause, contract

CLAUSES = contract(
    # --- step 1: open_db ------------------------------------------------------------------
    Clause("1.connection", "open_db returns the psycopg.Connection it opened, in autocommit mode and "
                           "with no transaction open"),
    Clause("1.schema", "a new database gets orders, outbox, inbox, stock and fence_seq with the contract's "
                       "columns, types, NOT NULLs, defaults, identity seq and UNIQUE id"),
    Clause("1.reopen-keeps", "re-opening keeps every row and does not reset fence_seq"),
    Clause("1.concurrent-open", "two processes calling open_db on a new database at the same moment both "
                                "succeed (CREATE TABLE IF NOT EXISTS races in the catalog: serialise with "
                                "pg_advisory_xact_lock)"),
    Clause("1.no-idle-transaction", "no connection is left idle inside a transaction holding locks "
                                    "(autocommit off, or a statement outside transaction())"),
    Clause("1.init-failure", "a failure while creating the schema closes the connection and propagates "
                             "the original error"),
    # --- step 2: accept -------------------------------------------------------------------
    Clause("2.new-true", "a new event → True: its order and its outbox row (canonical body, fence 0, "
                         "unclaimed, unpublished), both in one transaction"),
    Clause("2.same-false", "the same id and content → False, nothing changed"),
    Clause("2.conflict", "the same id with other content → Conflict, nothing changed"),
    Clause("2.validate", "the event is validated with lab 01's rules first: ValueError, nothing written"),
    Clause("2.one-transaction", "the order and its outbox row are written in one transaction: a failure "
                                "part-way leaves neither"),
    Clause("2.concurrent-accept", "processes accepting one id at the same moment: exactly one True, the "
                                  "others False; never a UniqueViolation (SELECT, then INSERT) or a deadlock"),
    # --- step 3: claim --------------------------------------------------------------------
    Clause("3.arg-ranges", "owner 1-64 printable ASCII, limit an int 1-16, lease_s finite with "
                           "0 < lease_s <= 3600, bool never a number; else ValueError before any statement "
                           "(no token taken, nothing changed)"),
    Clause("3.seq-order-limit", "up to limit unpublished rows, in seq order, returned as new dicts "
                                "{seq, id, event, fence}"),
    Clause("3.claimable", "published rows and rows under a live claim are never claimed; rows whose claim "
                          "expired are claimed again"),
    Clause("3.db-clock", "claims expire and are set on the database's clock (clock_timestamp()), never the "
                         "caller's: claim_until = clock_timestamp() + lease"),
    Clause("3.sequence-fence", "each claimed row takes a fresh nextval('fence_seq'), never max(fence) + 1"),
    Clause("3.row-update", "a claimed row carries claimed_by = owner, the returned fence and claim_until"),
    Clause("3.for-update", "many processes claiming at once never hold live claims on one row "
                           "(SELECT without FOR UPDATE hands one row to two publishers)"),
    Clause("3.skip-locked", "a claim never waits for rows another transaction has locked (FOR UPDATE "
                            "without SKIP LOCKED waits for the other publisher)"),
    # --- step 4: publish ------------------------------------------------------------------
    Clause("4.xadd-fields", "each row is added with XADD stream * id <id> body <canonical body> fence "
                            "<fence>, in seq order"),
    Clause("4.saved-after-xadd", "published_at and stream_id are saved after the XADD and after_add, never "
                                 "before: an XADD error propagates and leaves the row claimed, unpublished"),
    Clause("4.fence-checked", "published is saved only if the row still carries this fence; else StaleClaim "
                              "is counted as stale and the batch goes on"),
    Clause("4.save-error", "only StaleClaim is counted as stale: any other error saving the row (a lost "
                           "connection) propagates, and the row stays claimed"),
    Clause("4.no-maxlen", "XADD without MAXLEN or MINID: trimming drops entries no consumer has read"),
    Clause("4.counts", "returns {published, stale}; a published row has stream_id = the entry id and its "
                       "claim cleared"),
    # --- step 5: ensure_group -------------------------------------------------------------
    Clause("5.group-at-zero", "the group is created at id 0: it sees entries added before it (a group at $ "
                              "never does)"),
    Clause("5.mkstream", "a missing stream is created (MKSTREAM) → True"),
    Clause("5.busygroup-false", "a group that exists already → False, its state unchanged; other errors "
                                "propagate"),
    # --- step 6: consume ------------------------------------------------------------------
    Clause("6.apply", "a new event: inbox row and stock added, committed, then XACK; counted applied"),
    Clause("6.duplicate", "the same event in another entry is acknowledged without effect; counted duplicate"),
    Clause("6.commit-before-ack", "XACK only after the commit: a failure inside the transaction leaves the "
                                  "entry pending"),
    Clause("6.one-transaction", "the inbox row and the stock change are one transaction: a failure before "
                                "commit leaves neither"),
    Clause("6.own-pending-first", "this consumer's own pending entries (XREADGROUP 0) are processed before "
                                  "new ones (`>` only never re-reads them after a restart)"),
    Clause("6.count-block", "at most count entries; block_ms 0 never waits (never BLOCK 0)"),
    Clause("6.dead-letter", "a body that is not a valid event, or an id applied with another body, goes to "
                            "<stream>.dead with entry_id, fields (JSON) and reason, then is acknowledged"),
    Clause("6.dead-before-ack", "a poison entry is acknowledged only after it reached the dead-letter stream"),
    Clause("6.hooks", "before_commit(entry id) runs inside the transaction, after its inbox row and stock "
                      "change; before_ack(entry id) before every XACK, dead letters included"),
    Clause("6.no-noack", "entries are read into the PEL (never NOACK): an entry whose consumer dies before "
                         "XACK stays pending"),
    # --- step 7: reclaim ------------------------------------------------------------------
    Clause("7.takes-idle", "entries idle longer than min_idle_ms in any consumer are taken over "
                           "(XAUTOCLAIM) and returned as claimed; entries not idle enough stay"),
    Clause("7.delivery-count", "an idle entry delivered more than max_deliveries times goes to the "
                               "dead-letter stream and is acknowledged, not claimed again"),
    Clause("7.all-pages", "XAUTOCLAIM is followed to cursor 0-0 and XPENDING to its end: every idle entry, "
                          "not one page"),
    # --- step 8: lag ----------------------------------------------------------------------
    Clause("8.measures", "unpublished, oldest_unpublished_s, pending, oldest_pending_ms, max_deliveries, dead, "
                         "each from the database and XPENDING / XLEN / XINFO GROUPS"),
    Clause("8.zero-not-none", "an empty measure is 0, never None (also without the stream)"),
    Clause("8.read-only", "lag changes nothing: no row, no pending entry, no delivery count"),
    # --- final: real processes, real servers, real kills ----------------------------------
    Clause("final.publisher-dies", "publisher #1 dies after XADD; after the lease #2 adds it again with a "
                                   "larger fence: two entries, one event"),
    Clause("final.consumer-dies", "consumer A dies between commit and XACK; B's reclaim and consume find it "
                                  "applied: stock counted once"),
    Clause("final.valkey-killed", "Valkey SIGKILLed and restarted: answered XADDs, the group and its PEL kept; "
                                  "a publisher while it is down saves nothing; later processes carry on"),
    Clause("final.postgres-crash", "PostgreSQL stopped in immediate mode mid-apply: the half-done apply is "
                                   "gone, the entry pending, applied once later"),
    Clause("final.poison", "a poison body and a deadly event are dead-lettered with their reasons; the rest "
                           "flow; final state applied exactly once, PEL empty, lag says so"),
)
