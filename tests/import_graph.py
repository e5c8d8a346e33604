"""Which folder imports which: the import graph of `labkit/` and `checks/`, folded to folders.

A folder is a package directory (`labkit/judge`, `checks/vending`; `labkit`'s own top-level
modules are the folder `labkit`). An edge A → B means a module in A imports one in B when it is
imported ("eager": at module level, outside `if TYPE_CHECKING:`), or only when a function runs
("deferred"). A circle between folders is a design fault even when deferred imports keep Python
from tripping over it: the two folders cannot be understood, tested or moved apart.

    python tests/import_graph.py          # prints the folders, their edges and the circles
"""

from __future__ import annotations

import ast
from pathlib import Path

import parse_python

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("labkit", "checks")


def folder_of(module: str) -> str | None:
    """`labkit.judge.run` → `labkit/judge`; None outside our packages. A package's own top-level
    modules are nodes of their own (`labkit.labs` → `labkit/labs.py`): `labkit/cli.py` imports
    every folder and every folder imports `labkit/labs.py`, which is layering, not a circle."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    path = ROOT.joinpath(*parts)
    while parts and not path.is_dir():
        parts, path = parts[:-1], path.parent
    if len(parts) == 1:
        rest = module.split(".")[1:2]
        return f"{parts[0]}/{rest[0]}.py" if rest and ROOT.joinpath(parts[0], rest[0] + ".py").exists() else parts[0]
    return "/".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            parts = list(file.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


def parse(file: Path) -> ast.Module:
    """`ast.parse` of a file (`parse_python`: CPython 3.11.7's spurious SystemError)."""
    return parse_python.parse(file.read_text(encoding="utf-8"), str(file))


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, file: Path) -> list[tuple[str, bool]]:
    """(imported module, eager) for every import statement in the file."""
    tree = parse(file)
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            inner = eager and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, eager) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.append((base, eager))
                found.extend((f"{base}.{alias.name}", eager) for alias in child.names)
            visit(child, inner)

    visit(tree, True)
    return found


def folder_edges() -> dict[tuple[str, str], bool]:
    """(importing folder, imported folder) → True when at least one such import is eager."""
    modules = _modules()
    edges: dict[tuple[str, str], bool] = {}
    for module, file in modules.items():
        source = folder_of(module)
        for target_module, eager in _imports(module, file):
            target = folder_of(target_module)
            if target and target != source and (target_module in modules or target_module.rpartition(".")[0] in modules):
                edges[(source, target)] = edges.get((source, target), False) or eager
    return edges


def circles(edges) -> list[list[str]]:
    """The strongly connected components with more than one folder (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for source, target in edges:
        graph.setdefault(source, []).append(target)
        graph.setdefault(target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strong(node)
    return sorted(found)


def main() -> None:
    edges = folder_edges()
    for (source, target), eager in sorted(edges.items()):
        print(f"{source} -> {target}{'' if eager else '   (deferred only)'}")
    everything = circles(edges)
    eager = circles({edge for edge, is_eager in edges.items() if is_eager})
    print(f"\n{len({f for e in edges for f in e})} folders, {len(edges)} edges")
    print(f"circles between folders, counting deferred imports: {len(everything)}")
    for circle in everything:
        print("  " + " <-> ".join(circle))
    print(f"circles between folders, eager imports only: {len(eager)}")
    for circle in eager:
        print("  " + " <-> ".join(circle))


if __name__ == "__main__":
    main()
