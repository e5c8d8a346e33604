"""Lab `outbox`'s contract (shared/labs/outbox.md), one rule per clause.

Every case of `checks/outbox/lab.py` carries the IDs of the clauses it tries, and a failing case
the ID of the one it caught. A clause is one thing a wrong `worker.py` can get wrong on its
own: a range bound (both sides of it), a type rule, a character class, a literal the contract
fixes, an ordering, a transaction or lock rule, an error path, a crash scenario's sub-step.
"""

from __future__ import annotations

from labkit.judge.contract import Clause, contract


def _name_rules(field: str, longest: int) -> list[Clause]:
    """id and sku follow the same grammar; only their longest length differs."""
    return [
        Clause(f"1.{field}-type", f"{field} is a str: an int, bytes, None or a list is ValueError."),
        Clause(f"1.{field}-min", f"{field} has at least 1 character: the empty string is ValueError, "
                                 "one character is accepted."),
        Clause(f"1.{field}-max", f"{field} has at most {longest} characters: {longest} is accepted, "
                                 f"{longest + 1} is ValueError."),
        Clause(f"1.{field}-ascii", f"{field} is ASCII only: letters and digits of other scripts (é, ١, Ａ, "
                                   "², the Kelvin sign K) are ValueError."),
        Clause(f"1.{field}-first", f"{field}'s first character is an ASCII letter or digit: '.', '_' or '-' "
                                   "first is ValueError; a digit or a capital first is accepted."),
        Clause(f"1.{field}-rest", f"{field}'s other characters are ASCII letters, digits, '.', '_' or '-' "
                                  "(each accepted); anything else ('/', ':', '+', '@', '~', '*') is ValueError."),
        Clause(f"1.{field}-space", f"{field} holds no whitespace or control character anywhere, of any kind "
                                   "str.strip()/split() know (space, \\t, \\r, \\x0b, \\x0c, \\x1c-\\x1f, "
                                   "\\x85, \\xa0, \\u2028, \\u3000): ValueError."),
        Clause(f"1.{field}-newline", f"{field} may not end with a newline: re's `$` matches before a final "
                                     "'\\n', the contract does not."),
    ]


STEP_1 = [
    Clause("1.event-dict", "An event is a dict: None, a list of pairs, a str or a tuple is ValueError."),
    Clause("1.keys-missing", "A missing key (id, sku or qty) is ValueError, not KeyError."),
    Clause("1.keys-extra", "An extra key is ValueError; it is never silently dropped."),
    *_name_rules("id", 64),
    *_name_rules("sku", 32),
    Clause("1.qty-type", "qty is an int: a float (5.0), a str ('5'), None or a list is ValueError, never converted."),
    Clause("1.qty-bool", "qty is an int, never a bool: True and False are ValueError."),
    Clause("1.qty-min", "qty is at least 1: 0 and negative numbers are ValueError, 1 is accepted."),
    Clause("1.qty-max", "qty is at most 1000: 1000 is accepted, 1001 and huge numbers are ValueError."),
    Clause("1.returns-equal", "A valid event comes back as a dict with exactly id, sku and qty, equal to the "
                              "input's values (same types)."),
    Clause("1.returns-new", "The result is a new dict, not the input object."),
    Clause("1.input-unchanged", "The input is never modified, whether it is accepted or refused."),
]

