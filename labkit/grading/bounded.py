"""Every byte a student controls that the grader parses goes through here, bounded.

A submission's notebook, its `work/quiz-<lab>.json` and `work/revealed-<lab>.json` are read
with a cap on size (while reading: `read_capped`), then checked by a linear, non-recursive
pre-scan of the raw bytes (`scan`) for how deep they nest, how many lists and objects and how
many strings they hold — before `json.loads` sees them. Python's json recurses once per level
and raises RecursionError (not ValueError) at about 1000: a 200 KB file nested 100,000 deep
used to end the whole batch. With the pre-scan, deep input never reaches a recursive parser,
and everything after it (nbformat, copy.deepcopy, json.dumps) walks at most `max_depth` levels.

Every refusal is a `Refused` whose message a student understands ("it is nested 100,000 deep;
the grader reads at most 64 levels"); the batch turns it into that student's `malformed` row.
`describe` makes any other exception printable in a row the same way.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path


class Refused(ValueError):
    """The bytes are not read as JSON; the message says why, for the student ("it is ...")."""


@dataclass(frozen=True)
class Bounds:
    max_bytes: int
    max_depth: int  # lists and objects inside each other (the outermost counts 1)
    max_containers: int  # lists and objects in all
    max_strings: int  # strings in all, object keys included


# A notebook: 20 MB as before. 64 levels is far above any notebook Jupyter writes (widget state
# and plotly figures nest about 10); the counts allow a 20 MB notebook of short printed lines
# and keep what json.loads builds from 20 MB to a few hundred MB.
NOTEBOOK = Bounds(max_bytes=20 * 1024**2, max_depth=64, max_containers=1_000_000, max_strings=4_000_000)
# `work/quiz-<lab>.json` and `work/revealed-<lab>.json`: a few dozen entries, 3 levels deep.
SIDE_FILE = Bounds(max_bytes=256 * 1024, max_depth=16, max_containers=10_000, max_strings=50_000)


def read_capped(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never following a link, never blocking, never past `limit`.

    Raises OSError (with a reason a student understands) for a link, a FIFO, a device, a
    folder, or a file larger than `limit` (checked before reading, and again while reading).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "it is a symbolic link; links are never followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"it is larger than {limit:,} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"it is larger than {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


# A JSON string as json.loads reads it: from a quote to the next quote no backslash escapes.
# Possessive (no backtracking), and an unterminated string runs to the end of the input (as it
# does for json.loads), so every quote outside a string starts exactly one match: linear time.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]++")
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))
# A \uD800-\uDFFF escape: json.loads lets a lone one through, and UTF-8 cannot encode it later.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Shape:
    depth: int
    containers: int
    strings: int


def scan(data: bytes, max_containers: int | None = None) -> Shape:
    """How deep the JSON in `data` nests, and how many lists, objects and strings it holds.

    Linear and not recursive: strings are cut out first (a bracket inside a string is text),
    then the brackets left are counted, +1 for `[` `{` and -1 for `]` `}`; the depth is the
    highest running sum. For valid JSON it is exactly the nesting; for anything else it is at
    least as deep as json.loads gets before it fails (json.loads reads left to right, and up to
    where it fails the input is a valid prefix, whose strings and brackets these are).
    Past `max_containers` lists and objects the depth is not computed (reported as 0).
    """
    bare, strings = _STRING.subn(b"", data)
    brackets = _NOT_BRACKET.sub(b"", bare)
    containers = brackets.count(b"[") + brackets.count(b"{")
    if not containers or (max_containers is not None and containers > max_containers):
        return Shape(0, containers, strings)
    depth = max(accumulate(map(_STEP.__getitem__, brackets)))
    return Shape(max(depth, 0), containers, strings)


def loads(data: bytes, bounds: Bounds):
    """The JSON value in `data` (UTF-8, a BOM allowed), or Refused with the reason."""
    if len(data) > bounds.max_bytes:
        raise Refused(f"it is larger than {bounds.max_bytes:,} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Refused("it is not text (not UTF-8)") from None
    shape = scan(data, bounds.max_containers)
    if shape.containers > bounds.max_containers:
        raise Refused(f"it holds {shape.containers:,} lists and objects; the grader reads at most "
                      f"{bounds.max_containers:,}")
    if shape.depth > bounds.max_depth:
        raise Refused(f"it is nested {shape.depth:,} levels deep; the grader reads at most {bounds.max_depth}")
    if shape.strings > bounds.max_strings:
        raise Refused(f"it holds {shape.strings:,} strings; the grader reads at most {bounds.max_strings:,}")
    try:
        value = json.loads(text)
    except RecursionError:  # not reached after the scan; kept so no parse can end a batch
        raise Refused("it is nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, and an integer of over 4300 digits
        where = f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if hasattr(exc, "lineno") else ""
        hint = " It is empty." if not text.strip() else ""
        raise Refused(f"it is not valid JSON{where}.{hint}".rstrip(".")) from None
    if _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise Refused("it holds a \\u escape that is not a character (a lone UTF-16 surrogate)") from None
    return value


def read(path: Path, bounds: Bounds):
    """`read_capped`, then `loads`; OSError (the file) or Refused (its content)."""
    return loads(read_capped(path, bounds.max_bytes), bounds)


def printable(text: str, limit: int = 300) -> str:
    """Text from a student (or an exception about it) as one safe line: control characters
    escaped, cut to `limit` characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return out if len(out) <= limit else out[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """An exception as a row's message: its type and its (escaped, shortened) message."""
    return printable(f"{type(exc).__name__}: {exc}")


def side_file(notebook: Path, name: str):
    """`work/NAME` beside a submitted notebook, parsed (`SIDE_FILE` bounds); None if there is none.

    No `work` folder, a `work` that is a link, no file, or a file that is a link: None (links are
    never followed). A file that is there but cannot be read as bounded JSON: Refused, naming it.
    """
    folder = notebook.parent / "work"
    if folder.is_symlink() or not folder.is_dir():
        return None
    try:
        return read(folder / name, SIDE_FILE)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise Refused(f"work/{name} could not be read: {exc.strerror or exc}.") from None
    except Refused as exc:
        raise Refused(f"work/{name} could not be read: {exc}.") from None
