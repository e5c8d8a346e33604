"""Lab `vending`: every hint the judge gives, in one place (one text per idea).

Shared hints first, then step 1's per-clause hints and step 4's (tables keyed by clause ID,
also used for the counterexamples of the property tests), then the hints of single steps.
"""

BOOL_HINT = "`True` is an `int` in Python (`isinstance(True, int)` is True): test `type(x) is int`."

ORDER_HINT = ("The contract's order, in one transaction: insert the ledger row, update the total, "
              "call fault(), update last, COMMIT.")

CURSOR_HINT = ("Update the cursor (`last`) after fault(), in the same transaction as the ledger row "
               "and the total: a cursor saved ahead of its total says 'done' for work that was undone.")

ACK_AFTER_COMMIT = ("The ACK tells the feed 'saved, forget it': write it only after consume_line returned, "
                   "that is after COMMIT, and after before_ack(seq).")

CLOSE_HINT = ("Put `writer.close()` and a bounded `wait_closed()` in a `finally:` around the whole "
              "session, so it runs on success, on error and on cancellation.")

ABORT_HINT = ("If the bounded `wait_closed()` raises TimeoutError or ConnectionError, call "
              "`writer.transport.abort()` and carry on: catch it inside the `finally`, so the "
              "original error is not masked.")

TIMEOUT_HINT = "timeout is a positive, finite int or float (not bool): anything else is ValueError."

READ_HINT = "Bound every read: `await asyncio.wait_for(reader.readline(), timeout)`."

DB_CLOSE_HINT = ("Close the DB connection on every path: open_store, then `try: ... finally: "
                 "con.close()` around everything after it.")

SOCKET_HINT = ("If anything fails before consume_session takes over, close the writer yourself "
               "(`writer.close()` in an `except BaseException:` before re-raising).")

SHIELD_HINT = ("Let the cancellation reach the connect: `await asyncio.wait_for(asyncio.open_connection(...), "
               "timeout)`, no `asyncio.shield` around it. A cancelled connect opens nothing; a shielded one opens "
               "a socket later that nobody closes.")

LF_HINT = ("A frame without its final LF is torn: the feed may have died mid-line. "
           "Check `line.endswith(b\"\\n\")` before you strip anything.")

STRIP_HINT = ("Check that the frame is complete *before* stripping: `line[:-1]` cuts a byte without "
              "looking, and `rstrip()`/`strip()` eat a second LF or trailing blanks. Test "
              "`line.endswith(b\"\\n\")` and the count of LFs first, then drop exactly one byte.")

CRLF_HINT = ("CRLF is not this feed's line ending: exactly one LF ends a frame, and a `\\r` anywhere "
             "is an error. (`strip()`, `splitlines()` and `str.split()` hide it.)")

ONE_FRAME_HINT = ("One frame is one line: exactly one LF, as its last byte, and at most 64 bytes in all. "
                 "`re`'s `$` also matches just before a final LF, so `\\n$` lets an extra LF through (use "
                 "`fullmatch` or `\\Z`), and `rstrip(b\"\\n\")` eats every trailing LF, not one.")

ZERO_HINT = ("No leading zeros: `int(b\"07\")` is 7, so check the digits yourself "
             "(only the number `0` itself may start with 0).")

SPACE_HINT = ("Fields are separated by exactly one space: `split()` with no argument splits on any run of "
              "whitespace (tabs, form feeds, CRs…), and `int()` ignores blanks around a number; split on "
              "`b\" \"` exactly and look at every byte.")

ASCII_HINT = ("Only ASCII: once decoded, `int()`, `isdigit()` and the regex `\\d` accept digits of other "
              "scripts. Keep the line as bytes and match `[0-9]`, or check `line.isascii()`.")

DIGITS_HINT = ("A number is ASCII digits (delta: an optional `-` first) and nothing else: `int()` also "
               "accepts `_` between digits, blanks around them, and more; check the characters yourself.")

KEYWORD_HINT = "The frame starts with exactly `EVENT` (capitals, nothing before it, one space after it)."

FIELDS_HINT = "Exactly two numbers follow `EVENT`: seq, then delta."

TYPE_HINT = "Only `bytes` are frames: test `type(line) is bytes`; refuse a str, bytearray or None, don't convert."

PLUS_HINT = "No `+` sign: `int()` accepts one, the frame format does not."

MINUS_ZERO_HINT = "`-0` is refused: zero has one spelling, `0`. A pattern like `-?[0-9]+` lets it through."

SEQ_RANGE_HINT = "seq ranges from 0 to 2147483647, both included: no sign, at most that value."

DELTA_RANGE_HINT = "delta ranges from -1000 to 1000, both included."

RESULT_HINT = "Return a tuple of two ints: `(seq, delta)`."

RANGE_HINT = "seq ranges from 0 to 2147483647, delta from -1000 to 1000, both ends included."

CLAUSE_HINTS = {
    "1.bytes-only": TYPE_HINT, "1.keyword": KEYWORD_HINT, "1.single-space": SPACE_HINT,
    "1.two-fields": FIELDS_HINT, "1.final-lf": LF_HINT, "1.complete-before-strip": STRIP_HINT,
    "1.no-crlf": CRLF_HINT, "1.one-frame": ONE_FRAME_HINT, "1.ascii": ASCII_HINT, "1.digits": DIGITS_HINT,
    "1.no-leading-zero": ZERO_HINT, "1.no-plus": PLUS_HINT, "1.no-minus-zero": MINUS_ZERO_HINT,
    "1.seq-range": SEQ_RANGE_HINT, "1.delta-range": DELTA_RANGE_HINT, "1.result": RESULT_HINT,
}

KEEP_HINT = ("Create the tables only if missing (`CREATE TABLE IF NOT EXISTS`) and the checkpoint row "
             "only if missing (`INSERT OR IGNORE`): never drop, clear or reset a saved store. "
             "Resetting the cursor turns a reconnect into reprocessing from the start.")

PART_HINT = ("Create every table that is missing, each on its own (`CREATE TABLE IF NOT EXISTS` for each): a file "
             "may hold some of them (a crash during set-up, an older program). Finding one table is no proof "
             "that the others exist.")

READ_ONLY_HINT = ("state only reads: a plain SELECT sees what is committed even while another connection is in "
                 "the middle of a write. Wrapping it in `BEGIN IMMEDIATE` makes it wait for every writer, and "
                 "fail with 'database is locked' after the busy timeout.")

PASS_FAULT_HINT = ("Pass `fault` on to apply_event: consume_line(con, line, fault) → "
                  "apply_event(con, seq, delta, fault).")

RESYNC_HINT = ("A log starting at 10 joins a cursor at 9, but a cursor at 8 is missing 9: "
               "raise ResyncRequired when last < first_seq - 1.")

REPLAY_HINTS = {
    "4.events-list": "events is a list of 1 to 128 (seq, delta) tuples: anything else is ValueError.",
    "4.event-shape": "Each event is a tuple of exactly two ints (`type(x) is int`: not bool, not float).",
    "4.event-ranges": RANGE_HINT,
    "4.consecutive": "Each seq is the previous + 1, all the way to the last event.",
    "4.last-range": "last is an int (not bool) from -1 to 2147483647.",
    "4.limit-range": "limit is an int (not bool) from 1 to 16.",
    "4.last-past-final": "last greater than the final seq is ValueError; equal to it, the answer is [].",
    "4.resync": RESYNC_HINT,
    "4.limit": "At most `limit` entries.",
    "4.after-last": "Entries with seq > last, in order, as a new list.",
}
