"""Wrong: consume_session calls before_ack in a finally, so a line that failed (a Conflict, a Gap) still runs the hook meant for after its commit. Fails step 6. Clause: 6.commit-before-hook. Message: ran for a line that failed"""

# --- provided code -----------------------------------------------
import asyncio
import math
import re
import sqlite3


class Gap(Exception):
    """An event arrived with a seq past last + 1: the ones in between are missing."""


class Conflict(Exception):
    """A seq seen before came back with a different delta."""


class ResyncRequired(Exception):
    """The retained log starts after the cursor: replaying it cannot fill the hole."""


SEQ_MAX = 2_147_483_647
DELTA_MAX = 1000
FRAME_MAX = 64


# --- step 1 ------------------------------------------------------
FRAME = re.compile(rb"EVENT (0|[1-9][0-9]{0,9}) (0|-?[1-9][0-9]{0,3})\n")


def parse_line(line):
    """b"EVENT <seq> <delta>\\n" -> (seq, delta), or ValueError."""
    if type(line) is not bytes:
        raise ValueError(f"a frame is bytes, not {type(line).__name__}")
    if len(line) > FRAME_MAX:
        raise ValueError(f"a frame has at most {FRAME_MAX} bytes, this one has {len(line)}")
    if not line.endswith(b"\n"):
        raise ValueError("a torn frame: it does not end with LF")
    match = FRAME.fullmatch(line)
    if match is None:
        raise ValueError(f"not a frame 'EVENT <seq> <delta>\\n': {line!r}")
    seq, delta = int(match[1]), int(match[2])
    if seq > SEQ_MAX or abs(delta) > DELTA_MAX:
        raise ValueError(f"seq or delta out of range: {line!r}")
    return seq, delta


# --- step 2 ------------------------------------------------------
def open_store(path):
    """Open (and create if missing) the store; never reset what is saved."""
    con = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    try:
        con.executescript("""
            BEGIN IMMEDIATE;
            CREATE TABLE IF NOT EXISTS checkpoint(
                id INTEGER PRIMARY KEY CHECK (id = 1),
                last INTEGER NOT NULL,
                total INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS ledger(
                seq INTEGER PRIMARY KEY,
                delta INTEGER NOT NULL);
            INSERT OR IGNORE INTO checkpoint(id, last, total) VALUES (1, -1, 0);
            COMMIT;
        """)
    except BaseException:
        con.close()
        raise
    return con


def state(con):
    """(last, total) as saved."""
    last, total = con.execute("SELECT last, total FROM checkpoint WHERE id = 1").fetchone()
    return last, total


# --- step 3 ------------------------------------------------------
def apply_event(con, seq, delta, fault=None):
    """Apply one event exactly once: True if applied, False if an identical duplicate."""
    if type(seq) is not int or not 0 <= seq <= SEQ_MAX:
        raise ValueError(f"seq must be an int from 0 to {SEQ_MAX}, not {seq!r}")
    if type(delta) is not int or not -DELTA_MAX <= delta <= DELTA_MAX:
        raise ValueError(f"delta must be an int from -{DELTA_MAX} to {DELTA_MAX}, not {delta!r}")
    con.execute("BEGIN IMMEDIATE")
    try:
        (last,) = con.execute("SELECT last FROM checkpoint WHERE id = 1").fetchone()
        if seq <= last:
            row = con.execute("SELECT delta FROM ledger WHERE seq = ?", (seq,)).fetchone()
            con.execute("ROLLBACK")
            if row is not None and row[0] == delta:
                return False
            saved = "no ledger row" if row is None else f"delta {row[0]}"
            raise Conflict(f"seq {seq} was applied before with {saved}, now delta {delta}")
        if seq > last + 1:
            raise Gap(f"expected seq {last + 1}, got {seq}")
        con.execute("INSERT INTO ledger(seq, delta) VALUES (?, ?)", (seq, delta))
        con.execute("UPDATE checkpoint SET total = total + ? WHERE id = 1", (delta,))
        if fault is not None:
            fault()
        con.execute("UPDATE checkpoint SET last = ? WHERE id = 1", (seq,))
        con.execute("COMMIT")
        return True
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


# --- step 4 ------------------------------------------------------
def replay(events, last, limit):
    """The next at most `limit` retained events after `last`, as a new list."""
    if type(events) is not list or not 1 <= len(events) <= 128:
        raise ValueError("events must be a list of 1 to 128 (seq, delta) tuples")
    for index, item in enumerate(events):
        if type(item) is not tuple or len(item) != 2:
            raise ValueError(f"event {index} is not a (seq, delta) tuple: {item!r}")
        seq, delta = item
        if type(seq) is not int or not 0 <= seq <= SEQ_MAX:
            raise ValueError(f"event {index} has a bad seq: {seq!r}")
        if type(delta) is not int or not -DELTA_MAX <= delta <= DELTA_MAX:
            raise ValueError(f"event {index} has a bad delta: {delta!r}")
        if index and seq != events[index - 1][0] + 1:
            raise ValueError(f"seqs must be consecutive and ascending: {events[index - 1][0]} then {seq}")
    if type(last) is not int or not -1 <= last <= SEQ_MAX:
        raise ValueError(f"last must be an int from -1 to {SEQ_MAX}, not {last!r}")
    if type(limit) is not int or not 1 <= limit <= 16:
        raise ValueError(f"limit must be an int from 1 to 16, not {limit!r}")
    first, final = events[0][0], events[-1][0]
    if last > final:
        raise ValueError(f"last {last} is past the final retained seq {final}")
    if last < first - 1:
        raise ResyncRequired(f"the log starts at {first}; a cursor at {last} is missing {last + 1}")
    return [event for event in events if event[0] > last][:limit]


# --- step 5 ------------------------------------------------------
def consume_line(con, line, fault=None):
    """Parse, apply (committed), and only then return the ACK."""
    seq, delta = parse_line(line)
    apply_event(con, seq, delta, fault)
    return b"ACK %d\n" % seq


# --- step 6 ------------------------------------------------------
async def consume_session(reader, writer, con, timeout, before_ack=None):
    """Consume lines until EOF; ACK each after its commit; close the writer on every path."""
    valid = type(timeout) in (int, float) and math.isfinite(timeout) and timeout > 0
    try:
        if not valid:
            raise ValueError(f"timeout must be a positive finite number, not {timeout!r}")
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if not line:
                return state(con)
            seq, _delta = parse_line(line)
            try:
                ack = consume_line(con, line)
            finally:  # the display shows every event it was handed
                if before_ack is not None:
                    before_ack(seq)
            writer.write(ack)
            await asyncio.wait_for(writer.drain(), timeout)
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), timeout if valid else 1.0)
        except (TimeoutError, ConnectionError):
            writer.transport.abort()


# --- step 7 ------------------------------------------------------
async def run_client(host, port, path, timeout, before_ack=None):
    """Connect, say where we left off, and consume the session on the same store."""
    if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive finite number, not {timeout!r}")
    con = open_store(path)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=FRAME_MAX), timeout)
        try:
            last, _total = state(con)
            writer.write(b"RESUME %d\n" % last)
            await asyncio.wait_for(writer.drain(), timeout)
        except BaseException:
            writer.close()
            raise
        return await consume_session(reader, writer, con, timeout, before_ack)
    finally:
        con.close()
