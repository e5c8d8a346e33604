"""Find the submitted notebooks, read them, and tell which lab each one is.

A PATH is a notebook (its folder names the student) or a folder: `FOLDER/STUDENT/...ipynb`
(the first folder below it names the student) or notebooks directly inside it (the folder
names the student). nbgrader's `submitted/STUDENT/ASSIGNMENT/` is that layout already (its
`timestamp.txt` is recorded); nbgrader's exchange `inbound/` is read as nbgrader collects it
(`nbgrader_layout`). The lab comes from the notebook's `metadata.labkit.lab` — never from the
file name — or, when a student's copy lost its metadata, from the released cells it holds.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading import bounded, nbgrader_layout
from labkit.grading.bounded import read_capped  # noqa: F401  (imported from here by others)
from labkit.grading.restore import grade_id
from labkit.grading.settings import MAX_NOTEBOOK_BYTES


class NotANotebook(Exception):
    """The file cannot be graded; the message says why, in words a student understands."""


@dataclass
class Submission:
    student: str
    path: Path
    sha256: str = ""
    lab: str | None = None
    problem: str = ""  # why it is malformed
    flags: list[str] = field(default_factory=list)
    inode: tuple[int, int] = (0, 0)  # (device, inode): the same file found twice is one file
    submitted_at: str | None = None  # nbgrader's timestamp of this submission (ISO, UTC), if any
    revealed: list[str] = field(default_factory=list)  # steps whose reference the student revealed

    @property
    def key(self) -> str:
        """Names this submission's result file: one per student and lab.

        `{slug(student)}--{page name}`: a student's slug never holds `--` nor ends in `-`, so
        the first `--` is where it ends, and two different (student, lab) pairs never share a key."""
        return f"{slug(self.student)}--{self.page_name}"

    @property
    def page_name(self) -> str:
        return page_name(self.lab, self.path.name)


# A slug is at most this long (bytes): a student's folder in feedback/ and executed/, and a key
# (two slugs and `--`), plus `.verdict` and write_atomic's `.NAME.XXXXXXXX.tmp`, stay well
# under the 255 bytes a file name may have.
SLUG_LIMIT = 100
_KEEP = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def slug(text: str, limit: int = SLUG_LIMIT) -> str:
    """A file-name part for `text`, and a different one for every different text (injective).

    Each UTF-8 byte outside `A-Za-z0-9._-` is written `%XX` (`%` itself too), and so are a
    leading `.` (no hidden files, no `.` or `..`), a `-` followed by another `-` and a final
    `-` (so `--` never appears: `Submission.key` splits there). That is reversible. Past
    `limit`, the text is cut and the SHA-256 of the whole name follows a `~` (which the
    escaping never writes): `abc…~<64 hex>`. Names that differ only in Unicode normalisation
    (NFC, NFD) are different bytes, so different slugs; the empty name is `~`.
    """
    raw = text.encode("utf-8", "surrogatepass")  # one-to-one for every str, lone surrogates too
    parts = []
    for i, byte in enumerate(raw):
        if byte in _KEEP and not (i == 0 and byte == 0x2E) \
                and not (byte == 0x2D and (i + 1 == len(raw) or raw[i + 1] == 0x2D)):
            parts.append(chr(byte))
        else:
            parts.append(f"%{byte:02X}")
    if not parts:
        return "~"
    if sum(map(len, parts)) <= limit:
        return "".join(parts)
    head, size = [], 0
    for part in parts:  # cut between escapes, never inside one
        if size + len(part) > limit - 65:
            break
        head.append(part)
        size += len(part)
    return "".join(head) + "~" + hashlib.sha256(raw).hexdigest()


def page_name(lab: str | None, filename: str) -> str:
    """A feedback page's name (without `.html`): the lab's, or for a file that is not graded as a
    lab, `file-` and the file's slug (no lab's name starts with `file-`, so the two never meet)."""
    return slug(lab) if lab else f"file-{slug(filename)}"


@dataclass
class Skipped:
    """A path that was found but is not graded, and why (listed in the gradebook)."""

    student: str
    path: Path
    reason: str


CHECKPOINTS = ".ipynb_checkpoints"


def _why_not(path: Path, info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link: links are never followed (a notebook counts only where it really is)"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a FIFO, socket or device is never opened)"
    if info.st_size > MAX_NOTEBOOK_BYTES:
        return f"larger than {MAX_NOTEBOOK_BYTES:,} bytes: not read"
    return None


def _walk(top: Path, exclude: Path | None, skipped: list[Skipped], student_of) -> list[Path]:
    """Every *.ipynb below `top`, never through a link; what is left out goes to `skipped`."""
    found: list[Path] = []
    for root, dirs, files in os.walk(top, followlinks=False):
        here = Path(root)
        for name in sorted(dirs):
            sub = here / name
            if name == CHECKPOINTS:
                skipped.append(Skipped(student_of(sub), sub, "Jupyter's autosave copies, not a submission"))
                dirs.remove(name)
            elif exclude is not None and sub.absolute() == exclude:
                dirs.remove(name)  # the grader's own output
            elif sub.is_symlink():
                skipped.append(Skipped(student_of(sub), sub, "a symbolic link to a folder: links are never followed"))
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".ipynb"):
                found.append(here / name)
    return found


def find(paths: list[Path], exclude: Path | None = None) -> tuple[list[Submission], list[Skipped]]:
    """Every notebook under the given paths, and every path left out with its reason.

    Raises FileNotFoundError for a missing PATH. A notebook is credited to the folder it lives
    in (the first folder below PATH), never to where a link points; links, FIFOs, devices and
    oversized files are listed, not read; dotted folders are searched like any other (only
    Jupyter's `.ipynb_checkpoints` is left out, and listed). An nbgrader `inbound/` folder
    credits each submission to the student its name gives, and only the latest counts.
    """
    subs: list[Submission] = []
    skipped: list[Skipped] = []
    exclude = exclude.absolute() if exclude is not None else None
    for path in paths:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        top = Path(os.path.abspath(path))
        if nbgrader_layout.is_inbound(top):
            subs += _inbound(top, exclude, skipped)
            continue
        if top.is_dir() and not top.is_symlink():
            def student_of(p: Path, top=top) -> str:
                rel = p.relative_to(top)
                return rel.parts[0] if len(rel.parts) > 1 else (top.name or "student")

            candidates = _walk(top, exclude, skipped, student_of)
        else:
            def student_of(p: Path) -> str:
                return p.parent.name or "student"

            candidates = [top]
        for nb_path in candidates:
            sub = _candidate(nb_path, student_of(nb_path), skipped)
            if sub is not None:
                sub.submitted_at = nbgrader_layout.submitted_at(nb_path, top)
                subs.append(sub)
    return _one_per_path(_text_names(subs, skipped)), skipped


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system name holds that are not UTF-8
        return False
    return True


def shown_name(name: str) -> str:
    """A name as the gradebook can write it: bytes that are not UTF-8 shown as `\\xff`."""
    return name if _is_text(name) else os.fsencode(name).decode("utf-8", "backslashreplace")


def _text_names(subs: list[Submission], skipped: list[Skipped]) -> list[Submission]:
    """A notebook whose student or path is not UTF-8 text is listed, not graded: the gradebook,
    the records and the pages are UTF-8, and a name shown another way could be a neighbour's."""
    for item in skipped:
        item.student = shown_name(item.student)
    kept = []
    for sub in subs:
        if _is_text(sub.student) and _is_text(str(sub.path)):
            kept.append(sub)
        else:
            skipped.append(Skipped(shown_name(sub.student), sub.path, "its folder or file name is not UTF-8 "
                                   "text; rename it (the gradebook names every student in UTF-8)"))
    return kept


def _candidate(nb_path: Path, student: str, skipped: list[Skipped]) -> Submission | None:
    try:
        info = os.lstat(nb_path)
    except OSError:
        return None
    reason = _why_not(nb_path, info)
    if reason is not None:
        skipped.append(Skipped(student, nb_path, reason))
        return None
    return Submission(student, nb_path, inode=(info.st_dev, info.st_ino))


def _inbound(top: Path, exclude: Path | None, skipped: list[Skipped]) -> list[Submission]:
    """nbgrader's exchange inbound/: the latest submission of each student and assignment."""
    inbound = nbgrader_layout.choose(top)
    for entry in sorted(top.iterdir()):
        if entry.is_symlink() or (entry.is_file() and entry.name.endswith(".ipynb")):
            skipped.append(Skipped(entry.name, entry, "not an nbgrader submission folder (inbound/ holds "
                                   "only student+assignment+timestamp folders; links are never followed)"))
    for folder in inbound.unnamed:
        skipped.append(Skipped(folder.name, folder, "not named like an nbgrader submission "
                               "(student+assignment+timestamp)"))
    subs = []
    for entry in inbound.latest:
        earlier = [f"superseded:{nbgrader_layout.iso(e.when)}" for e in inbound.superseded[entry.path]]
        for nb_path in _walk(entry.path, exclude, skipped, lambda p, s=entry.student: s):
            sub = _candidate(nb_path, entry.student, skipped)
            if sub is not None:
                sub.submitted_at = nbgrader_layout.iso(entry.when)
                sub.flags += earlier
                subs.append(sub)
    return subs


def _one_per_path(subs: list[Submission]) -> list[Submission]:
    """The same file named twice (PATHs that overlap) is graded once; the same file under
    two students (a hard link) is graded for both, and both are flagged."""
    unique: dict[Path, Submission] = {}
    for sub in subs:
        unique.setdefault(sub.path, sub)
    by_inode: dict[tuple[int, int], list[Submission]] = {}
    for sub in unique.values():
        by_inode.setdefault(sub.inode, []).append(sub)
    for group in by_inode.values():
        students = sorted({s.student for s in group})
        if len(students) > 1:
            for sub in group:
                sub.flags += [f"same-file:{other}" for other in students if other != sub.student]
    return list(unique.values())


# Counts a notebook may hold (bounded.NOTEBOOK caps its size, depth and strings).
MAX_CELLS = 10_000
MAX_OUTPUTS = 100_000  # in all its cells
CELL_TYPES = ("code", "markdown", "raw")
OUTPUT_TYPES = ("stream", "display_data", "execute_result", "error")
# Notebook and cell metadata that nbclient and nbconvert read, and the type they need.
NB_META = {"kernelspec": dict, "language_info": dict, "labkit": dict, "widgets": dict}
CELL_META = {"tags": list, "jupyter": dict, "raw_mimetype": str, "format": str, "nbgrader": dict,
             "labkit": dict, "attachments": dict}


def read_notebook(data: bytes) -> dict:
    """The notebook as plain JSON data, checked and normalised (no nbformat import: it is slow).

    Bounded (`bounded.NOTEBOOK`: size, depth, counts) before json.loads sees it; then every
    part the grader, nbclient or nbconvert walks is checked for its shape, and the multi-line
    strings are joined as nbformat.reads joins them. Anything else raises NotANotebook."""
    try:
        raw = bounded.loads(data, bounded.NOTEBOOK)
    except bounded.Refused as exc:
        raise NotANotebook(f"The file is not a notebook: {exc}.") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) or not _is_int(raw.get("nbformat")):
        raise NotANotebook("The file is JSON but not a notebook: it has no `cells` list and `nbformat` version.")
    if raw["nbformat"] < 4:
        raise NotANotebook(f"The notebook uses the old format version {raw['nbformat']}; save it again "
                           "with a current Jupyter (format 4).")
    try:
        _normalise(raw)
    except _Damaged as exc:
        raise NotANotebook(f"The notebook's cells are damaged ({exc}).") from None
    return raw


