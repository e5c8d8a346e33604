"""A warm judge: the same verdicts as `python -m labkit check --json`, one per request line.

A notebook's checks come one after another from one kernel; starting `python -m labkit check`
for each paid the interpreter and every import of the judge (most of a step's wait) each
time. This process pays them once. It reads one JSON request per line on stdin
(`{"lab", "solution", "steps", "seed"}`) and answers each with one line on stdout: the
verdict's JSON, or `{"error": ...}` for a request it cannot run. It judges exactly as the
command does (`run_lab`, same children, same sandbox); what it keeps between requests is
only what imports hold, the import check's memory of modules that loaded (`run._LOADED`),
each lab's next session, made ahead once a check ends (`ahead.SessionsAhead`: lab 04's servers
are up when the next check comes; every run still gets a session of its own), and the next
check's seed with the inputs its property tests will draw (`ahead.DrawsAhead`; a request that
names its seed is judged under that seed).

It ends at EOF on stdin (the kernel went away) and on SIGTERM, which unwinds like the
command's, so a run in progress still kills its children.
"""

from __future__ import annotations

import json
import signal
import sys
import traceback
from pathlib import Path

from labkit import labs
from labkit.judge.ahead import DrawsAhead, SessionsAhead
from labkit.judge.run import LabSpec, run_lab

MAX_REQUEST = 1 << 16
# Each lab's next session (lab 04's servers), made while the student reads the last verdict.
AHEAD = SessionsAhead()
DRAWS = DrawsAhead()  # and the next check's seed, its property tests' inputs drawn meanwhile


class BadRequest(ValueError):
    """A check that cannot be run as asked: the command says it as a usage error, the warm judge as its answer."""


def resolve(lab_name: str, solution: Path, steps: list[str] | None) -> tuple[LabSpec, list[str] | None]:
    """The lab to judge `solution` with, and `steps` (None: all), or BadRequest saying what is wrong."""
    try:
        lab = labs.load(lab_name)
    except KeyError:
        raise BadRequest(f"unknown lab {lab_name!r}; known: {', '.join(labs.available())}") from None
    if not solution.is_file():
        raise BadRequest(f"no such file: {solution}")
    for step in steps or []:
        try:
            lab.step(step)
        except KeyError:
            raise BadRequest(f"lab {lab_name} has no step {step!r}") from None
    return lab, steps or None


def answer(request: dict) -> dict:
    """The verdict's JSON for one request, or {"error": ...} when it cannot be run."""
    try:
        solution = Path(str(request["solution"])).resolve()
        lab, steps = resolve(str(request["lab"]), solution, [str(s) for s in request.get("steps") or []])
    except BadRequest as exc:
        return {"error": str(exc)}
    except (KeyError, TypeError) as exc:
        return {"error": f"not a check request: {type(exc).__name__}: {exc}"}
    seed = request.get("seed")
    if isinstance(seed, int):
        return run_lab(lab, solution, steps, seed, ahead=AHEAD).to_json()
    verdict = run_lab(lab, solution, steps, DRAWS.seed(lab.name), ahead=AHEAD)
    DRAWS.after(lab.name, steps)  # it starts drawing once this check is answered (`main`)
    return verdict.to_json()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for line in sys.stdin.buffer:
            with DRAWS.checking():  # nothing is drawn ahead until the answer is out
                try:
                    request = json.loads(line[:MAX_REQUEST])
                    reply = answer(request) if isinstance(request, dict) else {"error": "not a check request"}
                except ValueError as exc:
                    reply = {"error": f"not a check request: {exc}"}
                except Exception as exc:  # the judge's own bug: said for this request; the next may run
                    reply = {"error": "".join(traceback.format_exception(exc))[-2000:]}
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()
    finally:
        # On the way out, stop what was made ahead. `warm_judge.stop` closes our stdin and sends
        # SIGTERM right after: the SIGTERM must not cut that stop short, so it is ignored first,
        # and one that lands before (raising SystemExit here) only makes this try again. Inline:
        # a function call would be one more place for it to land outside the `try`.
        while True:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                break
            except SystemExit:
                continue
        DRAWS.close()
        AHEAD.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
