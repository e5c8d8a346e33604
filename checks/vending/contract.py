"""Lab `vending`'s contract (shared/labs/vending.md, seed 003) as numbered clauses.

One clause per rule a case can be about: every range bound, type rule, character class,
framing rule, ordering and transaction rule, error path, each cleanup and cancellation path,
the feed protocol and each stage of the crash scenario. Every case of the step modules
beside this one is tagged with the clauses it tries; a failing case names the one it caught.
"""

from __future__ import annotations

from labkit.judge.contract import Clause, contract

CLAUSES = contract(
    # --- step 1: parse_line(line) ---------------------------------------------------------
    Clause("1.bytes-only", "parse_line accepts only `bytes`: a str, a bytearray, None or any other type is "
                           "ValueError (not encoded, not converted)."),
    Clause("1.keyword", "A frame starts with the keyword `EVENT`, in capitals, exactly: `event`, `Event`, "
                        "`EVENTS`, `EVEN` or anything before it is ValueError."),
    Clause("1.single-space", "Keyword, seq and delta are separated by exactly one ASCII space: a run of spaces, "
                             "a tab, a vertical tab, a form feed, a CR, or a space at either end is ValueError."),
    Clause("1.two-fields", "Exactly two numbers follow the keyword, seq then delta: a missing, empty or third "
                           "field is ValueError."),
    Clause("1.final-lf", "A complete frame ends with LF: a line without its final LF is a torn frame and "
                         "is ValueError."),
    Clause("1.complete-before-strip", "Completeness is checked before the newline is stripped: cutting the "
                                      "last byte without looking (`line[:-1]`) or `rstrip` hides a torn "
                                      "frame or an extra LF."),
    Clause("1.no-crlf", "The line ending is LF alone: CRLF, or a CR anywhere, is ValueError."),
    Clause("1.one-frame", "One frame is one line of at most 64 bytes, LF included, whose only LF is the last "
                          "byte: an LF in the middle, two frames, an empty line after the frame or a longer "
                          "line is ValueError."),
    Clause("1.ascii", "Only ASCII: digits of other scripts (Arabic-Indic, fullwidth) and bytes >= 0x80 are "
                      "ValueError, although `int()` and `str.isdigit()` accept such digits."),
    Clause("1.digits", "seq is ASCII digits; delta is an optional `-` then ASCII digits: what `int()` also "
                       "tolerates (`_` between digits, `0x`, spaces around) is ValueError."),
    Clause("1.no-leading-zero", "No leading zeros (`07`, `00`, `-05`): only the number 0 itself starts with 0."),
    Clause("1.no-plus", "No `+` sign, on seq or delta (`int()` accepts one)."),
    Clause("1.no-minus-zero", "`-0` (and `-00`) is ValueError: zero has one spelling, `0`."),
    Clause("1.seq-range", "seq ranges from 0 to 2147483647, both accepted: -1 and 2147483648 are ValueError."),
    Clause("1.delta-range", "delta ranges from -1000 to 1000, both accepted: -1001 and 1001 are ValueError."),
    Clause("1.result", "A valid frame returns the tuple `(seq, delta)` of two ints."),
    # --- step 2: open_store(path), state(con) --------------------------------------------
    Clause("2.connection", "open_store returns the open `sqlite3.Connection` it made for `path`."),
    Clause("2.autocommit", "The connection is opened with `isolation_level=None` (no hidden transactions)."),
    Clause("2.busy-timeout", "The connection has a 1 s busy timeout."),
    Clause("2.schema", "Tables `checkpoint(id INTEGER PRIMARY KEY CHECK(id=1), last INTEGER NOT NULL, total "
                       "INTEGER NOT NULL)` and `ledger(seq INTEGER PRIMARY KEY, delta INTEGER NOT NULL)`."),
    Clause("2.initial-row", "A new store holds exactly one checkpoint row, `(1, -1, 0)`."),
    Clause("2.create-if-missing", "Tables are created only if missing: opening the same file again works and "
                                  "keeps exactly one checkpoint row."),
    Clause("2.keep-saved", "A saved store is never reset: its cursor, total and ledger stay as they were."),
    Clause("2.init-failure", "If initialisation fails, the connection is closed and the original sqlite3 error "
                             "propagates."),
    Clause("2.no-open-transaction", "open_store and state return with no transaction open."),
    Clause("2.state", "state(con) returns the tuple `(last, total)` of the checkpoint row."),
    # --- step 3: apply_event(con, seq, delta, fault=None) ------------------------------
    Clause("3.exceptions", "Gap and Conflict are direct subclasses of Exception."),
    Clause("3.types", "seq and delta are ints, never bool (nor float, str, None): else ValueError, and "
                      "nothing changes."),
    Clause("3.ranges", "seq 0–2147483647 and delta -1000–1000 are accepted at both ends; outside is "
                       "ValueError, and nothing changes."),
    Clause("3.validate-first", "Arguments are validated before the store is read: an out-of-range value is "
                               "ValueError even where the store would say Gap or Conflict."),
    Clause("3.apply-next", "seq == last + 1: the ledger row is inserted, delta added to the total, last set to "
                           "seq, all committed; returns True."),
    Clause("3.order", "In that transaction the order is: ledger row, total, fault() (once, if given), last; "
                      "fault() is called only for a new event."),
    Clause("3.one-transaction", "The ledger row, the total and the cursor are committed in one transaction: "
                                "another connection sees none of them before the COMMIT."),
    Clause("3.duplicate", "seq <= last with the ledger holding the same delta: returns False, nothing changes."),
    Clause("3.conflict", "seq <= last with another delta in the ledger, or no ledger row: raises Conflict, "
                         "nothing changes."),
    Clause("3.gap", "seq > last + 1: raises Gap, nothing changes."),
    Clause("3.concurrent-writer", "seq is compared with last inside the transaction that writes: while another "
                                  "connection applies the same event, apply_event applies it (True) or, if the "
                                  "other committed first, finds it applied (False, a duplicate); it waits for the "
                                  "other's lock (the 1 s busy timeout), never counts the event twice and never "
                                  "fails for it."),
    Clause("3.rollback", "Any failure inside the transaction (fault(), SQLite) rolls back every change."),
    Clause("3.no-open-transaction", "On every path, apply_event returns with no transaction open and no lock "
                                    "held."),
    Clause("3.original-error", "A failure propagates as the original exception object (fault()'s own, "
                               "sqlite3's own), not wrapped or replaced."),
    # --- step 4: replay(events, last, limit) -------------------------------------------
    Clause("4.exception", "ResyncRequired is a direct subclass of Exception."),
    Clause("4.events-list", "events is a list of 1 to 128 entries: a tuple, None, an empty list or 129 "
                            "entries is ValueError."),
    Clause("4.event-shape", "Each event is a tuple of exactly two ints (not bool, not float): else "
                            "ValueError."),
    Clause("4.event-ranges", "Each event's seq is 0–2147483647 and its delta -1000–1000: else ValueError."),
    Clause("4.consecutive", "Seqs are consecutive and ascending (no gap, no repeat, no descent): else "
                            "ValueError."),
    Clause("4.last-range", "last is an int from -1 to 2147483647, not bool: else ValueError."),
    Clause("4.limit-range", "limit is an int from 1 to 16, not bool: else ValueError."),
    Clause("4.last-past-final", "last greater than the final seq is ValueError; last equal to it returns []."),
    Clause("4.resync", "last < first_seq - 1 raises ResyncRequired; last == first_seq - 1 joins the log."),
    Clause("4.after-last", "The answer holds the entries with seq > last, in order."),
    Clause("4.limit", "The answer holds at most `limit` entries."),
    Clause("4.new-list", "The answer is a new list on every call: never the list passed in, nor one an earlier "
                         "call returned (a cache the caller's changes would reach)."),
    Clause("4.no-mutation", "The input list is never modified, on any path."),
    Clause("4.validate-first", "All of the input is validated before answering: a bad event the limit would "
                               "cut off, or one at or below last, is still ValueError, also with an old cursor."),
    # --- step 5: consume_line(con, line, fault=None) -----------------------------------
    Clause("5.parse-first", "The line goes through parse_line first: its ValueError propagates, nothing is "
                            "applied and no ACK is returned."),
    Clause("5.ack-format", "On success the result is the bytes `b\"ACK <seq>\\n\"` (ASCII, one LF)."),
    Clause("5.duplicate-acked", "An identical duplicate is ACKed too, without changing the store."),
    Clause("5.errors-propagate", "Gap and Conflict propagate: no ACK, nothing changes."),
    Clause("5.fault-passed", "fault is passed on to apply_event; a business failure propagates, no ACK, "
                             "nothing changes."),
    Clause("5.visible-at-ack", "When the ACK is returned, another DB connection already sees the commit."),
    # --- step 6: consume_session(reader, writer, con, timeout, before_ack=None) --------
    Clause("6.timeout", "timeout is a positive finite int or float, not bool (an int such as 1 is fine): "
                        "else ValueError, nothing read or written."),
    Clause("6.read-bounded", "Every readline wait is bounded by timeout, each line on its own (a session "
                             "longer than timeout is fine): a stalled feed ends in TimeoutError."),
    Clause("6.eof-state", "At EOF the session returns state(con)."),
    Clause("6.commit-before-hook", "before_ack(seq) is called with the line's seq, after consume_line committed "
                                   "it."),
    Clause("6.hook-before-ack", "The ACK (`ACK <seq>\\n`, one per committed line, duplicates included) is "
                                "written only after before_ack(seq) returned."),
    Clause("6.drain-bounded", "Each ACK write is followed by a drain bounded by timeout."),
    Clause("6.errors-propagate", "Errors (a torn or bad line, Gap, Conflict, before_ack's, a reset while "
                                 "reading or draining) propagate as they are; the failing line gets no ACK."),
    Clause("6.cancel-propagates", "Cancellation propagates as CancelledError, wherever it lands (reading, "
                                  "draining, closing)."),
    Clause("6.close-every-path", "On every path (EOF, error, timeout, cancellation) the writer is closed, then "
                                 "wait_closed() is awaited."),
    Clause("6.close-wait-bounded", "The wait_closed() wait is bounded by timeout, or by 1 s when timeout is "
                                   "invalid."),
    Clause("6.abort", "If the close wait raises TimeoutError or ConnectionError, writer.transport.abort() is "
                      "called."),
    Clause("6.never-mask", "A failing close wait never masks the session's outcome: the original error "
                           "propagates, a normal result is still returned."),
    Clause("6.db-left-open", "consume_session does not close the DB connection (it belongs to the caller)."),
    # --- step 7: run_client(host, port, path, timeout, before_ack=None) ----------------
    Clause("7.validate-first", "timeout is validated first (positive finite int/float, not bool): an invalid "
                               "one is ValueError before any store is opened or connection made."),
    Clause("7.open-store", "The store is opened with open_store(path) before connecting; if that fails, no "
                           "connection is made."),
    Clause("7.connect-bounded", "asyncio.open_connection is bounded by timeout."),
    Clause("7.read-limit", "The connection is made with `limit=64`, so readline refuses longer lines."),
    Clause("7.resume", "The first bytes sent are `RESUME <last>\\n` with the last saved in the store."),
    Clause("7.resume-drained", "The RESUME write is drained, bounded by timeout, before the session starts."),
    Clause("7.handover", "consume_session takes over (with before_ack) and its result is returned."),
    Clause("7.db-closed", "The DB connection is closed on every path: success, error, cancellation."),
    Clause("7.socket-closed", "If anything fails before consume_session takes over, run_client closes the "
                              "socket itself."),
    Clause("7.errors-propagate", "Errors propagate as they are: a refused connection, a reset, a timeout, "
                                 "before_ack's own error."),
    Clause("7.cancel-propagates", "Cancellation propagates as CancelledError, wherever it lands (connecting, "
                                  "sending RESUME, in the session)."),
    # --- the final check: killed between commit 1 and ACK 1 ----------------------------
    Clause("final.dies-after-commit", "Client #1's before_ack(1) runs after commit 1 and before ACK 1: the "
                                      "process dies there (exit 73) with seq 1 committed and ACK 1 not sent."),
    Clause("final.commit-survives", "After the kill, the store file holds every event up to seq 1, committed."),
    Clause("final.resume-cursor", "Client #2, a new process on the same file, sends RESUME 1 (the saved "
                                  "cursor), not -1."),
    Clause("final.resent-once", "The feed resends seq 1 to client #2, which ACKs it and does not count it "
                                "again."),
    Clause("final.all-once", "Client #2 returns the final state: every delta counted exactly once, every "
                             "event once in the ledger."),
)
