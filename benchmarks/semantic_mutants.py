"""Semantic mutation operators: the mistakes of meaning students make in idempotent delivery.

cosmic-ray's operators change syntax (`<` for `<=`, a number, `and` for `or`); the checks catch
nearly all of those, yet they missed students' mistakes of meaning far more often. Each operator
here is one class of such mistakes, written as a plain function `(source) -> list[Mutant]` that
applies wherever its pattern occurs in a module (never a hand-written edit of one line):

    read_before_begin       the first statement a transaction runs moved to before its BEGIN
                            (or before the `with` of a function that runs BEGIN): check-then-act
    begin_deferred          BEGIN IMMEDIATE -> BEGIN DEFERRED (fails at its first write instead of waiting)
    where_drop_conjunct     one conjunct of a SQL `a AND b` dropped (widens; `(c OR 1)` if c binds `?`)
    where_narrow            `AND col = lit` added to a WHERE, col = lit taken from another WHERE on
                            the same table in the module (duplicates looked for in some states only)
    swallow_error           a `raise` in an except handler -> `pass`
    raise_to_return         a `raise` in an except handler -> `return <the function's falsy return>`
    except_base_to_exception  `except BaseException` -> `except Exception` (Ctrl-C leaves the
                            transaction open)
    widen_except            `except SomeError` -> `except Exception` (and `sqlite3.X` -> `sqlite3.Error`)
    unguarded_rollback      `if con.in_transaction: ROLLBACK` -> `ROLLBACK` (can replace the error)
    drop_rollback           an `execute("ROLLBACK")` statement removed
    insert_or_replace       `INSERT [OR IGNORE] INTO` -> `INSERT OR REPLACE INTO`
    overwrite_on_conflict   `ON CONFLICT DO NOTHING` / `DO UPDATE SET c = <expr>` -> `SET c = excluded.c`
    setup_not_idempotent    `CREATE ... IF NOT EXISTS` -> `CREATE ...`; `INSERT OR IGNORE` -> `INSERT`
    commit_per_row          `COMMIT; BEGIN IMMEDIATE` added at the end of a loop inside a transaction,
                            or a COMMIT that follows a loop moved into it
    hook_before_previous    a call to a hook parameter (`after_*`, `before_*`, `on_*`), or the `if`
                            that guards it, moved before the statement that precedes it
    hook_on_failure         the hook's guard loses its other conditions (`if error is None and hook`),
                            or the hook is also called in the preceding failure branch (`if ...: raise`)
    eof_strip               `if not line:` <-> `if not line.strip():` for a line read from a stream
    unbounded_wait          `await asyncio.wait_for(x, t)` -> `await x`

Edits are made on the source text at the AST's positions, so the rest of the module (comments,
layout) stays as written and a mutant's diff shows only the mistake. A mutation that would not
compile is skipped. `python benchmarks/semantic_mutants.py FILE` lists the mutants of a file.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "semantic/"


@dataclass(frozen=True)
class Mutant:
    operator: str  # "semantic/<function name>", like cosmic-ray's "core/NumberReplacer"
    line: int  # where the mistake is, in the reference's numbering
    source: str  # the whole mutated module


# --- positions and text edits -------------------------------------------------------------------


def _starts(source: str) -> list[int]:
    """Character offset of each line's start (index 0 is line 1)."""
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return starts + [total]


def _offset(source: str, starts: list[int], line: int, col: int) -> int:
    """The character offset of AST position (line, col); `col` counts UTF-8 bytes."""
    text = source[starts[line - 1]:starts[line]]
    return starts[line - 1] + len(text.encode()[:col].decode(errors="ignore"))


