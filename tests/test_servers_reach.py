"""What a judged child, in the course's own sandbox (`profiles.child`), can reach of the servers.

Found here, for the checks' author: Valkey over loopback TCP needs nothing (a child shares the
judge's network); PostgreSQL's socket lives in the judge's folder, which a box does not show:
either a hard link to it in the step folder (`postgres.socket_in`, made again after each
restart; no change to the box) or a bind of the socket directory into the box (read-only is
enough: connecting is not a write to the file system). The data directory stays out of sight.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from server_folders import temp_base

from labkit import sandbox
from labkit.sandbox import profiles
from labkit.servers import postgres, valkey

CHILD = """
import sys, psycopg, valkey
dsn, data_dir, kwargs = sys.argv[1], sys.argv[2], eval(sys.argv[3])
try:
    with psycopg.connect(dsn, connect_timeout=10) as c:
        print("postgres", c.execute("SELECT current_user").fetchone()[0])
except psycopg.OperationalError as e:
    print("postgres refused", "No such file or directory" in str(e))
try:
    open(data_dir + "/PG_VERSION").read()
    print("data read")
except OSError as e:
    print("data", type(e).__name__)
print("valkey", valkey.Valkey(**kwargs).xadd("lab:1:s", {"a": "1"}) is not None)
"""


@pytest.fixture(scope="module")
def sandboxed():
    found = sandbox.support()
    if not found.ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox: {found.reason}")
        pytest.skip(f"no sandbox here: {found.reason}")


@pytest.fixture(scope="module")
def servers(sandboxed):
    for base in temp_base():
        with postgres.running(base / "pg") as pg, valkey.running(base / "vk") as vk:
            yield pg, postgres.fresh_database(pg, "step_1"), valkey.fresh_user(vk, "lab:1:")


def run_boxed(tmp_path, pg, db, user, extra_read_only=()) -> list[str]:
    module = tmp_path / "student.py"
    module.write_text("")
    policy = profiles.child(sandbox.uid(), module=module, workdir=tmp_path)
    policy = dataclasses.replace(policy, read_only=(*policy.read_only, *extra_read_only))
    box = sandbox.Box.open(profiles.copy_module(policy), sandbox.support().cgroups)
    proc = box.spawn([sys.executable, "-c", CHILD, db.dsn, str(pg.data_dir), repr(user.client_kwargs())],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        box.close(proc)
    assert proc.returncode == 0, err
    return out.splitlines()


def test_a_boxed_child_does_not_see_the_socket_in_the_judges_folder(tmp_path, servers):
    pg, db, user = servers
    assert run_boxed(tmp_path, pg, db, user) == [
        "postgres refused True", "data FileNotFoundError", "valkey True"]


def test_a_boxed_child_connects_through_a_link_in_its_step_folder_made_again_after_a_restart(tmp_path, servers):
    pg, db, user = servers
    linked = dataclasses.replace(db, dsn=postgres.socket_in(pg, db, tmp_path))
    assert f"host={tmp_path}" in linked.dsn
    assert run_boxed(tmp_path, pg, linked, user)[0] == f"postgres {db.role}"
    postgres.restart(pg)
    assert run_boxed(tmp_path, pg, linked, user)[0] == "postgres refused False"  # a stale link: refused
    linked = dataclasses.replace(db, dsn=postgres.socket_in(pg, db, tmp_path))
    assert run_boxed(tmp_path, pg, linked, user)[0] == f"postgres {db.role}"


def test_a_boxed_child_connects_once_the_socket_directory_is_bound_read_only(tmp_path, servers):
    pg, db, user = servers
    assert run_boxed(tmp_path, pg, db, user, extra_read_only=(pg.socket_dir,)) == [
        f"postgres {db.role}", "data FileNotFoundError", "valkey True"]


JUDGE = """
import os, psycopg
from pathlib import Path
from labkit.servers import postgres, valkey
base = Path("/tmp/judge")
base.mkdir(mode=0o711)
with postgres.running(base / "pg") as pg, valkey.running(base / "vk") as vk:
    db, user = postgres.fresh_database(pg, "step_1"), valkey.fresh_user(vk, "lab:1:")
    with psycopg.connect(db.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (x int)")
    postgres.stop_immediately(pg)
    postgres.restart(pg)
    valkey.kill(vk)
    valkey.restart(vk)
    with psycopg.connect(db.dsn) as c:
        print("uid", os.geteuid(), "as", pg.run_as.uid, "rows", c.execute("SELECT count(*) FROM t").fetchone()[0],
              "valkey", valkey.Valkey(**user.client_kwargs()).ping())
print("left", sorted(os.listdir(base)))
"""


def test_the_servers_run_in_the_judges_own_box_as_a_grading_jobs_uid(tmp_path, sandboxed):
    """No capabilities, no passwd entry (initdb gets one from nss_wrapper), seccomp, a private
    /tmp and network: start, a crash and restart of each, and nothing left in the folder."""
    module = tmp_path / "student.py"
    module.write_text("")
    env = {**profiles.base_env("/tmp"), "PYTHONPATH": str(profiles.ROOT)}
    box = sandbox.Box.open(profiles.judge_box(sandbox.uid(), module=module, tmp="/tmp", env=env),
                           sandbox.support().cgroups)
    proc = box.spawn([sys.executable, "-c", JUDGE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        box.close(proc)
    assert proc.returncode == 0, err
    assert out.splitlines() == [f"uid {sandbox.uid()} as None rows 0 valkey True", "left []"]
