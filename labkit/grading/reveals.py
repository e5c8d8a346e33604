"""Which steps a student revealed the reference of (`lab.reveal(step)`), as the gradebook records it.

The notebook side leaves two traces (`labkit.notebook.reveal`): `work/revealed-<lab>.json`
beside the notebook, and `metadata.labkit.revealed` on the output the reveal cell showed. Both
are the student's own files, read like the quiz answers (`answers`): from the submitted folder,
never from the grading kernel's; a regular file, no link, bounded (`bounded.side_file`); only
steps the lab has count. A record or a tag that is there but damaged raises `bounded.Refused`
(the batch makes that the student's `malformed` row).
A reveal is not cheating — the course offers it — but an instructor wants to see it beside
the grade, and the class report counts it per step.
"""

from __future__ import annotations

from pathlib import Path

from labkit.grading import bounded

# A step as a reveal tag names it: "3" or 3; anything longer is not a step of any lab.
MAX_STEP_CHARS = 32


def _from_file(notebook: Path, lab: str) -> set[str]:
    name = f"revealed-{lab}.json"
    data = bounded.side_file(notebook, name)
    if data is None:
        return set()
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict) or not isinstance(data.get("lab", lab), str):
        raise bounded.Refused(f"work/{name} is not a record of reveals: it is not an object with a "
                              "`steps` object.")
    if data.get("lab", lab) != lab:
        return set()  # another lab's record, copied beside this notebook
    return {step for step, entry in steps.items() if isinstance(entry, dict)}


def _from_outputs(nb: dict, lab: str) -> set[str]:
    found = set()
    for index, cell in enumerate(nb.get("cells", [])):
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            meta = output.get("metadata") if isinstance(output, dict) else None
            tag = meta.get("labkit") if isinstance(meta, dict) else None
            if not isinstance(tag, dict) or tag.get("revealed") is None or tag.get("lab", lab) != lab:
                continue
            step = tag["revealed"]
            if isinstance(step, bool) or not isinstance(step, (str, int)) or len(str(step)) > MAX_STEP_CHARS:
                raise bounded.Refused(f"The output of cell {index} carries a `lab.reveal` tag that names no "
                                      "step (`metadata.labkit.revealed` is not a step number).")
            found.add(str(step))
    return found


def read(notebook: Path, lab: str, nb: dict, steps: list[str]) -> list[str]:
    """The lab's steps this student revealed, in the lab's order (the file and the outputs alike)."""
    said = _from_file(notebook, lab) | _from_outputs(nb, lab)
    return [step for step in steps if step in said]