def _span(source: str, node: ast.AST) -> tuple[int, int]:
    starts = _starts(source)
    return (_offset(source, starts, node.lineno, node.col_offset),
            _offset(source, starts, node.end_lineno, node.end_col_offset))


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _edit(source: str, edits: list[tuple[int, int, str]]) -> str:
    """Replace each (start, end) with its text; the edits do not overlap."""
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _mutant(name: str, reference: str, line: int, mutated: str) -> list[Mutant]:
    """The mutant, or nothing if it does not compile or changes nothing."""
    if mutated == reference:
        return []
    try:
        compile(mutated, "<mutant>", "exec")
    except SyntaxError:
        return []
    return [Mutant(PREFIX + name, line, mutated)]


# --- statements: blocks, moves, removals ----------------------------------------------------------


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    yield from (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _blocks(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every list of statements: bodies, else branches, handlers, finally blocks."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _own_nodes(stmts: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of these statements, not looking inside nested functions or classes."""
    todo = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)


def _lines(source: str, stmt: ast.stmt) -> list[str]:
    return source.splitlines(keepends=True)[stmt.lineno - 1:stmt.end_lineno]


def _reindent(lines: list[str], old: int, new: int) -> list[str]:
    """Shift a statement's lines from indentation `old` to `new` (continuation lines keep their offset)."""
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
        elif new >= old:
            out.append(" " * (new - old) + line)
        else:
            cut = min(old - new, len(line) - len(line.lstrip(" ")))
            out.append(line[cut:])
    return out


def _without(source: str, stmt: ast.stmt, block: list[ast.stmt], replacement: list[str] | None = None) -> list[str]:
    """The module's lines with `stmt` replaced (by `pass` if it was alone in its block)."""
    lines = source.splitlines(keepends=True)
    if replacement is None:
        replacement = [" " * stmt.col_offset + "pass\n"] if len(block) == 1 else []
    lines[stmt.lineno - 1:stmt.end_lineno] = replacement
    return lines


def _move_before(source: str, stmt: ast.stmt, block: list[ast.stmt], target: ast.stmt) -> str:
    """`stmt` taken out of its block and put, at `target`'s indentation, just before `target`
    (which comes earlier in the module)."""
    moved = _reindent(_lines(source, stmt), stmt.col_offset, target.col_offset)
    lines = _without(source, stmt, block)
    lines[target.lineno - 1:target.lineno - 1] = moved
    return "".join(lines)


def _insert_after(source: str, stmt: ast.stmt, new: list[str]) -> str:
    """Lines (already indented) put right after `stmt`."""
    lines = source.splitlines(keepends=True)
    lines[stmt.end_lineno:stmt.end_lineno] = new
    return "".join(lines)


def _call_name(node: ast.AST) -> str | None:
    """`f` for `f(...)`, `m` for `x.m(...)`."""
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return node.func.id
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
    return None


def _executes(stmt: ast.AST, keyword: str) -> bool:
    """`x.execute("<keyword> ...")` as a statement of its own."""
    return (isinstance(stmt, ast.Expr) and _call_name(stmt.value) == "execute" and stmt.value.args
            and isinstance(stmt.value.args[0], ast.Constant) and isinstance(stmt.value.args[0].value, str)
            and stmt.value.args[0].value.strip().upper().startswith(keyword))


def _transaction_functions(tree: ast.Module) -> set[str]:
    """Module functions that run BEGIN (like a `write_transaction` context manager)."""
    return {f.name for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(_executes(n, "BEGIN") for n in _own_nodes(f.body))}


def _transactions(tree: ast.Module, source: str) -> Iterator[tuple[str, ast.stmt, list[ast.stmt]]]:
    """(connection, the statement that begins, the statements that run inside) of every transaction
    begun by an `execute("BEGIN ...")` statement or a `with` of a function that runs one."""
    helpers = _transaction_functions(tree)
    for block in _blocks(tree):
        for n, stmt in enumerate(block):
            if _executes(stmt, "BEGIN"):
                yield ast.get_source_segment(source, stmt.value.func.value), stmt, block[n + 1:]
            elif (isinstance(stmt, ast.With) and len(stmt.items) == 1
                  and _call_name(stmt.items[0].context_expr) in helpers and stmt.items[0].context_expr.args):
                yield ast.get_source_segment(source, stmt.items[0].context_expr.args[0]), stmt, stmt.body


def _block_of(tree: ast.AST, stmt: ast.stmt) -> list[ast.stmt]:
    return next(block for block in _blocks(tree) if any(s is stmt for s in block))


def _hook_params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return {name for name in names if re.match(r"(after|before|on)_\w+$", name)}


def _hook_statements(tree: ast.Module) -> Iterator[tuple[ast.stmt, list[ast.stmt], str]]:
    """(statement, its block, hook) for each call of a hook parameter as a statement, or the `if`
    that guards such a call (`if hook is not None: hook(x)`)."""
    for function in _functions(tree):
        hooks = _hook_params(function)
        if not hooks:
            continue
        for block in _blocks(function):
            for stmt in block:
                if isinstance(stmt, ast.Expr) and _call_name(stmt.value) in hooks \
                        and isinstance(stmt.value.func, ast.Name):
                    yield stmt, block, stmt.value.func.id
                elif isinstance(stmt, ast.If) and not stmt.orelse:
                    named = {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)} & hooks
                    called = {_call_name(s.value) for s in stmt.body if isinstance(s, ast.Expr)}
                    if len(named) == 1 and named <= called:
                        yield stmt, block, named.pop()


