"""Submissions that want points without the work, or to hurt their neighbours (issue 9).

One entry at least per class of attack: read what it must not, write what it must not,
signal what it must not, outlive its job, lie from beside the probe, exceed limits sideways,
trip the discovery, poison the outputs — in lab 01 and lab 02 notebooks, from kernel cells
(the notebook as nbclient runs it) and from step cells (the module the judge's children
import). Every attack knows the real paths (`Targets`): the strongest student guesses them.
Each entry says which grade it deserves; the honest neighbours in the same batch
(`corpus.build`) must keep every point.

Where an attack would land, it leaves a file named ESCAPE (or a forged record): the test
looks for every one of them afterwards.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from tests.submissions.corpus import (
    ALL,
    NONE,
    Entry,
    _after,
    _code,
    _gid,
    expected_quiz,
    quiz_key,
    reference_parts,
    solved,
)

ESCAPE = "labkit-hostile-escape.txt"
GHOST = "ghost"  # a student who does not exist: no row may name them
VICTIM = "ada"  # the honest reference neighbour every attack aims at
SECRET = "VICTIM-SECRET-7f3a91"  # only the victim's notebook holds it


@dataclass(frozen=True)
class Targets:
    root: Path  # the course checkout (labkit, checks, solutions, the venv)
    subs: Path  # the submissions folder
    out: Path  # --out
    home: Path  # the grader's home
    venv: Path  # sys.prefix

    def escape_dirs(self) -> list[Path]:
        return [Path("/tmp"), Path("/dev/shm"), self.home, self.root, self.root / "labkit", self.subs,
                self.subs / VICTIM, self.out, self.out / ".results", self.out / "feedback", self.venv]


def attack(t: Targets, lab: str, *, reads: bool = True, writes: bool = True) -> str:
    """Python source that tries to read and write everything it must not, and says what happened."""
    reads_at = [t.root / "solutions" / "worker.py", t.root / "solutions" / "client.py",
                t.root / "notebooks" / "source" / "01-outbox.md", t.root / "checks" / lab / "lab.py",
                t.subs / VICTIM / "01-lab.ipynb", t.out / ".results" / f"{VICTIM}--outbox.json"]
    forged = json.dumps({"version": 1, "row": {"student": GHOST, "lab": lab, "total": 99, "max": 13,
                                               "status": "ok", "flags": [], "notebook": "x"}})
    writes_at = {t.out / ".results" / f"{GHOST}--{lab}.json": forged,
                 t.out / ".results" / f"{VICTIM}--outbox.json": forged.replace(GHOST, VICTIM).replace("99", "0"),
                 t.out / ".results" / f"{VICTIM}--outbox.verdict": "{}",
                 t.out / "feedback" / VICTIM / "outbox.html": "<h1>0 points</h1>",
                 t.subs / VICTIM / "01-lab.ipynb": "{}",
                 t.root / "labkit" / "__init__.py": "\n# pwned\n",
                 t.root / "checks" / "outbox" / "lab.py": "\n# pwned\n"}
    lines = [
        "import os as _os",
        "_stolen = []",
        f"for _p in {[str(p) for p in reads_at]!r} if {reads!r} else []:",
        "    try:",
        "        _stolen.append(open(_p).read()[:3000])",
        "    except OSError as _e:",
        "        print('read refused:', _p, _e.strerror)",
        "if _stolen:",
        "    print('STOLEN', _stolen)",
        f"for _p, _data in ({list((str(k), v) for k, v in writes_at.items())!r} if {writes!r} else []):",
        "    try:",
        "        with open(_p, 'a') as _f:",
        "            _f.write(_data)",
        "    except OSError as _e:",
        "        print('write refused:', _p, _e.strerror)",
        f"for _d in {[str(d) for d in t.escape_dirs()]!r} if {writes!r} else []:",
        "    try:",
        f"        open(_os.path.join(_d, {ESCAPE!r}), 'w').write('escaped')",
        "    except OSError as _e:",
        "        print('escape refused:', _d, _e.strerror)",
    ]
    return "\n".join(lines) + "\n"


# Every process the caller may signal, but itself (as root outside a sandbox: the grader too).
KILL_ALL = "try:\n    _os.kill(-1, _sig.SIGKILL)\nexcept OSError:\n    pass\n"
# SIGSTOP every process it can see but itself (then KILL_ALL finishes them).
STOP_ALL = ("import os as _os, signal as _sig\n"
            "for _pid in [int(p) for p in _os.listdir('/proc') if p.isdigit()]:\n"
            "    if _pid != _os.getpid():\n"
            "        try:\n"
            "            _os.kill(_pid, _sig.SIGSTOP)\n"
            "        except OSError:\n"
            "            pass\n")


def in_judged_children(code: str) -> str:
    """`code` run only where the judge imports the module (its children), not in the kernel."""
    return "if __name__ != '__main__':\n" + "\n".join("    " + line for line in code.splitlines())


def _header_first(nb: NotebookNode, code: str) -> None:
    """Put `code` at the top of the step header cell: it runs wherever the module is imported."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%step header"))
    first, _, rest = cell.source.partition("\n")
    cell.source = f"{first}\n{code}\n{rest}"


