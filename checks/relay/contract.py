"""Lab `relay`'s contract (shared/labs/relay.md) as clauses: every rule, every detail the checks
rely on, every pitfall the checks must catch. Each case of the step checks (one module per step,
listed in `checks/relay/lab.py`) names the clauses it tries; a failing case names the one it caught.
"""

from labkit.judge.contract import Clause, contract

CLAUSES = contract(
    # --- step 1: open_outbox --------------------------------------------------------------
    Clause("1.connection", "open_outbox returns the sqlite3.Connection it opened, with isolation_level=None "
                           "and no transaction left open"),
    Clause("1.busy-timeout", "the connection's busy timeout is 5 s"),
    Clause("1.wal", "the file is switched to PRAGMA journal_mode=WAL (readers do not block the other "
                    "publisher's writes)"),
    Clause("1.outbox-schema", "outbox has the contract's columns, types, NOT NULLs, defaults, AUTOINCREMENT "
                              "seq, UNIQUE id and the CHECK on state"),
    Clause("1.counter-schema", "fence_counter(id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL) "
                               "holds exactly the row (1, 0) in a new file"),
    Clause("1.reopen-keeps", "re-opening keeps every row, and the counter is inserted only if missing "
                             "(never reset: a token restarting after reopening)"),
    Clause("1.init-failure", "initialisation failure closes the connection and propagates the original error"),
    # --- step 2: enqueue ------------------------------------------------------------------
    Clause("2.new-pending", "a new event → True; one pending row with the canonical body and default "
                            "attempts 0, fence 0, due 0, no owner, no lease, no error"),
    Clause("2.same-false", "the same ID with the same body → False, nothing changes"),
    Clause("2.conflict", "the same ID with another body → Conflict (a direct Exception subclass), "
                         "nothing changes"),
    Clause("2.validate", "the event is validated with lab 01's rules first (bool is not a quantity): "
                         "ValueError, nothing written"),
    Clause("2.one-transaction", "the lookup and the insert are one transaction: another publisher's insert "
                                "between any two statements is seen (False) or waits; a failure or a "
                                "KeyboardInterrupt part-way propagates the original error, changes nothing and "
                                "leaves no transaction open"),
    # --- step 3: claim --------------------------------------------------------------------
    Clause("3.owner-range", "owner is a str of 1-64 characters from U+0020 to U+007E; else ValueError, "
                            "nothing changed"),
    Clause("3.now-range", "now is a finite int/float >= 0; else ValueError, nothing changed"),
    Clause("3.lease-range", "lease is a finite int/float with 0 < lease <= 3600; else ValueError, "
                            "nothing changed"),
    Clause("3.limit-range", "limit is an int from 1 to 16; else ValueError, nothing changed"),
    Clause("3.bool-not-number", "bool is never a number: True for now, lease or limit is ValueError"),
    Clause("3.due-pending", "pending rows are claimed when due <= now, and not before"),
    Clause("3.expired-lease", "a leased row whose lease_until <= now is claimed again (its owner is presumed "
                              "dead); a live lease is never taken (expired leases never re-claimed: a dead "
                              "owner's row stuck forever)"),
    Clause("3.skip-done", "sent and quarantined rows are never claimed"),
    Clause("3.seq-order-limit", "at most limit rows, in seq order"),
    Clause("3.global-counter", "each claimed row takes fence_counter.last + 1, stored back: one global counter, "
                               "never a token per row"),
    Clause("3.tokens-increase", "tokens are strictly increasing across every claim on the file: across "
                                "processes, reopenings and crashes"),
    Clause("3.row-update", "a claimed row is state 'leased', owner, lease_until = now + lease, fence = its "
                           "token, attempts + 1"),
    Clause("3.returns-dicts", "returns new dicts {seq, id, body, fence} in seq order"),
    Clause("3.empty-no-token", "a claim that finds nothing returns [] and takes no token"),
    Clause("3.one-transaction", "select and update in one BEGIN IMMEDIATE transaction: two processes claiming "
                                "at once never both hold a live lease on one row (a plain SELECT then UPDATE "
                                "gives both the same row)"),
    # --- step 4: complete -----------------------------------------------------------------
    Clause("4.token-decides", "a row leased with exactly this fence becomes 'sent', owner and lease_until "
                              "cleared"),
    Clause("4.keeps-fields", "complete changes only state, owner and lease_until: fence, attempts, due and "
                             "last_error stay"),
    Clause("4.stale", "another token, or a row that is not leased → StaleLease, nothing changes (a complete "
                      "that checks the owner name or the state instead of the token)"),
    Clause("4.expiry-not-stale", "expiry alone does not invalidate a token: an expired lease that was not "
                                 "re-claimed can still be completed (a complete that checks the clock)"),
    Clause("4.unknown-keyerror", "a seq without a row → KeyError"),
    Clause("4.one-transaction", "the token check and the change are one BEGIN IMMEDIATE transaction: another "
                                "publisher's claim between any two statements is either seen (StaleLease) or waits; "
                                "a failure or a KeyboardInterrupt part-way propagates, changes nothing and leaves no "
                                "transaction open"),
    Clause("4.int-args", "seq and fence that are not ints (or are bools) → ValueError before the DB is touched"),
    # --- step 5: backoff ------------------------------------------------------------------
    Clause("5.full-jitter", "a uniform draw from [0, min(cap, base * 2 ** (attempt - 1))]: full jitter, not "
                            "equal jitter, not the ceiling itself"),
    Clause("5.cap", "the wait never exceeds cap (backoff without a cap)"),
    Clause("5.seeded-rng", "draws once, only with rng.random() or rng.uniform() of the rng passed in (never "
                           "the global random module): the same seed gives the same waits"),
    Clause("5.large-attempt", "large attempts neither overflow nor slow down: attempt = 10**6, and attempts past "
                              "2 ** 1024 with a base so small that the ceiling is still below the cap (the bound is "
                              "computed without 2 ** attempt as a float)"),
    Clause("5.arg-ranges", "attempt is an int >= 1; base and cap finite with 0 < base <= cap; bool refused; "
                           "else ValueError"),
    # --- step 6: fail ---------------------------------------------------------------------
    Clause("6.token-check", "the token is checked as in complete: StaleLease (nothing changes), KeyError, "
                            "ValueError for non-int seq/fence (a fail that ignores the token)"),
    Clause("6.retry", "a transient error with attempts < max_attempts → 'pending', due = now + "
                      "backoff(attempts, base, cap, rng)"),
    Clause("6.quarantine-max", "attempts >= max_attempts → 'quarantined' (attempts counts claims)"),
    Clause("6.quarantine-permanent", "a PermanentError (or subclass) is quarantined at once, never retried"),
    Clause("6.clears-lease", "either way owner and lease_until are cleared; fence and attempts stay"),
    Clause("6.last-error", "last_error is f\"{type(error).__name__}: {error}\" cut to 200 characters (not "
                           "bytes)"),
    Clause("6.rng-only-retry", "fail draws from rng only for a retry, after the token check: a stale call or "
                               "a quarantine consumes no random number"),
    Clause("6.one-transaction", "the token check and the change are one BEGIN IMMEDIATE transaction: another "
                                "publisher's claim between any two statements is either seen (StaleLease) or waits; "
                                "a failure or a KeyboardInterrupt part-way propagates, changes nothing and leaves no "
                                "transaction open"),
    Clause("6.returns-state", "returns the new state, 'pending' or 'quarantined' (quarantine is not sent)"),
    # --- step 7: redrive ------------------------------------------------------------------
    Clause("7.requeue", "each quarantined row → pending, attempts 0, due = now, last_error kept; returns the "
                        "count"),
    Clause("7.all-or-nothing", "every id must name a quarantined row, else ValueError and nothing changes "
                               "(a redrive that applies partially)"),
    Clause("7.never-sent", "a sent row is never redriven (a redrive that touches sent rows)"),
    Clause("7.ids-shape", "ids is a list, tuple or set of str; empty → 0; a bare string or an id listed twice "
                          "→ ValueError"),
    # --- step 8: relay_once ---------------------------------------------------------------
    Clause("8.args-first", "relay_once checks its arguments before claiming: bad input never leaves rows "
                           "leased"),
    Clause("8.order-hooks", "for each claimed row in order: after_claim(seq), send(the decoded event), "
                            "after_send(seq) on a True ACK, then complete"),
    Clause("8.true-only", "only a return value that is True is an ACK; any other return → fail with a "
                          "DeliveryError (transient)"),
    Clause("8.exception-fails", "an Exception from send → fail with that very error (retry or quarantine)"),
    Clause("8.no-head-of-line", "a failure does not stop the batch: the rows behind it are still sent (a "
                                "poison row that blocks the rows behind it; lab 01's stop-at-first-failure)"),
    Clause("8.stale-skip", "StaleLease from complete or fail is counted as stale and the row is never retried"),
    Clause("8.base-exception", "KeyboardInterrupt and SystemExit from send propagate; the row stays leased"),
    Clause("8.hook-errors", "exceptions from the hooks propagate"),
    Clause("8.poison-body", "a stored body that is not a JSON object is quarantined as a PermanentError, "
                            "without calling send"),
    Clause("8.counts", "returns {sent, retry, quarantined, stale} for this call (quarantine counted as sent "
                       "is wrong)"),
    Clause("8.claim-committed", "send runs after the claim committed: another connection can write meanwhile"),
    # --- final: two publishers, a kill and a pause ----------------------------------------
    Clause("final.dead-owner", "publisher A killed in after_claim (exit 74) leaves its row leased by A"),
    Clause("final.lease-respected", "publisher B does not claim the row while A's lease is live"),
    Clause("final.takeover", "once the lease has expired B claims the row with a larger token and delivers it"),
    Clause("final.paused-owner", "a publisher frozen with SIGSTOP in after_claim is taken over after its lease"),
    Clause("final.stale-complete", "the woken publisher's complete gets StaleLease: the row stays sent by B's "
                                   "token and its counts say stale 1"),
    Clause("final.poison-quarantined", "a permanently refused event is quarantined on its first attempt, "
                                       "with its error"),
    Clause("final.transient-retried", "a transiently refused event is retried with growing, jittered waits "
                                      "(judge's clock) and delivered on its third attempt"),
    Clause("final.no-head-of-line", "the other events are delivered at once, without waiting for either"),
    Clause("final.redrive", "after the refusal is lifted, the redriven row is delivered by a new publisher"),
    Clause("final.applied-once", "every event applied exactly once, none lost, attempts as expected"),
)
