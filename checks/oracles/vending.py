"""Lab `vending`'s pure functions, written again from the contract for differential tests.

`parse_line` and `replay` here are the judge's oracle: an independent implementation of
shared/labs/vending.md steps 1 and 4 (byte by byte, no regular expression, nothing shared
with solutions/client.py), so a mistake in the reference cannot hide the same mistake in a
student's code. `line_clause` and `replay_clause` name the contract clause an input is about
(the first rule it breaks, or the rule that says what a valid input returns), so a
counterexample comes with the hint of the rule it violates.

Judge-side only: the sandbox hides `checks/oracles/` from the child.
"""

from __future__ import annotations

from typing import Any

SEQ_MAX = 2_147_483_647
DELTA_MAX = 1000
FRAME_MAX = 64
EVENTS_MAX = 128
LIMIT_MAX = 16
DIGITS = frozenset(b"0123456789")
# What `str.split()` and `int()` treat as blanks among ASCII bytes (\x1c-\x1f too).
BLANKS = frozenset(b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f ")


class ResyncRequired(Exception):
    """The oracle's own: a retained log that starts after the cursor."""


# --- step 1 -------------------------------------------------------------------------------


def _number(field: bytes, signed: bool) -> int:
    negative = signed and field[:1] == b"-"
    digits = field[1:] if negative else field
    if not digits or not set(digits) <= DIGITS:
        raise ValueError(f"not a number: {field!r}")
    if len(digits) > 1 and digits[0] == ord("0"):
        raise ValueError(f"a leading zero: {field!r}")
    if negative and digits == b"0":
        raise ValueError("-0")
    value = int(digits)
    return -value if negative else value


def parse_line(line: Any) -> tuple[int, int]:
    """b"EVENT <seq> <delta>\\n" -> (seq, delta); anything else is ValueError."""
    if type(line) is not bytes:
        raise ValueError("not bytes")
    if len(line) > FRAME_MAX:
        raise ValueError("longer than 64 bytes")
    if line[-1:] != b"\n" or line.count(b"\n") != 1:
        raise ValueError("not exactly one LF, at the end")
    fields = line[:-1].split(b" ")
    if len(fields) != 3 or fields[0] != b"EVENT":
        raise ValueError("not 'EVENT <seq> <delta>'")
    seq, delta = _number(fields[1], signed=False), _number(fields[2], signed=True)
    if seq > SEQ_MAX or abs(delta) > DELTA_MAX:
        raise ValueError("out of range")
    return seq, delta


def _number_clause(field: bytes, signed: bool) -> str | None:
    if field[:1] == b"+":
        return "1.no-plus"
    negative = field[:1] == b"-"
    digits = field[1:] if negative else field
    if negative and not signed:
        return "1.seq-range" if digits and set(digits) <= DIGITS else "1.digits"
    if not digits or not set(digits) <= DIGITS:
        return "1.digits"
    if negative and set(digits) == {ord("0")}:
        return "1.no-minus-zero"
    if len(digits) > 1 and digits[0] == ord("0"):
        return "1.no-leading-zero"
    return None


def line_clause(line: Any) -> str:
    """The clause a parse_line input is about: the first rule it breaks, else "1.result"."""
    if type(line) is not bytes:
        return "1.bytes-only"
    if not line.isascii():
        return "1.ascii"
    if len(line) > FRAME_MAX:
        return "1.one-frame"
    if b"\r" in line:
        return "1.no-crlf"
    if line[-1:] != b"\n":
        return "1.final-lf"
    if line.count(b"\n") != 1:
        return "1.one-frame"
    body = line[:-1]
    if set(body) & (BLANKS - {ord(" ")}) or b"  " in body or body[:1] == b" " or body[-1:] == b" ":
        return "1.single-space"
    fields = body.split(b" ")
    if fields[0] != b"EVENT":
        return "1.keyword"
    if len(fields) != 3:
        return "1.two-fields"
    for field, signed in ((fields[1], False), (fields[2], True)):
        clause = _number_clause(field, signed)
        if clause is not None:
            return clause
    if int(fields[1]) > SEQ_MAX:
        return "1.seq-range"
    if abs(int(fields[2])) > DELTA_MAX:
        return "1.delta-range"
    return "1.result"


# --- step 4 -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return type(value) is int


def _events_clause(events: Any) -> str | None:
    if type(events) is not list or not 1 <= len(events) <= EVENTS_MAX:
        return "4.events-list"
    for item in events:
        if type(item) is not tuple or len(item) != 2 or not all(_is_int(v) for v in item):
            return "4.event-shape"
    for seq, delta in events:
        if not 0 <= seq <= SEQ_MAX or not -DELTA_MAX <= delta <= DELTA_MAX:
            return "4.event-ranges"
    for (before, _), (after, _) in zip(events, events[1:], strict=False):
        if after != before + 1:
            return "4.consecutive"
    return None


def replay_clause(events: Any, last: Any, limit: Any) -> str:
    """The clause a replay input is about: the first rule it breaks, else the rule of its answer."""
    clause = _events_clause(events)
    if clause is not None:
        return clause
    if not _is_int(last) or not -1 <= last <= SEQ_MAX:
        return "4.last-range"
    if not _is_int(limit) or not 1 <= limit <= LIMIT_MAX:
        return "4.limit-range"
    first, final = events[0][0], events[-1][0]
    if last > final:
        return "4.last-past-final"
    if last < first - 1:
        return "4.resync"
    if final - last > limit:
        return "4.limit"
    return "4.after-last"


def replay(events: Any, last: Any, limit: Any) -> list[tuple[int, int]]:
    """The next at most `limit` events after `last`, as a new list; ValueError or ResyncRequired."""
    clause = replay_clause(events, last, limit)
    if clause == "4.resync":
        raise ResyncRequired(f"the log starts at {events[0][0]}, the cursor is {last}")
    if clause not in ("4.limit", "4.after-last"):
        raise ValueError(clause)
    start = last - events[0][0] + 1  # events are consecutive: seq s sits at index s - first
    return list(events[start:start + limit])