# --- SQL in string literals ------------------------------------------------------------------------

SQL = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|BEGIN|COMMIT|ROLLBACK|WITH)\b")
STRING = re.compile(r"([rRuU]?)('''|\"\"\"|'|\")")


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def _char_positions(source: str, node: ast.Constant) -> list[int] | None:
    """For each character of the string's value, its offset in `source`, plus one last entry
    just after the final character; None for literals whose text is not their value character
    for character (escapes, f-strings, bytes)."""
    start, end = _span(source, node)
    positions, i = [], start
    while i < end:
        if source[i].isspace() or source[i] in "()":
            i += 1
            continue
        if source[i] == "#":
            i = source.index("\n", i)
            continue
        match = STRING.match(source, i)
        if not match:
            return None
        body = match.end()
        close = source.find(match[2], body)
        if close < 0 or close > end or (not match[1] and "\\" in source[body:close]):
            return None
        positions += range(body, close)
        i = close + len(match[2])
    if not positions or "".join(source[p] for p in positions) != node.value:
        return None
    return positions + [positions[-1] + 1]


def _sql_strings(tree: ast.Module, source: str) -> Iterator[tuple[str, list[int]]]:
    """(value, character positions) of every string literal that is SQL (not docstrings, f-strings)."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and SQL.match(node.value):
            positions = _char_positions(source, node)
            if positions is not None:
                yield node.value, positions


def _sql_edit(name: str, source: str, positions: list[int], edits: list[tuple[int, int, str]]) -> list[Mutant]:
    """Apply edits given in the string's value (start, end, text) to the module. A replaced range must
    lie in one piece of an implicitly concatenated literal; an insertion at a seam goes at the end
    of the piece before it."""
    done = []
    for start, end, text in edits:
        if end > start:
            if positions[end - 1] - positions[start] != end - 1 - start:
                return []
            done.append((positions[start], positions[end - 1] + 1, text))
        else:
            at = positions[start] if start == 0 else positions[start - 1] + 1
            done.append((at, at, text))
    line = _line_of(source, done[0][0])
    return _mutant(name, source, line, _edit(source, done))


def _scan(sql: str) -> Iterator[tuple[int, int, str]]:
    """(index, paren depth around it, character) of every character outside quoted SQL text; a
    parenthesis has the depth outside it, an unmatched `)` depth -1."""
    depth, quote = 0, None
    for i, ch in enumerate(sql):
        if quote:
            quote = None if ch == quote else quote
            continue
        if ch in "'\"":
            quote = ch
            continue
        depth -= ch == ")"
        yield i, depth, ch
        depth += ch == "("


CLAUSE_END = re.compile(r"\s+(ORDER\s+BY|GROUP\s+BY|LIMIT|RETURNING|ON\s+CONFLICT)\b")


def _where_clauses(sql: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, table) of each WHERE condition: from after WHERE to the end of its clause
    (ORDER BY, LIMIT..., `;`, a closing parenthesis or the end of the string)."""
    for match in re.finditer(r"\bWHERE\s+", sql):
        start, end = match.end(), len(sql)
        for i, depth, ch in _scan(sql[start:]):
            if depth < 0 or (depth == 0 and (ch == ";" or CLAUSE_END.match(sql, start + i))):
                end = start + i
                break
        statement = sql[:match.start()].rpartition(";")[2]
        tables = re.findall(r"\b(?:FROM|UPDATE|INTO)\s+([A-Za-z_]\w*)", statement)
        yield start, len(sql[:end].rstrip()), tables[0] if tables else ""