STEP_2 = [
    Clause("2.source-connection", "open_source returns an open sqlite3.Connection to the file at path."),
    Clause("2.sink-connection", "open_sink returns an open sqlite3.Connection to the file at path."),
    Clause("2.isolation-none", "The connection has isolation_level=None (explicit transactions)."),
    Clause("2.busy-timeout", "The connection has a busy timeout of 1 s (1000 ms)."),
    Clause("2.orders-table", "source: orders(id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL)."),
    Clause("2.outbox-columns", "source: outbox has the columns seq INTEGER PRIMARY KEY, id TEXT, body TEXT, "
                               "sent INTEGER."),
    Clause("2.outbox-autoincrement", "outbox.seq is AUTOINCREMENT: a seq value is never reused."),
    Clause("2.outbox-id-unique", "outbox.id is UNIQUE."),
    Clause("2.outbox-sent-default", "outbox.sent defaults to 0."),
    Clause("2.outbox-sent-check", "outbox.sent has CHECK (sent IN (0, 1))."),
    Clause("2.source-not-null", "orders.sku, orders.qty, outbox.id, outbox.body and outbox.sent are NOT NULL."),
    Clause("2.inbox-table", "sink: inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL)."),
    Clause("2.stock-table", "sink: stock(sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)."),
    Clause("2.source-keeps-rows", "Re-opening an existing source keeps every row: tables are created only if missing."),
    Clause("2.sink-keeps-rows", "Re-opening an existing sink keeps every row: tables are created only if missing."),
    Clause("2.creates-missing", "Each table is created if it is missing, whichever of the others the file already "
                                "has: a file with orders but no outbox gets an outbox (and the same for every "
                                "table), and the rows of the tables it had are kept."),
    Clause("2.no-transaction-left", "The returned connection holds no open transaction: another connection can "
                                    "write at once."),
    Clause("2.init-error-propagates", "If creating the tables fails, the original sqlite3 error propagates."),
    Clause("2.init-error-closes", "If creating the tables fails, the connection that was opened is closed."),
    Clause("2.connect-error-propagates", "If the file cannot be opened at all (its folder does not exist), "
                                         "sqlite3's own error propagates."),
]

STEP_3 = [
    Clause("3.validates-first", "An invalid event is ValueError and writes nothing: validate before any write."),
    Clause("3.new-true", "A new id returns True."),
    Clause("3.order-row", "A new order is inserted into orders with its id, sku and qty."),
    Clause("3.outbox-row", "A new order gets exactly one outbox row, pending (sent = 0), after the rows accepted "
                           "before it (seq order is acceptance order, whatever the ids)."),
    Clause("3.canonical-body", "The outbox body is the canonical JSON: "
                               "json.dumps(event, sort_keys=True, separators=(',', ':'))."),
    Clause("3.repeat-false", "The same id with identical content returns False and changes nothing."),
    Clause("3.same-content", "'Identical content' is judged on the event's values, not on the key order of "
                             "the dict passed in."),
    Clause("3.conflict", "The same id with a different sku or qty raises Conflict (a direct subclass of Exception)."),
    Clause("3.conflict-no-change", "A Conflict changes nothing: the first order stays as it was."),
    Clause("3.one-transaction", "The order and its outbox row are written in one transaction: whichever insert "
                                "fails, neither row remains."),
    Clause("3.original-error", "A failure part-way propagates the original error, not a wrapper: an sqlite3 "
                               "error, or a KeyboardInterrupt — even one that arrives just after COMMIT or "
                               "ROLLBACK, when a clean-up's own ROLLBACK would fail and replace it."),
    Clause("3.no-transaction-left", "After every call (new, repeat, conflict, invalid, failure) the caller's "
                                    "connection is open and holds no transaction: another connection can write."),
    Clause("3.concurrent-writer", "The repeat lookup and the inserts are one BEGIN IMMEDIATE transaction: when "
                                  "another connection accepts the same order at any moment (before or between any "
                                  "two of accept's statements), accept returns False (the other came first) or "
                                  "True (it waited for the other's lock), never an sqlite3 error."),
    Clause("3.locked-propagates", "When another connection holds the write lock past the busy timeout, accept "
                                  "raises sqlite3's OperationalError ('database is locked') and writes nothing: a "
                                  "lock is not a duplicate."),
]

