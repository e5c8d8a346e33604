"""A lab's contract as numbered clauses, so every check case says which rule it tries.

Each clause is one rule of `shared/labs/<lab>.md` (a range bound, a type rule, an ordering
or transaction rule, a crash scenario…). Cases carry the IDs of the clauses they exercise,
and a failing case the ID of the clause it caught, so a grade, a class report or a coverage
table can count by rule instead of parsing messages. IDs are stable: `<step>.<slug>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CLAUSE_ID = re.compile(r"\A(?:\d+|final)\.[a-z0-9]+(?:-[a-z0-9]+)*\Z")


@dataclass(frozen=True)
class Clause:
    id: str  # "1.qty-bool": step, then a slug
    text: str  # the rule in plain words

    def __post_init__(self) -> None:
        if not CLAUSE_ID.match(self.id):
            raise ValueError(f"clause id {self.id!r} is not '<step>.<slug>' (lower case, digits, dashes)")

    @property
    def step(self) -> str:
        return self.id.partition(".")[0]


def contract(*clauses: Clause) -> tuple[Clause, ...]:
    """A lab's clauses, checked once: IDs unique."""
    seen: set[str] = set()
    for clause in clauses:
        if clause.id in seen:
            raise ValueError(f"clause {clause.id} is declared twice")
        seen.add(clause.id)
    return tuple(clauses)