def _split(sql: str, start: int, end: int, word: str) -> list[tuple[int, int]]:
    """The parts of sql[start:end] between its top-level `word`s (AND, OR)."""
    top = {start + i for i, depth, _ch in _scan(sql[start:end]) if depth == 0}
    parts, first = [], start
    for match in re.finditer(rf"\s+{word}\s+", sql[start:end]):
        if start + match.start() in top:
            parts.append((first, start + match.start()))
            first = start + match.end()
    return parts + [(first, end)]


def _wrapped(sql: str, start: int, end: int) -> bool:
    """sql[start:end] is one parenthesised condition: `(` ... its own `)`."""
    inner = list(_scan(sql[start + 1:end - 1]))
    return (sql[start] == "(" and sql[end - 1] == ")" and all(d >= 0 for _i, d, _c in inner)
            and sum((c == "(") - (c == ")") for _i, _d, c in inner) == 0)


def _conjunct_groups(sql: str, start: int, end: int) -> Iterator[list[tuple[int, int]]]:
    """Every group of AND-ed conditions in a condition, at any depth of parentheses."""
    for a, b in _split(sql, start, end, "OR"):
        conjuncts = _split(sql, a, b, "AND")
        if len(conjuncts) > 1:
            yield conjuncts
        for c, d in conjuncts:
            if _wrapped(sql, c, d):
                yield from _conjunct_groups(sql, c + 1, d - 1)


EQUALS_LITERAL = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*('(?:[^']|'')*'|-?\d+(?:\.\d+)?)")


# --- the operators -------------------------------------------------------------------------------


def read_before_begin(source: str) -> list[Mutant]:
    """The first statement a transaction runs (the first of a `try` right after BEGIN) moved to
    before the BEGIN or the transaction's `with`: what it reads can change before the write."""
    tree, out = ast.parse(source), []
    for _con, begin, inside in _transactions(tree, source):
        if not inside:
            continue
        first = inside[0].body[0] if isinstance(inside[0], ast.Try) and begin is not inside[0] else inside[0]
        if isinstance(first, (ast.Return, ast.Raise, ast.Break, ast.Continue, ast.Pass)):
            continue
        block = _block_of(tree, first)
        out += _mutant("read_before_begin", source, first.lineno, _move_before(source, first, block, begin))
    return out


def begin_deferred(source: str) -> list[Mutant]:
    """BEGIN IMMEDIATE (or EXCLUSIVE) -> BEGIN DEFERRED, in statements and scripts."""
    out = []
    for sql, positions in _sql_strings(ast.parse(source), source):
        for match in re.finditer(r"\bBEGIN\s+(IMMEDIATE|EXCLUSIVE)\b", sql):
            out += _sql_edit("begin_deferred", source, positions, [(match.start(1), match.end(1), "DEFERRED")])
    return out


