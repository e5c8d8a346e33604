"""The helpers a step's reference cell calls that another step's cell defines.

A reference cell may call a private helper that an earlier step's reference defines: relay's
`_finite` is in step 3's cell and steps 5-7 call it. A student who wrote their own step 3 and
then reveals step 5 has no `_finite`, and the revealed cell would end in a NameError. So a
reveal carries those helpers along (`for_step`). A helper is a top-level name that a step's
reference defines and its skeleton does not: the names a skeleton defines (the step's
functions, the provided code) every student's cell defines too.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    name: str
    step: str
    source: str


def defined(code: str) -> dict[str, ast.stmt]:
    """Top-level name → the statement that binds it (def, class, assignment, import)."""
    found: dict[str, ast.stmt] = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        found[leaf.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                found[(alias.asname or alias.name).split(".")[0]] = node
    return found


def globals_used(code: str) -> set[str]:
    """The global names `code` reads: at top level, and free in any function or class in it."""
    top = symtable.symtable(code, "<cell>", "exec")
    used = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        used |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        tables.extend(table.get_children())
    return used


def _statement_source(code: str, node: ast.stmt) -> str:
    lines = code.splitlines()
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(lines[first - 1:node.end_lineno])


def for_step(step: str, solutions: dict[str, str], skeletons: dict[str, str]) -> list[Helper]:
    """The helpers step `step`'s reference needs from other steps' references, in lesson order.

    `solutions` and `skeletons`: every step cell of the lesson (the provided code included),
    in lesson order, as the reference and as the student's notebook have it.
    """
    given = set(dir(builtins)).union(*(defined(code) for code in skeletons.values()))
    owners = {}
    for other, code in solutions.items():
        if other != step:
            for name, node in defined(code).items():
                if name not in given:
                    owners.setdefault(name, (other, code, node))
    wanted, chosen = list(globals_used(solutions[step]) - set(defined(solutions[step]))), {}
    while wanted:
        name = wanted.pop()
        if name in chosen or name not in owners:
            continue
        other, code, node = owners[name]
        source = _statement_source(code, node)
        chosen[name] = Helper(name, other, source)
        wanted.extend(globals_used(source) - set(defined(source)))
    order = {key: index for index, key in enumerate(solutions)}
    return sorted(chosen.values(), key=lambda h: (order[h.step], solutions[h.step].find(h.source)))


def with_helpers(step: str, solutions: dict[str, str], skeletons: dict[str, str]) -> str:
    """Step `step`'s reference, after the helpers it needs from other steps (none: unchanged)."""
    helpers = for_step(step, solutions, skeletons)
    if not helpers:
        return solutions[step]
    steps = sorted({h.step for h in helpers}, key=list(solutions).index)
    named = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(steps[:-1])} and {steps[-1]}"
    intro = (f"# Helpers from the reference of {named}, which this cell calls: your own {named} may not\n"
             f"# define them. A helper of yours with the same name is replaced by this one.")
    sources = list(dict.fromkeys(h.source for h in helpers))  # one assignment may bind several names
    return "\n\n\n".join([intro + "\n" + "\n\n\n".join(sources), solutions[step]])