STEP_4 = [
    Clause("4.limit-type", "limit is an int: 2.0, '3', None are ValueError."),
    Clause("4.limit-bool", "limit is never a bool: True is ValueError."),
    Clause("4.limit-min", "limit is at least 1: 0 and -1 are ValueError; 1 returns one event."),
    Clause("4.limit-max", "limit is at most 16: 16 returns sixteen events, 17 is ValueError."),
    Clause("4.limit-caps", "min(limit, pending rows) events come back: never more than limit."),
    Clause("4.none-pending", "With nothing pending the result is an empty list."),
    Clause("4.unsent-only", "Only rows with sent = 0 come back."),
    Clause("4.seq-order", "Events come back in outbox seq order, never by id."),
    Clause("4.events-rebuilt", "The result is a list of dicts equal to the accepted events (rebuilt from "
                               "outbox.body, qty an int)."),
    Clause("4.new-dicts", "Every call returns new dicts: a caller changing one result never changes what the next "
                          "call returns."),
    Clause("4.read-only", "Reading changes nothing in the database."),
    Clause("4.no-transaction-left", "After the call the caller's connection is open and holds no transaction "
                                    "or read lock: another connection can write."),
]

STEP_5 = [
    Clause("5.validates-first", "An invalid event is ValueError and writes nothing."),
    Clause("5.new-true", "An unknown id returns True."),
    Clause("5.inbox-row", "An unknown id is recorded in inbox with its canonical body."),
    Clause("5.stock-new-sku", "The first event of a sku creates its stock row holding qty."),
    Clause("5.stock-added", "A later event of a sku adds its qty to stock[sku]."),
    Clause("5.stock-other-skus", "Other skus' stock is untouched."),
    Clause("5.duplicate-false", "A known id with the identical body returns False and changes nothing "
                                "(a valid duplicate)."),
    Clause("5.same-content", "'Identical body' is judged on the event's values, not on the key order of the "
                             "dict passed in."),
    Clause("5.conflict", "A known id with a different body (sku or qty) raises Conflict."),
    Clause("5.conflict-no-change", "A Conflict changes nothing."),
    Clause("5.one-transaction", "The inbox row and the stock change commit together: whichever write fails, "
                                "neither remains."),
    Clause("5.original-error", "A failure part-way propagates the original error: an sqlite3 error, or a "
                               "KeyboardInterrupt — even one that arrives just after COMMIT or ROLLBACK, when a "
                               "clean-up's own ROLLBACK would fail and replace it."),
    Clause("5.no-transaction-left", "After every call the caller's connection is open and holds no transaction."),
    Clause("5.concurrent-writer", "The inbox lookup and the writes are one BEGIN IMMEDIATE transaction: when "
                                  "another connection applies the same event at any moment (before or between any "
                                  "two of receive's statements), receive returns False or True, never an sqlite3 "
                                  "error, and the event is applied once."),
    Clause("5.locked-propagates", "When another connection holds the write lock past the busy timeout, receive "
                                  "raises sqlite3's OperationalError ('database is locked') and writes nothing: a "
                                  "lock is not a duplicate."),
]

STEP_6 = [
    Clause("6.pending-true", "A pending row is set to sent = 1 and mark_sent returns True."),
    Clause("6.only-that-row", "Only the row with exactly that id changes."),
    Clause("6.already-false", "An already sent row returns False and stays sent."),
    Clause("6.unknown-keyerror", "An id not in the outbox (also one differing only in case, or a pattern) "
                                 "raises KeyError and changes nothing."),
    Clause("6.no-transaction-left", "After every call (a KeyboardInterrupt or an sqlite3 error part-way too) the "
                                    "caller's connection is open and holds no transaction."),
    Clause("6.original-error", "An error or a KeyboardInterrupt part-way propagates as it was raised — even one "
                               "that arrives just after COMMIT or ROLLBACK: mark_sent's clean-up rolls back only "
                               "an open transaction, so its own ROLLBACK never fails and replaces it."),
    Clause("6.concurrent-writer", "mark_sent reads the flag and updates it in its own transaction: when another "
                                  "connection marks the row at any moment (before or between any two of "
                                  "mark_sent's statements), mark_sent returns False (the other marked it) or True "
                                  "(it waited for the other's lock), never an sqlite3 error."),
    Clause("6.locked-propagates", "When another connection holds the write lock past the busy timeout, mark_sent "
                                  "raises sqlite3's OperationalError ('database is locked') and changes nothing."),
]