def where_drop_conjunct(source: str) -> list[Mutant]:
    """One condition of `a AND b` in a WHERE dropped; one that binds a parameter becomes
    `(c OR 1)` so the statement still takes the same parameters."""
    out = []
    for sql, positions in _sql_strings(ast.parse(source), source):
        for start, end, _table in _where_clauses(sql):
            for group in _conjunct_groups(sql, start, end):
                for n, (a, b) in enumerate(group):
                    if re.search(r"\?|:\w", sql[a:b]):
                        edit = [(a, a, "("), (b, b, " OR 1)")]
                    elif n + 1 < len(group):
                        edit = [(a, group[n + 1][0], "")]
                    else:
                        edit = [(group[n - 1][1], b, "")]
                    out += _sql_edit("where_drop_conjunct", source, positions, edit)
    return out


def where_narrow(source: str) -> list[Mutant]:
    """`AND col = lit` added to a WHERE, where `col = lit` is compared in another WHERE on the same
    table in the module and `col` is not in this one (`AND sent = 0`, `AND state = 'pending'`):
    a duplicate looked for in some states only."""
    strings = list(_sql_strings(ast.parse(source), source))
    compared: dict[str, list[tuple[str, str]]] = {}
    for sql, _positions in strings:
        for start, end, table in _where_clauses(sql):
            for col, lit in EQUALS_LITERAL.findall(sql[start:end]):
                if (col, lit) not in compared.setdefault(table, []):
                    compared[table].append((col, lit))
    out = []
    for sql, positions in strings:
        for start, end, table in _where_clauses(sql):
            condition = sql[start:end]
            for col, lit in compared.get(table, []):
                if re.search(rf"\b{col}\b", condition):
                    continue
                if _split(sql, start, end, "OR")[1:]:
                    edit = [(start, start, "("), (end, end, f") AND {col} = {lit}")]
                else:
                    edit = [(end, end, f" AND {col} = {lit}")]
                out += _sql_edit("where_narrow", source, positions, edit)
    return out


def _handler_raises(tree: ast.Module) -> Iterator[tuple[ast.Raise, ast.ExceptHandler, ast.AST | None]]:
    """(raise, its handler, the function it is in) for each raise directly in an except handler."""
    owner = {}
    for function in _functions(tree):
        for node in _own_nodes(function.body):
            owner[id(node)] = function
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            for stmt in node.body:
                if isinstance(stmt, ast.Raise):
                    yield stmt, node, owner.get(id(stmt))


def swallow_error(source: str) -> list[Mutant]:
    """A `raise` in an except handler -> `pass`: the error is swallowed and the code goes on."""
    tree, out = ast.parse(source), []
    for stmt, handler, _function in _handler_raises(tree):
        replacement = [" " * stmt.col_offset + "pass\n"]
        out += _mutant("swallow_error", source, stmt.lineno,
                       "".join(_without(source, stmt, handler.body, replacement)))
    return out


def raise_to_return(source: str) -> list[Mutant]:
    """A `raise` in an except handler -> `return X`, X the first falsy constant the function returns
    elsewhere (`return False`), else None: the error is reported as an ordinary answer."""
    tree, out = ast.parse(source), []
    for stmt, handler, function in _handler_raises(tree):
        if function is None:
            continue
        falsy = [n.value for n in _own_nodes(function.body) if isinstance(n, ast.Return)
                 and isinstance(n.value, ast.Constant) and not n.value.value]
        value = repr(min(falsy, key=lambda c: (c.lineno, c.col_offset)).value) if falsy else "None"
        replacement = [" " * stmt.col_offset + f"return {value}\n"]
        out += _mutant("raise_to_return", source, stmt.lineno,
                       "".join(_without(source, stmt, handler.body, replacement)))
    return out


