"""The judge opens files in a step folder only through labkit.judge.step_files.

A child writes into its step folder, so a name the judge reads there may be a link to a file only
the judge may read (an oracle, /proc/self/environ), a FIFO, a folder or a huge sparse file. Each is
refused at once with a reason that never quotes what it points to; a DB file's link is refused
before sqlite3 follows it. End to end: a lab 01 module whose open_source swaps its DB file for a
link to the outbox oracle fails that step with the refusal, and no line of the oracle appears in
the judge's JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from checks.outbox import db
from checks.outbox import schema as stores
from labkit.judge import step_files

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT / "checks" / "outbox" / "oracle.py"
SECRETS = (ORACLE, Path("/proc/self/environ"))


def oracle_lines() -> list[str]:
    """The oracle's distinctive lines (long enough not to occur by chance in a verdict)."""
    return [line.strip() for line in ORACLE.read_text().splitlines() if len(line.strip()) >= 25]


@pytest.mark.parametrize("secret", SECRETS, ids=["oracle", "environ"])
def test_a_link_in_place_of_a_file_is_refused_without_quoting_its_target(tmp_path, secret):
    link = tmp_path / "warehouse.jsonl"
    link.symlink_to(secret)
    with pytest.raises(step_files.Refused, match="replaced by a link") as info:
        step_files.read_bytes(link)
    assert str(secret) not in str(info.value)
    assert not any(line in str(info.value) for line in oracle_lines())


@pytest.mark.parametrize("secret", SECRETS, ids=["oracle", "environ"])
@pytest.mark.parametrize("suffix", ["", "-journal", "-wal", "-shm"])
def test_a_link_in_place_of_a_db_file_or_its_journal_is_refused_before_sqlite_opens_it(tmp_path, secret, suffix):
    path = db.make_source(tmp_path / "source.db", [{"id": "a", "sku": "s", "qty": 1}])
    if suffix == "":
        path.unlink()
    Path(f"{path}{suffix}").symlink_to(secret)
    which = "the database file" if not suffix else f"the database's {suffix[1:]} file"
    with pytest.raises(step_files.DatabaseRefused, match=f"{which} .* was replaced by a link"):
        stores.rows(path, "SELECT * FROM outbox")
    broken = db.outbox(path)  # the checks' reads turn it into a verdict, never an exception
    assert isinstance(broken, db.Broken) and "replaced by a link" in str(broken)
    assert "replaced by a link" in db.try_write(path)
    assert str(secret) not in str(broken)
    assert secret.read_bytes()  # untouched, and still there


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "sink.db"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(step_files.Refused, match="is a FIFO, not a regular file"):
        step_files.read_bytes(fifo)
    with pytest.raises(step_files.DatabaseRefused, match="replaced by a FIFO"):
        stores.rows(fifo, "SELECT 1")
    assert isinstance(db.stock(fifo), db.Broken)
    os.mkfifo(tmp_path / "source.db-journal")
    assert "replaced by a FIFO" in db.try_write(tmp_path / "source.db")
    assert time.monotonic() - began < 2.0


def test_a_directory_is_refused(tmp_path):
    folder = tmp_path / "log.jsonl"
    folder.mkdir()
    with pytest.raises(step_files.Refused, match="is a directory"):
        step_files.read_bytes(folder)
    with pytest.raises(step_files.DatabaseRefused, match="replaced by a directory"):
        stores.rows(folder, "SELECT 1")


def test_a_2_gb_sparse_file_is_read_capped(tmp_path):
    sparse = tmp_path / "warehouse.jsonl"
    with open(sparse, "wb") as fh:
        fh.truncate(2 * 1024 ** 3)
    began = time.monotonic()
    contents = step_files.read(sparse, limit=4096)
    assert (len(contents.data), contents.size, contents.cut) == (4096, 2 * 1024 ** 3, True)
    assert len(step_files.read_bytes(sparse)) == step_files.DEFAULT_LIMIT
    assert time.monotonic() - began < 2.0


