import gc
import os
import shutil
import sys
import tempfile
import time
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
def judge_tmp(monkeypatch):
    """A private temp dir for the judge (and its children), and a list of what it created there.
    In the judge's own place for its folders (`labkit.scratch`: /dev/shm here, as /tmp is a disk),
    so they land in it; short, rather than under tmp_path: a server's Unix socket linked into a
    step folder there must fit in 107 bytes (xdist's tmp_path alone takes ~70)."""
    from labkit import scratch

    private = Path(tempfile.mkdtemp(prefix="lk-", dir=scratch.place()))
    private.chmod(0o711)  # as /tmp: lab 04's servers, run as nobody under root, traverse it
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    created: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def spy(*args, **kwargs):
        path = real_mkdtemp(*args, **kwargs)
        created.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    yield private, created
    shutil.rmtree(private, ignore_errors=True)


@pytest.fixture
def tag(monkeypatch):
    """Every marker of this test's runs starts with a tag, so /proc scans see only our processes."""
    from labkit.sandbox import reaper

    prefix = f"leftovers-{os.getpid()}-"
    real_new_marker = reaper.new_marker
    monkeypatch.setattr(reaper, "new_marker", lambda: prefix + real_new_marker())
    return prefix


@pytest.fixture
def nothing_left(tag, judge_tmp):
    """`with nothing_left(): ...` fails if the block left anything the world did not have before
    it (tests/leftovers.py says what is counted) or any temp dir the judge made. Only what is
    new counts: the worker is a subreaper, and an earlier test's orphan, re-parented to it, may
    be reaped or end during the block (seen in CI: a zombie from before, gone after)."""
    from leftovers import snapshot

    private, created = judge_tmp

    @contextmanager
    def check():
        before = snapshot(tag, private)
        yield
        after = snapshot(tag, private)
        new = {what: sorted(set(found) - set(before[what])) for what, found in after.items()}
        assert {what: found for what, found in new.items() if found} == {}
        assert created, "the judge made no temp dir: this test would not see one left behind"
        assert not [p for p in created if os.path.exists(p)]

    return check


# Parallel runs (pytest-xdist, `--dist loadscope` in pyproject): a module's tests stay on one
# worker, so its module-scoped fixtures (a JupyterLab server, a graded batch) are built once.
# Only modules of many independent cases, with no fixture dearer than loading a lab, are spread
# over every worker: the catalogue's tests, whose runs are the suite's biggest share. (Not
# `--dist loadgroup` with xdist_group marks: pytest 9 keeps a node's id in `_id`, and xdist 3.8
# still renames `_nodeid`, so the groups were silently split, and a 200 s graded batch was
# built once per worker. xdist's own hook for the scheduler is the documented way.)
SPREAD = {"test_catalogue_seeds", "test_case_inputs", "test_no_course_blame", "test_outbox_checks",
          "test_relay_checks", "test_vending_checks"}


# Modules that build a graded batch, nbgrader's folders, a release or a browser session: each
# runs 1-3 minutes on one worker (CI's --durations, longest first). They start first, and the
# many short tests fill the cores beside them. xdist's own order (most tests first) started them
# last: the run ended with one worker still building a batch and the others idle.
LONG = ("test_class", "test_hostile2", "test_first_hour", "test_grading_outputs", "test_grading",
        "test_jupyterlab", "test_nbgrader_layout", "test_student_release", "test_pipeline",
        "test_kernel_explains", "test_timeline_in_jupyterlab", "test_relay", "test_pipeline_grading")


