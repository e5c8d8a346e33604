"""A child that stays up (`labkit.judge.child.child_session`) answers call after call, and
whatever the student's function does — hang, die, exit, fail to import — each call ends in a
named outcome, and nothing is left running afterwards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from labkit.judge import expect
from labkit.judge.child import child_session
from labkit.values import decode, encode

TOY = '''\
import os


def double(x):
    return x * 2


def append_one(items):
    items.append(1)
    return items


def hang(x):
    while True:
        pass


def die(x):
    os._exit(7)


def leave(x):
    raise SystemExit(3)


def fail(x):
    raise KeyError(x)


def shout(x):
    print("from the student", x)
    return x


print("imported")
'''


def toy(tmp_path: Path, source: str = TOY) -> Path:
    path = tmp_path / "toy.py"
    path.write_text(source)
    return path


def session_of(path: Path, timeout: float = 5.0):
    return child_session(path, workdir=path.parent, timeout=timeout, module_name="toy")


def call(session, fn: str, *args, **kwargs) -> dict:
    return session.call({"fn": fn, "args": [encode(a) for a in args]}, **kwargs)


def test_one_child_answers_many_calls_in_order(tmp_path, nothing_left):
    with nothing_left(), session_of(toy(tmp_path)) as session:
        assert session.imported
        replies = [call(session, "double", n) for n in range(200)]
        pid = session.proc.pid
    assert [decode(r["outcome"]["value"]) for r in replies] == [2 * n for n in range(200)]
    assert session.proc.pid == pid and session.calls == 200


def test_replies_describe_exceptions_missing_functions_and_what_was_received(tmp_path, nothing_left):
    with nothing_left(), session_of(toy(tmp_path)) as session:
        raised = call(session, "fail", "k")
        missing = call(session, "no_such_function", 1)
        changed = call(session, "append_one", [0, 0])
        sized = call(session, "double", b"abc")
    assert raised["outcome"]["kind"] == "raised" and raised["outcome"]["type"] == "KeyError"
    assert missing["outcome"] == {"kind": "missing"}
    assert changed["observed"]["input_changed"] and changed["observed"]["returned_input"]
    assert changed["observed"]["received"] == [{"type": "list", "len": 2}]
    assert sized["observed"]["received"] == [{"type": "bytes", "len": 3}]


def test_a_hanging_call_is_timed_out_and_later_calls_say_so(tmp_path, nothing_left):
    with nothing_left(), session_of(toy(tmp_path)) as session:
        started = time.monotonic()
        hung = call(session, "hang", 1, timeout=0.5)
        waited = time.monotonic() - started
        after = call(session, "double", 1)
    assert hung["outcome"] == {"kind": "timed_out", "seconds": 0.5}
    assert waited < 3.0
    assert after["outcome"]["kind"] == "timed_out"
    assert session.run.timed_out


@pytest.mark.parametrize(("fn", "outcome"), [("die", {"kind": "died", "exit_code": 7}),
                                              ("leave", "aborted")])
def test_a_child_that_ends_itself_is_a_named_outcome(tmp_path, nothing_left, fn, outcome):
    with nothing_left(), session_of(toy(tmp_path)) as session:
        reply = call(session, fn, 1)
    if outcome == "aborted":
        assert reply["outcome"]["kind"] == "aborted"
        assert reply["outcome"]["error"]["type"] == "SystemExit"
    else:
        assert reply["outcome"] == outcome


def test_the_students_output_is_captured_not_mixed_with_replies(tmp_path, nothing_left):
    with nothing_left(), session_of(toy(tmp_path)) as session:
        reply = call(session, "shout", "hello")
    assert decode(reply["outcome"]["value"]) == "hello"
    assert session.run.stdout == "imported\nfrom the student hello\n"


@pytest.mark.parametrize(("source", "got"), [
    ("raise RuntimeError('broken')\n", "importing your module failed: raised RuntimeError: broken"),
    ("import time\ntime.sleep(60)\n", "importing your module did not finish within 1 s"),
    ("import os\nos._exit(5)\n", "the process died while importing your module (exit code 5)"),
], ids=["raises", "hangs", "dies"])
def test_a_module_that_does_not_import_is_reported_as_an_import_problem(tmp_path, nothing_left, source, got):
    with nothing_left(), session_of(toy(tmp_path, source), timeout=1.0) as session:
        assert not session.imported
        reply = call(session, "double", 1)
    assert reply["outcome"]["kind"] in ("died", "timed_out")
    said = expect.import_problem(session.run, 1.0)[0]
    # where a hang was, when the child had reached it: the student's line, never labkit's
    assert said == got or said == got + ": it was running line 2 of toy.py: `time.sleep(60)`", said
