"""Reading the catalogues of wrong solutions (`tests/wrong_solutions/<lab>/*.py`).

Each file is a copy of the lab's reference with one realistic mistake, and starts with
`\"\"\"Wrong: <mistake>. Fails step <N>. Clause: <id>. Message: <text the student must be told>\"\"\"`
(the clause is the contract clause, `labkit.judge.contract`, whose case must catch it).
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

from labkit.judge.verdict import LabVerdict, StepVerdict

DOCSTRING = re.compile(r'\A"""Wrong: (?P<mistake>.+?)\. Fails step (?P<step>\d+|final)\. '
                       r'(?:Clause: (?P<clause>(?:\d+|final)\.[a-z0-9-]+)\. )?'
                       r'Message: (?P<message>.+?)"""\n', re.S)


def promise(path: Path) -> dict[str, str]:
    """What a wrong solution's docstring says: the mistake, the failing step, the message."""
    match = DOCSTRING.match(path.read_text())
    assert match, f"{path.name} must start with '\"\"\"Wrong: ... Fails step N. Message: ...\"\"\"'"
    return match.groupdict()


def failures(step: StepVerdict) -> str:
    return "\n\n".join(f"[{c.name}]\n{c.message}" for c in step.cases if not c.passed)


def by_step(verdict: LabVerdict) -> dict[str, StepVerdict]:
    return {str(s.step): s for s in verdict.steps}


def touched_definitions(path: Path, reference: Path) -> set[str]:
    """The top-level definitions of the reference that a wrong solution changes."""
    text = reference.read_text()
    spans = []
    for node in ast.parse(text).body:
        label = getattr(node, "name", None) or ast.unparse(getattr(node, "targets", [node])[0])
        spans.append((node.lineno, node.end_lineno, label))
    body = DOCSTRING.sub("", path.read_text(), count=1).lstrip("\n").splitlines()
    touched = set()
    matcher = difflib.SequenceMatcher(None, text.splitlines(), body, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for line in range(i1 + 1, i2 + 1) if i2 > i1 else [i1]:  # 1-based; an insertion follows line i1
            touched |= {label for first, last, label in spans if first <= line <= last} or {f"line {line}"}
    return touched