STEP_7 = [
    Clause("7.limit-range", "limit 1–16 as in step 4, checked before anything is sent: 0, -1, 17 are ValueError."),
    Clause("7.limit-type", "limit is an int, not bool, checked before anything is sent: True, 2.0, '3', None "
                           "are ValueError."),
    Clause("7.batch-size", "The batch is at most limit events: limit 1, 2 and 16 send exactly that many when "
                           "more are pending."),
    Clause("7.batch-order", "The batch is sent in outbox seq order, each event once."),
    Clause("7.batch-unsent", "Only pending rows are sent."),
    Clause("7.read-before-send", "The batch's read is finished before the first send: while send runs, another "
                                 "connection can BEGIN IMMEDIATE and commit a new order."),
    Clause("7.batch-fixed", "Orders accepted while the batch runs are not part of it: they wait for the next call."),
    Clause("7.fresh-copy", "send gets a fresh copy of each event: equal to it, never the selected dict itself."),
    Clause("7.ack-is-true", "Only a return value that `is True` is an ACK; any other (1, 1.0, 'True', [True], "
                            "None, False, an object equal to True…) raises DeliveryError."),
    Clause("7.hook-after-ack", "after_delivery(event_id) runs after a True ACK and before mark_sent, once per "
                               "delivered event, with the id as selected; never for a failed send."),
    Clause("7.marks-acked", "Each acknowledged event's row is marked sent (mark_sent after the hook)."),
    Clause("7.mark-after-ack", "A row is marked only after its ACK: never before or while send runs."),
    Clause("7.mark-as-selected", "mark_sent gets the id as selected, even when the callee changed its copy."),
    Clause("7.stop-on-failure", "The first failure stops the batch: no later event is sent."),
    Clause("7.keep-marked", "Rows marked before a failure stay marked; the failed one and later ones stay pending."),
    Clause("7.send-error-same", "An exception from send propagates unchanged: the same object, whatever its class."),
    Clause("7.returns-count", "dispatch returns how many rows this call marked (0 when nothing is pending)."),
]

