"""A box shows the course's files through views (labkit/sandbox/course_view.py): the same files
at the same paths as one bind each would, nothing else, and never a stale or linked copy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkit import sandbox
from labkit.sandbox import bwrap, cgroups, course_view, profiles
from tests.test_sandbox import _run as run_in_box

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "solutions" / "outbox.py"


def _binds(cmd: list[str]) -> list[tuple[str, str]]:
    return [(cmd[i + 1], cmd[i + 2]) for i, arg in enumerate(cmd) if arg in ("--ro-bind", "--bind")]


def _listed(read_only) -> dict[str, str]:
    """Course file (relative path) → its sha256, for every file the policy's paths name."""
    found = {}
    for path in map(Path, read_only):
        if course_view._folder_of(path) is None and path not in (ROOT / "labkit", ROOT / "checks"):
            continue
        files = [Path(d) / f for d, _, fs in os.walk(path) for f in fs] if path.is_dir() else [path]
        for file in files:
            found[str(file.relative_to(ROOT))] = hashlib.sha256(file.read_bytes()).hexdigest()
    return found


@pytest.mark.parametrize("make", ["child", "launched_child", "kernel"])
def test_a_box_binds_the_course_once_per_folder_from_a_view(make, tmp_path):
    profiles.compile_course()
    if make == "kernel":
        policy = profiles.kernel(sandbox.uid(), home="/tmp/home", sockets=tmp_path, lab="outbox", shown={}, env={},
                                 memory_bytes=2**30, file_bytes=2**20)
    else:
        policy = getattr(profiles, make)(sandbox.uid(), module=MODULE, workdir=tmp_path, lab="checks.outbox")
    cmd = bwrap.command(policy, ["/bin/true"])
    course = [(src, dest) for src, dest in _binds(cmd) if Path(dest).is_relative_to(ROOT / "labkit")
              or Path(dest).is_relative_to(ROOT / "checks")]
    # one bind per folder, never one per file (a kernel sees all of labkit/: that folder itself)
    assert sorted(dest for _, dest in course) == [str(ROOT / "checks"), str(ROOT / "labkit")], course
    listed = _listed(policy.read_only)
    for src, dest in course:
        if src == dest:
            assert Path(dest) in policy.read_only
            continue
        assert Path(src).is_relative_to(course_view.place()), src
        copied = {str(Path(dest, p.relative_to(src)).relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in Path(src).rglob("*") if p.is_file()}
        assert copied == {k: v for k, v in listed.items() if Path(ROOT, k).is_relative_to(dest)}


LIST_COURSE = textwrap.dedent("""
    import hashlib, json, os
    root = {root!r}
    found = {{}}
    for top in ("labkit", "checks"):
        for folder, _dirs, files in os.walk(os.path.join(root, top)):
            for name in files:
                path = os.path.join(folder, name)
                found[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    print(json.dumps(found))
""")


def test_a_child_sees_exactly_the_course_files_its_policy_lists(tmp_path):
    """Inside a real box: every listed file, with its content, and not one file more."""
    if not sandbox.enabled():
        if os.environ.get("CI"):
            pytest.fail("CI must be able to sandbox")
        pytest.skip("no sandbox here")
    profiles.compile_course()
    policy = profiles.child(sandbox.uid(), module=MODULE, workdir=tmp_path, lab="checks.outbox")
    run, _report = run_in_box(policy, LIST_COURSE.format(root=str(ROOT)))
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout)
    assert seen == _listed(policy.read_only)
    assert "checks/outbox/lab.py" not in seen and "labkit/probe/main.py" in seen


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course of two files in tmp_path, as course_view's ROOT."""
    root = tmp_path / "course"
    (root / "labkit").mkdir(parents=True)
    (root / "labkit" / "a.py").write_text("A = 1\n")
    (root / "checks").mkdir()
    (root / "checks" / "b.py").write_text("B = 1\n")
    monkeypatch.setattr(course_view, "ROOT", root)
    return root


def test_the_same_files_share_a_view_and_a_changed_file_gets_a_new_one(course):
    files = [course / "labkit" / "a.py", course / "checks" / "b.py"]
    kept, first = course_view.collapse(files)
    assert kept == [] and [dest for _, dest in first] == [course / "checks", course / "labkit"]
    assert course_view.collapse(files)[1] == first
    (course / "labkit" / "a.py").write_text("A = 22\n")
    _, second = course_view.collapse(files)
    assert second != first
    assert (second[1][0] / "a.py").read_text() == "A = 22\n"
    assert (first[1][0] / "a.py").read_text() == "A = 1\n"  # a box still starting from the old one keeps it


def test_a_folder_shown_whole_keeps_its_files_and_is_bound_as_it_is(course):
    files = [course / "labkit", course / "labkit" / "a.py", course / "checks" / "b.py"]
    kept, views = course_view.collapse(files)
    assert kept == files[:2] and [dest for _, dest in views] == [course / "checks"]


def test_where_no_view_can_be_made_the_files_are_bound_one_by_one(course, tmp_path, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    full.chmod(0o500)  # as a /dev/shm with no room: mkdir fails
    monkeypatch.setattr(course_view.scratch, "fast_place", lambda: full)
    monkeypatch.setattr(course_view, "_place", None)
    files = [course / "labkit" / "a.py", course / "checks" / "b.py"]
    if os.geteuid() == 0:  # root writes through 0500: make mkdir fail another way
        monkeypatch.setattr(Path, "mkdir", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    assert course_view.place() is None
    assert course_view.collapse(files) == (files, [])


def test_a_link_in_the_course_is_bound_as_before_never_copied(course, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not the course's")
    (course / "labkit" / "link.py").symlink_to(secret)
    files = [course / "labkit" / "a.py", course / "labkit" / "link.py"]
    assert course_view.collapse(files) == (files, [])
    (course / "labkit" / "pkg").mkdir()
    (course / "labkit" / "pkg" / "linked").symlink_to(tmp_path)
    folder = [course / "labkit" / "pkg", course / "labkit" / "a.py"]
    assert course_view.collapse(folder) == (folder, [])
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    assert course_view.collapse([outside]) == ([outside], [])


def test_the_views_of_a_dead_maker_are_swept_and_a_live_ones_kept(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    dead_owner = cgroups._process_id(gone.pid)
    gone.wait()
    dead = tmp_path / f"{course_view.PREFIX}aaaa-{dead_owner}"
    live = tmp_path / f"{course_view.PREFIX}bbbb-{cgroups.OWNER}"
    other = tmp_path / f"{course_view.PREFIX}no-owner-named"
    for folder in (dead, live, other):
        (folder / "v0").mkdir(parents=True)
    assert course_view.sweep(tmp_path) == [dead]
    assert live.is_dir() and other.is_dir() and not dead.exists()


MAKER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from labkit.sandbox import course_view
    _, views = course_view.collapse([Path(course_view.ROOT, "labkit", "values.py")])
    place = course_view.place()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a fork's exit runs atexit: it must not take its parent's views
    os.waitpid(pid, 0)
    print(place, place.is_dir() and views[0][0].is_dir(), flush=True)
""")


def test_views_go_with_their_maker_and_never_with_a_fork():
    out = subprocess.run([sys.executable, "-c", MAKER], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    place, alive = out.stdout.split()
    assert alive == "True"  # after the fork ended
    assert not Path(place).exists()  # after the maker ended
