"""labkit.probe.statements: a fault just after the statement that ends a transaction."""

from __future__ import annotations

import sqlite3

import pytest

from labkit.probe import statements


def _file(tmp_path):
    path = tmp_path / "s.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    return str(path)


def _rows(path):
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT x FROM t ORDER BY x").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("end", ["sql", "method"])
def test_the_interrupt_comes_after_the_commit_has_run(tmp_path, end):
    path = _file(tmp_path)
    con, counter = statements.faulty(path, 1, KeyboardInterrupt(), after_end=True)
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(KeyboardInterrupt):
        con.execute("COMMIT") if end == "sql" else con.commit()
    assert counter.stop() and not con.in_transaction
    assert counter.sql == ("COMMIT" if end == "sql" else "commit()")
    con.close()
    assert _rows(path) == [(1,)]  # committed before the interrupt


def test_only_the_kth_end_is_interrupted_and_statements_inside_do_not_count(tmp_path):
    path = _file(tmp_path)
    con, counter = statements.faulty(path, 2, KeyboardInterrupt(), after_end=True)
    for x in (1, 2):
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t VALUES (?)", (x,))
        con.execute("SELECT 1")
        if x == 1:
            con.execute("ROLLBACK")  # the 1st end: runs on
        else:
            with pytest.raises(KeyboardInterrupt):
                con.execute("COMMIT")
    con.execute("SELECT 1")  # a statement outside a transaction ends nothing
    assert counter.count == 2
    con.close()
    assert _rows(path) == [(2,)]


def test_an_unconditional_rollback_after_it_replaces_the_interrupt(tmp_path):
    """What the check catches: the clean-up's ROLLBACK fails, and its error is what comes out."""
    path = _file(tmp_path)
    con, _ = statements.faulty(path, 1, KeyboardInterrupt(), after_end=True)
    with pytest.raises(sqlite3.OperationalError, match="no transaction is active"):
        con.execute("BEGIN IMMEDIATE")
        try:
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    con.close()
