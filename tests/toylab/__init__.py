"""A tiny lab, registered only inside tests, to prove that the generic rules can fail.

Contract of `half(n)`: `n` is an int (never a bool) from 0 to 10, else ValueError; returns
`n // 2`. The lab is a package of content like the course's own (`manifest.toml`, `lab.py`);
`install(monkeypatch, folder)` registers it as lab "toy" with a reference
`folder/solutions/toy.py` and a catalogue `folder/wrong_solutions/toy/`, the way the real labs
are found (`labkit.labs`, `labkit.judge.coverage`).
"""

from __future__ import annotations

from pathlib import Path

from labkit import labs
from labkit.judge import coverage

REFERENCE = '''\
def half(n):
    if type(n) is not int:
        raise ValueError("an int")
    if not 0 <= n <= 10:
        raise ValueError("0 to 10")
    return n // 2
'''


def wrong(mistake: str, clause: str, old: str, new: str, step: str = "1") -> str:
    """A catalogue file: the reference with `old` replaced by `new`, and its docstring."""
    assert old in REFERENCE
    return (f'"""Wrong: {mistake}. Fails step {step}. Clause: {clause}. Message: {mistake}"""\n'
            + REFERENCE.replace(old, new))


def install(monkeypatch, folder: Path, catalogue: dict[str, str] | None = None) -> Path:
    """Register the toy lab with its reference and `catalogue` (file name → source) under `folder`."""
    (folder / "solutions").mkdir(parents=True)
    (folder / "solutions" / "toy.py").write_text(REFERENCE)
    wrong_dir = folder / "wrong_solutions" / "toy"
    wrong_dir.mkdir(parents=True)
    for name, source in (catalogue or {}).items():
        (wrong_dir / name).write_text(source)
    monkeypatch.setitem(labs.manifests(), "toy", labs.read(Path(__file__).parent, __name__))
    monkeypatch.setattr(coverage, "ROOT", folder)
    monkeypatch.setattr(coverage, "CATALOGUE", folder / "wrong_solutions")
    # The course's own labs have their references under the real ROOT: the toy stands alone.
    monkeypatch.setattr(coverage, "contract_labs", lambda: ["toy"])
    return wrong_dir
