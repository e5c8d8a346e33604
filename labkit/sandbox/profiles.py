"""The course's sandbox policies: a judge's child, a grading kernel, and the judge's own box.

What each one sees is listed here and nowhere else:

- a judge's child (`child`): the Python runtime read-only, the child-side code (labkit's
  probe, values, limits; the lab's probes module), the student's module file read-only, the
  step's work folder writable; the judge's network (its servers are reachable);
- a grading kernel (`kernel`): the runtime, labkit and the lab's quiz read-only, a private
  tmpfs as its home and working folder, its Jupyter socket folder; no network at all;
- the judge's own box (`judge_box`): trusted code that starts the children; the runtime,
  labkit, checks and the module read-only, cgroups writable, a private size-capped tmpfs for
  every step's files, and a network namespace of its own that no other job can reach.

Never visible to student code: solutions/, notebooks/, the judge-side checks (every module of
`checks/<lab>/` but its probes, e.g. `lab.py`, `contract.py`, `oracle.py`), other submissions, the grader's --out, its
home directory, other processes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil
import sys
import uuid
from pathlib import Path

from labkit import limits
from labkit.sandbox import course_view
from labkit.sandbox.policy import MiB, Policy

ROOT = Path(__file__).resolve().parents[2]
# The child-side code, relative to the repository: everything a child imports from the course.
CHILD_CODE = ("labkit/__init__.py", "labkit/probe", "labkit/values.py", "labkit/limits.py",
              "checks/__init__.py")
# Variables a sandboxed program may keep from its caller's environment (nothing else is passed).
PASS_THROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONUNBUFFERED", "PYTHONIOENCODING",
                "PYTHONHASHSEED")
TMP_BYTES = 64 * MiB
KERNEL_SCRATCH_BYTES = 256 * MiB
JUDGE_TMP_BYTES = 1024 * MiB
JUDGE_BOX_MEMORY = 6 * 1024 * MiB
JUDGE_BOX_PROCESSES = 2048


def runtime() -> list[Path]:
    """The Python installation (read-only): the base runtime and the venv with its packages."""
    paths = [Path(sys.base_prefix).resolve()]
    prefix = Path(sys.prefix).absolute()
    if prefix.resolve() != paths[0]:
        paths.append(prefix)
    return paths


def base_env(home: str = "/tmp") -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp", "USER": "student",
           "LOGNAME": "student", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONNOUSERSITE": "1"}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    return env


def module_file(name: str) -> Path | None:
    """Where a dotted module's source is, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _code(relative: tuple[str, ...] | list[str]) -> list[Path]:
    return _with_bytecode([ROOT / rel for rel in relative if (ROOT / rel).exists()])


def _probe_modules(package: str | None = None) -> list[Path]:
    """The child-side probes (a manifest's `probes`, with the package's `__init__`) of the lab
    `package` ("checks.outbox"), or of every lab when it is None or no lab's; never the
    judge-side checks. One lab's are half a dozen files, shown through a view (`course_view`)."""
    from labkit import labs

    found = []
    every = list(labs.manifests().values())
    for lab in [m for m in every if m.package == package] or every:
        found += [lab.folder / "__init__.py", *(lab.path(part) for part in lab.probes)]
    return _with_bytecode(found)


def _manifests_and_quiz(lab: str) -> list[Path]:
    """What a grading kernel reads of the course's labs: every manifest (data: steps, titles,
    points) and its own lab's quiz module; never a lab's checks."""
    from labkit import labs

    found = [path for m in labs.manifests().values() for path in (m.folder / "manifest.toml", m.folder / "__init__.py")]
    manifest = labs.manifests().get(lab)
    if manifest is not None and manifest.quiz:
        found.append(manifest.path(manifest.quiz))
    return found


def _with_bytecode(paths: list[Path]) -> list[Path]:
    """Each source file shown with its compiled file, where there is one (`compile_course`):
    a sandboxed interpreter may not write it, so without it every child compiles the module."""
    found = []
    for path in paths:
        found.append(path)
        if path.suffix == ".py":
            compiled = Path(importlib.util.cache_from_source(str(path)))
            if compiled.is_file():
                found.append(compiled)
    return found


