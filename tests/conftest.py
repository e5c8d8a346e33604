import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def jupyter_env(tmp_path, monkeypatch):
    """Jupyter's config/data/runtime dirs in a temp dir: no state from the home directory."""
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        path = tmp_path / name.lower()
        path.mkdir()
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return tmp_path


@pytest.fixture
def judge_tmp(tmp_path, monkeypatch):
    """A private temp dir for the judge (and its children), and a list of what it created there."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    created: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def spy(*args, **kwargs):
        path = real_mkdtemp(*args, **kwargs)
        created.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return private, created


@pytest.fixture
def tag(monkeypatch):
    """Every marker of this test's runs starts with a tag, so /proc scans see only our processes."""
    from labkit.judge import reaper

    prefix = f"leftovers-{os.getpid()}-"
    real_new_marker = reaper.new_marker
    monkeypatch.setattr(reaper, "new_marker", lambda: prefix + real_new_marker())
    return prefix


@pytest.fixture
def nothing_left(tag, judge_tmp):
    """`with nothing_left(): ...` fails unless the world after the block is the world before it
    (tests/leftovers.py says what is counted) and every temp dir the judge made is gone."""
    from leftovers import snapshot

    private, created = judge_tmp

    @contextmanager
    def check():
        before = snapshot(tag, private)
        yield
        after = snapshot(tag, private)
        assert after == before
        assert created, "the judge made no temp dir: this test would not see one left behind"
        assert not [p for p in created if os.path.exists(p)]

    return check


# Parallel runs (pytest-xdist, `--dist loadgroup` in pyproject): a module's tests stay on one
# worker, so its module-scoped fixtures (a JupyterLab server, a graded batch) are built once.
# Only modules of many independent, fixture-free cases are spread over every worker.
SPREAD = {"test_catalogue_seeds", "test_case_inputs", "test_no_course_blame"}


def pytest_collection_modifyitems(items):
    for item in items:
        name = item.module.__name__.rpartition(".")[2]
        if name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(name))