def _handler_types(tree: ast.Module) -> Iterator[ast.expr]:
    """Each exception class an except clause names (each element of a tuple)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            yield from node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]


def except_base_to_exception(source: str) -> list[Mutant]:
    """`except BaseException` -> `except Exception`: KeyboardInterrupt skips the clean-up."""
    out = []
    for node in _handler_types(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id == "BaseException":
            start, end = _span(source, node)
            out += _mutant("except_base_to_exception", source, node.lineno, _edit(source, [(start, end, "Exception")]))
    return out


def widen_except(source: str) -> list[Mutant]:
    """`except SomeError` -> `except Exception`, and `except sqlite3.X` -> `except sqlite3.Error`:
    errors of another kind are taken for this one."""
    out = []
    for node in _handler_types(ast.parse(source)):
        name = ast.unparse(node)
        if name in ("Exception", "BaseException"):
            continue
        start, end = _span(source, node)
        wider = ["sqlite3.Error"] if name.startswith("sqlite3.") and name != "sqlite3.Error" else []
        for text in wider + ["Exception"]:
            out += _mutant("widen_except", source, node.lineno, _edit(source, [(start, end, text)]))
    return out


def unguarded_rollback(source: str) -> list[Mutant]:
    """`if con.in_transaction: con.execute("ROLLBACK")` -> the ROLLBACK alone: when the error came
    from a transaction SQLite already ended, the ROLLBACK's own error replaces the real one."""
    tree, out = ast.parse(source), []
    for block in _blocks(tree):
        for stmt in block:
            if (isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.test, ast.Attribute)
                    and stmt.test.attr == "in_transaction" and any(_executes(s, "ROLLBACK") for s in stmt.body)):
                body = [line for s in stmt.body for line in _lines(source, s)]
                lines = _without(source, stmt, block, _reindent(body, stmt.body[0].col_offset, stmt.col_offset))
                out += _mutant("unguarded_rollback", source, stmt.lineno, "".join(lines))
    return out


def drop_rollback(source: str) -> list[Mutant]:
    """An `execute("ROLLBACK")` statement removed: the transaction stays open on that path."""
    tree, out = ast.parse(source), []
    for block in _blocks(tree):
        for stmt in block:
            if _executes(stmt, "ROLLBACK"):
                out += _mutant("drop_rollback", source, stmt.lineno, "".join(_without(source, stmt, block)))
    return out


def insert_or_replace(source: str) -> list[Mutant]:
    """`INSERT INTO` / `INSERT OR IGNORE INTO` -> `INSERT OR REPLACE INTO`: a repeat overwrites."""
    out = []
    for sql, positions in _sql_strings(ast.parse(source), source):
        for match in re.finditer(r"\bINSERT(\s+OR\s+(IGNORE|ABORT|FAIL|ROLLBACK))?\s+INTO\b", sql):
            out += _sql_edit("insert_or_replace", source, positions,
                             [(match.start(), match.end(), "INSERT OR REPLACE INTO")])
    return out


def overwrite_on_conflict(source: str) -> list[Mutant]:
    """An upsert that keeps or combines the stored row made to overwrite it:
    `DO NOTHING` -> `DO UPDATE SET c = excluded.c` (c: the inserted columns outside the conflict
    target), and `DO UPDATE SET c = <expr>` -> `SET c = excluded.c`."""
    out = []
    for sql, positions in _sql_strings(ast.parse(source), source):
        for match in re.finditer(r"\bON\s+CONFLICT\s*(?:\(([^)]*)\))?\s*DO\s+NOTHING\b", sql):
            insert = re.search(r"\bINTO\s+\w+\s*\(([^)]*)\)", sql[:match.start()])
            target = {c.strip() for c in (match[1] or "").split(",")}
            columns = [c.strip() for c in insert[1].split(",") if c.strip() not in target] if insert else []
            if columns:
                update = "DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in columns)
                start = sql.index("DO", match.end(1) if match[1] else match.start())
                out += _sql_edit("overwrite_on_conflict", source, positions, [(start, match.end(), update)])
        for match in re.finditer(r"\bDO\s+UPDATE\s+SET\s+", sql):
            end = len(sql)
            for i, depth, ch in _scan(sql[match.end():]):
                if depth == 0 and (ch == ";" or re.match(r"\s+WHERE\b", sql[match.end() + i:])):
                    end = match.end() + i
                    break
            for assignment in re.finditer(r"([A-Za-z_]\w*)\s*=\s*([^,;]+)", sql[match.end():end]):
                col, expr = assignment[1], assignment[2].rstrip()
                if expr != f"excluded.{col}":
                    at = match.end() + assignment.start(2)
                    out += _sql_edit("overwrite_on_conflict", source, positions,
                                     [(at, at + len(expr), f"excluded.{col}")])
    return out


