"""An untouched step is answered from the source alone (labkit.judge.skeleton), with the verdict
its cases would have given, and nothing else ever is.

Proven here: the released skeleton of every lab gets, step by step, the same standing, pass and
points with the shortcut as without it, and starts no child for its steps; no reference and no
wrong solution of the catalogues loses a single case to it; and the reading refuses every way
the source could hide that a "skeleton" is something else.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import nbformat
import parse_python
import pytest
from catalogue import every_wrong_file

from labkit import labs
from labkit.judge import child, skeleton
from labkit.judge.run import run_lab
from labkit.notebook.module_export import assemble, parts_from_notebook

ROOT = Path(__file__).resolve().parents[1]


def released() -> dict[str, str]:
    """Lab name -> the module its released notebook makes before the student writes a line."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        lab = nb.metadata.get("labkit", {}).get("lab")
        if lab:
            found[lab] = assemble(parts_from_notebook(nb))
    return found


RELEASED = released()


def test_every_lab_has_a_release_and_every_step_names_its_functions():
    assert set(RELEASED) == set(labs.available())
    for lab in labs.available():
        for step in labs.manifest(lab).steps:
            assert step.functions, f"{lab} step {step.step} names no functions"


@pytest.mark.parametrize("lab", labs.available())
def test_the_release_is_all_skeleton_and_the_reference_none_of_it(lab):
    manifest = labs.manifest(lab)
    declared = {f for step in manifest.steps for f in step.functions}
    assert skeleton.skeletons(RELEASED[lab]) >= declared
    reference = (ROOT / "solutions" / manifest.module_file).read_text()
    assert not skeleton.skeletons(reference) & declared
    defined = set(_top_level_functions(reference))
    assert declared <= defined, f"declared but not defined by the reference: {declared - defined}"


def test_no_wrong_solution_loses_a_case_to_the_shortcut():
    for lab, path in every_wrong_file():
        found = skeleton.of_file(path)
        for step in labs.manifest(lab).steps:
            assert skeleton.skeleton_cases(step.functions, found) is None, (path.name, step.step)


@pytest.mark.parametrize("lab", labs.available())
def test_the_untouched_lab_gets_the_verdict_its_cases_give_without_running_them(lab, tmp_path, monkeypatch):
    module = tmp_path / labs.manifest(lab).module_file
    module.write_text(RELEASED[lab])
    spec = labs.load(lab)
    started = []
    real_spawn = child.spawn
    monkeypatch.setattr(child, "spawn", lambda *a, **k: started.append(a) or real_spawn(*a, **k))
    short = run_lab(spec, module, seed=1)
    assert len(started) <= 1, f"{len(started)} children started for an untouched lab (only the import check may)"
    with monkeypatch.context() as m:
        m.setattr(skeleton, "of_file", lambda path: frozenset())
        full = run_lab(spec, module, seed=1)
    assert len(started) > 1, "the run without the shortcut started no child: it proves nothing"
    for a, b in zip(short.steps, full.steps, strict=True):
        assert (a.step, a.status, a.passed, a.points, a.waiting) == (b.step, b.status, b.passed, b.points, b.waiting)
        assert a.status == "not_implemented"
        assert all(c.got == "not implemented yet" and c.hint for c in a.cases)


def test_a_fifo_or_a_missing_file_is_read_as_no_skeleton_without_waiting(tmp_path):
    import os

    fifo = tmp_path / "worker.py"
    os.mkfifo(fifo)
    assert skeleton.of_file(fifo) == frozenset()  # returns: nothing ever writes to it
    assert skeleton.of_file(tmp_path / "absent.py") == frozenset()
    regular = tmp_path / "regular.py"
    regular.write_text(SKELETONS["bare"])
    assert skeleton.of_file(regular) == {"f"}


def test_a_step_with_one_function_written_still_runs_its_cases():
    found = skeleton.skeletons("def open_source(p):\n    return p\n\ndef open_sink(p):\n    raise NotImplementedError\n")
    assert found == {"open_sink"}
    assert skeleton.skeleton_cases(("open_source", "open_sink"), found) is None
    assert skeleton.skeleton_cases(("open_sink",), found) is not None


SKELETONS = {
    "bare": "def f(x):\n    raise NotImplementedError\n",
    "with a docstring and a message": 'def f(x, y=2):\n    """Do it."""\n    raise NotImplementedError("your code here")\n',
    "async": "async def f():\n    raise NotImplementedError\n",
    "beside other code": "import json\nLIMIT = 3\n\ndef g():\n    return f()\n\ndef f():\n    raise NotImplementedError()\n",
}

NOT_SKELETONS = {
    "rebound after": "def f():\n    raise NotImplementedError\n\nf = len\n",
    "bound twice": "try:\n    from fast import f\nexcept ImportError:\n    def f():\n        raise NotImplementedError\n",
    "decorated": "import functools\n\n@functools.cache\ndef f():\n    raise NotImplementedError\n",
    "code before the raise": "def f(x):\n    print(x)\n    raise NotImplementedError\n",
    "a branch": "def f(x):\n    if x:\n        return 1\n    raise NotImplementedError\n",
    "another exception": "def f():\n    raise NotImplementedError.__mro__[1]\n",
    "raised from": "def f():\n    raise NotImplementedError from None\n",
    "a computed message": "def f():\n    raise NotImplementedError(print('side'))\n",
    "NotImplementedError rebound": "NotImplementedError = StopIteration\n\ndef f():\n    raise NotImplementedError\n",
    "globals()": "def f():\n    raise NotImplementedError\n\nglobals()['f'] = len\n",
    "setattr": "import types\n\ndef f():\n    raise NotImplementedError\n\nsetattr(types, 'x', 1)\n",
    "sys.modules": "import sys\n\ndef f():\n    raise NotImplementedError\n\nsys.modules[__name__].f = len\n",
    "from sys import modules": "from sys import modules as m\n\ndef f():\n    raise NotImplementedError\n\nm[__name__].f = len\n",
    "global": "def f():\n    raise NotImplementedError\n\ndef g():\n    global f\n    f = len\n\ng()\n",
    "star import": "from os.path import *\n\ndef f():\n    raise NotImplementedError\n",
    "exec": "def f():\n    raise NotImplementedError\n\nexec('f = len')\n",
    "walrus": "def f():\n    raise NotImplementedError\n\n[(f := len) for _ in [1]]\n",
    "a lambda's default": "def f():\n    raise NotImplementedError\n\ng = lambda x=(f := len): x\n",
    "a loop variable": "def f():\n    raise NotImplementedError\n\nfor f in [len]:\n    pass\n",
    "a syntax error": "def f(:\n    raise NotImplementedError\n",
}


@pytest.mark.parametrize("source", SKELETONS.values(), ids=SKELETONS)
def test_a_skeleton_is_read_as_one_and_only_raises_not_implemented(source):
    assert skeleton.skeletons(source) == {"f"}
    namespace: dict = {}
    exec(compile(source, "<skeleton>", "exec"), namespace)
    fn = namespace["f"]
    args = [None] * len(inspect.signature(fn).parameters)
    with pytest.raises(NotImplementedError):
        result = fn(*args)
        if inspect.iscoroutine(result):
            result.send(None)


@pytest.mark.parametrize("source", NOT_SKELETONS.values(), ids=NOT_SKELETONS)
def test_what_could_be_something_else_is_never_a_skeleton(source):
    assert "f" not in skeleton.skeletons(source)


def _top_level_functions(source: str) -> list[str]:
    import ast

    return [n.name for n in parse_python.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
