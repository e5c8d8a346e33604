"""`python -m labkit check`: the command-line contract, driven as a student's shell would.

Exit 0 when every step passes, 1 when any fails (whatever the student's module does), 2 for a
usage error. `--json` prints exactly one JSON object; text mode prints the seed. A broken,
hanging, dying or lying module gives a verdict, never a traceback from labkit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from catalogue import wrong_file

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "worker.py"
STEPS = [1, 2, 3, 4, 5, 6, 7, 8, "final"]
LAB_KEYS = {"lab", "passed", "score", "max_score", "seconds", "seed", "steps"}
STEP_KEYS = {"step", "title", "passed", "points", "max_points", "cases"}
CASE_KEYS = {"name", "passed", "message"}
FAKE_VERDICT = {"lab": "outbox", "passed": True, "score": 13, "max_score": 13, "seconds": 0.1, "seed": 1,
                "steps": [{"step": 1, "title": "validate_event", "passed": True, "points": 1, "max_points": 1,
                           "cases": []}]}


def labkit(*args: object, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=timeout)


def verdict_of(proc: subprocess.CompletedProcess) -> dict:
    """stdout must be exactly one JSON object (json.loads refuses anything after it)."""
    data = json.loads(proc.stdout)
    assert isinstance(data, dict)
    return data


def assert_no_labkit_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    # the student's own traceback may be shown, trimmed to their frames: never one of ours
    assert not re.search(r'File "[^"]*labkit/', proc.stderr + proc.stdout), proc.stderr + proc.stdout


def steps_of(verdict: dict) -> dict:
    return {str(s["step"]): s for s in verdict["steps"]}


def failing_messages(step: dict) -> str:
    return "\n".join(c["message"] for c in step["cases"] if not c["passed"])


def reference_with(tmp_path: Path, function: str, *lines: str) -> Path:
    """The reference solution with `lines` run first in `function`."""
    source = REFERENCE.read_text()
    head = re.compile(rf"^def {function}\(.*\):\n", re.M)
    assert len(head.findall(source)) == 1, function
    inserted = "".join(f"    {line}\n" for line in lines)
    path = tmp_path / "worker.py"
    path.write_text(head.sub(lambda m: m.group(0) + inserted, source))
    return path


def module(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(source)
    return path


@pytest.fixture(scope="module")
def reference_run():
    return labkit("check", "outbox", "--solution", REFERENCE, "--seed", 7, "--json")


# --- the JSON verdict and the exit codes --------------------------------------------------------


def test_reference_exits_0(reference_run):
    assert reference_run.returncode == 0, reference_run.stdout + reference_run.stderr
    assert_no_labkit_traceback(reference_run)


def test_json_has_the_documented_keys(reference_run):
    verdict = verdict_of(reference_run)
    assert LAB_KEYS <= set(verdict)
    assert verdict["lab"] == "outbox" and verdict["seed"] == 7 and verdict["passed"] is True
    assert verdict["score"] == verdict["max_score"] > 0
    assert isinstance(verdict["seconds"], float) and verdict["seconds"] > 0
    assert [s["step"] for s in verdict["steps"]] == STEPS
    for step in verdict["steps"]:
        assert STEP_KEYS <= set(step), step.keys()
        assert (type(step["step"]) is int) or step["step"] == "final"
        assert isinstance(step["title"], str) and step["title"]
        assert step["passed"] is True and step["points"] == step["max_points"] > 0
        assert step["cases"], f"step {step['step']} has no cases"
        for case in step["cases"]:
            assert CASE_KEYS <= set(case), case.keys()
            assert isinstance(case["name"], str) and case["passed"] is True and isinstance(case["message"], str)


def test_failing_solution_exits_1():
    proc = labkit("check", "outbox", "--solution", wrong_file("outbox", "bool_qty"), "--step", 1, "--json")
    assert proc.returncode == 1
    verdict = verdict_of(proc)
    assert verdict["passed"] is False and verdict["score"] == 0
    assert "qty True and False (2 calls)" in [c["name"] for c in verdict["steps"][0]["cases"] if not c["passed"]]
    assert_no_labkit_traceback(proc)


@pytest.mark.parametrize(("args", "complaint"), [
    (["check", "nosuchlab", "--solution", REFERENCE], "unknown lab 'nosuchlab'"),
    (["check", "outbox", "--solution", ROOT / "no" / "such" / "worker.py"], "no such file"),
    (["check", "outbox", "--solution", REFERENCE, "--step", 9], "has no step '9'"),
    (["check", "outbox", "--solution", REFERENCE, "--step", "finale"], "has no step 'finale'"),
], ids=["unknown lab", "missing solution file", "unknown step number", "unknown step name"])
def test_usage_errors_exit_2(args, complaint):
    proc = labkit(*args)
    assert proc.returncode == 2
    assert complaint in proc.stderr
    assert proc.stdout == ""
    assert_no_labkit_traceback(proc)


# --- seeds and step selection -------------------------------------------------------------------


def test_same_seed_same_cases_and_verdicts(reference_run):
    again = verdict_of(labkit("check", "outbox", "--solution", REFERENCE, "--seed", 7, "--json"))
    first = verdict_of(reference_run)

    def cases(verdict):
        return [(s["step"], c["name"], c["passed"]) for s in verdict["steps"] for c in s["cases"]]

    def calls(verdict):  # what was called, with the seeded ids; steps 8 and final also name ports
        return [c.get("called") for s in verdict["steps"] if s["step"] not in (8, "final") for c in s["cases"]]

    assert cases(again) == cases(first)
    assert calls(again) == calls(first)
    assert again["seed"] == first["seed"] == 7


def test_another_seed_other_cases(reference_run):
    """Step 3's cases call with seeded ids, sku and quantities: the same cases, other values."""
    other = verdict_of(labkit("check", "outbox", "--solution", REFERENCE, "--seed", 8, "--json", "--step", 3))
    mine = steps_of(verdict_of(reference_run))["3"]["cases"]
    theirs = other["steps"][0]["cases"]
    assert [c["name"] for c in theirs] == [c["name"] for c in mine]
    assert [c.get("called") for c in theirs] != [c.get("called") for c in mine]


