"""What one `grade` run was: written into its --out folder, so shards can be merged safely.

`DIR/.results/manifest.state` (JSON) records everything that decides a grade — the released
notebooks and the grader's own code (as fingerprints), the seed, the limits, whether student
code ran in the sandbox — plus the shard (`I/N`, or 1/1 for a whole run), every student found
in the submissions, and every submission the whole class has (key, student, lab, file hash),
so `merge` can tell which shard owes which record, and who is missing or counted twice.
It is written by the grader, where no sandbox can reach, like every record beside it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.grading import gradebook
from labkit.grading.settings import ROOT, Limits

VERSION = 1
NAME = "manifest.state"  # not *.json: every .json in .results is one submission's record
# The grader's own code: a change in any of these can change a grade.
CODE = ("labkit", "checks")


def path(out: Path) -> Path:
    return gradebook.results_dir(out) / NAME


def release_fingerprint(releases: dict) -> dict[str, str]:
    """lab → SHA-256 of its released notebook (what the restored check cells come from)."""
    return {lab: hashlib.sha256(release.path.read_bytes()).hexdigest() for lab, release in sorted(releases.items())}


def code_fingerprint(root: Path = ROOT) -> str:
    """SHA-256 over the grader's and the checks' Python sources (paths and contents)."""
    digest = hashlib.sha256()
    for top in CODE:
        for file in sorted((root / top).rglob("*.py")):
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(root)).encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


@dataclass
class Manifest:
    seed: int
    shard: list[int]  # [I, N]; [1, 1] for a whole run
    release: dict[str, str]
    code: str
    limits: dict
    step_timeout: float
    sandboxed: bool
    sandbox: str
    students: list[str]  # every student found, in every shard's manifest alike
    submissions: dict[str, dict] = field(default_factory=dict)  # key → {student, lab, sha256, shard}
    version: int = VERSION

    def options(self) -> dict:
        """What must be equal in every shard of one class (all but the shard's own index)."""
        return {"version": self.version, "seed": self.seed, "shards": self.shard[1], "release": self.release,
                "code": self.code, "limits": self.limits, "step_timeout": self.step_timeout,
                "sandboxed": self.sandboxed, "students": self.students, "submissions": self.submissions}

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=1, sort_keys=True) + "\n"


class ManifestError(ValueError):
    """A manifest that is missing or cannot be read as one."""


def write(out: Path, manifest: Manifest) -> None:
    gradebook.write_atomic(path(out), manifest.to_json())


def read(out: Path) -> Manifest:
    file = path(out)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{out} has no {gradebook.results_dir(out).name}/{NAME}: it is not the "
                            "output of a `grade` run (or of one older than manifests)") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{file} cannot be read: {exc}") from None
    try:
        if data.get("version") != VERSION:
            raise ManifestError(f"{file} has version {data.get('version')!r}, not {VERSION}")
        manifest = Manifest(**data)
        index, count = manifest.shard
        students = manifest.students
        if not (isinstance(index, int) and isinstance(count, int) and 1 <= index <= count):
            raise ManifestError(f"{file}: shard {manifest.shard!r} is not [I, N]")
        if not (isinstance(students, list) and all(isinstance(s, str) for s in students)):
            raise ManifestError(f"{file}: students is not a list of names")
        for key, sub in manifest.submissions.items():
            if not (isinstance(sub, dict) and {"student", "lab", "sha256", "shard"} <= sub.keys()):
                raise ManifestError(f"{file}: submission {key!r} is not described fully")
    except (TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"{file} is not a grading manifest: {exc}") from None
    return manifest


def describe(limits: Limits) -> dict:
    return limits.to_json()