def pytest_collection_modifyitems(config, items):
    """LONG modules first, in that order; then the other modules (most tests first) spaced
    evenly among the spread modules' single tests; last, the modules that read the catalogue's
    cached verdicts. Each module keeps its order.

    Spaced, not after the single tests: many modules mostly wait (a timeout running out, a
    server's answer) and the catalogue's seed runs mostly compute, so a worker on one of them
    beside the others' seed runs keeps the cores busy. The readers last: the seed test runs
    seed 1 too, three seeds at a time; a reader before it ran each file's seed 1 alone, half
    waiting, and three readers side by side left the cores a third idle for minutes (measured:
    CPU per test in a cgroup per worker, on CI's machine)."""
    import catalogue

    def reads_the_catalogue(item) -> bool:
        return any(getattr(item.module, name, None) is getattr(catalogue, name) for name in ("step_verdicts", "verdict"))

    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.stem] = counts.get(item.path.stem, 0) + 1
    readers = {item.path for item in items
               if item.path.stem not in LONG and item.path.stem not in SPREAD and reads_the_catalogue(item)}
    # each spread module's tests evenly over the whole stretch, not one module after another
    rank_in_module: dict[int, float] = {}
    for stem in {item.path.stem for item in items if item.path.stem in SPREAD}:
        own = [item for item in items if item.path.stem == stem]
        rank_in_module.update({id(item): i / len(own) for i, item in enumerate(own)})
    singles = sorted((item for item in items if item.path.stem in SPREAD), key=lambda item: rank_in_module[id(item)])
    modules = sorted({item.path for item in items
                      if item.path.stem not in LONG and item.path.stem not in SPREAD and item.path not in readers},
                     key=lambda path: (-counts[path.stem], str(path)))
    stride = len(singles) / max(1, len(modules))
    place = {path: (i + 0.5) * stride for i, path in enumerate(modules)}
    single_place = {id(item): float(i) for i, item in enumerate(singles)}

    def rank(item) -> tuple:
        stem = item.path.stem
        if stem in LONG:
            return (0, LONG.index(stem), "")
        if item.path in readers:
            return (2, -counts[stem], str(item.path))
        return (1, single_place[id(item)] if stem in SPREAD else place[item.path], "")

    items.sort(key=rank)


def pytest_collection_finish(session):
    """What collection imported lives as long as the worker: frozen out of the collector's
    sight, a full collection no longer walks it (measured over the outbox catalogue's runs:
    each worker's gen-2 time 1.6-1.8 -> 0.6-1.0 CPU-s in 106 s)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order is pytest_collection_modifyitems's

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if Path(module).stem in SPREAD else module

    return ModulesTogether(config, log)


# `-n auto` (pyproject): one and a half workers per core. A worker waits about a fifth of its
# time (timeouts run out, servers and browsers answer): measured on 2 cores, two workers kept the
# CPU 78 % busy; a third fills that. The verdicts do not follow the load (tests/test_load.py).
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    cores = len(os.sched_getaffinity(0)) or 1
    return max(1, cores + cores // 2)


# One verdict cache on disk for the whole session (tests/catalogue.py): the controller makes it,
# hands it to each xdist worker, and removes it at the end.
from catalogue import CACHE_ENV  # noqa: E402

# The shared temp folders a test's leftovers would land in. The session's controller lists them
# at the start and, when every test passed, names anything it did not list that remains
# (pytest's own basetemp excepted: pytest keeps the last three on purpose). Under CI=true (a
# machine of its own) that fails the run; elsewhere another program may write there meanwhile,
# so it is said in yellow.
SHARED_TEMP = (Path(tempfile.gettempdir()), Path("/dev/shm"))
KEPT_TEMP = ("pytest-of-",)
LEFTOVER_WAIT = 30.0  # s


def _temp_entries() -> set[Path]:
    found = set()
    for folder in SHARED_TEMP:
        try:
            found.update(folder.iterdir())
        except OSError:
            pass
    return found


def pytest_configure(config):
    given = getattr(config, "workerinput", {}).get(CACHE_ENV)
    if not hasattr(config, "workerinput"):
        config._temp_before = _temp_entries()
    if given:
        os.environ[CACHE_ENV] = given
    elif not os.environ.get(CACHE_ENV):
        config._verdict_cache = tempfile.mkdtemp(prefix="labkit-verdicts-")
        os.environ[CACHE_ENV] = config._verdict_cache
    if not given:  # once per session, as a grader's forkserver does: sandboxed children read them
        from labkit.sandbox import profiles

        profiles.compile_course()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[CACHE_ENV] = os.environ[CACHE_ENV]


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_temp_before", None)
    if before is None or exitstatus != 0:
        return
    cache = getattr(session.config, "_verdict_cache", None)
    # What ends on its own goes a moment after the last test: a kernel's warm judge ends at its
    # kernel's EOF, then stops its servers and removes its views (seconds). Bounded.
    deadline = time.monotonic() + LEFTOVER_WAIT
    while True:
        left = sorted(str(path) for path in _temp_entries() - before
                      if not path.name.startswith(KEPT_TEMP) and str(path) != cache)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        enforced = bool(os.environ.get("CI"))
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line("the tests left these in the shared temp folders (a test removes what it "
                                "makes, on every path):", red=enforced, yellow=not enforced)
            for path in left:
                reporter.write_line(f"  {path}")
        if enforced:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    made = getattr(config, "_verdict_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(CACHE_ENV, None)
