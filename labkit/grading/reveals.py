"""Which steps a student revealed the reference of (`lab.reveal(step)`), as the gradebook records it.

The notebook side leaves two traces (`labkit.notebook.reveal`): `work/revealed-<lab>.json`
beside the notebook, and `metadata.labkit.revealed` on the output the reveal cell showed. Both
are the student's own files, read like the quiz answers (`answers`): from the submitted folder,
never from the grading kernel's; a regular file, no link, capped; only steps the lab has count.
A reveal is not cheating — the course offers it — but an instructor wants to see it beside
the grade, and the class report counts it per step.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit.grading.settings import MAX_QUIZ_BYTES
from labkit.grading.submissions import read_capped


def _from_file(notebook: Path, lab: str) -> set[str]:
    folder = notebook.parent / "work"
    try:
        if folder.is_symlink() or not folder.is_dir():
            return set()
        data = json.loads(read_capped(folder / f"revealed-{lab}.json", MAX_QUIZ_BYTES).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return set()
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict) or data.get("lab", lab) != lab:
        return set()
    return {str(step) for step, entry in steps.items() if isinstance(entry, dict)}


def _from_outputs(nb: dict, lab: str) -> set[str]:
    found = set()
    for cell in nb.get("cells", []):
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            meta = output.get("metadata") if isinstance(output, dict) else None
            tag = meta.get("labkit") if isinstance(meta, dict) else None
            if isinstance(tag, dict) and tag.get("revealed") is not None and tag.get("lab", lab) == lab:
                found.add(str(tag["revealed"]))
    return found


def read(notebook: Path, lab: str, nb: dict, steps: list[str]) -> list[str]:
    """The lab's steps this student revealed, in the lab's order (the file and the outputs alike)."""
    said = _from_file(notebook, lab) | _from_outputs(nb, lab)
    return [step for step in steps if step in said]
