"""A revealed step runs in a module whose other steps are the student's own (labkit.notebook.helpers).

The oracle is Python's own: the names the revealed functions load as globals (their bytecode's
LOAD_GLOBAL) must all exist in the student's module, built the way `%%step` builds it, with
every other step as its skeleton (the least a student's own cell defines).
"""

from __future__ import annotations

import builtins
import dis
import types

import pytest

from labkit.notebook import build, helpers, module_export, reveal

LESSONS = [build.parse(path) for path in sorted(build.SOURCES.glob("*.md"))]
STEPS = [(lesson.lab, block.arg) for lesson in LESSONS for block in lesson.blocks
         if block.kind == "step" and block.arg.isdigit()]


def loaded_globals(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= loaded_globals(const)
    return names


def student_module(lab: str, step: str, revealed: str) -> dict:
    """The module of a student who wrote every other step themselves (as bare as the skeleton)
    and pasted step `step`'s reveal into its cell."""
    lesson = next(lesson for lesson in LESSONS if lesson.lab == lab)
    parts = {b.arg: build.skeleton(b.text) for b in lesson.blocks if b.kind == "step"}
    parts[step] = revealed
    namespace: dict = {"__name__": f"student_{lab}"}
    exec(compile(module_export.assemble(parts), f"<{lab}>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize(("lab", "step"), STEPS, ids=[f"{lab}:{step}" for lab, step in STEPS])
def test_a_revealed_step_finds_every_name_it_calls_beside_the_students_own_steps(lab, step):
    revealed = reveal.reference(lab, step)
    assert revealed is not None and revealed.startswith(f"%%step {step}\n")
    body = revealed.split("\n", 1)[1]
    namespace = student_module(lab, step, body)
    missing = set()
    for node in compile(body, "<reveal>", "exec").co_consts:
        if isinstance(node, types.CodeType):
            missing |= {n for n in loaded_globals(node) if n not in namespace and not hasattr(builtins, n)}
    assert not missing, f"{lab} step {step}'s reveal calls {sorted(missing)}, which only another step's reference defines"


def test_the_course_has_steps_to_reveal():
    assert {lab for lab, _ in STEPS} >= {"outbox", "vending", "relay"}


SOLUTIONS = {
    "header": "import math\nLIMIT = 3",
    "1": "def _ok(x):\n    return math.isfinite(x) and _small(x)\n\n\ndef _small(x):\n    return x < LIMIT\n\n\n"
         "def first(x):\n    return _ok(x)",
    "2": "def _unused():\n    pass\n\n\ndef second(x):\n    check = lambda: _ok(x)  # noqa: E731\n    return check()",
    "3": "def third(x):\n    return first(x)",
}
SKELETONS = {"header": SOLUTIONS["header"], "1": "def first(x):\n    raise NotImplementedError",
             "2": "def second(x):\n    raise NotImplementedError", "3": SOLUTIONS["3"]}


def test_helpers_are_found_through_nested_functions_and_other_helpers_and_never_a_step_function():
    found = helpers.for_step("2", SOLUTIONS, SKELETONS)
    assert [(h.name, h.step) for h in found] == [("_ok", "1"), ("_small", "1")]
    assert helpers.for_step("3", SOLUTIONS, SKELETONS) == []  # `first` is the student's own step 1
    text = helpers.with_helpers("2", SOLUTIONS, SKELETONS)
    assert text.startswith("# Helpers from the reference of step 1, which this cell calls")
    assert text.endswith(SOLUTIONS["2"]) and "_unused" not in text.split(SOLUTIONS["2"])[0]
    assert helpers.with_helpers("1", SOLUTIONS, SKELETONS) == SOLUTIONS["1"]
