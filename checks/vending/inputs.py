"""Lab `vending`: the inputs the cases send — step 1's frames, random deltas and histories, bad timeouts.

Fixed tables are tried in every run; what is drawn from the step's rng is added, never instead,
so a mistake at a bound is caught by the same cases under every seed.
"""

from __future__ import annotations

import random

SEQ_MAX = 2_147_483_647


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


# Every kind of invalid timeout, in every run: zero and negatives, bools, the non-finite
# floats, and values of other types.
INVALID_TIMEOUTS = [0, 0.0, -1, -0.5, True, False, float("nan"), float("inf"), float("-inf"), "1", None]


def script(events: list[tuple[int, int]], gap: float = 0.0) -> list[list]:
    """Frames for a scripted reader, `gap` seconds apart (the first at once)."""
    return [[0.0 if i == 0 else gap, f"EVENT {s} {d}\n"] for i, (s, d) in enumerate(events)]