def compile_course() -> None:
    """Compile labkit and the checks once, as the trusted grader, where the course is writable.

    Sandboxed interpreters run with PYTHONDONTWRITEBYTECODE and read-only views, so they only
    ever read these; a stale one is ignored by Python itself (it records its source's mtime)."""
    import compileall

    for folder in ("labkit", "checks"):
        if os.access(ROOT / folder, os.W_OK):
            compileall.compile_dir(str(ROOT / folder), quiet=2, workers=1)


def child(uid: int, *, module: Path, workdir: Path, code_modules: tuple[str, ...] = (),
          env: dict[str, str] | None = None, lab: str | None = None) -> Policy:
    """A judge's child: imports the student's module and runs one probe (or serves `receive`).
    `lab`: the package whose probes it runs (`labs.package_of`); None: every lab's."""
    workdir = Path(workdir).resolve()
    module = Path(module).resolve()
    # The module as the child sees it: a readable copy (the student's own file may be 0600 and
    # root's), shown at the module's own path, so paths and tracebacks stay the student's.
    shown = ((workdir / f".labkit-module-{module.name}", str(module)),)
    return Policy(
        uid=uid, gid=uid,
        read_only=_child_reads(lab, tuple(code_modules)),
        writable=(workdir,),
        mapped=shown,
        cwd=workdir,
        env={**base_env(), "PYTHONPATH": str(ROOT), **(env or {})},
        network="shared",
        tmp_bytes=TMP_BYTES,
        memory_bytes=limits.CHILD_MEMORY_BYTES,
        max_processes=128,
        address_space=limits.CHILD_MEMORY_BYTES,
        file_bytes=limits.CHILD_FILE_BYTES,
    )


@functools.lru_cache(maxsize=64)
def _child_reads(lab: str | None, code_modules: tuple[str, ...]) -> tuple[Path, ...]:
    """The runtime and the course files a child of `lab` reads: the same for every child of a
    process, so worked out once (find_spec, the manifests and a stat per file were ~1 ms of the
    judge's CPU a box). Which compiled files there are is read then: a process's first box comes
    after `compile_course` (the tests' session, a grader's forkserver), and a compiled file
    missing from the list only costs the child a compile."""
    extra = [f for f in map(module_file, code_modules) if f is not None and f.is_relative_to(ROOT)]
    for name in code_modules:  # a package's __init__ along the way (labkit.servers.warehouse)
        parts = name.split(".")[:-1]
        for depth in range(1, len(parts) + 1):
            init = ROOT.joinpath(*parts[:depth], "__init__.py")
            if init.exists():
                extra.append(init)
    return tuple(dict.fromkeys([*runtime(), *_code(CHILD_CODE), *_probe_modules(lab), *_with_bytecode(extra)]))


def kernel_environment(home: str, env: dict[str, str]) -> dict[str, str]:
    """A grading kernel's whole environment: the box's plain one, the course on its path, `env`."""
    return {**base_env(home), "PYTHONPATH": str(ROOT), **env}


def kernel(uid: int, *, home: str, sockets: Path, lab: str, shown: dict[Path, str],
           env: dict[str, str], memory_bytes: int, file_bytes: int) -> Policy:
    """A grading kernel: runs the whole notebook, talks to nbclient over unix sockets only.

    `shown`: host files shown read-only inside its home (e.g. the student's quiz answers).
    """
    return Policy(
        uid=uid, gid=uid,
        read_only=tuple(dict.fromkeys([*runtime(), *_code(["labkit", "checks/__init__.py"]),
                                       *_with_bytecode(_manifests_and_quiz(lab))])),
        writable=(Path(sockets),),
        mapped=tuple(shown.items()),
        cwd=Path(home),
        env=kernel_environment(home, env),
        network="private",
        tmp_bytes=TMP_BYTES,
        scratch=((home, KERNEL_SCRATCH_BYTES),),
        memory_bytes=memory_bytes + KERNEL_SCRATCH_BYTES + 2 * TMP_BYTES,
        max_processes=256,
        address_space=memory_bytes,
        file_bytes=file_bytes,
    )