STEP_8 = [
    Clause("8.url-type", "url is a str: bytes and None are ValueError."),
    Clause("8.url-scheme", "The scheme is exactly `http`: https, HTTP, Http and ftp are ValueError."),
    Clause("8.url-host-localhost", "HOST `localhost` is accepted, spelled exactly so: LOCALHOST, localhost., "
                                   "localhost.evil, localhos are ValueError."),
    Clause("8.url-host-loopback", "HOST may be any dotted-decimal address in 127.0.0.0/8 (127.0.0.1, "
                                  "127.x.y.z, 127.255.255.255)."),
    Clause("8.url-host-other", "Any other host is ValueError: 0.0.0.0, 128.0.0.1, 126.255.255.255, 10.0.0.1, "
                               "::1, [::1], a name."),
    Clause("8.url-host-spelling", "Loopback written another way is ValueError: 127.1, 0x7f.0.0.1, 2130706433, "
                                  "127.0.0.1., 127.0.0.01, 127.0.0.1.5."),
    Clause("8.url-port", "PORT is required, decimal, 1–65535: missing, empty, 0, 65536, +80, ' 80', -1 and "
                         "non-ASCII digits are ValueError; 65535 is accepted."),
    Clause("8.url-path", "The path is exactly /events: /events/, /Events, //events, /events;x, /events%2f, "
                         "/orders and no path are ValueError."),
    Clause("8.url-userinfo", "No user info: user@, :@, user:pw@ are ValueError."),
    Clause("8.url-query", "No query, not even an empty one ('?')."),
    Clause("8.url-fragment", "No fragment, not even an empty one ('#')."),
    Clause("8.url-whitespace", "Nothing around or inside the URL: a leading space, a final newline, a tab or "
                               "newline inside (urlsplit silently drops those) are ValueError."),
    Clause("8.before-connect", "A refused url or timeout raises before any connection is made."),
    Clause("8.timeout-default", "timeout defaults to 2.0 seconds: send_http(url, event, timeout=2.0)."),
    Clause("8.timeout-type", "timeout is an int or a float, not bool: True, False, '2', None are ValueError."),
    Clause("8.timeout-positive", "timeout is positive: 0, 0.0, -0.0 and -1 are ValueError; an int is accepted."),
    Clause("8.timeout-finite", "timeout is finite: nan, inf and -inf are ValueError."),
    Clause("8.post-canonical", "One POST to /events carrying the canonical body."),
    Clause("8.content-type", "The request says Content-Type: application/json."),
    Clause("8.no-proxy", "Proxy environment variables are ignored."),
    Clause("8.no-redirect", "A redirect (301, 302, 303, 307, 308) is never followed: DeliveryError."),
    Clause("8.status-200", "Only status 200 is success: 201, 202, 203, 204, 300, 304, 400, 404, 409, 500 and "
                           "503 are DeliveryError."),
    Clause("8.ack-exact", "The body is exactly the JSON object {\"ack\": id}: an extra key or no ack key is "
                          "DeliveryError; JSON whitespace around and inside is fine."),
    Clause("8.ack-id", "The ack names exactly this event's id: another id, another case, a prefix, another "
                       "type (7 for '7') are DeliveryError."),
    Clause("8.ack-any-content-type", "The reply's headers are not part of the ACK: a 200 whose body is the ACK is "
                                     "True whatever its Content-Type says (none, text/plain, a charset)."),
    Clause("8.ack-json-object", "A body that is JSON but not an object (true, null, NaN, a list, a string, a "
                                "number) is DeliveryError."),
    Clause("8.ack-not-json", "A body that is not JSON (text, invalid UTF-8, empty) is DeliveryError."),
    Clause("8.ack-size", "A body of at most 1,024 bytes can be an ACK: exactly 1,024 is accepted, 1,025 is "
                         "DeliveryError — with Content-Length, without it, and chunked."),
    Clause("8.ack-read-bounded", "At most 1,025 bytes of the reply are read: a reply that never ends is "
                                 "DeliveryError, not a hang."),
    Clause("8.returns-true", "A verified ACK returns True, the object."),
    Clause("8.network-error", "Network failures propagate as the OSError they are, never DeliveryError: refused, "
                              "closed without a response, reset, timed out."),
    Clause("8.timeout-honoured", "A reply slower than timeout ends in an OSError after about timeout seconds."),
    Clause("8.closes-connection", "Every way out closes the connection: when send_http returns or raises, the "
                                  "server sees it closed."),
]

FINAL = [
    Clause("final.dies-at-hook", "Publisher #1 calls after_delivery after a verified ACK and dies there "
                                 "(exit code 73)."),
    Clause("final.pending-after-crash", "After the crash snack-7 is still pending in the source."),
    Clause("final.applied-before-crash", "After the crash the sink already holds stock 7 and the inbox row."),
    Clause("final.resent-once", "A new process re-sends snack-7: the warehouse sees exactly two POSTs for it, "
                                "applied then duplicate."),
    Clause("final.stock-once", "The final stock is 7: delivered twice, applied once."),
    Clause("final.sent-after-resend", "After the duplicate ACK the row is sent."),
    Clause("final.lost-response-pending", "A response lost after the warehouse's commit: dispatch raises an "
                                          "OSError and the row stays pending."),
    Clause("final.lost-response-redelivered", "The next dispatch gets a duplicate ACK: stock unchanged, row sent."),
    Clause("final.wrong-id-not-delivery", "An ACK naming another id is never taken as delivery."),
    Clause("final.oversized-not-delivery", "An oversized reply is never taken as delivery."),
    Clause("final.redirect-not-delivery", "A redirect is never taken as delivery."),
]

CLAUSES = contract(*STEP_1, *STEP_2, *STEP_3, *STEP_4, *STEP_5, *STEP_6, *STEP_7, *STEP_8, *FINAL)
