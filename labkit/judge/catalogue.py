"""A lab's catalogue of wrong solutions: one data file of mistakes, one small patch per mistake.

`<folder>/<lab>.toml` lists each mistake (name, step, clause, mistake, message); the patch
`<folder>/<lab>/<name>.patch` is a unified diff from the lab's reference to the mistaken code.
`Catalogue.source` rebuilds the file a student with that mistake would hand in: the docstring
line the tests read, then the patched reference. A patch is applied strictly (every context
and removed line where the hunk says, hunks in order, no fuzz), so a change to the reference
that touches a mistake's lines fails loudly instead of testing a different mistake.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

CONTEXT = 3  # lines of context around each change in a patch
# The first line of a wrong solution's source: what it gets wrong, which step and clause catch
# it, and a part of the message the student must be told. `parse` reads it back.
DOCSTRING = re.compile(r'\A"""Wrong: (?P<mistake>.+?)\. Fails step (?P<step>\d+|final)\. '
                       r'Clause: (?P<clause>(?:\d+|final)\.[a-z0-9-]+)\. Message: (?P<message>.+?)"""\n', re.S)
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
FIELDS = ("name", "step", "clause", "mistake", "message")


class PatchError(ValueError):
    """A patch that does not apply to the text it is meant for."""


@dataclass(frozen=True)
class Wrong:
    """One mistake: a table of the lab's data file."""

    name: str  # the patch's and the built file's stem
    step: str  # "1", "2", … or "final", as the docstring says it
    clause: str
    mistake: str
    message: str

    @property
    def docstring(self) -> str:
        return (f'"""Wrong: {self.mistake}. Fails step {self.step}. Clause: {self.clause}. '
                f'Message: {self.message}"""')

    def promise(self) -> dict[str, str]:
        """What the docstring promises: mistake, step, clause and message."""
        return {"mistake": self.mistake, "step": self.step, "clause": self.clause, "message": self.message}


@dataclass(frozen=True)
class Catalogue:
    folder: Path  # holds <lab>.toml and <lab>/<name>.patch
    lab: str
    entries: list[Wrong]
    # A blank line between the docstring and the code. Lab 03's copies were written without
    # one; kept, so its wrong solutions' line numbers (and so their messages) did not move.
    blank_line: bool = True

    def patch_path(self, name: str) -> Path:
        return self.folder / self.lab / f"{name}.patch"

    def body(self, entry: Wrong, reference: str) -> str:
        """The reference with `entry`'s mistake: its patch applied."""
        path = self.patch_path(entry.name)
        return apply(path.read_text(encoding="utf-8"), reference, str(path))

    def source(self, entry: Wrong, reference: str) -> str:
        """The whole wrong solution: docstring line, the lab's separator, the patched reference."""
        return entry.docstring + "\n" + ("\n" if self.blank_line else "") + self.body(entry, reference)


def data_file(folder: Path, lab: str) -> Path:
    return folder / f"{lab}.toml"


def read(folder: Path, lab: str) -> Catalogue:
    data = tomllib.loads(data_file(folder, lab).read_text(encoding="utf-8"))
    entries = [Wrong(**{key: str(row[key]) for key in FIELDS}) for row in data.get("wrong", [])]
    return Catalogue(folder, lab, entries, data.get("blank_line", True))


def dumps(catalogue: Catalogue) -> str:
    """The data file's text, entries sorted by name (JSON strings are TOML basic strings)."""
    lines = [f"# Wrong solutions of lab {catalogue.lab}: one table per mistake; its code is the reference",
             f"# patched by {catalogue.lab}/<name>.patch (labkit/judge/catalogue.py, tests/catalogue.py).", ""]
    if not catalogue.blank_line:
        lines += ["blank_line = false  # no blank line after the docstring (see labkit/judge/catalogue.py)", ""]
    for entry in sorted(catalogue.entries, key=lambda e: e.name):
        lines.append("[[wrong]]")
        for key in FIELDS:
            value = getattr(entry, key)
            lines.append(f"{key} = {value if key == 'step' and value.isdigit() else json.dumps(value, ensure_ascii=False)}")
        lines.append("")
    return "\n".join(lines)


def parse(name: str, text: str) -> tuple[Wrong, str]:
    """A wrong solution's source → its entry and its code (the text after the docstring line)."""
    match = DOCSTRING.match(text)
    if not match:
        raise ValueError(f"{name} must start with '\"\"\"Wrong: ... Fails step N. Clause: ... Message: ...\"\"\"'")
    return Wrong(name, **match.groupdict()), text[match.end():]


def make_patch(reference: str, changed: str, filename: str, context: int = CONTEXT) -> str:
    """A unified diff of `reference` → `changed`, headed `a/<filename>` and `b/<filename>` as git writes it."""
    if not (reference.endswith("\n") and changed.endswith("\n")):
        raise ValueError("both texts must end with a newline")
    return "".join(difflib.unified_diff(reference.splitlines(True), changed.splitlines(True),
                                        f"a/{filename}", f"b/{filename}", n=context))


def apply(patch: str, original: str, where: str = "the patch") -> str:
    """`original` with the unified diff `patch` applied, strictly: see the module's docstring."""
    lines, out, done = original.splitlines(True), [], 0  # done: original lines already copied
    text = patch.splitlines(True)
    if len(text) < 2 or not (text[0].startswith("--- ") and text[1].startswith("+++ ")):
        raise PatchError(f"{where}: not a unified diff (no '--- ' and '+++ ' header)")
    row, number = 2, 0
    while row < len(text):
        number += 1
        head = HUNK.match(text[row])
        if not head:
            raise PatchError(f"{where}: line {row + 1} should start hunk {number}, found {text[row]!r}")
        old_start, old_len, new_start, new_len = (int(g) if g is not None else 1 for g in head.groups())
        old, new, row = [], [], row + 1
        while row < len(text) and (len(old) < old_len or len(new) < new_len):
            mark, line = text[row][:1], text[row][1:]
            if mark not in " -+":
                raise PatchError(f"{where}: hunk {number} ({head.group()}): unexpected line {text[row]!r}")
            old += [line] if mark in " -" else []
            new += [line] if mark in " +" else []
            row += 1
        if (len(old), len(new)) != (old_len, new_len):
            raise PatchError(f"{where}: hunk {number} ({head.group()}) is cut short")
        at = old_start - 1 if old_len else old_start  # an empty range names the line before it
        if at < done:
            raise PatchError(f"{where}: hunk {number} ({head.group()}) starts before hunk {number - 1} ends")
        if lines[at:at + old_len] != old:
            n = next(n for n, line in enumerate(old) if lines[at + n:at + n + 1] != [line])
            got = repr(lines[at + n]) if at + n < len(lines) else "past the end"
            raise PatchError(f"{where}: hunk {number} ({head.group()}) does not apply: the reference's line "
                             f"{at + n + 1} is {got}, the patch expects {old[n]!r}")
        out += lines[done:at]
        if new_len and new_start != len(out) + 1:
            raise PatchError(f"{where}: hunk {number} ({head.group()}) puts its lines at {new_start}, "
                             f"but they land at {len(out) + 1}")
        out += new
        done = at + old_len
    return "".join(out + lines[done:])
