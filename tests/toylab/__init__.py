"""A tiny lab, registered only inside tests, to prove that the generic rules can fail.

Contract of `half(n)`: `n` is an int (never a bool) from 0 to 10, else ValueError; returns
`n // 2`. The lab is a package of content like the course's own (`manifest.toml`, `lab.py`);
`install(monkeypatch, folder)` registers it as lab "toy" with a reference
`folder/solutions/toy.py` and a catalogue `folder/wrong_solutions/toy.toml` with its patches
(`toy/<name>.patch`), built into `folder/build/`, the way the real labs are found
(`labkit.labs`, `labkit.judge.coverage`, `labkit.judge.catalogue`, tests/catalogue.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import catalogue as built

from labkit import labs
from labkit.judge import catalogue, coverage

REFERENCE = '''\
def half(n):
    if type(n) is not int:
        raise ValueError("an int")
    if not 0 <= n <= 10:
        raise ValueError("0 to 10")
    return n // 2
'''


def wrong(mistake: str, clause: str, old: str, new: str, step: str = "1") -> tuple[catalogue.Wrong, str]:
    """A catalogue entry (named by `install`) and its code: the reference with `old` replaced by `new`."""
    assert old in REFERENCE
    return catalogue.Wrong("", step, clause, mistake, mistake), REFERENCE.replace(old, new)


def install(monkeypatch, folder: Path, wrong_solutions: dict | None = None) -> Path:
    """Register the toy lab with its reference and catalogue (name → `wrong(...)`) under `folder`;
    returns the catalogue's folder."""
    (folder / "solutions").mkdir(parents=True)
    (folder / "solutions" / "toy.py").write_text(REFERENCE)
    # No blank line after the docstring: the toy's sources are what they were as copies.
    toy = catalogue.Catalogue(folder / "wrong_solutions", "toy", [], blank_line=False)
    (toy.folder / "toy").mkdir(parents=True)
    for name, (entry, code) in (wrong_solutions or {}).items():
        toy.entries.append(replace(entry, name=name))
        toy.patch_path(name).write_text(catalogue.make_patch(REFERENCE, code, "solutions/toy.py"))
    catalogue.data_file(toy.folder, "toy").write_text(catalogue.dumps(toy))
    monkeypatch.setitem(labs.manifests(), "toy", labs.read(Path(__file__).parent, __name__))
    monkeypatch.setattr(coverage, "ROOT", folder)
    monkeypatch.setattr(coverage, "CATALOGUE", toy.folder)
    monkeypatch.setattr(built, "BUILD", folder / "build" / "wrong_solutions")
    # The course's own labs have their references under the real ROOT: the toy stands alone.
    monkeypatch.setattr(coverage, "contract_labs", lambda: ["toy"])
    return toy.folder
