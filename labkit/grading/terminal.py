"""Text a student could choose, made safe to print on the instructor's terminal.

A folder name, a notebook's file name, a message quoting the student's code: printed raw, an
ESC sequence could clear the screen or retitle the window, a CR could overwrite the line
before it, a bidi override (U+202E) could show `evil.ipynb` as `bynpi.live`. `safe` shows
every such character as a visible escape instead (`\\x1b`, `\\r`, `\\u202e`): C0 controls
(newline included: one field never starts a line of its own), DEL, C1 controls, and the
Unicode bidi embeddings, overrides, isolates and marks.
"""

from __future__ import annotations

import re

# C0, DEL, C1; bidi marks (LRM, RLM, ALM), embeddings and overrides (U+202A–U+202E),
# isolates (U+2066–U+2069); the line and paragraph separators some terminals honour.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in NAMED:
        return NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` as one printable line: every control and bidi character shown as an escape."""
    return UNSAFE.sub(_escape, str(text))


def safe_lines(text: object) -> str:
    """Several lines: each made `safe`, the line breaks between them kept."""
    return "\n".join(safe(line) for line in str(text).split("\n"))
