"""`ast.parse` for the tests, surviving CPython 3.11.7's spurious SystemError.

CPython 3.11 keeps the AST conversion's recursion depth in state shared by the threads of a
process, so a parse races with any other parse in the same process, including the one
`traceback` makes to underline an error (`^^^^`), in a background thread: "AST constructor
recursion depth mismatch" (seen in CI in four tests; fixed in later CPython releases). The same
source parses on a second try.
"""

from __future__ import annotations

import ast


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    try:
        return ast.parse(source, filename)
    except SystemError:
        return ast.parse(source, filename)
