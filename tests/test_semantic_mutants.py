"""benchmarks/semantic_mutants.py: each operator finds its pattern wherever it occurs, and its
mutants are small, compilable, and the same on every run. No judge runs here."""

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = {name: ROOT / "solutions" / f"{name}.py" for name in ("worker", "client", "relay")}


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sm = load("semantic_mutants")

# Where each operator applies in the three references (worker: outbox, client: vending, relay).
APPLIES = {
    "read_before_begin": {"worker", "client", "relay"},
    "begin_deferred": {"worker", "client", "relay"},
    "where_drop_conjunct": {"relay"},
    "where_narrow": {"worker", "relay"},
    "swallow_error": {"worker", "client", "relay"},
    "raise_to_return": {"worker", "client", "relay"},
    "except_base_to_exception": {"worker", "client", "relay"},
    "widen_except": {"worker", "client", "relay"},
    "unguarded_rollback": {"worker", "client", "relay"},
    "drop_rollback": {"worker", "client", "relay"},
    "insert_or_replace": {"worker", "client", "relay"},
    "overwrite_on_conflict": {"worker"},
    "setup_not_idempotent": {"worker", "client", "relay"},
    "commit_per_row": {"relay"},
    "hook_before_previous": {"worker", "client", "relay"},
    "hook_on_failure": {"worker", "relay"},
    "eof_strip": {"client"},
    "unbounded_wait": {"client"},
}
NEAR = 12  # lines: a mutant changes only code around the place it reports


def test_every_operator_is_listed_with_where_it_applies():
    assert [op.__name__ for op in sm.OPERATORS] == list(APPLIES)


@pytest.mark.parametrize("operator", sm.OPERATORS, ids=lambda op: op.__name__)
def test_each_operator_finds_its_pattern_in_the_references_that_have_it(operator):
    found = {name for name, path in REFERENCES.items() if operator(path.read_text())}
    assert found == APPLIES[operator.__name__]


@pytest.mark.parametrize("name", REFERENCES)
def test_mutants_compile_differ_and_change_only_lines_near_the_one_they_report(name):
    source = REFERENCES[name].read_text()
    changed_lines = load("mutation_score").changed_lines
    mutants = sm.mutants(source)
    assert mutants
    for mutant in mutants:
        compile(mutant.source, f"{mutant.operator} at {mutant.line}", "exec")
        assert mutant.source != source
        assert mutant.operator.startswith("semantic/")
        far = [n for n in changed_lines(source, mutant.source) if abs(n - mutant.line) > NEAR]
        assert not far, f"{mutant.operator} reports line {mutant.line} but changes {far}"


@pytest.mark.parametrize("name", REFERENCES)
def test_mutants_are_the_same_on_every_run_and_never_repeat(name):
    source = REFERENCES[name].read_text()
    first = sm.mutants(source)
    assert first == sm.mutants(source)
    assert len({m.source for m in first}) == len(first)


def only(operator, source):
    """The one mutant `operator` makes of a toy source, as text."""
    mutants = operator(textwrap.dedent(source))
    assert len(mutants) == 1, [m.source for m in mutants]
    return mutants[0].source


def test_read_before_begin_moves_the_first_read_out_of_the_transaction():
    assert only(sm.read_before_begin, '''
        def take(con):
            con.execute("BEGIN IMMEDIATE")
            try:
                row = con.execute("SELECT n FROM t WHERE id = 1").fetchone()
                con.execute("UPDATE t SET n = ? WHERE id = 1", (row[0] + 1,))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        ''') == textwrap.dedent('''
        def take(con):
            row = con.execute("SELECT n FROM t WHERE id = 1").fetchone()
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("UPDATE t SET n = ? WHERE id = 1", (row[0] + 1,))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        ''')


def test_read_before_begin_moves_it_out_of_a_with_that_begins():
    mutants = sm.read_before_begin(textwrap.dedent('''
        def tx(con):
            con.execute("BEGIN IMMEDIATE")
            yield con
            con.execute("COMMIT")
        def take(con):
            with tx(con):
                row = con.execute("SELECT 1").fetchone()
                con.execute("DELETE FROM t")
        '''))
    # the helper's own first statement (the yield) moves too: its caller's body runs before BEGIN
    assert [m.line for m in mutants] == [4, 8]
    assert '    row = con.execute("SELECT 1").fetchone()\n    with tx(con):\n' in mutants[1].source


