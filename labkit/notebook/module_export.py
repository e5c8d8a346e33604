"""Step cells → one importable module file.

In the kernel, `%%step N` saves the cell as part N and rewrites the module from all parts,
so re-running a cell replaces its earlier version instead of appending. When grading, the
same assembly runs on the step cells of a notebook file, without any kernel.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MAGIC = "%%step"
HEADER = "header"


def part_key(part: str) -> tuple[int, str]:
    """The header first, then steps by number."""
    return (-1, "") if part == HEADER else (int(part) if part.isdigit() else 10_000, part)


def split_magic(source: str) -> tuple[str | None, str]:
    """`%%step 3\\ncode` → ("3", "code"); a cell without the magic → (None, source)."""
    first, _, rest = source.partition("\n")
    words = first.split()
    if len(words) == 2 and words[0] == MAGIC:
        return words[1], rest
    return None, source


def assemble(parts: dict[str, str]) -> str:
    chunks = []
    for part in sorted(parts, key=part_key):
        label = "provided code" if part == HEADER else f"step {part}"
        chunks.append(f"# --- {label} " + "-" * (60 - len(label)) + "\n" + parts[part].strip("\n") + "\n")
    return "\n\n".join(chunks)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def parts_dir(workdir: Path, lab: str) -> Path:
    return workdir / lab / "parts"


def save_part(workdir: Path, lab: str, module_file: str, part: str, code: str) -> Path:
    """Save one step's code and rebuild the module from every saved part."""
    write_atomic(parts_dir(workdir, lab) / f"{part}.py", code)
    return rebuild(workdir, lab, module_file)


def rebuild(workdir: Path, lab: str, module_file: str) -> Path:
    folder = parts_dir(workdir, lab)
    parts = {p.stem: p.read_text(encoding="utf-8") for p in folder.glob("*.py")} if folder.is_dir() else {}
    target = workdir / module_file
    write_atomic(target, assemble(parts))
    return target


def parts_from_notebook(nb) -> dict[str, str]:
    """The step cells of a notebook (an nbformat node), by part. Later cells win, as in a kernel."""
    parts = {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        part, code = split_magic(cell.get("source", ""))
        if part is not None:
            parts[part] = code
    return parts
