"""The architecture, as a test: folders import each other in one direction, and labkit/ knows no lab.

`labkit/` is the machinery, `checks/<lab>/` the content; labs are found through their manifests
(`labkit.labs`), so machinery that imports a lab's package, or a circle between two folders,
is a layout fault even when Python happens to import it (tests/import_graph.py prints the graph).
"""

from __future__ import annotations

import ast
import re

import import_graph

from labkit import labs


def test_no_circle_between_folders_not_even_through_deferred_imports():
    edges = import_graph.folder_edges()
    assert import_graph.circles(edges) == []


def test_the_circle_finder_finds_a_circle():
    assert import_graph.circles({("a", "b"): True, ("b", "c"): False, ("c", "a"): True, ("c", "d"): True}) == [["a", "b", "c"]]


def test_the_machinery_never_imports_a_lab():
    into_labs = sorted(f"{source} -> {target}" for source, target in import_graph.folder_edges()
                       if source.startswith("labkit") and target.startswith("checks"))
    assert into_labs == []


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_the_machinery_never_names_a_lab_in_its_code():
    """Docstrings may use a lab as an example; a string the code uses may not name one (a
    module path, a notebook or file name, a lab's name)."""
    manifests = labs.manifests().values()
    names = "|".join(re.escape(name) for lab in manifests for name in (lab.name, lab.package))
    pattern = re.compile(rf"\b(?:{names})\b")
    found = []
    for file in sorted((import_graph.ROOT / "labkit").rglob("*.py")):
        tree = import_graph.parse(file)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                    and pattern.search(node.value):
                found.append(f"{file.relative_to(import_graph.ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert found == []
