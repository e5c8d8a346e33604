"""Which version of each step a check judged, and whether the step's cell has moved on since.

`%%step N` records every run of a step cell in `work/<lab>/runs.json`: when the part was last
saved (and a hash of what was saved), and the latest attempt, saved or not ("syntax error",
"interrupted"). A check reads this to say which saved version it judged ("judged: step 6 as
saved at 14:02:31") and to warn, at the top of its panel, when the latest run of that step's
cell did not save, or when the notebook's cell (as last written to disk) differs from what is
saved: the verdict is then about an older version than the one on screen. The views show it
as one line (`render_text.judged_text`, `render_html.judged_html`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from labkit.notebook import module_export

SAVED = "saved"
SYNTAX_ERROR = "syntax error"
INTERRUPTED = "interrupted"


def digest(body: str) -> str:
    return hashlib.sha256(body.strip("\n").encode("utf-8", "surrogatepass")).hexdigest()[:16]


def path(workdir: Path, lab: str) -> Path:
    return Path(workdir) / lab / "runs.json"


def load(workdir: Path, lab: str) -> dict[str, dict]:
    try:
        data = json.loads(path(workdir, lab).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def record(workdir: Path, lab: str, part: str, body: str, result: str) -> None:
    """One run of a step cell: `result` is SAVED, or why it was not saved."""
    runs = load(workdir, lab)
    now = time.time()
    entry = runs.get(part, {})
    entry.update(attempt_at=now, attempt_hash=digest(body), attempt=result)
    if result == SAVED:
        entry.update(saved_at=now, saved_hash=digest(body))
    runs[part] = entry
    try:
        module_export.write_atomic(path(workdir, lab), json.dumps(runs, indent=1) + "\n")
    except OSError:
        pass  # a record we could not write only costs the warning, never the student's save


def clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def _saved_at(workdir: Path, lab: str, part: str, runs: dict[str, dict]) -> float | None:
    at = runs.get(part, {}).get("saved_at")
    if isinstance(at, (int, float)):
        return float(at)
    file = module_export.parts_dir(workdir, lab) / f"{part}.py"  # saved before runs.json existed
    return file.stat().st_mtime if file.exists() else None


def _label(part: str) -> str:
    return "the provided code" if part == module_export.HEADER else f"step {part}"


def notebook_cells(notebook: Path | None, parts) -> tuple[dict[str, str], float] | None:
    """The step cells of the notebook file as last written to disk (later cells win), and when."""
    if notebook is None:
        return None
    try:
        import nbformat

        nb = nbformat.read(notebook, as_version=4)
        written = notebook.stat().st_mtime
    except Exception:  # noqa: BLE001 - an unreadable notebook only costs the warning
        return None
    found = {}
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            step = module_export.read_step_cell(cell.get("source", ""), parts)
            if step.is_step:
                found[step.part] = step.body
    return found, written


def provenance(workdir: Path, lab: str, step: str, saved: dict[str, str],
               notebook: Path | None = None, parts=None) -> tuple[str, str]:
    """(judged line, warning or "") for a check of `step` ("final": every saved part)."""
    runs = load(workdir, lab)
    if step.isdigit():
        judged_parts = [step]
    else:
        judged_parts = sorted(saved, key=module_export.part_key)
    times = {p: _saved_at(workdir, lab, p, runs) for p in judged_parts if p in saved}
    times = {p: t for p, t in times.items() if t is not None}
    if step.isdigit():
        judged = f"judged: step {step} as saved at {clock(times[step])}" if step in times else ""
    elif times:
        latest = max(times, key=times.get)
        judged = (f"judged: your module as saved at {clock(times[latest])} "
                  f"(its latest change: {_label(latest)})")
    else:
        judged = ""
    on_disk = notebook_cells(notebook, parts)
    warnings = []
    for part in judged_parts:
        entry = runs.get(part, {})
        version = (f"this verdict is for the version saved at {clock(times[part])}" if part in times
                   else "nothing of it is saved, so this verdict is not about it")
        if entry.get("attempt") not in (None, SAVED):
            warnings.append(f"Your last run of {_label(part)} did not save ({entry['attempt']}): {version}.")
            continue
        if on_disk is None or part not in saved or part not in on_disk[0]:
            continue
        cells, written = on_disk
        if written > times.get(part, 0) + 1 and digest(cells[part]) != digest(saved[part]):
            warnings.append(f"Your {module_export.cell_name(part)[5:]} has changed since you last ran it: "
                            f"{version}. Run that cell to save the new version.")
    return judged, " ".join(warnings)


# --- the one line each view adds at the top of a panel ------------------------------------


def notebook_path() -> Path | None:
    """The notebook this kernel runs, from the server's JPY_SESSION_NAME (jupyter_server ≥ 2)."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    if not name.endswith(".ipynb"):
        return None
    candidate = Path(name)
    for found in (candidate, Path.cwd() / candidate.name):
        if found.is_absolute() and found.is_file():
            return found
    return None