def test_begin_deferred_in_a_statement_and_in_a_script():
    mutants = sm.begin_deferred('con.execute("BEGIN IMMEDIATE")\ncon.executescript("BEGIN EXCLUSIVE; COMMIT;")\n')
    assert [m.source for m in mutants] == [
        'con.execute("BEGIN DEFERRED")\ncon.executescript("BEGIN EXCLUSIVE; COMMIT;")\n',
        'con.execute("BEGIN IMMEDIATE")\ncon.executescript("BEGIN DEFERRED; COMMIT;")\n']


def test_where_drop_conjunct_drops_a_condition_and_keeps_the_parameters():
    mutants = sm.where_drop_conjunct('q = "SELECT id FROM t WHERE state = \'new\' AND due <= ? LIMIT 5"\n')
    assert [m.source for m in mutants] == [
        'q = "SELECT id FROM t WHERE due <= ? LIMIT 5"\n',
        'q = "SELECT id FROM t WHERE state = \'new\' AND (due <= ? OR 1) LIMIT 5"\n']


def test_where_narrow_adds_a_state_compared_elsewhere_on_the_same_table():
    assert only(sm.where_narrow, '''
        A = "SELECT body FROM box WHERE id = ?"
        B = "SELECT body FROM box WHERE sent = 0 ORDER BY seq"
        C = "SELECT x FROM other WHERE id = ?"
        ''') == textwrap.dedent('''
        A = "SELECT body FROM box WHERE id = ? AND sent = 0"
        B = "SELECT body FROM box WHERE sent = 0 ORDER BY seq"
        C = "SELECT x FROM other WHERE id = ?"
        ''')


def test_where_narrow_brackets_a_condition_with_or():
    assert only(sm.where_narrow, '''
        A = ("SELECT id FROM box"
             " WHERE a = ? OR b = ?"
             " LIMIT 1")
        B = "UPDATE box SET x = 1 WHERE state = 'new'"
        ''') == textwrap.dedent('''
        A = ("SELECT id FROM box"
             " WHERE (a = ? OR b = ?) AND state = 'new'"
             " LIMIT 1")
        B = "UPDATE box SET x = 1 WHERE state = 'new'"
        ''')


HANDLER = '''
    def f(con):
        try:
            if con.n:
                return False
            return True
        except BaseException:
            raise
    '''


def test_swallow_error_makes_the_raise_a_pass():
    assert only(sm.swallow_error, HANDLER) == textwrap.dedent(HANDLER).replace("        raise", "        pass")


def test_raise_to_return_returns_what_the_function_returns_for_no():
    assert only(sm.raise_to_return, HANDLER) == textwrap.dedent(HANDLER).replace("        raise", "        return False")


def test_except_base_to_exception():
    assert only(sm.except_base_to_exception, HANDLER) == textwrap.dedent(HANDLER).replace(
        "except BaseException", "except Exception")


def test_widen_except_takes_other_errors_for_this_one():
    mutants = sm.widen_except("try:\n    pass\nexcept sqlite3.IntegrityError:\n    pass\n")
    assert [m.source for m in mutants] == ["try:\n    pass\nexcept sqlite3.Error:\n    pass\n",
                                           "try:\n    pass\nexcept Exception:\n    pass\n"]


ROLLBACK = '''
    try:
        pass
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    '''


def test_unguarded_rollback():
    assert only(sm.unguarded_rollback, ROLLBACK) == textwrap.dedent(ROLLBACK).replace(
        '    if con.in_transaction:\n        con.execute("ROLLBACK")', '    con.execute("ROLLBACK")')


def test_drop_rollback_leaves_a_pass_where_it_was_alone():
    assert only(sm.drop_rollback, ROLLBACK) == textwrap.dedent(ROLLBACK).replace('con.execute("ROLLBACK")', "pass")


def test_insert_or_replace():
    mutants = sm.insert_or_replace('a = "INSERT INTO t(id) VALUES (?)"\nb = "INSERT OR IGNORE INTO t(id) VALUES (1)"\n')
    assert [m.source for m in mutants] == [
        'a = "INSERT OR REPLACE INTO t(id) VALUES (?)"\nb = "INSERT OR IGNORE INTO t(id) VALUES (1)"\n',
        'a = "INSERT INTO t(id) VALUES (?)"\nb = "INSERT OR REPLACE INTO t(id) VALUES (1)"\n']