def setup_not_idempotent(source: str) -> list[Mutant]:
    """Set-up that fails or resets when run twice: `CREATE ... IF NOT EXISTS` -> `CREATE ...`,
    `INSERT OR IGNORE` -> `INSERT`."""
    out = []
    for sql, positions in _sql_strings(ast.parse(source), source):
        for match in re.finditer(r"\bCREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)(\s+IF\s+NOT\s+EXISTS)\b", sql):
            out += _sql_edit("setup_not_idempotent", source, positions, [(match.start(1), match.end(1), "")])
        for match in re.finditer(r"\bINSERT(\s+OR\s+IGNORE)\b", sql):
            out += _sql_edit("setup_not_idempotent", source, positions, [(match.start(1), match.end(1), "")])
    return out


def commit_per_row(source: str) -> list[Mutant]:
    """Work committed row by row: `COMMIT` and a new `BEGIN IMMEDIATE` added at the end of each
    loop inside a transaction; a `COMMIT` right after a loop moved to the end of its body."""
    tree, out = ast.parse(source), []
    for con, _begin, inside in _transactions(tree, source):
        for loop in _own_nodes(inside):
            if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                indent = " " * loop.body[0].col_offset
                new = [f'{indent}{con}.execute("COMMIT")\n', f'{indent}{con}.execute("BEGIN IMMEDIATE")\n']
                out += _mutant("commit_per_row", source, loop.lineno, _insert_after(source, loop.body[-1], new))
    for block in _blocks(tree):
        for before, stmt in zip(block, block[1:], strict=False):
            if isinstance(before, (ast.For, ast.AsyncFor, ast.While)) and _executes(stmt, "COMMIT"):
                moved = _reindent(_lines(source, stmt), stmt.col_offset, before.body[0].col_offset)
                lines = _without(source, stmt, block)
                lines[before.body[-1].end_lineno:before.body[-1].end_lineno] = moved
                out += _mutant("commit_per_row", source, stmt.lineno, "".join(lines))
    return out


def hook_before_previous(source: str) -> list[Mutant]:
    """A hook call (or the `if` that guards it) moved before the statement that precedes it: it
    runs before the work it reports (and on that statement's failure path)."""
    tree, out = ast.parse(source), []
    for stmt, block, _hook in _hook_statements(tree):
        n = next(i for i, s in enumerate(block) if s is stmt)
        if n > 0:
            out += _mutant("hook_before_previous", source, stmt.lineno, _move_before(source, stmt, block, block[n - 1]))
    return out


def hook_on_failure(source: str) -> list[Mutant]:
    """A hook that runs on failures too: its guard loses the conditions that do not name it
    (`if error is None and after_send is not None` -> `if after_send is not None`), or a copy of
    it goes first into the preceding `if ...: raise` failure branch."""
    tree, out = ast.parse(source), []
    for stmt, block, hook in _hook_statements(tree):
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.And):
            keep = [v for v in stmt.test.values if any(isinstance(n, ast.Name) and n.id == hook for n in ast.walk(v))]
            if keep and len(keep) < len(stmt.test.values):
                start, end = _span(source, stmt.test)
                text = " and ".join(ast.get_source_segment(source, v) for v in keep)
                out += _mutant("hook_on_failure", source, stmt.lineno, _edit(source, [(start, end, text)]))
        n = next(i for i, s in enumerate(block) if s is stmt)
        failure = block[n - 1] if n > 0 else None
        if isinstance(failure, ast.If) and isinstance(failure.body[-1], ast.Raise):
            raise_ = failure.body[-1]
            copy = _reindent(_lines(source, stmt), stmt.col_offset, raise_.col_offset)
            lines = source.splitlines(keepends=True)
            lines[raise_.lineno - 1:raise_.lineno - 1] = copy
            out += _mutant("hook_on_failure", source, raise_.lineno, "".join(lines))
    return out


