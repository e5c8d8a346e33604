"""Lab `vending`'s pure functions, written again from the contract for differential tests.

`parse_line` and `replay` here are the judge's oracle: an independent implementation of
shared/labs/vending.md steps 1 and 4 (byte by byte, no regular expression, nothing shared
with solutions/client.py), so a mistake in the reference cannot hide the same mistake in a
student's code. `line_clause` and `replay_clause` name the contract clause an input is about
(the first rule it breaks, or the rule that says what a valid input returns), so a
counterexample comes with the hint of the rule it violates.

Judge-side only: the sandbox hides it from the child (it shows a lab's probes only).
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


# --- Hypothesis strategies near every clause (imported lazily: Hypothesis costs ~0.2 s) --------

SEQ_EDGES = (0, 1, 7, 9, 10, 99, 2_147_483_646, SEQ_MAX, SEQ_MAX + 1, 9_999_999_999, 10_000_000_000)
DELTA_EDGES = (0, 1, -1, 9, -9, 10, -10, 999, -999, 1000, -1000, 1001, -1001, 9999)
KEYWORDS = (b"EVENT", b"event", b"Event", b"EVENTS", b"EVEN", b"XEVENT", b"EVENT\t", b"ACK", b"")
SEPARATORS = (b" ", b"  ", b"\t", b"\x0b", b"\x0c", b"\r", b"\x1c", b"\x1f", b"", b"\xc2\xa0", b"\xa0")
ENDINGS = (b"\n", b"", b"\r\n", b"\r", b"\n\n", b" \n", b"\t\n", b"\x0c\n", b"\n ", b"\nEVENT 1 1\n")
FOREIGN_DIGITS = ("\u0660", "\u0665", "\uff17", "\u0967", "\u00b2", "\u09e7")


KINDS = ("keyword", "separator", "ending", "extra", "padding", "seq", "delta")
# No change (most often), one change of each kind, or two: few draws per example keep a property
# test within its budget (Hypothesis's cost is per draw).
CHANGES = ((),) * 4 + tuple((k,) for k in KINDS) + tuple((a, b) for i, a in enumerate(KINDS) for b in KINDS[i + 1:])
FIELD_CHANGES = ("zero", "plus", "minus", "underscore", "foreign", "space", "hex", "point")


def _changed(value: int, change: str, foreign: str) -> bytes:
    text = str(value)
    if change == "zero":
        return (b"-0" + text[1:].encode()) if text.startswith("-") else b"0" + text.encode()
    if change == "plus":
        return b"+" + text.encode()
    if change == "minus":
        return b"-" + text.encode()
    if change == "underscore" and len(text.lstrip("-")) > 1:
        return (text[:-1] + "_" + text[-1]).encode()
    if change == "foreign":
        return (text[:-1] + foreign).encode()
    if change == "space":
        return b" " + text.encode()
    if change == "hex":
        return b"0x" + format(abs(value), "x").encode()
    if change == "point":
        return text.encode() + b".0"
    return text.encode()


def frames():
    """One-argument tuples for parse_line: valid frames at every bound, and each kind of near-miss
    (one or two changes to a valid frame: keyword, separator, line ending, an extra field,
    padding past 64 bytes, a field with a leading zero, a sign, -0, '_', '0x', a point, a
    foreign digit or a blank), plus other types and raw bytes. Shrinks towards the plain frame
    `EVENT 0 0\\n` with no change."""
    from hypothesis import strategies as st

    seqs = st.one_of(st.sampled_from(SEQ_EDGES), st.integers(0, SEQ_MAX + 2))
    deltas = st.one_of(st.sampled_from(DELTA_EDGES), st.integers(-1002, 1002))

    @st.composite
    def near(draw) -> bytes:
        kinds = draw(st.sampled_from(CHANGES))
        seq, delta = draw(seqs), draw(deltas)
        keyword, first, second, ending, extra = b"EVENT", b" ", b" ", b"\n", b""
        seq_text, delta_text = str(seq).encode(), str(delta).encode()
        for kind in kinds:
            if kind in ("seq", "delta"):
                change, foreign = draw(st.sampled_from(FIELD_CHANGES)), draw(st.sampled_from(FOREIGN_DIGITS))
                if kind == "seq":
                    seq_text = _changed(seq, change, foreign)
                else:
                    delta_text = _changed(delta, change, foreign)
            elif kind == "keyword":
                keyword = draw(st.sampled_from(KEYWORDS))
            elif kind == "separator":
                blank = draw(st.sampled_from(SEPARATORS))
                first, second = (blank, second) if seq % 2 else (first, blank)
            elif kind == "ending":
                ending = draw(st.sampled_from(ENDINGS))
            elif kind == "extra":
                extra = draw(st.sampled_from((b" 9", b" ", b"\x00", b" -")))
        line = keyword + first + seq_text + second + delta_text + extra + ending
        if "padding" in kinds:
            line = line[:6] + b"0" * (40 + seq % 21) + line[6:]
        return line

    others = st.sampled_from(("EVENT 7 5\n", None, 7, bytearray(b"EVENT 7 5\n"), [b"EVENT 7 5\n"], 7.5))
    return st.one_of(near(), near(), near(), st.binary(max_size=70), others).map(lambda line: (line,))


LENGTHS = (1, 2, 3, 5, 16, 17) * 3 + (128, 129)  # long logs cost the most to send: rarer
DELTA_PATTERNS = ((0, 0, 0), (5, -7, 9), (1000, -1000, 0), (-1, 1, 999)) * 2 + ((1001, 0, 0), (0, -1001, 0))
LOG_CHANGES = ("none",) * 12 + ("tuple", "list item", "bool", "float", "gap", "repeat", "reverse", "empty",
                               "three fields", "past max", "balanced", "last skips")


def replay_args():
    """(events, last, limit) for replay: logs at every bound (1 and 128 events, seqs up to the
    largest, deltas at ±1000/±1001) with cursors and limits around their bounds, and each kind of
    broken log (a tuple, lists, bools, floats, a gap, a repeat, a reversal, an empty log...)."""
    from hypothesis import strategies as st

    @st.composite
    def args(draw) -> tuple:
        length = draw(st.sampled_from(LENGTHS))
        first = draw(st.one_of(st.sampled_from((0, 1, 10, SEQ_MAX - length + 1)), st.integers(0, 1000)))
        pattern = draw(st.sampled_from(DELTA_PATTERNS))
        events: Any = [(first + i, pattern[i] if i < 3 else 0) for i in range(length)]
        final = events[-1][0]
        events = _broken(events, draw(st.sampled_from(LOG_CHANGES)))
        last = draw(st.one_of(st.sampled_from((-2, -1, first - 2, first - 1, first, final - 1, final, final + 1,
                                               SEQ_MAX, SEQ_MAX + 1, True)),
                              st.integers(first - 3, final + 2)))
        limit = draw(st.one_of(st.integers(1, 16), st.sampled_from((-1, 0, 1, 16, 17, True, 2.0, None))))
        return events, last, limit

    return args()


def _broken(events: list, change: str) -> Any:
    """`events` with one thing the contract forbids (or unchanged for "none")."""
    if change == "tuple":
        return tuple(events)
    if change == "list item":
        return [list(events[0])] + events[1:]
    if change == "bool" and events[0][0] in (0, 1):
        return [(bool(events[0][0]), events[0][1])] + events[1:]
    if change == "float":
        return events[:-1] + [(float(events[-1][0]), events[-1][1])]
    if change == "gap" and len(events) > 2:
        return events[:1] + events[2:]
    if change == "repeat":
        return events[:1] + events
    if change == "reverse" and len(events) > 1:
        return events[::-1]
    if change == "empty":
        return []
    if change == "three fields":
        return [(*events[0], 0)] + events[1:]
    if change == "past max":
        return [(SEQ_MAX + 1 - len(events) + i, d) for i, (_s, d) in enumerate(events)] + [(SEQ_MAX + 1, 0)]
    if change == "balanced" and len(events) > 3:
        return events[:2] + [events[1]] + events[3:]
    if change == "last skips" and len(events) > 1:
        return events[:-1] + [(events[-1][0] + 1, events[-1][1])]
    return events