def build(release: NotebookNode, reference: str, targets: Targets, *, wrong_lock: str,
          vending: tuple[NotebookNode, str] | None = None) -> list[Entry]:
    parts = reference_parts(reference)
    lab = release.metadata["labkit"]["lab"]
    setup = next(_gid(c) for c in release.cells if c.metadata.get("labkit", {}).get("setup"))
    entries: list[Entry] = []

    # --- read what it must not -------------------------------------------------------------
    reader = copy.deepcopy(release)  # the three lines: exec the reference found beside labkit
    _header_first(reader, "import pathlib as _pl, labkit as _lk\n"
                          "try:\n"
                          "    exec(open(_pl.Path(_lk.__file__).parents[1] / 'solutions' / 'worker.py').read())\n"
                          "except OSError as _e:\n"
                          "    print('no solutions here:', _e)")
    _after(reader, setup, _code(attack(targets, lab, writes=False)))
    entries.append(Entry("rex", "01-lab.ipynb", reader, NONE,
                         why="execs solutions/worker.py from a step cell; reads other submissions and --out"))

    # --- write what it must not --------------------------------------------------------------
    writer = copy.deepcopy(release)
    _after(writer, setup, _code(attack(targets, lab, reads=False)))
    _header_first(writer, attack(targets, lab, reads=False))
    entries.append(Entry("wes", "01-lab.ipynb", writer, NONE,
                         why="forges its own, a neighbour's and a ghost's records, the feedback, the course "
                             "source and a neighbour's notebook, from the kernel and from the judge's children"))

    # --- signal what it must not -------------------------------------------------------------
    signaller = solved(release, parts, ALL)
    _after(signaller, setup, _code(STOP_ALL + KILL_ALL))
    entries.append(Entry("sig", "01-lab.ipynb", signaller, ALL,
                         why="SIGSTOPs every process it can see, then kill(-1): nothing else is in its reach"))

    killer = solved(release, parts, ALL)
    _header_first(killer, in_judged_children(STOP_ALL + KILL_ALL))
    entries.append(Entry("kai", "01-lab.ipynb", killer, ALL,
                         why="SIGSTOP everything, then kill(-1, SIGKILL), at import in the judge's children"))

    # --- outlive its job ---------------------------------------------------------------------
    outliver = solved(release, parts, ALL)
    later = f"import time; time.sleep(8); open({str(targets.out / 'grades.csv')!r}, 'w').write('pwned')"
    linger = ("import os as _os, sys as _sys\n"
              "if _os.fork() == 0:\n"
              "    _os.setsid()\n"
              "    if _os.fork() == 0:\n"
              f"        _os.execve(_sys.executable, [_sys.executable, '-c', {later!r}], {{}})\n"
              "    _os._exit(0)\n")
    _header_first(outliver, linger)
    _after(outliver, setup, _code(linger))
    entries.append(Entry("otto", "01-lab.ipynb", outliver, ALL,
                         why="setsid + execve with an empty environment, to rewrite the gradebook later"))

    # --- lie from beside the probe -----------------------------------------------------------
    liar = solved(release, reference_parts(wrong_lock), ALL)
    _header_first(liar, "import labkit.probe as _probe\n_probe.other_can_write = lambda db: True")
    # ("Could another writer proceed?" is the judge's own BEGIN IMMEDIATE, tried while the probe
    # waits on the witness: the patch changes nothing.)
    entries.append(Entry("lia", "01-lab.ipynb", liar, ALL, earns=wrong_lock,
                         why="holds the write lock during send and patches the probe's lock test to say 'free'"))

    # --- exceed limits sideways --------------------------------------------------------------
    hog = solved(release, parts, ALL)
    fill = ("import os as _os\n"
            "for _where in ('/dev/shm', '/tmp', '.'):\n"
            "    try:\n"
            "        with open(_os.path.join(_where, 'fill'), 'wb') as _f:\n"
            "            for _ in range(256):\n"
            "                _f.write(b'x' * (16 * 2**20))\n"
            "    except OSError as _e:\n"
            "        print('full:', _where, _e.strerror)\n"
            "    except MemoryError:\n"
            "        print('no memory for', _where)\n")
    _after(hog, setup, _code(fill))
    # In the judge's children only their private /dev/shm and /tmp: the step's folder is the
    # job's own tmpfs, which the judge needs too (filling it costs the student their steps).
    child_fill = fill.replace("('/dev/shm', '/tmp', '.')", "('/dev/shm', '/tmp')")
    _header_first(hog, "if __name__ != '__main__':\n" + "\n".join("    " + line for line in child_fill.splitlines()))
    entries.append(Entry("shm", "01-lab.ipynb", hog, ALL,
                         why="4 GB into /dev/shm, /tmp (and the kernel's folder), from the kernel and the children"))

    # --- trip the discovery --------------------------------------------------------------------
    entries.append(Entry("thief", "01-lab.ipynb", None, NONE, status="skipped", kind="symlink", link_to=VICTIM,
                         why="a symlink to the victim's notebook (the victim keeps the row and the points)"))
    entries.append(Entry("wanderer", "elsewhere", None, NONE, status="skipped", kind="dirlink",
                         why="a link to a folder outside the submissions, holding a foreign notebook"))
    entries.append(Entry(".dotty", "01-lab.ipynb", solved(release, parts, ALL), ALL,
                         why="a folder starting with '.' is graded like any other"))
    entries.append(Entry("fifo", "01-lab.ipynb", None, NONE, status="skipped", kind="fifo",
                         why="a FIFO named like a notebook: opening it would block forever"))
    entries.append(Entry("huge", "01-lab.ipynb", None, NONE, status="skipped", kind="huge",
                         why="a 25 MB file is not read"))
    commented = solved(release, parts, ALL)
    for cell in commented.cells:
        if cell.cell_type == "code" and cell.source.startswith("%%step 1\n"):
            cell.source = cell.source.replace("%%step 1\n", "%%step 1  # validate_event\n", 1)
    entries.append(Entry("stu", "01-lab.ipynb", commented, ALL,
                         why="`%%step 1  # validate_event` works in the kernel, so it must in the grader"))

    # --- poison the outputs --------------------------------------------------------------------
    entries.append(Entry("=1+2", "01-lab.ipynb", solved(release, parts, ALL), ALL,
                         why="a name that a spreadsheet would run as a formula"))
    questions = quiz_key(lab)
    wrong = {q["id"]: next(i for i, o in enumerate(q["options"]) if not o["correct"]) for q in questions[:2]}
    forged_quiz = {"lab": lab, "questions": 99, "answered": 99, "correct_first_time": 99,
                   "answers": {qid: {"choice": i, "option": "whatever", "correct": True, "first_choice": i,
                                     "first_correct": True, "attempts": 1} for qid, i in wrong.items()}
                   | {"no-such-question": {"choice": 0, "correct": True}}}
    entries.append(Entry("quinn", "01-lab.ipynb", solved(release, parts, ALL), ALL, quiz=expected_quiz(lab, wrong),
                         files={f"work/quiz-{lab}.json": json.dumps(forged_quiz).encode()},
                         why="quiz answers that declare themselves correct"))
    xss = solved(release, parts, set())
    xss.cells.append(nbformat.v4.new_markdown_cell("[click me](javascript:alert(1)) <script>alert(2)</script>"))
    xss.cells.append(_code("from IPython.display import HTML, display\n"
                           "display(HTML('<a href=\"javascript:alert(3)\">x</a><img src=x onerror=alert(4)>"
                           "<script>alert(5)</script>'))"))
    step_one = next(c for c in xss.cells if c.cell_type == "code" and c.source.startswith("%%step 1\n"))
    step_one.source = "%%step 1\ndef validate_event(event):\n    raise ValueError('<script>alert(6)</script>')\n"
    entries.append(Entry("xena", "01-lab.ipynb", xss, NONE,
                         why="scripts and javascript: links in markdown, outputs and its error messages"))

    # --- lab 02 ------------------------------------------------------------------------------
    if vending is not None:
        v_release, v_reference = vending
        v_parts = reference_parts(v_reference)
        v_setup = next(_gid(c) for c in v_release.cells if c.metadata.get("labkit", {}).get("setup"))
        entries.append(Entry("vera", "02-vending.ipynb", solved(v_release, v_parts, ALL), ALL, lab="vending",
                             why="lab 02's reference, in the same batch"))
        vex = copy.deepcopy(v_release)
        _header_first(vex, "import pathlib as _pl, labkit as _lk\n"
                           "try:\n"
                           "    exec(open(_pl.Path(_lk.__file__).parents[1] / 'solutions' / 'client.py').read())\n"
                           "except OSError as _e:\n"
                           "    print('no solutions here:', _e)\n" + attack(targets, "vending"))
        _after(vex, v_setup, _code(attack(targets, "vending")))
        entries.append(Entry("vex", "02-vending.ipynb", vex, NONE, lab="vending",
                             why="lab 02: execs solutions/client.py and tries every read and write"))
        v_kill = solved(v_release, v_parts, ALL)
        _header_first(v_kill, in_judged_children(STOP_ALL + KILL_ALL))
        entries.append(Entry("vik", "02-vending.ipynb", v_kill, ALL, lab="vending",
                             why="lab 02: SIGSTOP everything and kill(-1) at import in the judge's children"))
    return entries