def test_text_mode_prints_the_seed():
    given = labkit("check", "outbox", "--solution", REFERENCE, "--step", 1, "--seed", 4242)
    assert given.returncode == 0
    assert re.search(r"\bseed 4242\b", given.stdout), given.stdout
    chosen = labkit("check", "outbox", "--solution", REFERENCE, "--step", 1)
    assert re.search(r"\bseed \d+\b", chosen.stdout), chosen.stdout


def test_step_3_runs_only_step_3():
    proc = labkit("check", "outbox", "--solution", REFERENCE, "--step", 3, "--json")
    assert proc.returncode == 0
    assert [s["step"] for s in verdict_of(proc)["steps"]] == [3]


# --- modules that misbehave: a verdict, exit 1, never our traceback -------------------------------


def check_bad(path: Path, *steps: object, env: dict[str, str] | None = None) -> dict:
    args = [a for s in steps for a in ("--step", s)]
    proc = labkit("check", "outbox", "--solution", path, "--json", *args, env=env, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_no_labkit_traceback(proc)
    verdict = verdict_of(proc)
    assert verdict["passed"] is False
    return verdict


def test_syntax_error(tmp_path):
    verdict = check_bad(module(tmp_path, "def validate_event(event)\n    return event\n"), 1, 2)
    for step in verdict["steps"]:
        assert "importing your module failed: raised SyntaxError" in failing_messages(step)


def test_module_that_hangs_on_import(tmp_path):
    path = module(tmp_path, "import time\nwhile True:\n    time.sleep(0.05)\n")
    verdict = check_bad(path, 1, 2, env={"LABKIT_STEP_TIMEOUT": "2"})
    for step in verdict["steps"]:
        assert "importing your module did not finish within 2 s" in failing_messages(step)
    assert verdict["seconds"] < 10


def test_module_that_exits_on_import(tmp_path):
    verdict = check_bad(module(tmp_path, "import os\nos._exit(5)\n"), 1)
    assert "the process died while importing your module (exit code 5)" in failing_messages(verdict["steps"][0])


def test_module_that_raises_on_import(tmp_path):
    verdict = check_bad(module(tmp_path, "raise RuntimeError('no database configured')\n"), 1)
    messages = failing_messages(verdict["steps"][0])
    assert "importing your module failed: raised RuntimeError: no database configured" in messages


def test_module_that_prints_a_fake_verdict(tmp_path):
    fake = json.dumps(FAKE_VERDICT)
    source = (f"import sys\nFAKE = {fake!r}\nprint(FAKE, flush=True)\n\n\n"
              "def validate_event(event):\n    print(FAKE, flush=True)\n    sys.stdout.write(FAKE + '\\n')\n"
              "    return event\n\n\n"
              "def open_source(path):\n    print(FAKE, flush=True)\n    return None\n")
    verdict = check_bad(module(tmp_path, source), 1, 2)
    assert verdict["score"] == 0 and verdict["max_score"] == 2
    assert [s["passed"] for s in verdict["steps"]] == [False, False]


def test_step_function_that_hangs(tmp_path):
    path = reference_with(tmp_path, "validate_event", "while True:", "    pass")
    steps = steps_of(check_bad(path, 1, 2, 4, 6, env={"LABKIT_STEP_TIMEOUT": "2"}))
    first, *rest = steps["1"]["cases"]
    assert "no answer within 2 s; the process was killed" in first["message"]
    *fixed, generated = rest
    assert all("not run: an earlier case in this step hung" in c["message"] for c in fixed)
    assert "not judged: the fixed cases above fail" in generated["message"]
    assert [steps[s]["passed"] for s in ("2", "4", "6")] == [True, True, True]


def test_step_function_that_kills_its_process(tmp_path):
    path = reference_with(tmp_path, "validate_event", "import os", "os._exit(9)")
    steps = steps_of(check_bad(path, 1, 2, 4))
    first = steps["1"]["cases"][0]
    assert "the process died (exit code 9) before answering" in first["message"], first["message"]
    assert [steps[s]["passed"] for s in ("2", "4")] == [True, True]


def test_step_function_that_hogs_memory(tmp_path):
    path = reference_with(tmp_path, "pending", "hoard = bytearray(4 * 1024**3)")
    steps = steps_of(check_bad(path, 1, 4))
    assert "raised MemoryError" in failing_messages(steps["4"])
    assert all(not c["passed"] for c in steps["4"]["cases"])
    assert steps["1"]["passed"]
