"""The command line: parse, delegate, print. Exit 0 all passed, 1 any failed, 2 usage error."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from labkit import labs


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 as well; keep its message short
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="python -m labkit", description="Delivered Twice, Applied Once — the judge.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    check = sub.add_parser("check", help="run a lab's checks against a student's module")
    check.add_argument("lab", help=f"one of: {', '.join(labs.available())}")
    check.add_argument("--solution", required=True, type=Path, help="the student's module file")
    check.add_argument("--step", action="append", help="only this step (a number or 'final'); repeatable")
    check.add_argument("--seed", type=int, help="seed for the randomised cases (printed)")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    grade = sub.add_parser("grade", help="grade submitted notebooks")
    grade.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    grade.add_argument("--out", required=True, type=Path)
    grade.add_argument("--jobs", type=int)
    grade.add_argument("--seed", type=int, help="seed for the hidden cases (recorded in the gradebook)")
    grade.add_argument("--force", action="store_true", help="regrade submissions already graded")
    grade.add_argument("--no-sandbox", action="store_true",
                       help="grade without the sandbox (where none is possible); the gradebook says so")
    grade.add_argument("--shard", metavar="I/N",
                       help="grade only shard I of N (students split by a stable hash of their name); "
                            "needs --seed; combine the N --out folders with `merge`")
    report = sub.add_parser("report", help="write GRADES_DIR/report.html: what the class got wrong")
    report.add_argument("grades", type=Path, metavar="GRADES_DIR", help="a `grade` (or `merge`) --out folder")
    merge = sub.add_parser("merge", help="combine the --out folders of `grade --shard I/N` into one")
    merge.add_argument("shards", nargs="+", type=Path, metavar="OUT", help="the shards' --out folders")
    merge.add_argument("--out", required=True, type=Path, help="a new folder for the merged gradebook")
    start = sub.add_parser("start", allow_abbrev=False, help="open JupyterLab on your own workspace (made on the first start, "
                           "updated from the course on later ones); other arguments go to JupyterLab")
    start.add_argument("--workspace", type=Path, help="where your notebooks live (default: workspace/ in the clone)")
    start.add_argument("--prepare-only", action="store_true", help="create or update the workspace, do not start")
    release = sub.add_parser("release", help="write the student distribution: no solutions, no lesson sources")
    release.add_argument("out", type=Path, help="a new folder")
    return top


def run_check(args: argparse.Namespace) -> int:
    from labkit.judge.run import run_lab
    from labkit.judge.serve import BadRequest, resolve
    from labkit.views.render_text import render_lab
    from labkit.views.standing import MODULE

    try:
        lab, steps = resolve(args.lab, args.solution, args.step)
    except BadRequest as exc:
        raise UsageError(str(exc)) from None
    verdict = run_lab(lab, args.solution.resolve(), steps, args.seed)
    from labkit.grading.terminal import safe_lines

    # The verdict quotes what the student's code returned: no control character reaches the terminal
    # raw (JSON escapes them itself; ensure_ascii also escapes C1 controls and bidi overrides).
    text = json.dumps(verdict.to_json()) if args.json else safe_lines(render_lab(verdict, MODULE))
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `... | head`: the reader left; the verdict still decides the exit code
        sys.stdout = None
    return 0 if verdict.passed else 1


def run_grade(args: argparse.Namespace) -> int:
    from labkit.grading.batch import BatchUsageError, run
    from labkit.grading.shards import Shard, ShardError

    try:
        shard = Shard.parse(args.shard) if args.shard is not None else None
        return run(list(args.paths), args.out, args.jobs, args.seed, args.force, no_sandbox=args.no_sandbox,
                   shard=shard)
    except (BatchUsageError, ShardError) as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        print("interrupted: finished grades are kept; run the same command again to continue")
        return 130


def run_report(args: argparse.Namespace) -> int:
    from labkit.grading import gradebook, report

    if not gradebook.results_dir(args.grades).is_dir():
        raise UsageError(f"{args.grades} is not a `grade` output folder (it has no .results/)")
    from labkit.grading.terminal import safe_lines

    print(safe_lines(report.write(args.grades.resolve())))
    return 0


def run_merge(args: argparse.Namespace) -> int:
    from labkit.grading import merge

    try:
        return merge.run(list(args.shards), args.out)
    except merge.MergeRefused as exc:
        raise UsageError(str(exc)) from None


def run_start(args: argparse.Namespace, extra: list[str]) -> int:
    import os

    from labkit.notebook import workspace

    folder = (args.workspace or workspace.default_workspace()).resolve()
    first = not folder.exists()
    try:
        changes = workspace.sync(folder)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    print(f"Your workspace: {folder}")
    for change in changes:
        print(f"  {change.describe()}")
    if args.prepare_only:
        return 0
    command = workspace.jupyter_command(folder, first, extra)
    print("Starting JupyterLab (stop it with Ctrl-C) …", flush=True)
    env = workspace.jupyter_env(folder)  # every kernel of the workspace knows `%%step` from its start
    os.execve(command[0], command, env)  # JupyterLab takes over this process: Ctrl-C and kill reach it
    return 1  # not reached


def run_release(args: argparse.Namespace) -> int:
    from labkit.notebook.release import release

    try:
        written = release(args.out.resolve())
    except (FileExistsError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    except RuntimeError as exc:
        print(f"python -m labkit release: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} files and the student notebooks to {args.out}: no solutions, no lesson sources")
    return 0


def _exit_on_sigterm(signum, frame):
    # Raising unwinds through every `finally`, so the judge still kills its children.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args, extra = parser().parse_known_args(argv)
    if extra and args.command != "start":
        parser().parse_args(argv)  # the usual "unrecognized arguments" error, exit 2
    try:
        if args.command == "check":
            return run_check(args)
        if args.command == "start":
            return run_start(args, extra)
        if args.command == "release":
            return run_release(args)
        if args.command == "report":
            return run_report(args)
        if args.command == "merge":
            return run_merge(args)
        return run_grade(args)
    except UsageError as exc:
        from labkit.grading.terminal import safe_lines

        print(f"python -m labkit: error: {safe_lines(exc)}", file=sys.stderr)
        return 2