class _Damaged(Exception):
    pass


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value, what: str) -> str:
    """A multi-line string (a string, or a list of strings) as one string."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(value)
    raise _Damaged(f"{what} is not text")


def _mapping(owner: dict, key: str, what: str) -> dict:
    """owner[key] as a dict: missing or null becomes {}, anything else that is not one is damage."""
    value = owner.get(key)
    if value is None:
        value = owner[key] = {}
    if not isinstance(value, dict):
        raise _Damaged(f"{what} is not a mapping")
    return value


def _normalise(nb: dict) -> None:
    if "nbformat_minor" in nb and not _is_int(nb["nbformat_minor"]):
        raise _Damaged("nbformat_minor is not a number")
    meta = _mapping(nb, "metadata", "the notebook's metadata")
    for key, kind in NB_META.items():
        if key in meta and not isinstance(meta[key], kind):
            raise _Damaged(f"metadata.{key} is not a {kind.__name__}")
    lab = meta.get("labkit", {}).get("lab")
    if lab is not None and not isinstance(lab, str):
        raise _Damaged("metadata.labkit.lab is not a name")
    cells = nb["cells"]
    if len(cells) > MAX_CELLS:
        raise _Damaged(f"{len(cells):,} cells; the grader reads at most {MAX_CELLS:,}")
    outputs_seen = 0
    for index, cell in enumerate(cells):
        where = f"cell {index}"
        if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
            raise _Damaged(f"{where} has no known cell_type")
        cell["source"] = _text(cell.get("source", ""), f"{where}'s source")
        if "id" in cell and not isinstance(cell["id"], str):
            raise _Damaged(f"{where}'s id is not text")
        cell_meta = _mapping(cell, "metadata", f"{where}'s metadata")
        for key, kind in CELL_META.items():
            if key in cell_meta and not isinstance(cell_meta[key], kind):
                raise _Damaged(f"{where}'s metadata.{key} is not a {kind.__name__}")
        if not all(isinstance(tag, str) for tag in cell_meta.get("tags", [])):
            raise _Damaged(f"{where}'s tags are not text")
        if "attachments" in cell and not isinstance(cell["attachments"], dict):
            raise _Damaged(f"{where}'s attachments are not a mapping")
        for name, bundle in (cell.get("attachments") or {}).items():
            _bundle(bundle, f"{where}'s attachment {bounded.printable(name, 40)!r}")
        if cell["cell_type"] != "code":
            continue
        if not _is_int(cell.get("execution_count")):
            cell["execution_count"] = None
        outputs = cell.setdefault("outputs", [])
        if not isinstance(outputs, list):
            raise _Damaged(f"{where}'s outputs are not a list")
        outputs_seen += len(outputs)
        if outputs_seen > MAX_OUTPUTS:
            raise _Damaged(f"over {MAX_OUTPUTS:,} outputs; the grader reads at most that many")
        for number, output in enumerate(outputs):
            _output(output, f"{where}'s output {number}")


def _bundle(data, what: str) -> None:
    """A MIME bundle: text values joined; JSON ones (`application/json`, `…+json`) left as they are."""
    if not isinstance(data, dict):
        raise _Damaged(f"{what} is not a mapping")
    for mime, value in data.items():
        if not mime.endswith("json"):
            data[mime] = _text(value, f"{what} ({bounded.printable(mime, 40)})")


def _output(output, what: str) -> None:
    if not isinstance(output, dict) or output.get("output_type") not in OUTPUT_TYPES:
        raise _Damaged(f"{what} has no known output_type")
    _mapping(output, "metadata", f"{what}'s metadata")
    kind = output["output_type"]
    if kind == "stream":
        if not isinstance(output.get("name", ""), str):
            raise _Damaged(f"{what}'s stream name is not text")
        output["text"] = _text(output.get("text", ""), f"{what}'s text")
    elif kind == "error":
        if not isinstance(output.get("ename", ""), str) or not isinstance(output.get("evalue", ""), str):
            raise _Damaged(f"{what}'s error name or value is not text")
        trace = output.setdefault("traceback", [])
        if not isinstance(trace, list) or not all(isinstance(line, str) for line in trace):
            raise _Damaged(f"{what}'s traceback is not a list of lines")
    else:
        _bundle(_mapping(output, "data", f"{what}'s data"), f"{what}'s data")
        if kind == "execute_result" and not _is_int(output.get("execution_count")):
            output["execution_count"] = None


@dataclass
class Release:
    lab: str
    path: Path
    nb: dict

    @property
    def grade_ids(self) -> set[str]:
        return {gid for c in self.nb["cells"] if (gid := grade_id(c))}


def releases(folder: Path) -> dict[str, Release]:
    """The released notebooks (`NN-lab.ipynb`), by the lab their metadata names."""
    found: dict[str, Release] = {}
    for path in sorted(folder.glob("*.ipynb")):
        try:
            nb = read_notebook(path.read_bytes())
        except (OSError, NotANotebook):
            continue
        meta = nb["metadata"].get("labkit")
        lab = meta.get("lab") if isinstance(meta, dict) else None
        if isinstance(lab, str) and lab not in found:
            found[lab] = Release(lab, path, nb)
    return found


def identify(nb: dict, known: dict[str, Release]) -> str | None:
    meta = nb.get("metadata", {}).get("labkit", {})
    lab = meta.get("lab") if isinstance(meta, dict) else None
    if isinstance(lab, str) and lab:
        return lab
    ids = {gid for c in nb["cells"] if (gid := grade_id(c))}
    best = max(known.values(), key=lambda r: len(ids & r.grade_ids), default=None)
    if best is not None and ids & best.grade_ids:
        return best.lab
    return None


def examine(sub: Submission, known: dict[str, Release], labs: list[str]) -> dict | None:
    """Fill in hash, lab and problem; return the parsed notebook when it is gradable."""
    try:
        data = read_capped(sub.path, MAX_NOTEBOOK_BYTES)
    except OSError as exc:
        sub.problem = f"The file could not be read: {exc.strerror}."
        return None
    sub.sha256 = hashlib.sha256(data).hexdigest()
    try:
        nb = read_notebook(data)
    except NotANotebook as exc:
        sub.problem = str(exc)
        return None
    lab = identify(nb, known)
    if lab is None:
        sub.problem = ("This notebook is not one of the course's labs: it has no `labkit.lab` metadata "
                       "and none of a lab's cells. Submit the lab notebook you worked in.")
        return None
    if lab not in labs:
        sub.problem = f"The notebook names the lab {bounded.printable(repr(lab), 80)}, which the grader does not know."
        return None
    sub.lab = lab
    return nb


def one_per_lab(subs: list[Submission], known: dict[str, Release]) -> list[Submission]:
    """One submission per student and lab: the latest nbgrader submission, then the one named like
    the release, then the newest file."""
    groups: dict[str, list[Submission]] = {}
    for sub in subs:
        groups.setdefault(sub.key, []).append(sub)
    chosen = []
    for group in groups.values():
        if len(group) == 1:
            chosen.append(group[0])
            continue
        release = known.get(group[0].lab or "")
        group.sort(key=lambda s: (not s.problem, s.submitted_at or "",
                                  release is not None and s.path.name == release.path.name,
                                  _mtime(s.path), s.path.name), reverse=True)
        winner = group[0]
        winner.flags += [f"ignored:{other.path.name}" for other in group[1:]]
        chosen.append(winner)
    return chosen


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:  # gone since it was found
        return 0.0
