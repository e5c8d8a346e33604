"""Lab `vending` — the snack machine that stops before the ACK (contract: labs/vending.md).

One check per contract step, then the crash check. Each check prepares real SQLite files
with the judge's own connections (and, for steps 6, 7 and final, the judge's own TCP event
feed), lets a child process run the student's `client.py` (see `vending_probes.py`), and
compares what the child reports with what the judge then observes: the DB files, the
feed's journal (every RESUME, line sent and ACK received) and the exit codes.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

from checks.outbox import schema as stores
from checks.vending import interference, oracle
from checks.vending.contract import CLAUSES
from checks.vending.feed_server import Feed, start_feed
from checks.vending.witness import FaultWitness
from labkit.judge.differential import after_fixed, differential
from labkit.judge.expect import (
    SKELETON_HINT,
    TRANSACTION_HINT,
    Miss,
    Plan,
    both,
    describe,
    import_problem,
    is_module_exception,
    outcome_hint,
    raises,
    returns,
    under,
    value_of,
)
from labkit.judge.hooks import KILLED_TEXT, run_to_hook
from labkit.judge.ports import refusing_port
from labkit.judge.processes import held_files, held_sockets
from labkit.judge.run import StepContext, lab_spec
from labkit.judge.served import served
from labkit.judge.verdict import Case, Outcome
from labkit.values import decode, encode, same, show

SEQ_MAX = 2_147_483_647

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


# --- shared helpers ------------------------------------------------------------------------


def unchanged_input(record: dict) -> Miss | None:
    if record["observed"].get("input_changed"):
        return Miss("the list passed in was modified",
                   "Never modify the input: the caller's log is still theirs. Build a new list.",
                   clause="4.no-mutation")
    return None


def close_feeds(feeds: list[Feed]) -> None:
    """Close every feed at once (each close joins its threads)."""
    if feeds:
        with ThreadPoolExecutor(max_workers=len(feeds)) as pool:
            list(pool.map(lambda feed: feed.close(), feeds))


def acks_on(journal: list[dict]) -> list[int]:
    return [e["seq"] for e in journal if e["kind"] == "ack"]


def sent_on(journal: list[dict]) -> list[int]:
    return [e["seq"] for e in journal if e["kind"] == "sent"]


def resumes_on(journal: list[dict]) -> list[int]:
    return [e["last"] for e in journal if e["kind"] == "resume"]


def deltas(rng: random.Random, n: int, start: int = 0) -> list[int]:
    """Random non-zero deltas, so counting one twice always shows in the total.

    A stock that goes in and out: applied in order from a total of `start`, the running total
    never drops below zero (a snack machine with thousands of snacks below zero reads as a bug
    in the course). The contract's negative bounds have cases of their own."""
    values, total = [], start
    for _ in range(n):
        if total >= 1 and rng.random() < 0.5:
            delta = -rng.randint(1, min(1000, total))
        else:
            delta = rng.randint(1, 1000)
        values.append(delta)
        total += delta
    return values


