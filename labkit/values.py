"""Values that cross the pipe from a child to the judge.

JSON loses the differences the labs care about (True vs 1, tuple vs list, bytes vs str vs
bytearray), so every value travels tagged and is rebuilt on the judge's side: `decode(encode(v))`
has v's exact type for every tag below, so a case built from a bytearray hands the student a
bytearray, never a look-alike.
"""

from __future__ import annotations

import re
from typing import Any

MAX_ITEMS = 1000
MAX_DEPTH = 8
MAX_REPR = 300
MAX_CHARS = 1_000_000  # all the text one encoded value may carry: a huge return is cut, not a torn record
MAX_INT_BITS = 10_000  # json cannot print an int of more than 4,300 digits (sys.int_max_str_digits)


class Opaque:
    """A value the judge cannot rebuild: shown by its type and repr, equal to nothing else.

    Read-only, like a frozen dataclass; not one, because every judged child imports this
    module, and `dataclasses` brings `inspect` (~7 ms of a child's ~75 ms start)."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "text", text)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"an Opaque is read-only: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return type(other) is Opaque and (self.type_name, self.text) == (other.type_name, other.text)

    def __hash__(self) -> int:
        return hash((self.type_name, self.text))

    def __reduce__(self) -> tuple:  # copy and pickle rebuild it through __init__
        return Opaque, (self.type_name, self.text)

    def __repr__(self) -> str:
        return self.text


def encode(value: Any, depth: int = 0, _left: list[int] | None = None) -> dict:
    left = [MAX_CHARS] if _left is None else _left  # characters still allowed, shared by the whole value
    if depth > MAX_DEPTH:
        return {"t": "other", "type": type(value).__name__, "repr": "<too deep>"}
    if left[0] <= 0:
        return {"t": "other", "type": type(value).__name__, "repr": "<cut: the value is too large>"}
    kind = type(value)
    if value is None:
        return {"t": "none"}
    if kind is bool:
        return {"t": "bool", "v": value}
    if kind is int:
        if value.bit_length() > MAX_INT_BITS:
            return {"t": "other", "type": "int", "repr": f"<an int of about {int(value.bit_length() * 0.30103)} digits>"}
        return {"t": "int", "v": value}
    if kind is float:
        return {"t": "float", "v": repr(value)}
    if kind is str:
        text = value[: min(100_000, left[0])]
        left[0] -= len(text)
        return {"t": "str", "v": text}
    if kind is bytes or kind is bytearray:
        data = bytes(value[: min(100_000, left[0])])
        left[0] -= len(data)
        return {"t": kind.__name__, "v": data.decode("latin-1")}
    if kind in (list, tuple):
        items = [encode(item, depth + 1, left) for item in value[:MAX_ITEMS]]
        return {"t": kind.__name__, "v": items, "cut": len(value) > MAX_ITEMS}
    if kind is dict:
        pairs = [[encode(k, depth + 1, left), encode(v, depth + 1, left)] for k, v in list(value.items())[:MAX_ITEMS]]
        return {"t": "dict", "v": pairs}
    try:
        text = repr(value)[:MAX_REPR]
    except Exception:  # a student's __repr__ may raise
        text = f"<{kind.__name__} object>"
    left[0] -= len(text)
    return {"t": "other", "type": kind.__name__, "repr": text}


def decode(data: dict) -> Any:
    tag = data.get("t")
    if tag == "none":
        return None
    if tag in ("bool", "int", "str"):
        return data["v"]
    if tag == "float":
        return float(data["v"])
    if tag == "bytes":
        return data["v"].encode("latin-1")
    if tag == "bytearray":
        return bytearray(data["v"].encode("latin-1"))
    if tag == "list":
        return [decode(item) for item in data["v"]]
    if tag == "tuple":
        return tuple(decode(item) for item in data["v"])
    if tag == "dict":
        out = {}
        for k, v in data["v"]:
            key = decode(k)
            try:
                out[key] = decode(v)
            except TypeError:  # an unhashable key cannot come back as a key
                return Opaque("dict", "<dict with unhashable keys>")
        return out
    return Opaque(str(data.get("type", "?")), str(data.get("repr", "?")))


def same(a: Any, b: Any) -> bool:
    """Equality that also compares types, so True != 1 and (1,) != [1]."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def show(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Refused before json.loads (a recursive parser) sees it: 64 KB of "[" is a RecursionError.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes and all (unrolled: 2x faster)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")
_OPENING = frozenset(b"[{")


def too_deep(line: bytes, limit: int) -> bool:
    """Whether a JSON text `line` nests arrays/objects deeper than `limit` (a loop, never recursion).

    Brackets inside JSON strings do not count; an unbalanced line is left to json.loads."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    every = _STRING.sub(b"", line).translate(None, _NOT_BRACKETS)
    # Most long reports are shallow: take away the innermost pairs, one level a pass (in C).
    # Empty within `limit` passes: not too deep. What is left (deep, or unbalanced) is walked.
    brackets = every
    for _ in range(limit):
        if not brackets:
            return False
        shorter = _INNERMOST.sub(b"", brackets)  # one level: "{[]}" takes two passes
        if len(shorter) == len(brackets):
            break
        brackets = shorter
    depth = 0
    for bracket in every:
        depth += 1 if bracket in _OPENING else -1
        if depth > limit:
            return True
    return False
