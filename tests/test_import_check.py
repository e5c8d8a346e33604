"""The import check (one child that only loads the module) runs once per module content in a
judge process: a pass is remembered by the bytes it loaded, a failure never is."""

from __future__ import annotations

import pytest
import toylab

from labkit import labs
from labkit.judge import run
from labkit.judge.verdict import Outcome


@pytest.fixture
def toy(monkeypatch, tmp_path):
    toylab.install(monkeypatch, tmp_path)
    monkeypatch.setattr(run, "_LOADED", set())
    monkeypatch.setattr(run, "_CHECKING", {})
    started = []
    real = run.run_child

    def counting(module, probe, *args, **kwargs):
        if probe == "labkit.probe:noop":
            started.append(module.read_text())
        return real(module, probe, *args, **kwargs)

    monkeypatch.setattr(run, "run_child", counting)
    return labs.load("toy"), tmp_path / "toy.py", started


def test_a_module_that_loaded_is_not_loaded_again_until_its_bytes_change(toy):
    lab, module, started = toy
    module.write_text(toylab.REFERENCE)
    for seed in (1, 2):
        assert run.run_lab(lab, module, seed=seed).passed
    assert len(started) == 1
    module.write_text(toylab.REFERENCE + "\n# edited\n")
    assert run.run_lab(lab, module, seed=3).passed
    assert len(started) == 2


def test_a_module_that_did_not_load_is_checked_every_time(toy):
    lab, module, started = toy
    module.write_text("raise RuntimeError('not yet')\n" + toylab.REFERENCE)
    for seed in (1, 2):
        verdict = run.run_lab(lab, module, seed=seed)
        assert [c.outcome for s in verdict.steps for c in s.cases] == [Outcome.IMPORT_FAILED] * len(verdict.steps)
    assert len(started) == 2
    module.write_text(toylab.REFERENCE)  # fixed: loads, then is remembered
    assert run.run_lab(lab, module, seed=3).passed and run.run_lab(lab, module, seed=4).passed
    assert len(started) == 3


def test_runs_of_the_same_bytes_side_by_side_share_one_import_check(toy):
    """Three seeds judged at once (as the tests do) start one import child, not three; a failure
    is still checked by each run that waited for it."""
    from concurrent.futures import ThreadPoolExecutor

    lab, module, started = toy
    module.write_text(toylab.REFERENCE)
    with ThreadPoolExecutor(3) as pool:
        assert all(v.passed for v in pool.map(lambda seed: run.run_lab(lab, module, seed=seed), (1, 2, 3)))
    assert len(started) == 1
    module.write_text("raise RuntimeError('not yet')\n" + toylab.REFERENCE)
    with ThreadPoolExecutor(3) as pool:
        verdicts = list(pool.map(lambda seed: run.run_lab(lab, module, seed=seed), (1, 2, 3)))
    assert all(not v.passed for v in verdicts)
    assert len(started) == 1 + 3