def test_owner_and_missing_file(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text("x\n")
    assert step_files.read_text(mine, owner=os.getuid()) == "x\n"
    with pytest.raises(step_files.Refused, match="belongs to uid"):
        step_files.read_text(mine, owner=os.getuid() + 12345)
    with pytest.raises(step_files.Refused, match="does not exist"):
        step_files.read_text(tmp_path / "absent")


def test_create_removes_a_planted_link_and_never_writes_through_it(tmp_path):
    target = tmp_path / "judge-only.txt"
    target.write_text("keep me")
    log = tmp_path / "warehouse.jsonl"
    log.symlink_to(target)
    fd = step_files.create(log)
    try:
        os.write(fd, b"line\n")
    finally:
        os.close(fd)
    assert target.read_text() == "keep me"
    assert not log.is_symlink() and log.read_text() == "line\n"


def test_pure_reads_are_read_only_and_a_hot_journal_is_still_rolled_back(tmp_path):
    path = db.make_source(tmp_path / "source.db", [{"id": "a", "sku": "s", "qty": 1}])
    with stores.reader(path) as con:
        with pytest.raises(Exception, match="readonly"):
            con.execute("DELETE FROM outbox")
    # A writer killed mid-transaction leaves a hot journal: the judge's read still sees the
    # committed state (its connection is read-write then, and rolls the journal back).
    script = textwrap.dedent(f'''
        import os, sqlite3
        con = sqlite3.connect({str(path)!r}, isolation_level=None)
        con.execute("PRAGMA journal_mode = DELETE")
        con.execute("BEGIN IMMEDIATE")
        con.execute("UPDATE outbox SET sent = 1")
        con.execute("PRAGMA cache_size = 1")
        for i in range(2000):
            con.execute("INSERT INTO orders VALUES (?, 'x', 1)", (f"pad{{i}}" + "x" * 200,))
        os._exit(9)
    ''')
    subprocess.run([sys.executable, "-c", script], check=False)
    assert Path(f"{path}-journal").exists()
    assert [row[3] for row in stores.outbox(path)] == [0]


def test_check_db_says_when_a_read_needs_a_writer(tmp_path):
    """A missing file, a journal beside it or a WAL-mode header each need a read-write connection."""
    path = tmp_path / "source.db"
    assert step_files.check_db(path).needs_writer  # missing: SQLite makes it
    db.make_source(path)
    assert step_files.check_db(path) == step_files.DbFiles(exists=True, journal=False, wal_mode=False)
    (tmp_path / "source.db-journal").write_bytes(b"")
    assert step_files.check_db(path).needs_writer
    (tmp_path / "source.db-journal").unlink()
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode = WAL")
    seen = step_files.check_db(path)
    assert seen.wal_mode and seen.needs_writer


LINKING = '''
import os as _os
_real_open_source = open_source
def open_source(path):
    con = _real_open_source(path)
    _os.unlink(path)
    _os.symlink({oracle!r}, path)
    return con
'''


def test_a_module_that_links_its_db_file_to_the_oracle_fails_that_step_and_leaks_nothing(tmp_path):
    module = tmp_path / "worker.py"
    module.write_text((ROOT / "solutions" / "worker.py").read_text() + LINKING.format(oracle=str(ORACLE)))
    done = subprocess.run([sys.executable, "-m", "labkit", "check", "outbox", "--solution", str(module),
                           "--step", "2", "--seed", "1", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    verdict = json.loads(done.stdout)
    (step,) = [s for s in verdict["steps"] if str(s["step"]) == "2"]
    assert step["status"] != "passed"
    failing = [c for c in step["cases"] if c["outcome"] != "passed"]
    assert any("replaced by a link" in json.dumps(c) for c in failing), json.dumps(failing)[:3000]
    for line in oracle_lines():
        assert line not in done.stdout
        assert line not in done.stderr