READS = {"readline", "read", "readuntil", "readexactly", "recv", "recvfrom"}


def eof_strip(source: str) -> list[Mutant]:
    """`if not line:` <-> `if not line.strip():` for a name assigned from a stream read: a blank
    line taken for the end of the stream, or the end of the stream missed."""
    tree, out = ast.parse(source), []
    for function in _functions(tree):
        read = {target.id for node in _own_nodes(function.body) if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)
                and any(_call_name(n) in READS for n in ast.walk(node.value))}
        for node in _own_nodes(function.body):
            if not (isinstance(node, (ast.If, ast.While)) and isinstance(node.test, ast.UnaryOp)
                    and isinstance(node.test.op, ast.Not)):
                continue
            operand = node.test.operand
            start, end = _span(source, operand)
            if isinstance(operand, ast.Name) and operand.id in read:
                text = f"{operand.id}.strip()"
            elif (_call_name(operand) == "strip" and not operand.args and isinstance(operand.func.value, ast.Name)
                  and operand.func.value.id in read):
                text = operand.func.value.id
            else:
                continue
            out += _mutant("eof_strip", source, node.lineno, _edit(source, [(start, end, text)]))
    return out


def unbounded_wait(source: str) -> list[Mutant]:
    """`await asyncio.wait_for(x, t)` -> `await x`: a peer that stops answering hangs it for ever."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Await) and _call_name(node.value) == "wait_for" and node.value.args:
            start, end = _span(source, node.value)
            inner = ast.get_source_segment(source, node.value.args[0])
            out += _mutant("unbounded_wait", source, node.lineno, _edit(source, [(start, end, inner)]))
    return out


OPERATORS: list[Callable[[str], list[Mutant]]] = [
    read_before_begin, begin_deferred,
    where_drop_conjunct, where_narrow,
    swallow_error, raise_to_return, except_base_to_exception, widen_except,
    unguarded_rollback, drop_rollback,
    insert_or_replace, overwrite_on_conflict,
    setup_not_idempotent,
    commit_per_row,
    hook_before_previous, hook_on_failure,
    eof_strip, unbounded_wait,
]


def mutants(source: str) -> list[Mutant]:
    """Every semantic mutant of a module, in a fixed order (operator, then place); no duplicates."""
    found, seen = [], set()
    for operator in OPERATORS:
        for mutant in sorted(operator(source), key=lambda m: (m.line, m.source)):
            if mutant.source not in seen:
                seen.add(mutant.source)
                found.append(mutant)
    return found


def function_at(source: str, line: int) -> str:
    """The innermost function whose lines hold `line` ("" at module level), as equivalent.md names it."""
    name, size = "", None
    for function in _functions(ast.parse(source)):
        first = min([function.lineno] + [d.lineno for d in function.decorator_list])
        if first <= line <= function.end_lineno and (size is None or function.end_lineno - first < size):
            name, size = function.name, function.end_lineno - first
    return name


if __name__ == "__main__":
    import difflib

    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        print("usage: python benchmarks/semantic_mutants.py MODULE.py ...  (prints every semantic mutant's diff)\n")
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    for path in sys.argv[1:]:
        text = Path(path).read_text()
        for m in mutants(text):
            print(f"{path}:{m.line} {m.operator}")
            print("".join(difflib.unified_diff(text.splitlines(keepends=True), m.source.splitlines(keepends=True), n=0))[:2000])