def distinct_history(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """Events 0..n-1 whose total differs from the last seq, so (total, last) swapped always shows."""
    values = deltas(rng, n)
    while sum(values) == n - 1:  # rare: draw again rather than bend the walk below zero
        values = deltas(rng, n)
    return list(enumerate(values))


# --- the judge's own view of a store (the contract's schema) ------------------------------

STORE_SCHEMA = """
CREATE TABLE checkpoint(id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL,
    total INTEGER NOT NULL);
CREATE TABLE ledger(seq INTEGER PRIMARY KEY, delta INTEGER NOT NULL);
"""
STORE_COLUMNS = {
    "checkpoint": [("id", "INTEGER", 0, 1), ("last", "INTEGER", 1, 0), ("total", "INTEGER", 1, 0)],
    "ledger": [("seq", "INTEGER", 0, 1), ("delta", "INTEGER", 1, 0)],
}


def make_store(path: Path, applied: list[tuple[int, int]] = ()) -> Path:
    """A store as a correct client would have left it after applying `applied`."""
    with closing(stores.connect(path)) as con:
        con.execute("PRAGMA synchronous = OFF")  # a temp seed file: no fsync, other processes still see it
        con.execute("BEGIN")
        for statement in STORE_SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        con.executemany("INSERT INTO ledger(seq, delta) VALUES (?, ?)", list(applied))
        last = applied[-1][0] if applied else -1
        con.execute("INSERT INTO checkpoint VALUES (1, ?, ?)", (last, sum(d for _, d in applied)))
        con.execute("COMMIT")
    return path


def snapshot(path: Path) -> dict | None:
    """last, total and the ledger, read through the judge's own connection."""
    if not Path(path).exists():
        return None
    try:
        row = stores.rows(path, "SELECT last, total FROM checkpoint WHERE id = 1")
        ledger = stores.rows(path, "SELECT seq, delta FROM ledger ORDER BY seq")
    except sqlite3.Error:
        return None
    if not row:
        return None
    return {"last": row[0][0], "total": row[0][1], "ledger": [list(r) for r in ledger]}


def shown(snap: dict | None) -> str:
    if snap is None:
        return "no readable store"
    seqs = [s for s, _ in snap["ledger"]]
    ledger = "empty" if not seqs else (f"seqs {seqs[0]}–{seqs[-1]}" if seqs == list(range(seqs[0], seqs[-1] + 1))
                                      else f"seqs {seqs}")
    return f"last {snap['last']}, total {snap['total']}, ledger {ledger}"


def state_after(expected: dict, hint: str):
    """The store, as the judge's own connection read it right after the call returned, is `expected`."""

    def check(record: dict) -> Miss | None:
        have = judged(record).get("after")
        if have is None:
            return Miss("the store could not be read afterwards", hint)
        if (have["last"], have["total"], have["ledger"]) != (expected["last"], expected["total"], expected["ledger"]):
            return Miss(f"right after the call the judge read {shown(have)}; expected {shown(expected)}", hint)
        return None

    return check


def judge_reads(path: Path, expected: dict, hint: str):
    """The judge's own connection, after the child has ended, sees `expected`."""

    def check(record: dict) -> Miss | None:
        have = snapshot(path)
        if have != expected:
            return Miss(f"the judge then read {shown(have)}; expected {shown(expected)}", hint)
        return None

    return check


def no_open_transaction(record: dict) -> Miss | None:
    """No write lock left (the judge's own BEGIN IMMEDIATE succeeded right after the call) and no
    transaction open on the connection the call was given (a deferred BEGIN holds no lock yet)."""
    if judged(record).get("can_write") is False:
        return Miss("right after the call the judge could not BEGIN IMMEDIATE: a write lock was still held",
                   TRANSACTION_HINT)
    if record["observed"].get("in_transaction"):
        return Miss("the call returned with a transaction still open", TRANSACTION_HINT)
    return None


# --- the judge's own observations between two served cases ---------------------------------


def judged(record: dict) -> dict:
    """What the judge itself observed around a case (never what the child reported)."""
    return record["observed"].get("judge") or {}


def can_write(path: Path) -> bool:
    """Can the judge enter a write transaction on `path` right now? (A real lock test.)"""
    with closing(stores.connect(path, 0.05)) as con:  # refuses a link or FIFO in place of the file
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        con.execute("ROLLBACK")
        return True


def store_state(applied: list[tuple[int, int]]) -> dict:
    return {"last": applied[-1][0] if applied else -1, "total": sum(d for _, d in applied),
            "ledger": [list(e) for e in applied]}


# --- step 1 -------------------------------------------------------------------------------

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

# Every way a line can be refused, each tried in every run: (case name, line, clauses). The
# first clause is the rule the oracle names for that line; a second one is the mistake it
# also catches.
WHITESPACE = (("a tab", b"\t"), ("a vertical tab", b"\x0b"), ("a form feed", b"\x0c"),
              ("two spaces", b"  "), ("an ASCII file separator (str.split() splits on it)", b"\x1c"))
REFUSED_LINES: list[tuple[str, object, tuple[str, ...]]] = [
    ("a str, not bytes", "EVENT 7 5\n", ("1.bytes-only",)),
    ("a bytearray", bytearray(b"EVENT 7 5\n"), ("1.bytes-only",)),
    ("None", None, ("1.bytes-only",)),
    ("an int", 7, ("1.bytes-only",)),
    ("lower-case keyword", b"event 7 5\n", ("1.keyword",)),
    ("capitalised keyword", b"Event 7 5\n", ("1.keyword",)),
    ("keyword EVENTS", b"EVENTS 7 5\n", ("1.keyword",)),
    ("keyword EVEN", b"EVEN 7 5\n", ("1.keyword",)),
    ("a byte before the keyword", b"XEVENT 7 5\n", ("1.keyword",)),
    ("no space after the keyword", b"EVENT7 5\n", ("1.keyword",)),
    ("no keyword", b"7 5\n", ("1.keyword",)),
    ("an empty line (a lone LF)", b"\n", ("1.keyword",)),
    *[(f"{name} after the keyword", b"EVENT" + blank + b"7 5\n", ("1.single-space",))
      for name, blank in WHITESPACE],
    *[(f"{name} between seq and delta", b"EVENT 7" + blank + b"5\n", ("1.single-space",))
      for name, blank in WHITESPACE],
    ("a space at the start", b" EVENT 7 5\n", ("1.single-space",)),
    ("a tab at the start", b"\tEVENT 7 5\n", ("1.single-space",)),
    ("a space before the LF", b"EVENT 7 5 \n", ("1.single-space", "1.complete-before-strip")),
    ("a tab before the LF", b"EVENT 7 5\t\n", ("1.single-space", "1.complete-before-strip")),
    ("a form feed before the LF", b"EVENT 7 5\x0c\n", ("1.single-space", "1.complete-before-strip")),
    ("no delta", b"EVENT 7\n", ("1.two-fields",)),
    ("no numbers", b"EVENT\n", ("1.two-fields",)),
    ("a third number", b"EVENT 7 5 9\n", ("1.two-fields",)),
    ("an empty line (no bytes at all)", b"", ("1.final-lf",)),
    ("a torn frame (no final LF)", b"EVENT 7 5", ("1.final-lf",)),
    ("a torn frame whose last byte looks like an LF's place (EVENT 7 55)", b"EVENT 7 55",
     ("1.final-lf", "1.complete-before-strip")),
    ("a torn frame cut after a digit (EVENT 70 50)", b"EVENT 70 50", ("1.final-lf", "1.complete-before-strip")),
    ("a frame ending in CRLF", b"EVENT 7 5\r\n", ("1.no-crlf",)),
    ("a frame ending in CR", b"EVENT 7 5\r", ("1.no-crlf", "1.complete-before-strip")),
    ("a CR between seq and delta", b"EVENT 7\r5\n", ("1.no-crlf",)),
    ("a frame ending in CR CR LF", b"EVENT 7 5\r\r\n", ("1.no-crlf",)),
    ("two frames in one line", b"EVENT 7 5\nEVENT 8 1\n", ("1.one-frame",)),
    ("an LF in the middle", b"EVENT 7\n5\n", ("1.one-frame",)),
    ("an empty line after the frame (LF LF)", b"EVENT 7 5\n\n", ("1.one-frame", "1.complete-before-strip")),
    ("a 63-byte line of leading zeros", b"EVENT 7 " + b"0" * 53 + b"5\n", ("1.no-leading-zero",)),
    ("a 64-byte line (the limit) of leading zeros", b"EVENT 7 " + b"0" * 54 + b"5\n", ("1.no-leading-zero",)),
    ("a 65-byte line of leading zeros", b"EVENT 7 " + b"0" * 55 + b"5\n", ("1.one-frame", "1.no-leading-zero")),
    ("a 65-byte line of digits", b"EVENT 7 " + b"1" * 56 + b"\n", ("1.one-frame", "1.delta-range")),
    ("a 1000-byte line", b"EVENT 7 " + b"1" * 991 + b"\n", ("1.one-frame", "1.delta-range")),
    ("fullwidth digits", "EVENT ７ 5\n".encode(), ("1.ascii",)),
    ("Arabic-Indic digits", "EVENT 7 ٥\n".encode(), ("1.ascii",)),
    ("Devanagari digits", "EVENT ७ 5\n".encode(), ("1.ascii",)),
    ("a superscript two", "EVENT 7 ²\n".encode(), ("1.ascii",)),
    ("a Latin-1 byte", b"EVENT 7 5\xa0\n", ("1.ascii",)),
    ("a UTF-8 no-break space between the fields", "EVENT\u00a07 5\n".encode(), ("1.ascii",)),
    ("a UTF-8 next-line character before the LF", "EVENT 7 5\u0085\n".encode(), ("1.ascii",)),
    ("an underscore in seq", b"EVENT 1_000 5\n", ("1.digits",)),
    ("an underscore in delta", b"EVENT 7 1_0\n", ("1.digits",)),
    ("a hexadecimal seq", b"EVENT 0x1 5\n", ("1.digits",)),
    ("a decimal point", b"EVENT 7 5.0\n", ("1.digits",)),
    ("an exponent", b"EVENT 7 5e2\n", ("1.digits",)),
    ("a lone minus", b"EVENT 7 -\n", ("1.digits",)),
    ("two minus signs", b"EVENT 7 --5\n", ("1.digits",)),
    ("a trailing minus", b"EVENT 7 5-\n", ("1.digits",)),
    ("a word for a number", b"EVENT seven 5\n", ("1.digits",)),
    ("a NUL byte after delta", b"EVENT 7 5\x00\n", ("1.digits",)),
    ("seq with a leading zero", b"EVENT 07 5\n", ("1.no-leading-zero",)),
    ("seq 00", b"EVENT 00 5\n", ("1.no-leading-zero",)),
    ("delta 00", b"EVENT 7 00\n", ("1.no-leading-zero",)),
    ("delta with a leading zero", b"EVENT 7 -05\n", ("1.no-leading-zero",)),
    ("delta with two leading zeros", b"EVENT 7 007\n", ("1.no-leading-zero",)),
    ("seq with a + sign", b"EVENT +7 5\n", ("1.no-plus",)),
    ("delta with a + sign", b"EVENT 7 +5\n", ("1.no-plus",)),
    ("delta +0", b"EVENT 7 +0\n", ("1.no-plus",)),
    ("delta -0", b"EVENT 7 -0\n", ("1.no-minus-zero",)),
    ("delta -00", b"EVENT 7 -00\n", ("1.no-minus-zero",)),
    ("seq -1", b"EVENT -1 5\n", ("1.seq-range",)),
    ("seq -0", b"EVENT -0 5\n", ("1.seq-range",)),
    ("seq 2147483648 (one past the largest)", b"EVENT 2147483648 5\n", ("1.seq-range",)),
    ("seq 10000000000 (eleven digits)", b"EVENT 10000000000 5\n", ("1.seq-range",)),
    ("delta 1001 (one past the largest)", b"EVENT 7 1001\n", ("1.delta-range",)),
    ("delta -1001 (one past the smallest)", b"EVENT 7 -1001\n", ("1.delta-range",)),
    ("delta 99999", b"EVENT 7 99999\n", ("1.delta-range",)),
]


def accepted_lines(rng: random.Random) -> list[tuple[str, bytes, tuple[int, int], tuple[str, ...]]]:
    """Frames that must parse: every bound, then a few drawn at random (added, never instead). The
    drawn ones stay off the bounds, which fixed cases try in every run: a mistake at a bound is
    then caught by the same cases under every seed."""
    seq, delta = rng.randint(11, SEQ_MAX - 1), rng.randint(11, 999)
    short = rng.randint(1, 9)
    return [
        ("a plain frame", b"EVENT 7 5\n", (7, 5), ("1.result",)),
        ("seq 0 and delta 0", b"EVENT 0 0\n", (0, 0), ("1.no-leading-zero",)),
        ("seq 0 (the smallest)", b"EVENT 0 5\n", (0, 5), ("1.seq-range",)),
        ("seq 2147483647 (the largest)", b"EVENT 2147483647 5\n", (SEQ_MAX, 5), ("1.seq-range",)),
        ("delta -1000 (the smallest)", b"EVENT 7 -1000\n", (7, -1000), ("1.delta-range",)),
        ("delta 1000 (the largest)", b"EVENT 7 1000\n", (7, 1000), ("1.delta-range",)),
        ("delta -1", b"EVENT 7 -1\n", (7, -1), ("1.result",)),
        ("seq 10 and delta -10 (a 0 after the first digit)", b"EVENT 10 -10\n", (10, -10), ("1.no-leading-zero",)),
        ("the longest frame (23 bytes)", b"EVENT 2147483647 -1000\n", (SEQ_MAX, -1000), ("1.one-frame",)),
        ("a random frame", b"EVENT %d %d\n" % (seq, delta), (seq, delta), ("1.result",)),
        ("a random negative delta", b"EVENT %d -%d\n" % (seq // 7, delta), (seq // 7, -delta), ("1.result",)),
        ("a random one-digit frame", b"EVENT %d %d\n" % (short, short), (short, short), ("1.result",)),
    ]


def check_parse(ctx: StepContext) -> list[Case]:
    plans, values = [], []
    for label, line, expected, clauses in accepted_lines(ctx.rng):
        plans.append(Plan(label, f"parse_line({show(line)})", show(expected),
                         returns(expected, CLAUSE_HINTS[clauses[0]] if clauses[0] != "1.result" else RESULT_HINT),
                         clauses=clauses))
        values.append(line)
    for label, line, clauses in REFUSED_LINES:
        hint = CLAUSE_HINTS[clauses[0]]
        plans.append(Plan(label, f"parse_line({show(line)})", "ValueError", raises("ValueError", hint), hint,
                         clauses=clauses))
        values.append(line)
    specs = [{"name": p.name, "fn": "parse_line", "args": [encode(v)]} for p, v in zip(plans, values, strict=True)]
    name = "parse_line agrees with the contract on generated lines"
    return after_fixed(ctx.cases("calls", plans, {"calls": specs}, probes="labkit.probe"), name,
                      "parse_line on generated lines", lambda: differential(
        ctx, "parse_line", oracle.frames(), oracle.parse_line,
        lambda line: (oracle.line_clause(line), CLAUSE_HINTS[oracle.line_clause(line)]),
        clauses=tuple(CLAUSE_HINTS), name=name))


# --- step 2 -------------------------------------------------------------------------------

KEEP_HINT = ("Create the tables only if missing (`CREATE TABLE IF NOT EXISTS`) and the checkpoint row "
             "only if missing (`INSERT OR IGNORE`): never drop, clear or reset a saved store. "
             "Resetting the cursor turns a reconnect into reprocessing from the start.")


def _schema_miss(path: Path) -> Miss | None:
    have = stores.tables(path)
    for table, cols in STORE_COLUMNS.items():
        if table not in have:
            return Miss(f"no table '{table}'", f"Create `{table}` exactly as the contract says.")
        got = [(c[0], c[1].upper(), 1 if c[2] else 0, 1 if c[4] else 0) for c in stores.columns(path, table)]
        if got != cols:
            return Miss(f"{table} has columns (name, type, not null, primary key) {got}",
                       f"Use the contract's columns for `{table}`: {cols}.")
    with closing(stores.connect(path)) as con:
        con.execute("BEGIN")
        try:
            con.execute("INSERT INTO checkpoint VALUES (2, 0, 0)")
            return Miss("checkpoint accepted a row with id 2",
                       "`id INTEGER PRIMARY KEY CHECK(id=1)`: there is exactly one checkpoint row.")
        except sqlite3.IntegrityError:
            return None
        finally:
            con.execute("ROLLBACK")


def check_store(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    new, empty, garbage, misshapen = (ctx.path(n) for n in ("new.db", "empty.db", "not-a-db.db", "misshapen.db"))
    history = distinct_history(rng, rng.randint(3, 6))
    saved = make_store(ctx.path("saved.db"), history)
    before = stores.fingerprint(saved)
    rowless = make_store(ctx.path("rowless.db"), history[:2])
    stores.execute(rowless, "DELETE FROM checkpoint")
    rowless_before = stores.rows(rowless, "SELECT seq, delta FROM ledger ORDER BY seq")
    fresh = make_store(ctx.path("fresh.db"))
    state_saved = make_store(ctx.path("state-saved.db"), history)  # apart: an open case may have wiped `saved`
    state_busy = make_store(ctx.path("state-busy.db"), history)
    # Set-up met half done (a crash during it, an older program): every part of the schema alone.
    only_checkpoint = make_store(ctx.path("only-checkpoint.db"), history)
    stores.execute(only_checkpoint, "DROP TABLE ledger")
    only_ledger = make_store(ctx.path("only-ledger.db"), history[:2])
    stores.execute(only_ledger, "DROP TABLE checkpoint")
    empty.write_bytes(b"")
    garbage.write_bytes(b"this is not a database, just text\n" * 64)
    stores.execute(misshapen, "CREATE TABLE checkpoint(id INTEGER PRIMARY KEY, last INTEGER NOT NULL);")

    opened = both(
        under("2.connection", returned_connection),
        under("2.autocommit", lambda r: None if r["observed"].get("isolation_level") == encode(None) else Miss(
            f"isolation_level is {show(decode(r['observed'].get('isolation_level', encode(''))))}",
            "Connect with `isolation_level=None`: the default opens hidden transactions.")),
        under("2.busy-timeout", lambda r: None if r["observed"].get("busy_timeout") == 1000 else Miss(
            f"the busy timeout is {r['observed'].get('busy_timeout')} ms",
            "Pass `timeout=1.0` to sqlite3.connect (a 1 s busy timeout).")),
        under("2.no-open-transaction", lambda r: None if judged(r).get("can_write") is not False else Miss(
            "right after open_store returned, the judge could not BEGIN IMMEDIATE: a write lock was still held",
            TRANSACTION_HINT)),
        under("2.no-open-transaction", lambda r: None if not r["observed"].get("in_transaction") else Miss(
            "open_store returned with a transaction still open", TRANSACTION_HINT)),
    )

    def initial_row(path: Path, hint: str):
        def check(record: dict) -> Miss | None:
            miss = under("2.schema", lambda _: _schema_miss(path))(record)
            if miss is not None:
                return miss
            rows = stores.rows(path, "SELECT id, last, total FROM checkpoint")
            if rows != [(1, -1, 0)]:
                return Miss(f"checkpoint holds {show_rows(rows)}", hint, clause="2.initial-row")
            return None

        return check

    def unchanged(path: Path, fingerprint: list, what: str):
        def check(record: dict) -> Miss | None:
            if stores.fingerprint(path) != fingerprint:
                return Miss(f"the saved store changed: before {what}; after {shown(snapshot(path))}", KEEP_HINT)
            return None

        return under("2.keep-saved", check)

    def ledger_kept(record: dict) -> Miss | None:
        now = stores.rows(rowless, "SELECT seq, delta FROM ledger ORDER BY seq")
        if now != rowless_before:
            return Miss(f"the ledger changed from {show_rows(rowless_before)} to {show_rows(now)}", KEEP_HINT)
        return None

    expected_saved = (history[-1][0], sum(d for _, d in history))
    tuple_hint = "Return a tuple `(last, total)` read from the checkpoint row."
    row_hint = "Insert the row (1, -1, 0) when it is missing, and only then (`INSERT OR IGNORE`)."
    plans = [
        Plan("open_store on a new file", "open_store(new file)",
             "a connection (isolation_level None, 1 s busy timeout); tables checkpoint and ledger; row (1, -1, 0)",
             both(opened, initial_row(new, row_hint)),
             clauses=("2.connection", "2.autocommit", "2.busy-timeout", "2.schema", "2.initial-row")),
        Plan("open_store on the same file again", "open_store(that file) again",
             "a connection; still exactly one checkpoint row (1, -1, 0)",
             both(under("2.create-if-missing", returned_connection),
                 under("2.create-if-missing", initial_row(new, KEEP_HINT))),
             clauses=("2.create-if-missing",)),
        Plan("open_store on an existing empty file", "open_store(a file of 0 bytes)",
             "a connection; tables checkpoint and ledger created; row (1, -1, 0)",
             both(opened, retag("2.create-if-missing", initial_row(empty, ""), (
                 "Create the tables whenever they are missing, also in a file that already exists: "
                 "`CREATE TABLE IF NOT EXISTS`, not a check of `os.path.exists`."))),
             clauses=("2.create-if-missing",)),
        Plan("open_store on a store saved by another process", "open_store(saved store) in a new process",
             f"a connection; the cursor still {expected_saved[0]}, every row unchanged",
             both(opened, unchanged(saved, before, f"last {expected_saved[0]}, total {expected_saved[1]}")),
             clauses=("2.keep-saved",)),
        Plan("open_store on a store whose checkpoint row is missing",
             f"open_store(a store with ledger rows {show_rows(rowless_before)} and no checkpoint row)",
             "a connection; the row (1, -1, 0) inserted; the ledger unchanged",
             both(opened, under("2.initial-row", initial_row(rowless, row_hint)),
                 under("2.keep-saved", ledger_kept)),
             clauses=("2.initial-row", "2.keep-saved")),
        Plan("open_store on a file that is not a database", "open_store(text file)",
             "sqlite3.DatabaseError; the connection closed", closed_after_failure, clauses=("2.init-failure",)),
        Plan("open_store on a store whose checkpoint table has the wrong columns",
             "open_store(a store holding checkpoint(id, last), empty)",
             "sqlite3's own error (inserting the row fails); the connection closed",
             closed_after_failure, clauses=("2.init-failure",)),
        Plan("open_store on a file holding only the checkpoint table",
             f"open_store(a store saved at last {expected_saved[0]} whose ledger table is missing)",
             f"a connection; table ledger created; the checkpoint row still ({expected_saved[0]}, "
             f"{expected_saved[1]})",
             both(opened, retag("2.create-if-missing", lambda r: _schema_miss(only_checkpoint), PART_HINT),
                 under("2.keep-saved", lambda r: None if stores.rows(
                     only_checkpoint, "SELECT id, last, total FROM checkpoint") == [(1, *expected_saved)] else Miss(
                     f"the saved store changed: before last {expected_saved[0]}, total {expected_saved[1]}; after "
                     f"{shown(snapshot(only_checkpoint))}", KEEP_HINT))),
             clauses=("2.create-if-missing", "2.keep-saved")),
        Plan("open_store on a file holding only the ledger table",
             f"open_store(a store with ledger rows {show_rows(history[:2])} whose checkpoint table is missing)",
             "a connection; table checkpoint created with the row (1, -1, 0); the ledger unchanged",
             both(opened, retag("2.create-if-missing", initial_row(only_ledger, row_hint), PART_HINT),
                 under("2.keep-saved", lambda r: None if (now := stores.rows(
                     only_ledger, "SELECT seq, delta FROM ledger ORDER BY seq")) == history[:2] else Miss(
                     f"the ledger changed from {show_rows(history[:2])} to {show_rows(now)}", KEEP_HINT))),
             clauses=("2.create-if-missing", "2.keep-saved")),
        Plan("state of a new store", "state(con) on a store holding (1, -1, 0)", "(-1, 0)",
             both(under("2.state", returns((-1, 0), tuple_hint)),
                 under("2.no-open-transaction", no_open_transaction)),
             clauses=("2.state", "2.no-open-transaction")),
        Plan("state of a saved store", f"state(con) on a store saved at last {expected_saved[0]}",
             show(expected_saved), both(under("2.state", returns(expected_saved, tuple_hint)),
                                       under("2.no-open-transaction", no_open_transaction)),
             clauses=("2.state", "2.no-open-transaction")),
        Plan("state while another connection is writing",
             f"state(con) on a store saved at last {expected_saved[0]}, while another connection is in the middle "
             "of a write transaction", f"{show(expected_saved)} at once (what is committed)",
             under("2.state", returns(expected_saved, READ_ONLY_HINT)), READ_ONLY_HINT, clauses=("2.state",)),
    ]
    opens = [new, new, empty, saved, rowless, garbage, misshapen, only_checkpoint, only_ledger]
    states = [{"path": str(fresh)}, {"path": str(state_saved)}, {"path": str(state_busy), "held": True}]
    return (served(ctx, "open", plans[:9], [{"path": str(path)} for path in opens], observe_store)
            + served(ctx, "state", plans[9:], states, observe_store))


PART_HINT = ("Create every table that is missing, each on its own (`CREATE TABLE IF NOT EXISTS` for each): a file "
             "may hold some of them (a crash during set-up, an older program). Finding one table is no proof "
             "that the others exist.")
READ_ONLY_HINT = ("state only reads: a plain SELECT sees what is committed even while another connection is in "
                 "the middle of a write. Wrapping it in `BEGIN IMMEDIATE` makes it wait for every writer, and "
                 "fail with 'database is locked' after the busy timeout.")


def observe_store(pid: int, spec: dict) -> dict:
    """After a call on a store: does the child still hold the file open, can the judge write it,
    and what does the judge's own connection read there?"""
    path = Path(spec.get("path") or spec["db"])
    try:
        writable = can_write(path)
    except sqlite3.DatabaseError:  # not a database at all
        writable = None
    return {"holds_file": os.path.realpath(path) in held_files(pid), "can_write": writable,
            "after": snapshot(path)}


def look_mid_transaction(path: Path) -> dict:
    """While fault() waits: is the store write-locked, and what is committed? (The judge's own
    connections; `checks/vending/witness.py` calls this.)"""
    try:
        locked = not can_write(path)
    except sqlite3.DatabaseError:
        locked = None
    return {"write_locked": locked, "outside": snapshot(path)}


def served_with_witness(ctx: StepContext, plans: list[Plan], specs: list[dict]) -> list[Case]:
    """Store calls whose fault() is watched from the judge's side while it runs."""
    with FaultWitness([Path(s["db"]) for s in specs], look_mid_transaction) as witness:
        for spec in specs:
            spec["witness"] = witness.address
        return served(ctx, "call", plans, specs, lambda pid, spec: (
            interference.observe_sweep(spec, snapshot, can_write) if spec.get("kind") == "sweep"
            else {**observe_store(pid, spec), "faults": witness.calls(spec["db"])}))


def closed_after_failure(record: dict) -> Miss | None:
    """Initialisation failed: sqlite3's own error, and no connection to the file left open."""
    miss = raises("DatabaseError", "Let sqlite3's own error propagate (a bare `raise` after closing).")(record)
    if miss is not None:
        return miss
    hint = "If initialisation fails, close the connection, then re-raise the original error."
    if judged(record).get("holds_file"):
        return Miss("raised, but the connection to the file was left open (the judge saw the process still "
                   "holding the file)", hint)
    if record["observed"].get("left_open"):
        return Miss("raised, but the connection to the file was left open", hint)
    return None


def retag(clause: str, check, hint: str = ""):
    """`check`, with every miss it finds attributed to `clause` (even one a sub-check named), and
    told with `hint` when given."""

    def tagged(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None:
            miss.clause = clause
            miss.hint = hint or miss.hint
        return miss

    return tagged


def returned_connection(record: dict) -> Miss | None:
    outcome, seen = record["outcome"], record["observed"]
    if outcome["kind"] != "returned" or outcome["value"].get("type") != "Connection":
        return Miss(describe(outcome), "open_store returns the sqlite3.Connection it opened.")
    if seen.get("closed"):
        return Miss("returned a connection that was already closed",
                   "Return the open connection: close it only when initialisation fails (then re-raise).")
    return None


def show_rows(rows: list) -> str:
    """Rows as the student would write them: (1, -1, 0), (2, 5); "none" for no rows."""
    return ", ".join(show(tuple(r)) for r in rows) if rows else "no rows"


# --- step 3 -------------------------------------------------------------------------------


PASS_FAULT_HINT = ("Pass `fault` on to apply_event: consume_line(con, line, fault) → "
                  "apply_event(con, seq, delta, fault).")


def fault_seen(seq: int, before: dict, delta: int, clause: str | None = None):
    """fault() ran once, inside the one transaction, between the total and the cursor. Misses name
    step 3's clause they break, or `clause` for every miss (step 5: fault was not passed on)."""

    def check(record: dict) -> Miss | None:
        miss = seen(record)
        if miss is not None and clause:
            miss.clause = clause
            if not judged(record).get("faults"):
                miss.hint = PASS_FAULT_HINT
        return miss

    def seen(record: dict) -> Miss | None:
        calls = judged(record).get("faults", [])  # the judge's witness: one entry per fault() call
        if len(calls) != 1:
            return Miss(f"fault() was called {len(calls)} times",
                       "Pass `fault` along and call it exactly once, after updating the total. " + ORDER_HINT,
                       clause="3.order")
        call = calls[0]
        outside = call.get("outside")
        if outside is not None and (outside["last"], outside["total"]) != (before["last"], before["total"]):
            return Miss(f"while fault() ran, the judge's own connection already read last {outside['last']}, "
                       f"total {outside['total']}: part of the event was committed early", CURSOR_HINT,
                       clause="3.one-transaction")
        reported = record["observed"].get("faults", [])
        inside = reported[0].get("inside") if len(reported) == 1 else None  # only the child's connection sees it
        if inside is not None:
            if inside["last"] != before["last"]:
                return Miss(f"when fault() ran, the cursor was already {inside['last']}", CURSOR_HINT,
                           clause="3.order")
            if seq not in inside["seqs"]:
                return Miss("when fault() ran, the ledger row was not inserted yet", ORDER_HINT, clause="3.order")
            if inside["total"] != before["total"] + delta:
                return Miss(f"when fault() ran, the total was {inside['total']}, not yet "
                           f"{before['total'] + delta}", ORDER_HINT, clause="3.order")
        if not call.get("write_locked"):
            return Miss("while fault() ran, the judge could BEGIN IMMEDIATE on the store: no write "
                       "transaction was open", TRANSACTION_HINT, clause="3.one-transaction")
        return None

    return check


def fault_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or outcome["type"] != "RuntimeError" or not record["observed"].get("same_error"):
        return Miss(describe(outcome), "Let fault()'s own exception propagate after the ROLLBACK (a bare `raise`).")
    return None


def interrupt_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or outcome["type"] != "Interrupted" or not record["observed"].get("same_error"):
        return Miss(describe(outcome), "Let it propagate after the ROLLBACK (a bare `raise`).")
    return None


def jam_error(record: dict) -> Miss | None:
    outcome = record["outcome"]
    if outcome["kind"] != "raised" or "the cursor is jammed" not in outcome.get("message", ""):
        return Miss(describe(outcome), "Re-raise sqlite3's original error (a bare `raise`), don't wrap it.")
    return None


def check_apply(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    history = distinct_history(rng, rng.randint(3, 6))
    k = history[-1][0]
    d0, d1 = deltas(rng, 2)
    d_next, d_far = deltas(rng, 2, start=sum(d for _, d in history))
    other = d0 + 1 if d0 < 1000 else d0 - 1
    old_seq, old_delta = history[rng.randrange(len(history) - 1)]
    old_other = old_delta + 1 if old_delta < 1000 else old_delta - 1
    plans: list[Plan] = []
    specs: list[dict] = []

    def case(label: str, applied: list[tuple[int, int]], args: list, expected: str, outcome_check,
             after: list[tuple[int, int]] | dict, clauses: tuple[str, ...], *, fault: str | None = None,
             extra=None, setup: str = "", hint: str = "", state_hint: str = "", held: bool = False) -> None:
        """One call on a store of its own, prepared by the judge as a correct client would have left it."""
        db = make_store(ctx.path(f"apply{len(plans)}.db"), applied)
        if setup:
            stores.execute(db, setup)
        kept = after if isinstance(after, dict) else store_state(after)
        state_hint = state_hint or ("Change nothing when the call is refused or fails: ROLLBACK, then raise."
                                   if after is applied or isinstance(after, dict) else
                                   "Insert the ledger row, add delta to the total, set last = seq, then COMMIT.")
        main = clauses[0]
        checks = [outcome_check, under("3.no-open-transaction", no_open_transaction)]
        if extra is not None:
            checks.append(extra)
        checks.append(under(main, state_after(kept, state_hint)))
        shown_call = ", ".join(show(a) for a in args)
        on = f"on a store at last {applied[-1][0]}" if applied else "on a new store (last -1)"
        on += ", while another connection is in the middle of a write" if held else ""
        plans.append(Plan(label, f"apply_event(con, {shown_call}{', fault=f' if fault else ''}) {on}", expected,
                         both(*checks), hint, clauses=(*clauses, "3.no-open-transaction")))
        specs.append({"name": label, "db": str(db), "fn": "apply_event", "args": [encode(a) for a in args],
                     "fault": fault, "held": held})

    applies = lambda hint: under("3.apply-next", returns(True, hint))  # noqa: E731
    new_hint = "A new event (seq == last + 1) is applied: return True."
    one = [(0, d0)]
    nothing = "ValueError; nothing changes"

    case("the first event (seq 0)", [], [0, d0], "True; ledger row, total and cursor saved", applies(new_hint), one,
         ("3.apply-next",))
    case("the next event (seq 1)", one, [1, d1], "True; total and cursor moved together", applies(new_hint),
         one + [(1, d1)], ("3.apply-next",))
    case("the next event after a saved cursor", history, [k + 1, d_next], "True; the event applied",
         applies("Read last from the store: seq == last + 1 is new."), history + [(k + 1, d_next)],
         ("3.apply-next",))
    # Types: each of these equals a valid argument in Python (False == 0, True == 1, 1.0 == 1).
    for label, applied, args in (
        ("seq False (a bool equal to 0) on a new store", [], [False, d0]),
        ("seq True (a bool equal to 1)", one, [True, d1]),
        ("delta True (a bool)", one, [1, True]),
        ("delta False (a bool)", one, [1, False]),
        ("seq 1.0 (a float)", one, [1.0, d1]),
        ("seq '1' (a str)", one, [str(1), d1]),
        ("seq None", one, [None, d1]),
        ("delta 2.0 (a float)", one, [1, 2.0]),
        ("delta '5' (a str)", one, [1, "5"]),
    ):
        hint = BOOL_HINT if "bool" in label else "seq and delta must be ints (`type(x) is int`): never convert."
        case(label, applied, args, nothing, under("3.types", raises("ValueError", hint)), applied, ("3.types",),
             hint=hint)
    # Ranges, both ends, and validation before the store is read.
    top = [(SEQ_MAX - 1, d0)]
    in_range = lambda hint: under("3.ranges", returns(True, hint))  # noqa: E731
    case("seq 2147483647 (the largest) after 2147483646", top, [SEQ_MAX, d1], "True; the event applied",
         in_range("seq ranges up to 2147483647, that value included."), top + [(SEQ_MAX, d1)], ("3.ranges",))
    case("delta 1000 (the largest)", one, [1, 1000], "True; the event applied",
         in_range("delta ranges from -1000 to 1000, both included."), one + [(1, 1000)], ("3.ranges",))
    low = [(0, rng.randint(1, 999))]  # so the smallest delta always takes the total below zero
    case("delta -1000 (the smallest), the total going below zero", low, [1, -1000], "True; the event applied",
         in_range("delta ranges from -1000 to 1000, both included."), low + [(1, -1000)], ("3.ranges",),
         state_hint="The total is a plain sum of the deltas: it may go below zero (a refund, a correction), "
                   "so never clamp it. Insert the ledger row, add delta, set last = seq, then COMMIT.")
    for label, args, clause, hint in (
        ("delta 1001", [k + 1, 1001], "3.ranges", RANGE_HINT),
        ("delta -1001", [k + 1, -1001], "3.ranges", RANGE_HINT),
        ("seq -1 on a saved store", [-1, old_delta], "3.validate-first",
         "Validate before looking at the store: seq -1 is ValueError, not a duplicate or a Conflict."),
        ("seq 2147483648 on a saved store", [SEQ_MAX + 1, d_next], "3.validate-first",
         "Validate before looking at the store: out of range is ValueError, not Gap."),
        ("a seen seq with delta 5000", [old_seq, 5000], "3.validate-first",
         "Validate first: an out-of-range delta is ValueError, not Conflict."),
        ("a seen seq with delta True", [old_seq, True], "3.validate-first", BOOL_HINT),
    ):
        case(label, history, args, nothing, under(clause, raises("ValueError", hint)), history,
             tuple(dict.fromkeys((clause, "3.ranges"))), hint=hint)
    # A refused call touches nothing: not even a write lock it would wait for while another writer works.
    busy_hint = ("Check the arguments before `BEGIN IMMEDIATE`: a call that is refused anyway must not wait "
                 "for the write lock (and fail with 'database is locked' when another writer keeps it).")
    for label, args in (("seq True while another connection is writing", [True, d_next]),):
        case(label, history, args, "ValueError at once; nothing changes",
             under("3.validate-first", raises("ValueError", busy_hint)), history, ("3.validate-first",),
             hint=busy_hint, held=True)
    # Duplicates, conflicts, gaps.
    dup_hint = "seq <= last with the same delta in the ledger is a duplicate: return False, change nothing."
    case("the same event again", one, [0, d0], "False (a duplicate); nothing changes",
         under("3.duplicate", returns(False, dup_hint)), one, ("3.duplicate",))
    case("an old seq with its recorded delta", history, [old_seq, old_delta], "False; nothing changes",
         under("3.duplicate", returns(False, "Look the seq up in the ledger: same delta → duplicate → False.")),
         history, ("3.duplicate",))
    case("the cursor's own seq with its delta", history, [k, history[-1][1]], "False; nothing changes",
         under("3.duplicate", returns(False, dup_hint)), history, ("3.duplicate",))
    conflict = "seq <= last with another delta in the ledger (or none at all) is a Conflict: raise it."
    case("seq 0 again with another delta", one, [0, other], "Conflict; nothing changes",
         module_exception("Conflict", conflict, "3.conflict"), one, ("3.conflict", "3.exceptions"))
    case("an old seq with another delta", history, [old_seq, old_other], "Conflict; nothing changes",
         module_exception("Conflict", conflict, "3.conflict"), history, ("3.conflict", "3.exceptions"))
    # Both directions, in every run: a comparison that only catches a larger (or a smaller) delta fails one.
    fixed = [(0, 500)]
    for label, other_delta in (("seq 0 (delta 500) again with delta 501", 501),
                              ("seq 0 (delta 500) again with delta 499", 499),
                              ("seq 0 (delta 500) again with delta -500", -500)):
        case(label, fixed, [0, other_delta], "Conflict; nothing changes",
             module_exception("Conflict", conflict, "3.conflict"), fixed, ("3.conflict",))
    pruned = {**store_state(history), "ledger": [list(e) for e in history[:1] + history[2:]]}
    case("an old seq the ledger does not hold", history, [1, history[1][1]], "Conflict; nothing changes",
         module_exception("Conflict", "seq <= last but no ledger row for it: that is a Conflict too (the "
                                     "lookup finds nothing; don't crash on `None[0]`).", "3.conflict"),
         pruned, ("3.conflict",), setup="DELETE FROM ledger WHERE seq = 1")
    gap = "seq > last + 1 means events are missing: raise Gap, apply nothing."
    case("a gap: seq 2 after 0", one, [2, d1], "Gap; nothing changes", module_exception("Gap", gap, "3.gap"), one,
         ("3.gap", "3.exceptions"))
    case("a gap of one after a saved cursor", history, [k + 2, d_next], "Gap; nothing changes",
         module_exception("Gap", gap, "3.gap"), history, ("3.gap",))
    case("seq 2147483647 on a new store", [], [SEQ_MAX, d_far], "Gap; nothing changes",
         module_exception("Gap", gap, "3.gap"), [], ("3.gap",))
    # fault(): where it runs, and what a failure leaves behind.
    base = store_state(history)
    case("the next event with a fault() that passes", history, [k + 1, d_next],
         f"True; fault() called once, between the total and the cursor; last {k + 1}",
         applies("Read last from the store; seq == last + 1 is new."), history + [(k + 1, d_next)], ("3.order",),
         fault="record", extra=fault_seen(k + 1, base, d_next))
    case("a duplicate with a fault()", history, [old_seq, old_delta], "False; fault() not called",
         under("3.duplicate", returns(False, dup_hint)), history, ("3.order",), fault="raise",
         extra=under("3.order", fault_not_called))
    case("a gap with a fault()", history, [k + 2, d_next], "Gap; fault() not called",
         module_exception("Gap", gap, "3.gap"), history, ("3.order",), fault="raise",
         extra=under("3.order", fault_not_called))
    case("fault() raises inside the transaction", history, [k + 1, d_next],
         "fault()'s own RuntimeError; ledger, total and cursor unchanged; no open transaction",
         under("3.original-error", fault_error), history, ("3.rollback", "3.original-error", "3.one-transaction"),
         fault="raise", extra=fault_seen(k + 1, base, d_next))
    case("fault() raises a BaseException (like KeyboardInterrupt)", history, [k + 1, d_next],
         "that BaseException propagates; ledger, total and cursor unchanged; no open transaction",
         under("3.original-error", interrupt_error), history, ("3.rollback", "3.no-open-transaction"),
         fault="interrupt", extra=fault_seen(k + 1, base, d_next))
    case("updating the cursor fails", history, [k + 1, d_next],
         "sqlite3.IntegrityError 'the cursor is jammed'; nothing changes; no open transaction",
         under("3.original-error", jam_error), history, ("3.rollback", "3.original-error", "3.one-transaction"),
         setup=JAM_CURSOR)
    # Something between two statements, at every statement in turn (checks/vending/interference.py).
    template = make_store(ctx.path("sweep.db"), history)
    applied = store_state(history + [(k + 1, d_next)])
    new_call = f"apply_event(con, {k + 1}, {d_next})"
    dup_call = f"apply_event(con, {old_seq}, {old_delta}) (a duplicate)"
    new_args, dup_args = [encode(k + 1), encode(d_next)], [encode(old_seq), encode(old_delta)]
    for plan, args, modes in (
        (interference.another_writer(k + 1, d_next, base, applied, shown), new_args, ["write"]),
        (interference.faults_between("applying the next event", new_call, base, shown), new_args,
         ["error", "interrupt"]),
        (interference.faults_between("applying a duplicate", dup_call, base, shown), dup_args, ["error", "interrupt"]),
    ):
        plans.append(plan)
        specs.append(interference.spec("apply_event", args, template, f"sweep{len(specs)}", modes))
    return served_with_witness(ctx, plans, specs)


# The checkpoint's cursor cannot change, however the update is spelled (UPDATE, or INSERT OR
# REPLACE, which deletes and inserts).
JAM_CURSOR = """
CREATE TRIGGER cursor_jammed BEFORE UPDATE OF last ON checkpoint
    BEGIN SELECT RAISE(ABORT, 'the cursor is jammed'); END;
CREATE TRIGGER cursor_jammed_insert BEFORE INSERT ON checkpoint
    BEGIN SELECT RAISE(ABORT, 'the cursor is jammed'); END;
"""


def module_exception(cls: str, hint: str, clause: str):
    """The module's own `cls` (a miss under `clause`), a direct subclass of Exception (else 3.exceptions)."""
    check = is_module_exception(cls, hint)

    def tagged(record: dict) -> Miss | None:
        miss = check(record)
        if miss is not None:
            outcome = record["outcome"]
            raised_it = outcome.get("kind") == "raised" and outcome.get("type") == cls
            miss.clause = {"Gap": "3.exceptions", "Conflict": "3.exceptions",
                          "ResyncRequired": "4.exception"}[cls] if raised_it else clause
        return miss

    return tagged


def fault_not_called(record: dict) -> Miss | None:
    calls = judged(record).get("faults", [])
    if calls:
        return Miss(f"fault() was called {len(calls)} time(s)",
                   "fault() belongs to applying a new event (between the total and the cursor): a duplicate "
                   "or a Gap applies nothing, so it never calls fault().")
    return None


# --- step 4 -------------------------------------------------------------------------------

RESYNC_HINT = ("A log starting at 10 joins a cursor at 9, but a cursor at 8 is missing 9: "
               "raise ResyncRequired when last < first_seq - 1.")


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
    return after_fixed(ctx.cases("calls", plans, {"calls": calls}, probes="labkit.probe"), name,
                      "replay on generated logs", lambda: differential(
        ctx, "replay", oracle.replay_args(), oracle.replay,
        lambda *args: (oracle.replay_clause(*args), REPLAY_HINTS[oracle.replay_clause(*args)]),
        clauses=tuple(REPLAY_HINTS), unchanged="4.no-mutation", examples=REPLAY_EXAMPLES, name=name,
        show_call=lambda events, last, limit: f"replay({show(events, 120)}, {show(last)}, {show(limit)})"))


# A log costs more to generate, send and compare than a line: fewer examples keep step 4 within
# the property-test budget (every kind of log is still drawn; see oracles.vending.replay_args).
REPLAY_EXAMPLES = 100
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


# --- step 5 -------------------------------------------------------------------------------


def visible_ack(seq: int, expected: dict, clause: str):
    """Returned b"ACK seq\\n", and another connection saw the commit right after."""

    def check(record: dict) -> Miss | None:
        ack = b"ACK %d\n" % seq
        outcome = record["outcome"]
        if outcome["kind"] == "returned" and isinstance(value_of(record), bytes | bytearray | str):
            miss = under("5.ack-format", returns(ack, f"Return the bytes `{ack!r}`: ASCII, one space, one LF."))(
                record)
        else:
            miss = under(clause, returns(ack, f"Return the bytes `{ack!r}` (ASCII, one LF)."))(record)
        if miss is not None:
            return miss
        have = judged(record).get("after")
        if have is None or have["last"] < seq:
            return Miss(f"returned {ack!r}, but right then the judge's own connection read {shown(have)}",
                       ACK_AFTER_COMMIT, clause="5.visible-at-ack")
        return under(clause, state_after(expected, "Apply each event exactly once."))(record)

    return check


def check_consume_line(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    history = distinct_history(rng, 3)
    k = history[-1][0]
    d0, d1, d2 = deltas(rng, 3)
    other = d0 + 1 if d0 < 1000 else d0 - 1
    plans, specs = [], []
    one = [(0, d0)]

    def case(label: str, applied: list[tuple[int, int]], line, expected: str, check, clauses: tuple[str, ...],
             after: list[tuple[int, int]], hint: str = "", fault: str | None = None) -> None:
        """One call on a store of its own; the judge reads that file again after the child ended."""
        db = make_store(ctx.path(f"line{len(plans)}.db"), applied)
        kept = store_state(after)
        on = f"on a store at last {applied[-1][0]}" if applied else "on a new store"
        plans.append(Plan(label, f"consume_line(con, {show(line)}{', fault=f' if fault else ''}) {on}", expected,
                         both(check, under(clauses[0], state_after(kept, "Commit before returning the ACK; change "
                                                                         "nothing on a refused line."))),
                         hint, clauses=clauses))
        specs.append({"name": label, "db": str(db), "fn": "consume_line", "args": [encode(line)], "fault": fault})

    no_ack = "A refused line gets no ACK: let the exception propagate."
    case("a new frame", [], b"EVENT 0 %d\n" % d0, "b'ACK 0\\n'; the commit visible to another connection",
         both(visible_ack(0, store_state(one), "5.ack-format"), under("5.ack-format", no_open_transaction)),
         ("5.ack-format", "5.visible-at-ack"), one)
    case("the largest seq", [(SEQ_MAX - 1, d0)], b"EVENT %d %d\n" % (SEQ_MAX, d1), "b'ACK 2147483647\\n'",
         visible_ack(SEQ_MAX, store_state([(SEQ_MAX - 1, d0), (SEQ_MAX, d1)]), "5.ack-format"), ("5.ack-format",),
         [(SEQ_MAX - 1, d0), (SEQ_MAX, d1)])
    case("the same frame again", one, b"EVENT 0 %d\n" % d0,
         "b'ACK 0\\n' again (a duplicate is ACKed too); nothing changes",
         both(visible_ack(0, store_state(one), "5.duplicate-acked"), no_open_transaction), ("5.duplicate-acked",), one,
         "An identical duplicate is ACKed: apply_event returned False, that is fine.")
    case("an old frame again", history, b"EVENT 1 %d\n" % history[1][1], "b'ACK 1\\n'; nothing changes",
         visible_ack(1, store_state(history), "5.duplicate-acked"), ("5.duplicate-acked",), history,
         "An identical duplicate is ACKed: apply_event returned False, that is fine.")
    case("seq 0 again with another delta", one, b"EVENT 0 %d\n" % other, "Conflict, no ACK",
         both(under("5.errors-propagate", is_module_exception("Conflict", "A Conflict is not delivered: no ACK, "
                                                                         "let it propagate.")),
              under("5.errors-propagate", state_after(store_state(one), no_ack))),
         ("5.errors-propagate",), one)
    case("a gap", one, b"EVENT 2 %d\n" % d2, "Gap, no ACK",
         both(under("5.errors-propagate", is_module_exception("Gap", "A Gap is not delivered: no ACK, let it "
                                                                    "propagate.")),
              under("5.errors-propagate", state_after(store_state(one), no_ack))),
         ("5.errors-propagate",), one)
    parse_hint = "Call parse_line first; its ValueError propagates."
    for label, line in (("a CRLF frame", b"EVENT 1 %d\r\n" % d1), ("a torn frame", b"EVENT 1 %d" % d1),
                       ("a frame with a leading zero", b"EVENT 01 %d\n" % d1),
                       ("a str line", f"EVENT 1 {d1}\n"), ("a bytearray line", bytearray(b"EVENT 1 %d\n" % d1))):
        case(label, one, line, "ValueError, no ACK, nothing applied",
             both(under("5.parse-first", raises("ValueError", parse_hint)),
                 under("5.parse-first", state_after(store_state(one), no_ack))),
             ("5.parse-first",), one)
    case("the next frame, with a fault() that passes", one, b"EVENT 1 %d\n" % d1,
         "fault() called once inside the transaction; b'ACK 1\\n'; the commit visible",
         both(visible_ack(1, store_state(one + [(1, d1)]), "5.fault-passed"), no_open_transaction,
              fault_seen(1, store_state(one), d1, "5.fault-passed")),
         ("5.fault-passed", "5.visible-at-ack"), one + [(1, d1)], fault="record")
    base = store_state(history)
    case("the business step fails", history, b"EVENT %d %d\n" % (k + 1, d2),
         "fault()'s own RuntimeError; no ACK; nothing changes",
         both(fault_seen(k + 1, base, d2, "5.fault-passed"), under("5.fault-passed", fault_error),
              under("5.fault-passed", no_open_transaction), under("5.fault-passed", state_after(base, no_ack))),
         ("5.fault-passed",), history,
         "Pass `fault` on to apply_event: consume_line(con, line, fault) → apply_event(con, seq, delta, fault).",
         fault="raise")
    return served_with_witness(ctx, plans, specs)


# --- step 6 -------------------------------------------------------------------------------

# A store that cannot take seq 1: its commit fails, so an ACK 1 reaching the feed can only have
# been written before the commit. The judge sees that in the feed's journal, whatever the timing.
REFUSE_SEQ_1 = """
CREATE TRIGGER store_refuses_seq_1 BEFORE INSERT ON ledger WHEN NEW.seq = 1
    BEGIN SELECT RAISE(ABORT, 'the store refuses seq 1 (a judge trigger)'); END;
"""

# Every kind of invalid timeout, in every run: zero and negatives, bools, the non-finite
# floats, and values of other types.
INVALID_TIMEOUTS = [0, 0.0, -1, -0.5, True, False, float("nan"), float("inf"), float("-inf"), "1", None]


def seqs_text(seqs: list) -> str:
    """[0, 1, 2] as "0, 1 and 2"; [] as "none"."""
    items = [str(s) for s in seqs]
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _log(record: dict) -> list[dict]:
    return record["observed"].get("log", [])


def _writes(record: dict) -> list[bytes]:
    return [decode(e["data"]) for e in _log(record) if e["kind"] == "write"]


def closed(record: dict) -> Miss | None:
    """close(), then wait_closed() — on every path (the calls the writer saw, in the child)."""
    kinds = [e["kind"] for e in _log(record)]
    if "close" not in kinds:
        if record["observed"].get("closed"):
            return Miss("the socket was aborted, but writer.close() was never called", CLOSE_HINT,
                       clause="6.close-every-path")
        return Miss("the writer was never closed", CLOSE_HINT, clause="6.close-every-path")
    if "wait_closed" not in kinds[kinds.index("close"):]:
        return Miss("writer.close() was called, but wait_closed() was never awaited after it",
                   "After close(), await `asyncio.wait_for(writer.wait_closed(), timeout)`.",
                   clause="6.close-every-path")
    return None


def feed_saw_close(record: dict) -> Miss | None:
    """Real TCP: the feed itself saw the client hang up (EOF or reset on its side), and the child
    held no socket to the feed any more."""
    seen = judged(record)
    step7 = "dials" in record["observed"]
    hint, clause = (SOCKET_HINT, "7.socket-closed") if step7 else (CLOSE_HINT, "6.close-every-path")
    if seen.get("sockets"):
        return Miss(f"after the call the process still held a socket to the feed: {seen['sockets'][0]}", hint,
                   clause=clause)
    if seen.get("feed_closed") not in ("eof", "reset"):
        return Miss(f"the feed never saw the connection close (it ended: {seen.get('feed_closed') or 'still open'})",
                   hint, clause=clause)
    return None


def acks_after_commits(record: dict) -> Miss | None:
    """Each ACK written after its commit and after before_ack; each write drained (what the writer
    saw, in the child; for real TCP the judge also reads the store when each ACK arrives)."""
    log = _log(record)
    hooked_seqs: set[int] = set()
    for i, entry in enumerate(log):
        if entry["kind"] == "before_ack":
            seq = decode(entry["seq"])
            if entry.get("last_committed") is not None and entry["last_committed"] < seq:
                return Miss(f"before_ack({seq}) ran while another connection still saw last "
                           f"{entry['last_committed']}", "Call before_ack(seq) after consume_line returned.",
                           clause="6.commit-before-hook")
            hooked_seqs.add(seq)
        if entry["kind"] == "write":
            data = decode(entry["data"])
            if not (isinstance(data, bytes) and data.startswith(b"ACK ")):
                continue
            seq = int(data[4:].strip()) if data[4:].strip().isdigit() else None
            if seq is not None and entry.get("last_committed") is not None and entry["last_committed"] < seq:
                return Miss(f"{data!r} was written while another connection still saw last "
                           f"{entry['last_committed']}: the ACK went out before the commit", ACK_AFTER_COMMIT,
                           clause="6.hook-before-ack")
            if seq is not None and seq not in hooked_seqs:
                return Miss(f"{data!r} was written before before_ack({seq}) was called",
                           "Call before_ack(seq) after the commit and before writing the ACK.",
                           clause="6.hook-before-ack")
            following = [e["kind"] for e in log[i + 1:] if e["kind"] in ("drain", "write", "close")]
            if not following or following[0] != "drain":
                return Miss(f"{data!r} was written but not drained before going on",
                           "After each write, `await asyncio.wait_for(writer.drain(), timeout)`.",
                           clause="6.drain-bounded")
    return None


def acks_seen_committed(record: dict) -> Miss | None:
    """Real TCP: when each ACK reached the feed, the judge's own connection already read its commit."""
    for ack in judged(record).get("acks", []):
        last = (ack.get("observed") or {}).get("last")
        if last is None or last < ack["seq"]:
            return Miss(f"when ACK {ack['seq']} reached the feed, the judge's own connection read last "
                       f"{last}: the ACK went out before the commit", ACK_AFTER_COMMIT,
                       clause="6.hook-before-ack")
    return None


def wrote_acks(seqs: list[int], hint: str = "", clause: str = "6.hook-before-ack"):
    def check(record: dict) -> Miss | None:
        expected = [b"ACK %d\n" % s for s in seqs]
        got = _writes(record)
        if got != expected:
            text = ", ".join(show(w) for w in got) or "nothing"
            return Miss(f"wrote {text}; expected " + (", ".join(show(w) for w in expected) or "nothing"),
                       hint or "Write exactly one `ACK <seq>\\n` per committed line, nothing else.", clause=clause)
        return None

    return check


def hooked(seqs: list[int]):
    def check(record: dict) -> Miss | None:
        got = [decode(e["seq"]) for e in _log(record) if e["kind"] == "before_ack"]
        if got != seqs:
            return Miss(f"before_ack was called with {seqs_text(got)}; expected {seqs_text(seqs)}",
                       "After each committed line, call before_ack(seq) with that line's seq.",
                       clause="6.commit-before-hook")
        return None

    return check


def hooks_on_acked_lines(fails_at: int | None):
    """On every path, before_ack(seq) is called exactly for the lines that get an ACK, each right
    before its ACK (no await comes between them); only a hook that raised has no ACK after it."""

    def check(record: dict) -> Miss | None:
        hooked_seqs = [decode(e["seq"]) for e in _log(record) if e["kind"] == "before_ack"]
        acked = [int(w[4:-1]) for w in _writes(record)
                 if isinstance(w, bytes) and w.startswith(b"ACK ") and w[4:-1].isdigit()]
        if hooked_seqs in (acked, acked + [fails_at]):
            return None
        extra = next((seq for i, seq in enumerate(hooked_seqs) if i >= len(acked) or acked[i] != seq), None)
        return Miss(f"before_ack was called for seqs {hooked_seqs}, but ACKs went out for {acked}"
                   + (f": before_ack({extra}) ran for a line that failed" if extra is not None else ""),
                   "Call before_ack(seq) only after consume_line returned the line's ACK, right before writing "
                   "it: never in a `finally` or an `except`, never for a line that failed.",
                   clause="6.commit-before-hook")

    return check


def aborted(record: dict) -> Miss | None:
    kinds = [e["kind"] for e in _log(record)]
    if "abort" not in kinds:
        return Miss("wait_closed() never finished, and writer.transport.abort() was not called", ABORT_HINT,
                   clause="6.abort")
    return None


def took(seconds: float, hint: str, clause: str, slack: float = 0.05):
    """Virtual-clock cases: the call lasted `seconds` (exact, whatever the machine's load)."""

    def check(record: dict) -> Miss | None:
        spent = record["observed"].get("seconds")
        if spent is None or abs(spent - seconds) > slack:
            return Miss(f"the call took {spent} s of (virtual) time; expected {seconds:g} s", hint, clause=clause)
        return None

    return check


def db_kept_open(record: dict) -> Miss | None:
    """The connection it was handed is still open: the judge sees the child still holding the
    store file (the probe keeps that connection until the next case)."""
    if judged(record).get("holds_db") is False:
        return Miss("after consume_session ended, the process no longer held the store open: the DB "
                   "connection it was handed was closed",
                   "Do not close the DB connection: it belongs to the caller (run_client).", clause="6.db-left-open")
    if not record["observed"].get("con_open", True):
        return Miss("the DB connection was closed by consume_session",
                   "Do not close the DB connection: it belongs to the caller (run_client).", clause="6.db-left-open")
    return None


def same_error(hint: str, clause: str):
    def check(record: dict) -> Miss | None:
        if not record["observed"].get("same_error"):
            return Miss(describe(record["outcome"]), hint, clause=clause)
        return None

    return check


def within(low: float, high: float, expected: str, hint: str, clause: str):
    """Real-clock cases: wide bounds, so a busy machine cannot change the verdict."""

    def check(record: dict) -> Miss | None:
        spent = record["observed"].get("seconds")
        if spent is None or not low <= spent <= high:
            return Miss(f"{describe(record['outcome'])} after {spent} s; expected {expected}", hint, clause=clause)
        return None

    return check


def cancelled(clause: str):
    def check(record: dict) -> Miss | None:
        if record["outcome"]["kind"] != "cancelled":
            return Miss(describe(record["outcome"]),
                       "Let CancelledError propagate: no `except BaseException` or `except CancelledError` that "
                       "swallows it; clean up in `finally`.", clause=clause)
        return None

    return check


def script(events: list[tuple[int, int]], gap: float = 0.0) -> list[list]:
    """Frames for a scripted reader, `gap` seconds apart (the first at once)."""
    return [[0.0 if i == 0 else gap, f"EVENT {s} {d}\n"] for i, (s, d) in enumerate(events)]


def check_session(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = distinct_history(rng, 5)
    total = sum(d for _, d in events)
    every = [s for s, _ in events]
    first = (0, events[0][1])
    plans: list[Plan] = []
    specs: list[dict] = []
    faults: list[str] = []
    dbs: dict[int, Path] = {}  # feed connection → the store its client commits to
    call = "consume_session(reader, writer, con, {t}, before_ack=hook)"

    def scenario(label, called, expected, checks, clauses, setup="", **spec):
        """One case on a store of its own; `checks(db, conn)` builds its checks (conn: its feed connection)."""
        db = make_store(ctx.path(f"s{len(specs)}.db"))
        if setup:
            stores.execute(db, setup)
        conn = None
        if spec["io"] == "feed":
            faults.append(spec.pop("fault"))
            conn = len(faults)
            dbs[conn] = db
        specs.append({"db": str(db), "timeout": encode(spec.pop("timeout")), "conn": conn, **spec})
        plans.append(Plan(label, called, expected, both(*checks(db, conn), db_kept_open,
                                                       hooks_on_acked_lines(spec.get("hook_fails_at"))),
                         clauses=(*clauses, "6.db-left-open")))

    def feed_acked(seqs: list[int], hint: str = "Send exactly one `ACK <seq>\\n` per committed line, and drain it."):
        def check(record: dict) -> Miss | None:
            got = [a["seq"] for a in judged(record).get("acks", [])]
            if got != seqs:
                return Miss(f"the feed received ACKs for {seqs_text(got)}; expected {seqs_text(seqs)}", hint,
                           clause="6.hook-before-ack")
            return None

        return check

    def committed(db: Path, applied: list[tuple[int, int]], hint: str, clause: str):
        return under(clause, judge_reads(db, store_state(applied), hint))

    # Real TCP against the judge's feed: one connection per case, in this order.
    scenario("reads, commits and ACKs every line, then returns the state at EOF", call.format(t=3.0),
             f"{(events[-1][0], total)}; before_ack then ACK for 0–4, each after its commit; writer closed",
             lambda db, conn: [
                 under("6.eof-state", returns((events[-1][0], total), "At EOF (readline returns b\"\"), return "
                                                                    "state(con).")),
                 hooked(every), acks_seen_committed, acks_after_commits, wrote_acks(every), closed,
                 feed_acked(every), committed(db, events, "Commit every line.", "6.eof-state")],
             ("6.eof-state", "6.commit-before-hook", "6.hook-before-ack", "6.drain-bounded"),
             io="feed", fault="none", timeout=3.0, guard=5.0)
    scenario("a stalled feed ends in TimeoutError", call.format(t=0.1) + "; the feed sends nothing",
             "TimeoutError after about 0.1 s; writer closed",
             lambda db, conn: [under("6.read-bounded", raises("TimeoutError", READ_HINT)),
                              within(0.09, 2.0, "about 0.1 s", READ_HINT, "6.read-bounded"), closed,
                              feed_saw_close],
             ("6.read-bounded", "6.close-every-path"), io="feed", fault="stall", timeout=0.1, guard=2.5)
    scenario("the feed drops the connection after one line", call.format(t=3.0),
             f"{first} at EOF; writer closed",
             lambda db, conn: [under("6.eof-state", returns(first, "EOF ends the session: return state(con).")),
                              closed, feed_acked([0])],
             ("6.eof-state", "6.close-every-path"), io="feed", fault="drop_mid_stream", timeout=3.0, guard=5.0)
    scenario("a torn last line is not a command",
             call.format(t=3.0) + "; the feed sends b'EVENT 0 …' without LF and closes",
             "ValueError; nothing applied, no ACK; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", raises("ValueError", "A torn last line (no LF) is not a command: "
                                                                 "parse_line refuses it, and the error propagates.")),
                 wrote_acks([], "Never ACK a torn line.", "6.errors-propagate"), closed,
                 committed(db, [], "Never apply a torn line.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="torn_last_line", timeout=3.0, guard=5.0)
    scenario("a conflicting duplicate", call.format(t=3.0) + "; the feed resends seq 0 with another delta",
             "Conflict; only ACK 0 written; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", is_module_exception("Conflict", "consume_line's Conflict propagates out "
                                                                            "of consume_session.")),
                 wrote_acks([0], clause="6.errors-propagate"), closed, feed_saw_close, feed_acked([0]),
                 committed(db, events[:1], "Apply seq 0 once.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="conflicting_duplicate", timeout=3.0,
             guard=5.0)
    scenario("a skipped seq", call.format(t=3.0) + "; the feed starts at seq 1", "Gap; no ACK; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", is_module_exception("Gap", "consume_line's Gap propagates out of "
                                                                       "consume_session.")),
                 wrote_acks([], clause="6.errors-propagate"), closed, feed_saw_close,
                 committed(db, [], "Apply nothing after a Gap.", "6.errors-propagate")],
             ("6.errors-propagate", "6.close-every-path"), io="feed", fault="skip_seq", timeout=3.0, guard=5.0)
    scenario("before_ack raises at seq 1", call.format(t=3.0) + " where hook(1) raises RuntimeError",
             "that RuntimeError; seq 1 committed but not ACKed; writer closed",
             lambda db, conn: [
                 same_error("Let before_ack's own exception propagate.", "6.errors-propagate"),
                 wrote_acks([0], "No ACK for a line whose before_ack failed.", "6.hook-before-ack"), closed,
                 feed_saw_close, feed_acked([0]),
                 committed(db, events[:2], "Commit before calling before_ack.", "6.commit-before-hook")],
             ("6.errors-propagate", "6.commit-before-hook", "6.hook-before-ack"),
             io="feed", fault="none", timeout=3.0, guard=5.0, hook_fails_at=1)
    scenario("the store refuses to commit seq 1", call.format(t=3.0) + "; a trigger makes inserting seq 1 fail",
             "sqlite3's IntegrityError; the feed gets ACK 0 and no ACK 1; writer closed",
             lambda db, conn: [
                 under("6.errors-propagate", raises("IntegrityError", "Let sqlite3's own error propagate out of "
                                                                     "consume_session.")),
                 feed_acked([0], "An ACK says 'committed': a line whose commit failed gets none. Write the ACK "
                                "only after consume_line returned."),
                 closed, feed_saw_close, committed(db, events[:1], "Apply seq 0 only.", "6.errors-propagate")],
             ("6.hook-before-ack", "6.errors-propagate"), io="feed", fault="none", timeout=3.0, guard=5.0,
             setup=REFUSE_SEQ_1)
    scenario("cancelled while waiting for a line", call.format(t=5.0) + "; the feed stalls; cancelled after 0.02 s",
             "CancelledError propagates; writer closed",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed, feed_saw_close],
             ("6.cancel-propagates", "6.close-every-path"),
             io="feed", fault="stall", timeout=5.0, guard=2.0, cancel_after=0.02)

    # In-process I/O on a virtual clock: a scripted StreamReader and a fake writer.
    line0 = script(events[:1])
    slow = events[:4]
    scenario("lines 0.3 s apart with timeout 0.5 (the session outlasts the timeout)",
             call.format(t=0.5) + "; 4 lines, 0.3 s apart, then EOF",
             f"{(slow[-1][0], sum(d for _, d in slow))}: each read waits at most 0.5 s, the session as long as it must",
             lambda db, conn: [under("6.read-bounded", returns((slow[-1][0], sum(d for _, d in slow)), (
                 "Bound each readline on its own (`wait_for(reader.readline(), timeout)` inside the loop), not "
                 "the whole session."))), wrote_acks([0, 1, 2, 3], clause="6.read-bounded")],
             ("6.read-bounded",), io="script", script=script(slow, 0.3), end_after=0.3, timeout=0.5, guard=30.0)
    scenario("no line ever comes", call.format(t=0.5) + "; the reader gets nothing, not even EOF",
             "TimeoutError after exactly 0.5 s; writer closed",
             lambda db, conn: [under("6.read-bounded", raises("TimeoutError", READ_HINT)),
                              took(0.5, "Bound every readline by `timeout`.", "6.read-bounded"), closed],
             ("6.read-bounded", "6.close-every-path"), io="script", end="open", timeout=0.5, guard=30.0)
    scenario("the connection is reset while reading", call.format(t=0.5) + "; one line, then ConnectionResetError",
             "ConnectionResetError propagates; ACK 0 written; writer closed",
             lambda db, conn: [under("6.errors-propagate", raises("ConnectionResetError",
                                                                 "Let the reader's error propagate.")),
                              wrote_acks([0], clause="6.errors-propagate"), closed],
             ("6.errors-propagate", "6.close-every-path"), io="script", script=line0, end="reset", end_after=0.1,
             timeout=0.5, guard=30.0)
    dup = [events[0], events[0], events[1]]
    scenario("an identical duplicate line is ACKed again", call.format(t=0.5) + "; lines 0, 0 (the same), 1, EOF",
             f"{(1, events[0][1] + events[1][1])}; ACK 0, ACK 0, ACK 1",
             lambda db, conn: [under("6.eof-state", returns((1, events[0][1] + events[1][1]), "Return state(con).")),
                              hooked([0, 0, 1]), wrote_acks([0, 0, 1], "A duplicate is ACKed too (consume_line "
                                                                       "returns its ACK).")],
             ("6.hook-before-ack",), io="script", script=script(dup), timeout=0.5, guard=30.0)
    # Lines that look like nothing: only b"" (readline at EOF) ends the stream; these are bad frames.
    eof_hint = ("Only `b\"\"` (what readline returns at EOF) ends the session. An empty or blank line is a bad "
                "frame: hand it to consume_line, whose parse_line refuses it (`if not line.strip()` or "
                "`if line == b\"\\n\"` takes it for the end).")
    for label, blank in (("an empty line (a lone LF)", "\n"), ("a lone CRLF", "\r\n"), ("a lone space", " \n")):
        scenario(f"{label} between two frames is an error, not the end", call.format(t=0.5)
                 + f"; lines 0, {show(blank.encode())}, 1, EOF", "ValueError after ACK 0; line 1 never applied",
                 lambda db, conn: [under("6.errors-propagate", raises("ValueError", eof_hint)),
                                  wrote_acks([0], eof_hint, "6.errors-propagate"),
                                  committed(db, [first], eof_hint, "6.errors-propagate")],
                 ("6.errors-propagate",), io="script",
                 script=[*script([first]), [0.0, blank], *script([(1, events[1][1])])], timeout=0.5, guard=30.0)
    scenario("timeout 1 (an int) is accepted", call.format(t=1) + "; two lines, EOF",
             f"{(1, events[0][1] + events[1][1])}; both ACKed",
             lambda db, conn: [under("6.timeout", returns((1, events[0][1] + events[1][1]), (
                 "timeout may be an int: test `type(timeout) in (int, float)` and not bool, finite, > 0.")))],
             ("6.timeout",), io="script", script=script(events[:2]), timeout=1, guard=30.0)
    scenario("drain never finishes", call.format(t=0.5) + "; writer.drain() hangs",
             "TimeoutError after 0.5 s; writer closed",
             lambda db, conn: [
                 under("6.drain-bounded", raises("TimeoutError", "Bound every drain: "
                                                                "`await asyncio.wait_for(writer.drain(), timeout)`.")),
                 took(0.5, "Bound the drain by `timeout`.", "6.drain-bounded"), closed],
             ("6.drain-bounded", "6.close-every-path"), io="script", script=line0, drain="hang", timeout=0.5,
             guard=30.0)
    scenario("drain fails", call.format(t=0.5) + "; writer.drain() raises ConnectionResetError",
             "ConnectionResetError propagates; writer closed",
             lambda db, conn: [under("6.errors-propagate", raises("ConnectionResetError",
                                                                 "Let the error from drain propagate.")), closed],
             ("6.errors-propagate", "6.close-every-path"), io="script", script=line0, drain="raise", timeout=0.5,
             guard=30.0)
    scenario("cancelled while draining", call.format(t=5.0) + "; drain hangs; cancelled after 0.05 s",
             "CancelledError propagates; writer closed",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates", "6.close-every-path"), io="script", script=line0, end="open", drain="hang",
             timeout=5.0, guard=30.0, cancel_after=0.05)
    scenario("wait_closed hangs after a normal end",
             call.format(t=0.5) + "; EOF after one line; wait_closed() hangs", f"{first}; abort() after 0.5 s",
             lambda db, conn: [
                 took(0.5, "Bound wait_closed by `timeout`.", "6.close-wait-bounded"),
                 under("6.never-mask", returns(first, "A close wait that times out is handled by abort(): the "
                                                     "session's result stands.")),
                 closed, aborted],
             ("6.close-wait-bounded", "6.abort", "6.never-mask"), io="script", script=line0, wait_closed="hang",
             timeout=0.5, guard=30.0)
    scenario("wait_closed fails after a normal end",
             call.format(t=0.5) + "; EOF after one line; wait_closed() raises ConnectionResetError",
             f"{first}; abort() called",
             lambda db, conn: [under("6.never-mask", returns(first, ABORT_HINT)), closed, aborted],
             ("6.abort", "6.never-mask"), io="script", script=line0, wait_closed="reset", timeout=0.5, guard=30.0)
    scenario("wait_closed fails after an error",
             call.format(t=0.5) + "; a bad line; wait_closed() raises ConnectionResetError",
             "the original ValueError (not masked); abort() called",
             lambda db, conn: [under("6.never-mask", raises("ValueError", ABORT_HINT)), closed, aborted],
             ("6.abort", "6.never-mask"), io="script", script=[[0.0, "EVENT 0 x\n"]], wait_closed="reset",
             timeout=0.5, guard=30.0)
    scenario("wait_closed hangs after an error", call.format(t=0.5) + "; seq 5 first (a gap); wait_closed() hangs",
             "the original Gap (not masked); abort() after 0.5 s",
             lambda db, conn: [took(0.5, "Bound wait_closed by `timeout`.", "6.close-wait-bounded"),
                              under("6.never-mask", is_module_exception("Gap", ABORT_HINT)), closed, aborted],
             ("6.close-wait-bounded", "6.abort", "6.never-mask"), io="script", script=[[0.0, "EVENT 5 1\n"]],
             wait_closed="hang", timeout=0.5, guard=30.0)
    scenario("wait_closed hangs after a cancellation",
             call.format(t=0.5) + "; no data; cancelled after 0.05 s; wait_closed() hangs",
             "CancelledError (not masked by the close wait's TimeoutError); abort() after 0.5 s more",
             lambda db, conn: [took(0.55, "Bound wait_closed by `timeout`, also after a cancellation.",
                                   "6.close-wait-bounded"),
                              cancelled("6.never-mask"), closed, aborted],
             ("6.never-mask", "6.abort", "6.close-wait-bounded"), io="script", end="open", wait_closed="hang",
             timeout=0.5, guard=30.0, cancel_after=0.05)
    scenario("cancelled while reading (virtual clock)", call.format(t=5.0) + "; no data; cancelled after 0.05 s",
             "CancelledError propagates; close() and wait_closed()",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates", "6.close-every-path"), io="script", end="open", timeout=5.0, guard=30.0,
             cancel_after=0.05)
    scenario("cancelled while waiting for wait_closed",
             call.format(t=5.0) + "; EOF after one line; wait_closed() hangs; cancelled after 0.05 s",
             "CancelledError propagates; close() was called first",
             lambda db, conn: [cancelled("6.cancel-propagates"), closed],
             ("6.cancel-propagates",), io="script", script=line0, wait_closed="hang", timeout=5.0, guard=30.0,
             cancel_after=0.05)
    for bad in INVALID_TIMEOUTS:
        scenario(f"timeout {bad!r} is refused", call.format(t=repr(bad)) + "; wait_closed() hangs",
                 "ValueError; nothing read or written; writer closed with a 1 s close wait, then abort()",
                 lambda db, conn: [
                    under("6.timeout", raises("ValueError", TIMEOUT_HINT)),
                    wrote_acks([], TIMEOUT_HINT, "6.timeout"), closed, aborted,
                    took(1.0, "With an invalid timeout, still close the writer, and bound wait_closed by 1 s.",
                         "6.close-wait-bounded"),
                    committed(db, [], TIMEOUT_HINT, "6.timeout")],
                 ("6.timeout", "6.close-wait-bounded", "6.close-every-path"), io="script", script=line0,
                 wait_closed="hang", timeout=bad, guard=30.0)

    feed = start_feed(events, faults, stall_seconds=3.0, io_timeout=3.0,
                     on_ack=lambda conn, seq: {"last": committed_last(dbs.get(conn))})
    try:
        for spec in specs:
            if spec["io"] == "feed":
                spec.update(host=feed.host, port=feed.port)
        return served(ctx, "session", plans, specs, lambda pid, spec: observe_feed_case(feed, pid, spec))
    finally:
        close_feeds([feed])


def committed_last(path: Path | None) -> int | None:
    """The cursor saved in `path`, read by the judge's own read-only connection (None if unreadable)."""
    if path is None:
        return None
    try:
        with closing(stores.reader(path, 0.5)) as con:
            row = con.execute("SELECT last FROM checkpoint WHERE id = 1").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def observe_feed_case(feed: Feed, pid: int, spec: dict) -> dict:
    """After a session case: does the child still hold the store open (the connection it was
    handed); against the feed, also how the feed's connection ended (waiting for it, bounded),
    the ACKs it received with what the judge read at each, and the sockets the child still holds."""
    holds_db = {"holds_db": os.path.realpath(spec["db"]) in held_files(pid)} if spec.get("db") else {}
    conn = spec.get("conn")
    if conn is None:
        return holds_db
    sockets = held_sockets(pid, feed.port)
    settled(feed, sockets)
    ended = feed_closed(feed, conn, 0.0)
    journal = [e for e in feed.journal() if e["conn"] == conn]
    return {**holds_db, "feed_closed": ended, "sockets": sockets,
            "acks": [{"seq": e["seq"], "observed": e.get("observed")} for e in journal if e["kind"] == "ack"]}


def settled(feed: Feed, sockets: list[str]) -> None:
    """Let the feed catch up with what the child did: when the child holds no socket to it, wait
    (bounded) until the feed has no connection open or waiting to be accepted, so a close the
    child made is in the journal. A socket still held means no EOF is coming: no wait."""
    if not sockets:
        feed.wait_idle(5.0)


def feed_closed(feed: Feed, conn: int, seconds: float) -> str | None:
    """How the feed's connection `conn` ended ("eof", "done", ...), waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        for entry in feed.journal():
            if entry["conn"] == conn and entry["kind"] == "closed":
                return entry["reason"]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


# --- step 7 -------------------------------------------------------------------------------


def check_run_client(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = distinct_history(rng, rng.randint(4, 6))
    total = sum(d for _, d in events)
    every = [s for s, _ in events]
    result = (events[-1][0], total)
    saved_at = rng.randint(1, len(events) - 2)
    plans: list[Plan] = []
    specs: list[dict] = []
    feeds: list[Feed] = []
    call = "run_client(host, port, path, {t}, before_ack=hook)"
    refused = refusing_port()  # bound, never listening, held until the step ends: nobody else gets it

    def scenario(label, called, expected, checks, clauses, faults=None, path=None, feed=None, **spec):
        """One case; `checks(path, feed)` builds its checks (feed: the case's own feed, if any)."""
        path = Path(path or ctx.path(f"c{len(specs)}.db"))
        if faults is not None:
            feed = start_feed(events, faults, stall_seconds=3.0, io_timeout=3.0,
                             on_ack=lambda conn, seq, path=path: {"last": committed_last(path)})
            feeds.append(feed)
        host, port = (feed.host, feed.port) if feed else ("127.0.0.1", refused.getsockname()[1])
        specs.append({"path": str(path), "timeout": encode(spec.pop("timeout")), "host": host, "port": port,
                     "feed": len(feeds) - 1 if faults is not None else None, **spec})
        plans.append(Plan(label, called, expected, both(*checks(path, feed)), clauses=clauses))

    def stored(applied, hint, clause="7.handover"):
        def check(record: dict) -> Miss | None:
            have, expected = judged(record).get("after"), store_state(applied)
            if have != expected:
                return Miss(f"right after run_client ended the judge read {shown(have)}; expected {shown(expected)}",
                           hint, clause=clause)
            return None

        return check

    def normal(path, feed, resume, acked):
        return [under("7.handover", returns(result, "Return what consume_session returns: state(con) at EOF.")),
                db_closed, dialled_with_limit, resumed(resume), feed_resumed(resume), socket_closed,
                stored(events, "Apply every event once; events at or below the saved cursor are duplicates."),
                feed_got_acks(acked), acks_seen_committed]

    try:
        silent = start_feed(events)  # the cases that must never connect use it
        feeds.append(silent)
        scenario("a new store: RESUME -1, then every event", call.format(t=3.0) + " on a new file",
                 f"{result}; the feed saw RESUME -1 and an ACK for each event; DB and socket closed",
                 lambda path, feed: normal(path, feed, -1, every),
                 ("7.open-store", "7.read-limit", "7.resume", "7.resume-drained", "7.handover", "7.db-closed"),
                 faults=["none"], timeout=3.0, guard=5.0)
        saved = make_store(ctx.path("saved.db"), events[: saved_at + 1])
        scenario("a store saved by another process: RESUME from its cursor",
                 call.format(t=3.0) + f" on a store saved at last {saved_at}",
                 f"the feed saw RESUME {saved_at}; {result}; DB closed",
                 lambda path, feed: normal(path, feed, saved_at, every[saved_at + 1:]),
                 ("7.resume", "7.handover", "7.db-closed"), faults=["none"], path=saved, timeout=3.0, guard=5.0)
        scenario("timeout 1 (an int) is accepted", call.format(t=1) + " on a new file",
                 f"{result}; DB and socket closed",
                 lambda path, feed: [under("7.validate-first", returns(result, (
                    "timeout may be an int: test `type(timeout) in (int, float)` and not bool, finite, > 0."))),
                    db_closed],
                 ("7.validate-first",), faults=["none"], timeout=1, guard=5.0)
        for bad in INVALID_TIMEOUTS:
            scenario(f"timeout {bad!r} is refused before anything else", call.format(t=repr(bad)),
                    "ValueError; no store file created, no connection made",
                    lambda path, feed: [under("7.validate-first", raises("ValueError", TIMEOUT_HINT)),
                                        validated_first(path, feed)],
                    ("7.validate-first",), feed=silent, timeout=bad, guard=3.0)
        garbage = ctx.path("not-a-db.db")
        garbage.write_bytes(b"this is not a database, just text\n" * 64)
        scenario("the store file is not a database", call.format(t=3.0) + " on a text file",
                 "sqlite3.DatabaseError from open_store; no connection made",
                 lambda path, feed: [under("7.open-store", raises("DatabaseError", (
                    "Open the store first (open_store(path)) and let its error propagate."))),
                    store_before_connect(feed)],
                 ("7.open-store", "7.errors-propagate"), path=garbage, feed=silent, timeout=3.0, guard=5.0)
        scenario("the feed sends a 100-byte line", call.format(t=3.0) + "; the feed's first line has 100 bytes",
                 "ValueError from readline (limit=64), the line never parsed; DB and socket closed",
                 lambda path, feed: [
                    under("7.read-limit", raises_any(("ValueError", "LimitOverrunError"), (
                        "With `limit=64`, readline raises ValueError on a longer line; let it propagate."))),
                    dialled_with_limit, never_parsed_long, db_closed, socket_closed,
                    stored([], "Apply nothing from an oversized line.", "7.read-limit")],
                 ("7.read-limit", "7.db-closed"), faults=["overlong_line"], timeout=3.0, guard=5.0)
        scenario("nothing listens on the port", call.format(t=3.0) + " to a port that refuses connections",
                 "ConnectionRefusedError; the store opened first, then closed; no socket left",
                 lambda path, feed: [
                    under("7.errors-propagate", raises("ConnectionRefusedError", "Let the connection error "
                                                                                 "propagate.")),
                    db_closed, socket_closed, opened_before_connecting(path)],
                 ("7.errors-propagate", "7.db-closed", "7.open-store"), timeout=3.0, guard=5.0)
        scenario("connecting never completes", call.format(t=0.5) + "; open_connection never returns",
                 "TimeoutError after 0.5 s; DB closed",
                 lambda path, feed: [
                    under("7.connect-bounded", raises("TimeoutError", (
                        "Bound the connect: `await asyncio.wait_for(asyncio.open_connection(host, port, limit=64), "
                        "timeout)`."))),
                    took(0.5, "Bound open_connection by `timeout`.", "7.connect-bounded"), db_closed],
                 ("7.connect-bounded", "7.db-closed"), dial="hang", timeout=0.5, guard=30.0)
        scenario("cancelled while connecting", call.format(t=5.0) + "; open_connection never returns; cancelled "
                                                                   "after 0.05 s",
                 "CancelledError propagates; DB closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed],
                 ("7.cancel-propagates", "7.db-closed"), dial="hang", timeout=5.0, guard=30.0, cancel_after=0.05)
        scenario("cancelled while connecting, the connect finishing later",
                 call.format(t=5.0) + "; open_connection returns after 0.2 s; cancelled after 0.05 s",
                 "CancelledError propagates; DB closed; no socket left open, also 0.2 s later",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed, under("7.socket-closed", lambda r: (
                    None if all(r["observed"].get("sockets_closed", [])) else Miss(
                        "after run_client was cancelled, its connect still finished 0.2 s later and that socket "
                        "was never closed: a connect shielded from the cancellation goes on with nobody left to "
                        "close what it opens", SHIELD_HINT)))],
                 ("7.cancel-propagates", "7.socket-closed"), dial="slow", dial_delay=0.2, timeout=5.0, guard=30.0,
                 cancel_after=0.05)
        scenario("sending RESUME fails", call.format(t=3.0) + "; the drain after RESUME raises ConnectionResetError",
                 "ConnectionResetError; socket and DB closed (the feed sees the connection close)",
                 lambda path, feed: [under("7.errors-propagate", raises("ConnectionResetError",
                                                                       "Let the error from drain propagate.")),
                                    socket_closed, db_closed, feed_saw_close],
                 ("7.errors-propagate", "7.socket-closed", "7.db-closed"), faults=["stall"], drain="raise",
                 timeout=3.0, guard=5.0)
        scenario("the drain after RESUME never finishes", call.format(t=0.5) + "; the drain hangs",
                 "TimeoutError after 0.5 s; socket and DB closed",
                 lambda path, feed: [under("7.resume-drained", raises("TimeoutError",
                                                                     "Bound the drain after RESUME by `timeout`.")),
                                    took(0.5, "Bound the drain after RESUME by `timeout`.", "7.resume-drained"),
                                    socket_closed, db_closed],
                 ("7.resume-drained", "7.socket-closed", "7.db-closed"), dial="fake", drain="hang", timeout=0.5,
                 guard=30.0)
        scenario("cancelled while sending RESUME", call.format(t=5.0) + "; the drain hangs; cancelled after 0.05 s",
                 "CancelledError propagates; socket and DB closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), socket_closed, db_closed],
                 ("7.cancel-propagates", "7.socket-closed", "7.db-closed"), dial="fake", drain="hang", timeout=5.0,
                 guard=30.0, cancel_after=0.05)
        scenario("before_ack raises at seq 1", call.format(t=3.0) + " where hook(1) raises RuntimeError",
                 "that RuntimeError; seq 1 committed, not ACKed; DB and socket closed",
                 lambda path, feed: [
                    hook_called, same_error("Let before_ack's own exception propagate.", "7.errors-propagate"),
                    db_closed,
                    socket_closed, feed_got_acks([0], exact=True),
                    stored(events[:2], "Commit, then before_ack, then ACK.", "7.handover")],
                 ("7.errors-propagate", "7.handover", "7.db-closed"), faults=["none"], timeout=3.0, guard=5.0,
                 hook_fails_at=1)
        scenario("cancelled during the session",
                 call.format(t=3.0) + "; the feed stalls; cancelled 0.05 s after RESUME was written",
                 "CancelledError propagates; DB and socket closed",
                 lambda path, feed: [cancelled("7.cancel-propagates"), db_closed, socket_closed],
                 ("7.cancel-propagates", "7.db-closed"), faults=["stall"], timeout=3.0, guard=5.0, cancel_after=0.05,
                 cancel_after_resume=True)
        return served(ctx, "client", plans, specs, lambda pid, spec: observe_client_case(feeds, pid, spec))
    finally:
        close_feeds(feeds)
        refused.close()


def observe_client_case(feeds: list[Feed], pid: int, spec: dict) -> dict:
    """After a run_client case: the store as the judge reads it, whether the child still holds the
    store file or a socket to the case's port, and what the case's feed saw."""
    path = Path(spec["path"])
    seen: dict = {"after": snapshot(path), "exists": path.exists(),
                 "holds_file": os.path.realpath(path) in held_files(pid),
                 "sockets": held_sockets(pid, spec["port"])}
    if spec.get("feed") is not None:
        feed = feeds[spec["feed"]]
        settled(feed, seen["sockets"])
        ended = feed_closed(feed, 1, 0.0)
        journal = feed.journal()
        seen.update(feed_closed=ended, resumes=resumes_on(journal), sent=sent_on(journal),
                   acks=[{"seq": e["seq"], "observed": e.get("observed")} for e in journal if e["kind"] == "ack"])
    return seen


def hook_called(record: dict) -> Miss | None:
    if not any(e["kind"] == "before_ack" for e in _log(record)):
        return Miss(f"before_ack was never called ({describe(record['outcome'])})",
                   "Pass before_ack on: `return await consume_session(reader, writer, con, timeout, before_ack)`.",
                   clause="7.handover")
    return None


def db_closed(record: dict) -> Miss | None:
    if judged(record).get("holds_file"):
        return Miss("after run_client ended, the process still held the store file open", DB_CLOSE_HINT,
                   clause="7.db-closed")
    left = record["observed"].get("db_left_open")
    if left:
        return Miss(f"{left} DB connection(s) still open after run_client ended", DB_CLOSE_HINT, clause="7.db-closed")
    return None


SOCKET_HINT = ("If anything fails before consume_session takes over, close the writer yourself "
               "(`writer.close()` in an `except BaseException:` before re-raising).")


SHIELD_HINT = ("Let the cancellation reach the connect: `await asyncio.wait_for(asyncio.open_connection(...), "
               "timeout)`, no `asyncio.shield` around it. A cancelled connect opens nothing; a shielded one opens "
               "a socket later that nobody closes.")


def socket_closed(record: dict) -> Miss | None:
    sockets = judged(record).get("sockets")
    if sockets:
        return Miss(f"after run_client ended, the process still held a socket: {sockets[0]}", SOCKET_HINT,
                   clause="7.socket-closed")
    if not all(record["observed"].get("sockets_closed", [])):
        return Miss("the socket was still open after run_client ended", SOCKET_HINT, clause="7.socket-closed")
    return None


def dialled_with_limit(record: dict) -> Miss | None:
    dials = record["observed"].get("dials", [])
    if not dials:
        return Miss("asyncio.open_connection was never called",
                   "Connect with `asyncio.open_connection(host, port, limit=64)`.", clause="7.read-limit")
    limit = decode(dials[0]["limit"])
    if limit != 64:
        return Miss(f"asyncio.open_connection was called with limit {show(limit)}",
                   "Pass `limit=64`: then readline refuses any line longer than a frame instead of "
                   "buffering it.", clause="7.read-limit")
    return None


def never_parsed_long(record: dict) -> Miss | None:
    longest = record["observed"].get("longest_frame", 0)
    if longest > 64:
        return Miss(f"readline returned the whole line: parse_line received {longest} bytes",
                   "Pass `limit=64` to open_connection: readline then raises ValueError instead of "
                   "reading an oversized line into memory.", clause="7.read-limit")
    return None


def resumed(last: int):
    """The first write is RESUME <last>, and it is drained before anything else."""

    def check(record: dict) -> Miss | None:
        log = _log(record)
        writes = [(i, decode(e["data"])) for i, e in enumerate(log) if e["kind"] == "write"]
        expected = b"RESUME %d\n" % last
        if not writes or writes[0][1] != expected:
            first = show(writes[0][1]) if writes else "never made"
            return Miss(f"the first write was {first}; expected {expected!r}",
                       "Write `b\"RESUME <last>\\n\"` first, with the `last` read from the store.", clause="7.resume")
        following = [e["kind"] for e in log[writes[0][0] + 1:] if e["kind"] in ("drain", "write")]
        if not following or following[0] != "drain":
            return Miss("RESUME was written but not drained",
                       "After writing RESUME, `await asyncio.wait_for(writer.drain(), timeout)`.",
                       clause="7.resume-drained")
        return None

    return check


def feed_resumed(last: int):
    def check(record: dict) -> Miss | None:
        got = judged(record).get("resumes", [])
        if got != [last]:
            hint = "Send `RESUME <last>` once, with the last the store saved."
            if got == [-1] and last != -1:
                hint = ("the feed saw RESUME -1 from a store saved at a later cursor: read `last` from the "
                       "store, never reset it.")
            said = " then ".join(f"RESUME {n}" for n in got) or "no RESUME at all"
            return Miss(f"the feed received {said}; expected RESUME {last}", hint, clause="7.resume")
        return None

    return check


def feed_got_acks(seqs: list[int], exact: bool = False):
    """The feed got an ACK for each of `seqs`; a feed may resend more, and those need ACKs too."""

    def check(record: dict) -> Miss | None:
        seen = judged(record)
        got, sent = [a["seq"] for a in seen.get("acks", [])], seen.get("sent", [])
        if exact:
            if got != seqs:
                return Miss(f"the feed received ACKs for {seqs_text(got)}; expected {seqs_text(seqs)}",
                           "ACK exactly the lines that were committed and passed before_ack.", clause="7.handover")
            return None
        if any(s not in got for s in seqs) or any(s not in got for s in sent):
            return Miss(f"the feed sent {seqs_text(sent)} and received ACKs for {seqs_text(got)}",
                       "ACK every line after its commit, duplicates included.", clause="7.handover")
        return None

    return check


def validated_first(path: Path, silent: Feed):
    def check(record: dict) -> Miss | None:
        seen = record["observed"]
        if seen.get("dials") or silent.connections():
            return Miss("ValueError, but only after connecting to the feed",
                       "Validate timeout first, before opening the store or a connection.",
                       clause="7.validate-first")
        if judged(record).get("exists") or seen.get("db_opened"):
            return Miss("ValueError, but only after opening the store (the judge found the store file created)",
                       "Validate timeout first, before open_store(path).", clause="7.validate-first")
        return None

    return check


def store_before_connect(silent: Feed):
    def check(record: dict) -> Miss | None:
        if record["observed"].get("dials") or silent.connections():
            return Miss("the store could not be opened, but a connection to the feed was made anyway",
                       "Open the store first, then connect: open_store(path) before asyncio.open_connection.",
                       clause="7.open-store")
        return None

    return check


def opened_before_connecting(path: Path):
    def check(record: dict) -> Miss | None:
        if not judged(record).get("exists"):
            return Miss("the connection was refused, and the judge found no store file: the store was not "
                       "opened before connecting",
                       "Open the store first (open_store(path)), then connect.", clause="7.open-store")
        return None

    return check


def raises_any(names: tuple[str, ...], hint: str):
    def check(record: dict) -> Miss | None:
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and any(n in outcome.get("mro", []) for n in names):
            return None
        return Miss(describe(outcome), outcome_hint(outcome, hint))

    return check


# --- final check: killed between commit and ACK ---------------------------------------------------

KILL = 1  # the contract's scenario: client #1 dies after commit 1, before ACK 1
NOT_REACHED_KILL = (f"not checked: client #1 did not die between commit {KILL} and ACK {KILL} (see the first "
                   "case), so there was no crash to recover from")


def check_crash(ctx: StepContext) -> list[Case]:
    rng = ctx.rng
    events = list(enumerate(deltas(rng, rng.randint(4, 7))))
    db = ctx.path("vending.db")
    timeline = ctx.evidence.timeline
    timeline.append({"t": time.time(), "actor": "judge", "kind": "setup",
                    "text": f"feed with {len(events)} events {events}; no store file yet; kill at seq {KILL}"})
    # Generous waits: nothing in this scenario stalls on purpose, so they only bound a client that
    # hangs, and a correct client on a machine at load 45 (3 s to start a sandboxed child) fits:
    # the client's read timeout and the feed's wait for a line or an ACK, and one client process.
    io_seconds, child_seconds = ctx.timeout / 2, 2 * ctx.timeout
    args = {"db": str(db), "timeout": io_seconds, "guard": 2 * io_seconds}
    feed = start_feed(events, io_timeout=io_seconds)
    second = None
    try:
        args.update(host=feed.host, port=feed.port)
        # On before_ack(KILL)'s report the judge kills client #1's whole sandbox, then reads the store.
        first, hook = run_to_hook(ctx.solution, f"{ctx.lab.probes}:crash_client", {**args, "kill": KILL},
                                 workdir=ctx.workdir, timeout=child_seconds, marker=ctx.marker(),
                                 module_name=ctx.lab.module_name,
                                 at_hook=lambda r: r.get("kind") == "before_ack" and r.get("seq") == encode(KILL))
        feed.wait_idle(2.0)
        after_kill, t_kill = snapshot(db), time.time()
        died = died_after_commit(first, after_kill, feed.journal(), child_seconds, hook)
        if died.passed:  # only a real crash between commit and ACK has anything to recover from
            second = ctx.child("crash_client", {**args, "kill": None}, timeout=child_seconds)
            feed.wait_idle(2.0)
        after_all, t_end = snapshot(db), time.time()
    finally:
        close_feeds([feed])
    journal = feed.journal()
    j1 = [e for e in journal if e["conn"] in _conns_during(journal, first)]
    j2 = [e for e in journal if second is not None and e["conn"] in _conns_during(journal, second)]
    later = recovery_cases(events, after_kill, after_all, j2, second, child_seconds) if died.passed else [
        Case(name, Outcome.NOT_REACHED, called, expected, NOT_REACHED_KILL, clauses=(clause,))
        for name, called, expected, clause in RECOVERY]
    recognised = all(c.passed for c in later[1:3])
    _timeline_process(timeline, "client #1", first, KILL, child_seconds, hook)
    if second is not None:
        _timeline_process(timeline, "client #2", second, None, child_seconds)
    _timeline_feed(timeline, journal, _conns_during(journal, first),
                  _conns_during(journal, second) if second is not None else set(), KILL if recognised else None)
    timeline.append({"t": t_kill, "actor": "store", "kind": "snapshot", "text": "after client #1: " + shown(after_kill)})
    if second is not None:
        timeline.append({"t": t_end, "actor": "store", "kind": "snapshot",
                        "text": "after client #2: " + shown(after_all)})
    timeline.sort(key=lambda e: e["t"])
    if died.passed:
        ctx.evidence.faults.append(f"client #1 killed in before_ack at seq {KILL} — {KILLED_TEXT}, "
                                  f"seq {KILL} committed, no ACK {KILL} at the feed")
    if died.passed and recognised:
        ctx.evidence.faults.append(f"seq {KILL} delivered twice (committed by client #1, resent to client #2) — "
                                  f"ACKed and counted once")
    ctx.evidence.ladder.extend(ladder(events, died, after_kill, j1, j2, after_all, second is not None))
    return [died, *later]


def died_after_commit(first, after_kill: dict | None, journal: list[dict], timeout: float,
                     hook: dict | None = None) -> Case:
    """Client #1 really died in before_ack(1): the judge killed its sandbox there (`hook`: the
    report it acted on), seq 1 in the file (the judge's read), and no ACK 1 at the feed (the
    feed's journal). Each claim observed, or it fails."""
    case = Case(f"client #1 dies in before_ack({KILL}), after commit {KILL} and before ACK {KILL}", Outcome.PASSED,
                f"run_client(feed, new store, 3.0, before_ack=hook) where the judge kills the process in hook({KILL})",
                f"{KILLED_TEXT}; seq {KILL} in the store; no ACK {KILL} at the feed",
                clauses=("final.dies-after-commit",))
    hooked_at_kill = hook is not None
    acked = [e for e in journal if e["kind"] == "ack" and e["seq"] == KILL and e["conn"] in _conns_during(journal, first)]
    seqs = [s for s, _ in after_kill["ledger"]] if after_kill else []
    if not hooked_at_kill:
        miss = _process_problem(first, "Call before_ack(seq) after each commit, before the ACK; run_client "
                                      "passes before_ack on to consume_session.", timeout)
        case.outcome, case.got, case.hint = miss.outcome, miss.got, miss.hint
    elif KILL not in seqs or after_kill["last"] < KILL:
        case.outcome = Outcome.WRONG
        case.got = (f"client #1 was killed by the judge in before_ack({KILL}), but the judge then read "
                   f"{shown(after_kill)}: seq {KILL} was not committed")
        case.hint = ("before_ack(seq) runs after the COMMIT of that seq: call consume_line first, then "
                    "before_ack(seq), then write the ACK.")
    elif acked:
        case.outcome = Outcome.WRONG
        case.got = (f"the feed received ACK {KILL} from client #1 before it died in before_ack({KILL}): "
                   f"the ACK went out before before_ack")
        case.hint = "Call before_ack(seq) after the commit and before writing the ACK."
    return case


RECOVERY = [
    (f"the commit of seq {KILL} survived the kill", "the judge reads the store file after client #1 died",
     f"every event up to seq {KILL} committed", "final.commit-survives"),
    ("client #2 resumes from the saved cursor", "run_client(...) again, in a new process, on the same file",
     f"the feed sees RESUME {KILL}", "final.resume-cursor"),
    (f"the resent seq {KILL} is ACKed and counted once", f"the feed resends seq {KILL} to client #2",
     f"ACK {KILL} from client #2; seq {KILL} counted once", "final.resent-once"),
    ("client #2 finishes with every delta counted exactly once", "run_client returns; the judge reads the store file",
     "the final state returned and stored", "final.all-once"),
]


def recovery_cases(events, after_kill, after_all, j2, second, timeout) -> list[Case]:
    """The four cases after a real crash: each claims only what the judge observed."""
    total = sum(d for _, d in events)
    survived, resume, once, finished = (Case(name, Outcome.PASSED, called, expected, clauses=(clause,))
                                       for name, called, expected, clause in RECOVERY)
    committed = store_state(events[: KILL + 1])
    survived.expected = shown(committed)
    if after_kill != committed:
        survived.outcome, survived.got = Outcome.WRONG, f"the judge read {shown(after_kill)}"
        survived.hint = "Commit the ledger row, the total and the cursor together, once per event."
    resumes2 = resumes_on(j2)
    if resumes2 != [KILL]:
        if resumes2:
            resume.outcome = Outcome.WRONG
            resume.got = "the feed received " + " then ".join(f"RESUME {n}" for n in resumes2) + " from client #2"
        else:
            miss = _process_problem(second, "Send `RESUME <last>` with the last the store saved.", timeout)
            resume.outcome, resume.got = miss.outcome, f"the feed received no RESUME from client #2 ({miss.got})"
        resume.hint = ("the feed saw RESUME -1 from the new process: read `last` from the store, never reset it."
                      if resumes2 == [-1] else "Send `RESUME <last>` with the last the store saved.")
    sent2, acks2 = sent_on(j2), acks_on(j2)
    counted = after_all["total"] if after_all else None
    if KILL not in sent2:
        once.outcome = Outcome.WRONG
        once.got = (f"the feed did not send seq {KILL} to client #2 (it sent " + (seqs_text(sent2) or "nothing")
                   + ")" + (f", after RESUME {resumes2[0]}" if resumes2 else ", as no RESUME came"))
        once.hint = resume.hint if not resume.passed else "Send `RESUME <last>` with the last the store saved."
    elif KILL not in acks2:
        once.outcome = Outcome.WRONG
        once.got = f"client #2 ACKed {seqs_text(acks2)}, not {KILL}"
        once.hint = "An identical duplicate is ACKed too: apply_event returns False, consume_line still ACKs."
    elif counted != total:
        once.outcome = Outcome.WRONG
        twice = counted is not None and counted - total == events[KILL][1]
        once.got = f"the total is {counted}, expected {total}" + (
            f": seq {KILL}'s delta {events[KILL][1]} was counted twice" if twice else "")
        once.hint = "Look seq up in the ledger: seq <= last with the same delta is a duplicate, not a new event."
    expected_end = (events[-1][0], total)
    finished.expected = f"{expected_end} returned; the store holds {shown(store_state(events))}"
    outcome = second.cases().get("run_client", {}).get("outcome")
    if outcome is None or outcome.get("kind") != "returned" or not same(decode(outcome["value"]), expected_end):
        miss = _process_problem(second, "run_client returns state(con) at EOF.", timeout)
        finished.outcome, finished.got, finished.hint = miss.outcome, miss.got, miss.hint
    elif after_all != store_state(events):
        finished.outcome, finished.got = Outcome.WRONG, f"the judge read {shown(after_all)}"
        finished.hint = "Each event once in the ledger, the total their sum, last the final seq."
    return [survived, resume, once, finished]


def _conns_during(journal: list[dict], run) -> set[int]:
    """The feed connections a child process opened: those that began while it ran."""
    return {e["conn"] for e in journal if e["kind"] == "connect" and run.started_at <= e["t"] <= run.ended_at}


def _process_problem(run, expected: str, timeout: float) -> Miss:
    """Why a client process did not do what the scenario needed."""
    if not run.imported:
        got, hint, _ = import_problem(run, timeout)
        return Miss(got, hint, Outcome.IMPORT_FAILED)
    record = run.cases().get("run_client")  # a report beats run.timed_out, which can race with a normal exit
    if record is not None:
        outcome = record["outcome"]
        if outcome.get("kind") == "not_implemented":
            return Miss("run_client still raises NotImplementedError (the skeleton)", SKELETON_HINT,
                       Outcome.NOT_IMPLEMENTED)
        if outcome.get("kind") == "missing":
            return Miss("run_client is not defined in your module", "Run every step's cell.", Outcome.MISSING)
        return Miss(f"run_client {describe(outcome)} (exit code {run.exit_code})", expected,
                   Outcome.RAISED if outcome.get("kind") == "raised" else Outcome.WRONG)
    if _killed_by_judge(run, timeout):
        return Miss("the client did not finish in time and was killed", "Look for a wait without a timeout.",
                   Outcome.TIMED_OUT)
    return Miss(f"the process ended with exit code {run.exit_code} before run_client returned", expected,
                Outcome.DIED)


def _killed_by_judge(run, timeout: float) -> bool:
    """Timed out for real: it ran until the deadline. (`run.timed_out` alone can also be set for a
    process caught in the middle of exiting; and the exit code of a killed one may read 0.)"""
    return run.timed_out and run.seconds >= timeout - 0.05


def _timeline_process(timeline: list[dict], label: str, run, kill: int | None, timeout: float,
                     hook: dict | None = None) -> None:
    timeline.append({"t": run.started_at, "actor": label, "kind": "start", "text": "process started"})
    for note in run.messages():
        if note.get("kind") == "before_ack":
            try:  # what a child wrote: anything at all
                seq = decode(note["seq"])
            except Exception:  # noqa: BLE001
                seq = "?"
            text = f"before_ack({seq}) (as the process reported it)"
            t = note.get("t")
            t = t if isinstance(t, (int, float)) and run.started_at <= t <= run.ended_at else run.ended_at
            timeline.append({"t": t, "actor": label, "kind": "hook", "text": text})
    if kill is not None and hook is not None:
        timeline.append({"t": run.ended_at, "actor": label, "kind": "killed", "text": KILLED_TEXT})
        return
    timeline.append({"t": run.ended_at, "actor": label, "kind": "exit",
                    "text": f"exit code {run.exit_code}" + (" (no answer in time: killed by the judge)"
                                                            if _killed_by_judge(run, timeout) else "")})


def _timeline_feed(timeline: list[dict], journal: list[dict], conns1: set[int], conns2: set[int],
                  recognised: int | None = None) -> None:
    """The feed's journal as timeline events. `recognised`: the killed seq, when the judge saw
    it committed before client #2 started, resent, ACKed by client #2 and counted once — only
    then is that ACK marked as a duplicate."""
    owner = {**{c: "client #1" for c in conns1}, **{c: "client #2" for c in conns2}}
    for e in journal:
        who = owner.get(e["conn"], "unknown client")
        if e["kind"] == "ack" and who == "client #2" and e.get("seq") == recognised:
            timeline.append({"t": e["t"], "actor": "feed", "kind": "duplicate",
                            "text": f"[{who}] ← ACK {recognised}: a resent seq the ledger already held, counted once"})
            continue
        text = {
            "connect": f"connection {e['conn']} from {who}",
            "resume": f"← RESUME {e.get('last')}",
            "sent": f"→ EVENT {e.get('seq')} {e.get('delta')}",
            "ack": f"← ACK {e.get('seq')}",
            "closed": f"connection {e['conn']} closed ({e.get('reason')})",
        }.get(e["kind"], f"{e['kind']} {({k: v for k, v in e.items() if k not in ('t', 'conn', 'kind')})}")
        timeline.append({"t": e["t"], "actor": "feed", "kind": e["kind"], "text": f"[{who}] {text}"})


def ladder(events, died: Case, after_kill, j1, j2, after_all, restarted: bool) -> list[dict]:
    """The evidence ladder, each rung filled only with what the judge observed (or "not reached")."""
    seqs1 = [s for s, _ in after_kill["ledger"]] if after_kill else []
    ack1 = [e for e in j1 if e["kind"] == "ack" and e["seq"] == KILL]
    resent = [e for e in j2 if e["kind"] == "sent" and e["seq"] == KILL]
    ack2 = [e for e in j2 if e["kind"] == "ack" and e["seq"] == KILL]
    total = sum(d for _, d in events)
    not_restarted = "not reached: client #2 was not started (client #1 did not die between commit and ACK)"
    if after_kill is None:
        committed = "no: the judge found no readable store after client #1 ended"
    elif KILL in seqs1:
        committed = f"yes: seq {KILL} in the ledger, last {after_kill['last']} (the judge's own read)"
    else:
        committed = f"no: seq {KILL} is not in the ledger (the judge read {shown(after_kill)})"
    if ack1:
        sent = f"yes: ACK {KILL} reached the feed from client #1 before it died"
    elif died.passed:
        sent = f"no: client #1 was {KILLED_TEXT} in before_ack({KILL}) and no ACK {KILL} reached the feed"
    else:
        sent = "not observed: client #1 did not die in before_ack"
    duplicate = bool(ack2) and after_all is not None and after_all["total"] == total and KILL in seqs1
    return [
        {"rung": "committed", "observed": committed, "when": "after client #1 ended"},
        {"rung": "ACK sent", "observed": sent, "when": "client #1"},
        {"rung": "ACK seen by the feed",
         "observed": f"yes: the feed got ACK {KILL} from client #1" if ack1 else f"no: the feed has no ACK {KILL} "
                                                                                 "from client #1",
         "when": "client #1's connection"},
        {"rung": "resent",
         "observed": (not_restarted if not restarted else f"yes: the feed sent EVENT {KILL} again to client #2"
                     if resent else f"no: the feed did not send seq {KILL} to client #2"),
         "when": "client #2's connection"},
        {"rung": "recognised as duplicate",
         "observed": (not_restarted if not restarted else
                     f"yes: client #2 ACKed {KILL} and the total {after_all['total']} counts it once" if duplicate
                     else f"no: {'no ACK ' + str(KILL) + ' from client #2' if not ack2 else 'the total is ' + str(after_all['total'] if after_all else None) + ', expected ' + str(total)}"),
         "when": "after client #2"},
    ]


# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_parse, 2: check_store, 3: check_apply, 4: check_replay, 5: check_consume_line,
                 6: check_session, 7: check_run_client, "final": check_crash}, contract=CLAUSES)