def test_overwrite_on_conflict():
    assert only(sm.overwrite_on_conflict, 'q = "INSERT INTO t(id, body) VALUES (?, ?) ON CONFLICT(id) DO NOTHING"\n') \
        == 'q = "INSERT INTO t(id, body) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body"\n'
    assert only(sm.overwrite_on_conflict, 'q = "INSERT INTO s(k, n) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET n = n + excluded.n"\n') \
        == 'q = "INSERT INTO s(k, n) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET n = excluded.n"\n'


def test_setup_not_idempotent():
    mutants = sm.setup_not_idempotent('S = """\nCREATE TABLE IF NOT EXISTS t(id);\nINSERT OR IGNORE INTO t VALUES (1);\n"""\n')
    assert [m.source for m in mutants] == [
        'S = """\nCREATE TABLE t(id);\nINSERT OR IGNORE INTO t VALUES (1);\n"""\n',
        'S = """\nCREATE TABLE IF NOT EXISTS t(id);\nINSERT INTO t VALUES (1);\n"""\n']


def test_commit_per_row_inside_a_loop_of_a_transaction_and_moved_into_the_loop():
    source = textwrap.dedent('''
        db.execute("BEGIN IMMEDIATE")
        for row in rows:
            db.execute("UPDATE t SET n = 1 WHERE id = ?", (row,))
        db.execute("COMMIT")
        ''')
    update = '    db.execute("UPDATE t SET n = 1 WHERE id = ?", (row,))\n'
    assert [m.source for m in sm.commit_per_row(source)] == [
        source.replace(update, update + '    db.execute("COMMIT")\n    db.execute("BEGIN IMMEDIATE")\n'),
        source.replace(update + 'db.execute("COMMIT")\n', update + '    db.execute("COMMIT")\n')]


HOOK = '''
    def send_all(items, send, after_send=None):
        for item in items:
            ok = send(item)
            if ok is not True:
                raise IOError(item)
            if after_send is not None:
                after_send(item)
    '''


def test_hook_before_previous():
    assert only(sm.hook_before_previous, HOOK) == textwrap.dedent('''
    def send_all(items, send, after_send=None):
        for item in items:
            ok = send(item)
            if after_send is not None:
                after_send(item)
            if ok is not True:
                raise IOError(item)
    ''')


def test_hook_on_failure_calls_it_in_the_failure_branch_too():
    assert only(sm.hook_on_failure, HOOK) == textwrap.dedent(HOOK).replace(
        "            raise IOError(item)\n",
        "            if after_send is not None:\n                after_send(item)\n            raise IOError(item)\n")


def test_hook_on_failure_drops_the_guard_condition_that_is_not_the_hook():
    source = "def f(error, on_done=None):\n    if error is None and on_done is not None:\n        on_done()\n"
    assert only(sm.hook_on_failure, source) == source.replace("error is None and ", "")


def test_eof_strip_both_ways():
    source = "async def f(r):\n    line = await r.readline()\n    if not line:\n        return\n    ok = 1\n    if not ok:\n        return\n"
    assert only(sm.eof_strip, source) == source.replace("if not line:", "if not line.strip():")
    assert only(sm.eof_strip, source.replace("if not line:", "if not line.strip():")) == source


def test_unbounded_wait():
    source = "async def f(r, t):\n    line = await asyncio.wait_for(\n        r.readline(), t)\n"
    assert only(sm.unbounded_wait, source) == "async def f(r, t):\n    line = await r.readline()\n"


def test_a_mutation_that_would_not_compile_is_skipped():
    # a raise in a module-level handler cannot become `return`
    assert sm.raise_to_return("try:\n    pass\nexcept ValueError:\n    raise\n") == []


def test_docstrings_and_f_strings_are_not_sql():
    source = 'def f():\n    """BEGIN IMMEDIATE ... COMMIT"""\n    return f"INSERT INTO {t}"\n'
    assert sm.begin_deferred(source) == [] and sm.insert_or_replace(source) == []


def test_function_at_names_the_innermost_function():
    source = "X = 1\ndef outer():\n    def inner():\n        return 1\n    return inner\n"
    assert [sm.function_at(source, n) for n in (1, 2, 4, 5)] == ["", "outer", "inner", "outer"]
