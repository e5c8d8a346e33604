""""What the check tries": a step's rules, written into its lesson from the lab's contract.

One source: the clauses that tag the check's cases (`checks/<lab>/contract.py`) are also what
`docs/coverage.md` lists and what the lesson says, so a student never meets a rule for the first
time as a red case. The build puts this cell just before the step's code cell (before the
final check's cell for `final`); `tests/test_lesson_rules.py` fails when a case of a step's
check is tagged with a clause that step's text does not state.
"""

from __future__ import annotations

import re

from labkit.judge.contract import Clause

# Outside `code` spans a clause's words are plain text: "'_'", "'*'", "\\t" or two "$" must not
# turn into emphasis, an escape or LaTeX in JupyterLab's Markdown.
_SPECIAL = re.compile(r"([\\`*_$<>\[\]#|~])")


def cell_id(lab: str, step: str) -> str:
    return f"{lab}-rules-{step}"


def step_clauses(contract: tuple[Clause, ...], step: str) -> list[Clause]:
    return [clause for clause in contract if clause.step == step]


def markdown(contract: tuple[Clause, ...], step: str) -> str | None:
    """The rules cell for one step, folded (a list of thirty rules should not push the lesson
    away), or None when the contract has no clause for that step."""
    clauses = step_clauses(contract, step)
    if not clauses:
        return None
    what = "the final check" if step == "final" else f"step {step}'s check"
    lines = [
        "<details>",
        f"<summary><b>What the check tries</b>: the {len(clauses)} rules {what} holds your code to</summary>",
        "",
        "Each rule has a name; a failing case in the check's panel names the rule it caught.",
        "",
    ]
    lines += [item(clause) for clause in clauses]
    lines += ["", "</details>"]
    return "\n".join(lines)


def item(clause: Clause) -> str:
    """One rule as a Markdown list item: its id, then its words."""
    parts = clause.text.split("`")
    text = "".join(f"`{part}`" if index % 2 else _SPECIAL.sub(r"\\\1", part)
                   for index, part in enumerate(parts)) if len(parts) % 2 else _SPECIAL.sub(r"\\\1", clause.text)
    return f"- `{clause.id}` {text}"