def launched_child(uid: int, *, module: Path, workdir: Path, code_modules: tuple[str, ...] = (),
                   env: dict[str, str] | None = None, lab: str | None = None) -> Policy:
    """A judge's child as the launcher makes it: `child`, but the module is shown from the
    grader's own copy (readable, outside every box) and the step folder is bound from the
    directory fd the judge sent (`Box.bound_fds`): nothing is copied into or read from it."""
    policy = child(uid, module=module, workdir=Path("/"), code_modules=code_modules, env=env, lab=lab)
    # The step folder's path is the judge's, named in its request: used as text, never resolved
    # here (the launcher's view of the filesystem is not the judge's, and root follows links).
    return dataclasses.replace(policy, mapped=(), read_only=(*policy.read_only, Path(module).resolve()),
                               writable=(Path(workdir),), cwd=Path(workdir))


def judge_box(uid: int, *, module: Path, tmp: str, env: dict[str, str], tables: Path | None = None) -> Policy:
    """The judge of one job: the job's uid, no capabilities, no cgroupfs, a network of its own.

    It starts no sandbox itself: the launcher does (`launcher.py`), in this box's network and
    pid namespaces, as the same uid — so the judge can see, signal and inspect its children
    and lock their SQLite files, and they cannot see it (a nested pid namespace, seccomp).
    Every step's folder is made under its private /tmp (`tmp`), so what children write there
    is capped by that tmpfs and counted in the job's memory, and goes with the box. `tables`:
    the grader's Hypothesis Unicode tables, read-only (`differential.warm_unicode_tables`). It
    also sees, read-only, this process's views of the course (`course_view.place`): the course
    files it may read anyway, copied for its children's boxes.
    """
    shown = [tables.resolve()] if tables is not None else []
    views = course_view.place()  # the folder of views its children's boxes bind (course_view.py)
    shown += [views] if views is not None else []
    return Policy(
        uid=uid, gid=uid,
        read_only=tuple(dict.fromkeys([*runtime(), ROOT / "labkit", ROOT / "checks", Path(module).resolve(),
                                       *shown])),
        cwd=Path(tmp),
        env=env,
        network="private",
        tmp_bytes=JUDGE_TMP_BYTES,
        memory_bytes=JUDGE_BOX_MEMORY,
        max_processes=JUDGE_BOX_PROCESSES,
        address_space=None,
        file_bytes=None,
    )


def child_box(module: Path, workdir: Path, env: dict[str, str], code_modules: tuple[str, ...] = (),
              lab: str | None = None):
    """A box for one judged child (a `NullBox` when the sandbox is off here).

    `env` is the environment the caller made for the child; inside the sandbox the child gets
    only what the caller set for it on top of its own environment (the marker, its pipes'
    numbers, a check's proxy variables...), never the judge's environment itself.
    """
    from labkit import sandbox
    from labkit.sandbox import remote

    launcher = remote.connection()
    if launcher is not None:  # an unprivileged judge: the launcher makes the box
        return remote.RemoteBox(launcher, code_modules, lab=lab)
    if not sandbox.enabled():
        return sandbox.NullBox()
    own = {k: v for k, v in env.items() if os.environ.get(k) != v}
    policy = child(sandbox.uid(), module=module, workdir=workdir, code_modules=code_modules, env=own, lab=lab)
    return sandbox.Box.open(copy_module(policy), sandbox.support().cgroups)


def copy_module(policy: Policy) -> Policy:
    """Make the readable copies a child's policy shows in place of the student's module.

    Children started side by side share a work folder, so each child gets copies of its own,
    under names no other child uses, written whole before its sandbox binds them. A copy shared
    by name and replaced by each start (as before) was unlinked under a bwrap still binding it:
    bwrap then failed ("Can't find .../.labkit-module-client.py (deleted) in mount table") and
    the child ended before loading the module, a course fault seen in CI under load."""
    mapped = []
    for copy, original in policy.mapped:
        if not os.path.isfile(original):  # nothing to show: the child then fails to import it, a verdict like any other
            continue
        own = Path(copy).with_name(f"{Path(copy).name}.{uuid.uuid4().hex[:12]}")
        shutil.copyfile(original, own)  # a name no other child knows: whole before it is bound
        os.chmod(own, 0o644)
        mapped.append((own, original))
    return dataclasses.replace(policy, mapped=tuple(mapped))
