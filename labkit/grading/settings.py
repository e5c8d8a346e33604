"""Every limit and default the grader uses, declared once.

Each can be overridden by an environment variable (tests shorten the timeouts); the
`grade` command-line contract stays as it is.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOCKET_BASE = "/tmp"  # short: a unix socket's path may hold 107 bytes (see socket_folder)


def _env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    # One cell may run this long; then the kernel is interrupted, and killed if that fails.
    cell_timeout: float = 60.0
    # Executing one notebook may take this long in all (kernel start included).
    notebook_timeout: float = 300.0
    # Extra time the worker gets on top of the notebook and the judge before it is killed.
    worker_grace: float = 120.0
    # Address space of the kernel (an idle ipykernel maps about 740 MB).
    kernel_memory: int = 2 * 1024**3
    # Largest file the kernel may write.
    kernel_file_size: int = 256 * 1024**2
    # Outputs kept in the saved executed notebook: per cell, and for the whole notebook.
    cell_output_bytes: int = 200 * 1024
    notebook_output_bytes: int = 4 * 1024**2

    @classmethod
    def from_env(cls) -> Limits:
        base = cls()
        return cls(
            cell_timeout=_env("LABKIT_GRADE_CELL_TIMEOUT", base.cell_timeout),
            notebook_timeout=_env("LABKIT_GRADE_NOTEBOOK_TIMEOUT", base.notebook_timeout),
            worker_grace=_env("LABKIT_GRADE_WORKER_GRACE", base.worker_grace),
            kernel_memory=int(_env("LABKIT_GRADE_KERNEL_MEMORY", base.kernel_memory)),
            kernel_file_size=base.kernel_file_size,
            cell_output_bytes=int(_env("LABKIT_GRADE_CELL_OUTPUT", base.cell_output_bytes)),
            notebook_output_bytes=int(_env("LABKIT_GRADE_NOTEBOOK_OUTPUT", base.notebook_output_bytes)),
        )

    def to_json(self) -> dict:
        return asdict(self)


# The labs whose released notebooks the batch's forkserver renders once (`warm.py`).
WARM_LABS_ENV = "LABKIT_WARM_LABS"


def release_dir() -> Path:
    """Where the released notebooks are (`notebooks/NN-lab.ipynb`); tests may point elsewhere."""
    return Path(os.environ.get("LABKIT_RELEASE_DIR") or ROOT / "notebooks")


# Result files, working dirs and the gradebook inside the --out directory.
RESULTS = ".results"
WORK = ".work"
FEEDBACK = "feedback"
EXECUTED = "executed"
# Every process started for one submission carries this variable (the judge's children too, which
# get their own LABKIT_RUN marker): what a killed worker left behind is found by it.
JOB_MARKER = "LABKIT_GRADE_JOB"
# Statuses of a row. `skipped`: a path that was found but not graded (the message says why).
OK, TIMEOUT, CRASHED, MALFORMED, SKIPPED = "ok", "timeout", "crashed", "malformed", "skipped"
# Files are never read past these sizes (checked before reading, and while reading).
MAX_NOTEBOOK_BYTES = 20 * 1024**2
MAX_QUIZ_BYTES = 256 * 1024


def socket_folder(out: Path, key: str, marker: str) -> Path:
    """Where one run of one job keeps its kernel's sockets: a short path of its own.

    Not under `--out`: a deep output folder made the kernel's socket path too long ("ZMQError:
    File name too long", and every notebook crashed). Named after the output folder and the
    job's key (so the batch finds every folder of a job: `socket_folders`), and after this
    run's marker: a rerun after a killed grader once shared the folder with what was left of
    the killed run's worker, and lost its kernel's connection file to that worker's clean-up."""
    return _socket_base() / f"labkit-kernel-{_job_digest(out, key)}-{marker[:8]}"


def work_folder(out: Path, key: str, marker: str) -> Path:
    """Where one run of one job keeps the judge's copy of the module: a folder of this run's own.
    A rerun after a killed grader once shared `.work/<key>` with the killed run's worker, whose
    clean-up removed the rerun's module mid-grade (seen in CI: FileNotFoundError, row crashed)."""
    return Path(out) / WORK / f"{key}-{marker[:8]}"


def socket_folders(out: Path, key: str) -> list[Path]:
    """Every socket folder of `key` under `out`, of this run or of an earlier, killed one."""
    return sorted(_socket_base().glob(f"labkit-kernel-{_job_digest(out, key)}-*"))


def _job_digest(out: Path, key: str) -> str:
    return hashlib.sha256(f"{Path(out).resolve()}\0{key}".encode()).hexdigest()[:16]


def _socket_base() -> Path:
    return Path(SOCKET_BASE if os.access(SOCKET_BASE, os.W_OK | os.X_OK) else tempfile.gettempdir())
