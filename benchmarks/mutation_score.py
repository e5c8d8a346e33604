"""Mutation score of a lab's checks: how many small changes to the reference do they catch?

cosmic-ray (pip install -e ".[mutation]") makes every mutant of `solutions/<module>.py` (one
operator applied at one place: `<` for `<=`, `and` for `or`, a number changed...). Each mutant
is judged by the course's own command line, on the step whose function it mutates:

    python -m labkit check LAB --solution <mutant> --step N --seed S     (exit 1 = killed)

and, if that step passes, by the final check too (`--step final`: it counts as killing). A
mutant of the header (imports, constants, exception classes, shared helpers) runs every step.
A mutant whose code is unchanged once docstrings are set aside (cosmic-ray never touches
comments) is "no-op" and not scored; lines marked `# pragma: no mutate` are skipped
(cosmic-ray's own filter). Survivors listed in tests/mutation/equivalent.md (same lab,
function, operator and changed line) count as equivalent, not as misses.

    python benchmarks/mutation_score.py --lab outbox [--jobs 2] [--seed 1] [--steps 1 3] [--fresh]
                                        [--operators all|syntactic|semantic] [--report-only]

Work goes to artifacts/mutation/<lab>[-steps-...]/: cosmic-ray mutates a file in place, so
each of the `--jobs` workers has its own copy of the module and its own cosmic-ray session
(the mutants are dealt round-robin in a fixed order). Every finished mutant is saved in its
session at once, so a run that is stopped goes on where it stopped when started again with
the same options (a changed reference, or `--fresh`, starts over). Prints killed / survived /
incompetent / timed out / no-op per step and for the lab, the score (killed + timed out out
of every scored mutant that is not equivalent), and writes the survivors (file:line, operator,
diff) to tests/mutation/survivors-<lab>.txt (generated; not committed). A mutant whose verdict
says the checker failed or blames the course's servers is listed too (the phrases are
`labkit.judge.verdict.COURSE_FAULT`).

cosmic-ray's operators are syntactic, and the checks catch nearly all of their mutants; students'
mistakes of meaning (a read moved out of the transaction, a narrowed WHERE, a swallowed error...)
are made by benchmarks/semantic_mutants.py's operators instead. `--operators semantic|syntactic|all`
(default all) picks which are judged. Semantic mutants are judged by the same `judge` (the step they
change, then final), their verdicts kept in artifacts/mutation/<lab>[-steps-...]-semantic/results.jsonl
(a stopped run goes on), counted per step and per operator, and their survivors written to
tests/mutation/survivors-<lab>-semantic.txt; equivalent.md matches them like any other row (its
operator column is then `semantic/<name>`).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # semantic_mutants

from labkit import labs  # noqa: E402
from labkit.judge.verdict import COURSE_FAULT  # noqa: E402

MUTATION = ROOT / "tests" / "mutation"
EQUIVALENT = MUTATION / "equivalent.md"
MARK = "LABKIT-MUTANT"
SECTION = re.compile(r"^# --- (?:step (\d+)|provided code) -+$")
CHECK_TIMEOUT = 240.0  # one labkit check of one mutant; its own steps time out far sooner
KINDS = ("killed", "survived", "incompetent", "timed out", "no-op")


# --- which step a line belongs to -------------------------------------------------------------


def sections(source: str) -> list[tuple[int, str]]:
    """(first line, step) of each `# --- step N` / `# --- provided code` section; "header" for the latter."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        match = SECTION.match(line)
        if match:
            found.append((number, match[1] or "header"))
    return found


def step_of_line(source: str, line: int) -> str:
    step = "header"
    for first, name in sections(source):
        if first <= line:
            step = name
    return step


def changed_lines(before: str, after: str) -> list[int]:
    """Line numbers (1-based, in `before`) that differ."""
    lines = []
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag != "equal":
            lines += list(range(i1 + 1, max(i2, i1 + 1) + 1))
    return lines


def code_shape(source: str) -> str:
    """The module's AST without docstrings: equal shapes mean the mutant changed no code."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def sample(lab: str, folder: Path, count: int) -> list[tuple[str, str, int, str]]:
    """`count` mutants spread evenly over the reference, none of the header:
    (step, operator, line, mutated source). Deterministic: the same reference gives the same sample."""
    import cosmic_ray.plugins
    from cosmic_ray.commands.init import init
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.work_db import WorkDB, use_db

    source = reference(lab).read_text()
    with use_db(str(folder / "sample.sqlite"), WorkDB.Mode.create) as db:
        init([reference(lab)], db, {})
        specs = sorted((item.mutations[0] for item in db.work_items),
                       key=lambda m: (m.start_pos, m.operator_name, m.occurrence))
    specs = [m for m in specs if step_of_line(source, m.start_pos[0]) != "header"]
    chosen = [specs[round(n * (len(specs) - 1) / max(1, count - 1))] for n in range(count)] if specs else []
    out = []
    for m in chosen:
        operator = cosmic_ray.plugins.get_operator(m.operator_name)(**m.operator_args)
        mutated = mutate_code(source, operator, m.occurrence)
        if mutated is not None:
            out.append((step_of_line(source, m.start_pos[0]), m.operator_name, m.start_pos[0], mutated))
    return out


# --- the test command cosmic-ray runs for each mutant --------------------------------------------


def check(lab: str, module: Path, step: str, seed: int) -> tuple[str, str]:
    """Run `labkit check` on one step: ("passed" | "failed" | "incompetent" | "timed out", detail)."""
    result, detail, blamed = _check(lab, module, step, seed)
    if blamed:
        print(f"{MARK} blamed: {', '.join(blamed)}")
    return result, detail


def _check(lab: str, module: Path, step: str, seed: int) -> tuple[str, str, list[str]]:
    """`check`, with the COURSE_FAULT phrases the verdict holds instead of printing them."""
    command = [sys.executable, "-m", "labkit", "check", lab, "--solution", str(module), "--seed", str(seed), "--json"]
    if step != "all":
        command += ["--step", step]
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timed out", f"labkit check did not finish within {CHECK_TIMEOUT:g} s", []
    try:
        verdict = json.loads(proc.stdout)
    except ValueError:
        return "incompetent", f"exit {proc.returncode}, no verdict: {proc.stderr[-300:]}", []
    if proc.returncode not in (0, 1):
        return "incompetent", f"exit {proc.returncode}", []
    blamed = sorted({phrase for s in verdict["steps"] for c in s["cases"]
                     for phrase in COURSE_FAULT if phrase in c["message"]})
    failing = [f"{s['step']}: {c['name']}" for s in verdict["steps"] for c in s["cases"] if not c["passed"]]
    return ("failed", "; ".join(failing)[:300], blamed) if proc.returncode == 1 else ("passed", "", blamed)


def judge(lab: str, before: str, after: str, module: Path, seed: int) -> tuple[str, str, str, list[str]]:
    """(kind, step, detail, blamed phrases) of one mutant written to `module`: the step whose
    function it changes, then final (a change to the header, or to several steps: every step)."""
    lines = changed_lines(before, after)
    steps = {step_of_line(before, line) for line in lines} or {"header"}
    step = steps.pop() if len(steps) == 1 else "header"
    if code_shape(before) == code_shape(after):
        return "no-op", step, "", []
    order = ["all"] if step == "header" else [step, "final"]
    blamed: list[str] = []
    for chosen in order:
        result, detail, phrases = _check(lab, module.resolve(), chosen, seed)
        blamed += phrases
        if result != "passed":
            return {"failed": "killed"}.get(result, result), step, f"by {chosen}: {detail}", blamed
    return "survived", step, "", blamed


def test_mutant(lab: str, module: Path, pristine: Path, seed: int) -> int:
    """cosmic-ray's test command: exit 0 survived, 1 killed (or timed out), 3 incompetent.
    The kind and the step are printed as `LABKIT-MUTANT <kind> step <N>` for the report."""
    kind, step, detail, blamed = judge(lab, pristine.read_text(), module.read_text(), module, seed)
    if blamed:
        print(f"{MARK} blamed: {', '.join(sorted(set(blamed)))}")
    print(f"{MARK} {kind} step {step}" + (f" {detail}" if detail else ""))
    return {"killed": 1, "timed out": 1, "incompetent": 3}.get(kind, 0)


# --- sessions, one per worker ------------------------------------------------------------------------


def reference(lab: str) -> Path:
    return ROOT / "solutions" / labs.manifest(lab).module_file


def workdir(lab: str, steps: list[str]) -> Path:
    return ROOT / "artifacts" / "mutation" / (lab + (f"-steps-{'-'.join(steps)}" if steps else ""))


def prepare(lab: str, jobs: int, seed: int, steps: list[str], fresh: bool) -> list[Path]:
    """One folder per worker with its copy of the module, config and session (kept if still valid)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    pristine = reference(lab)
    base = workdir(lab, steps)
    stamp = {"reference": hashlib.sha256(pristine.read_bytes()).hexdigest(), "jobs": jobs, "seed": seed}
    stamp_file = base / "stamp.json"
    if fresh or not stamp_file.is_file() or json.loads(stamp_file.read_text()) != stamp:
        shutil.rmtree(base, ignore_errors=True)
    folders = [base / f"worker-{k}" for k in range(jobs)]
    if stamp_file.is_file():
        return folders
    module = Path("solutions") / pristine.name
    source = pristine.read_text()
    for k, folder in enumerate(folders):
        (folder / "solutions").mkdir(parents=True)
        shutil.copy(pristine, folder / module)
        command = (f"{sys.executable} {Path(__file__).resolve()} test-mutant --lab {lab} --module {module} "
                   f"--pristine {pristine} --seed {seed}")
        (folder / "config.toml").write_text(
            f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {CHECK_TIMEOUT * 2:.1f}\nexcluded-modules = []\n'
            f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
        subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "init", "config.toml", "session.sqlite"],
                       cwd=folder, check=True, capture_output=True)
        session = str(folder / "session.sqlite")
        subprocess.run([sys.executable, "-m", "cosmic_ray.tools.filters.pragma_no_mutate", "session.sqlite"],
                       cwd=folder, check=True, capture_output=True)  # the session's paths are relative
        with use_db(session, WorkDB.Mode.open) as db:
            items = sorted(db.work_items, key=lambda i: (i.mutations[0].start_pos, i.mutations[0].operator_name,
                                                          i.mutations[0].occurrence))
            others = [item.job_id for n, item in enumerate(items)
                      if n % jobs != k or (steps and step_of_line(source, item.mutations[0].start_pos[0]) not in steps)]
            if others:
                db.set_multiple_results(others, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="elsewhere"))
    stamp_file.write_text(json.dumps(stamp))
    return folders


def execute(folders: list[Path]) -> None:
    def run(folder: Path) -> None:
        with open(folder / "exec.log", "ab") as log:
            subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "exec", "config.toml", "session.sqlite"],
                           cwd=folder, stdout=log, stderr=log, check=False)

    with ThreadPoolExecutor(max_workers=len(folders)) as pool:
        list(pool.map(run, folders))


# --- the report ---------------------------------------------------------------------------------------


def equivalents(lab: str) -> set[tuple[str, str, str, str]]:
    """(function, operator, line before, line after) of each survivor judged equivalent for `lab`:
    rows `| lab | function | operator | `before` | `after` | why |` of tests/mutation/equivalent.md
    (a `|` inside a cell is written `\\|`)."""
    found = set()
    if EQUIVALENT.is_file():
        for line in EQUIVALENT.read_text().splitlines():
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) >= 6 and cells[0] == lab:
                found.add((cells[1], cells[2], cells[3].strip("`"), cells[4].strip("`")))
    return found


def diff_lines(diff: str) -> tuple[str, str]:
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return " ".join(removed), " ".join(added)


def classify(result) -> str:
    output = result.output or ""
    for line in output.splitlines():
        if line.startswith(MARK) and not line.startswith(f"{MARK} blamed"):
            return line.split()[1] if not line.startswith(f"{MARK} timed out") else "timed out"
    if output.strip() == "timeout":
        return "timed out"
    return "incompetent"


class Judged(NamedTuple):
    """One scored mutant, whichever tool made it. (Not a dataclass: tests load this file without
    putting it in sys.modules.)"""
    step: str
    kind: str  # one of KINDS, or "equivalent"
    operator: str
    survivor: str = ""  # "file:line step N function operator" and the diff, for a survivor
    blamed: str = ""  # the verdict's words, if it blamed the course


def report(lab: str, folders: list[Path], seconds: float | None) -> int:
    """The table of cosmic-ray's mutants, and their survivors in tests/mutation/survivors-<lab>.txt."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    source = reference(lab).read_text()
    known = equivalents(lab)
    judged, pending, excluded = [], 0, 0
    for folder in folders:
        with use_db(str(folder / "session.sqlite"), WorkDB.Mode.open) as db:
            done = {item.job_id for item, _ in db.completed_work_items}
            pending += sum(1 for item in db.work_items if item.job_id not in done)
            for item, result in db.completed_work_items:
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    excluded += result.output != "elsewhere"
                    continue
                mutation = item.mutations[0]
                line = mutation.start_pos[0]
                kind = classify(result)
                before, after = diff_lines(result.diff or "")
                if kind == "survived" and (mutation.definition_name or "", mutation.operator_name, before, after) in known:
                    kind = "equivalent"
                where = f"solutions/{reference(lab).name}:{line}"
                judged.append(Judged(
                    step_of_line(source, line), kind, mutation.operator_name,
                    f"{where} step {step_of_line(source, line)} {mutation.definition_name} {mutation.operator_name}\n"
                    f"{result.diff}" if kind == "survived" else "",
                    f"{where} {mutation.operator_name}: {result.output.strip()[:300]}"
                    if f"{MARK} blamed" in (result.output or "") else ""))
    notes = ((f" ({pending} still pending: run again to finish)" if pending else "")
             + (f", {excluded} skipped by '# pragma: no mutate'" if excluded else ""))
    summarise(lab, f"mutants of solutions/{reference(lab).name}{notes}", judged, seconds,
              MUTATION / f"survivors-{lab}.txt")
    return 0


def summarise(lab: str, title: str, judged: list[Judged], seconds: float | None, out: Path,
              by_operator: bool = False) -> None:
    """Print killed / survived / equivalent... per step and for the lab (and per operator), and
    write the survivors' diffs to `out`."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for j in judged:
        counts[j.step][j.kind] += 1
    order = [s for s in [*(str(s.step) for s in labs.load(lab).steps), "header"] if s in counts]
    print(f"\nlab {lab}: {title}")
    header = (f"{'killed':>7} {'survived':>9} {'equivalent':>11} {'incompetent':>12} {'timed out':>10} "
              f"{'no-op':>6} {'score':>7}")
    print(f"{'step':>8} {header}")
    total: Counter = Counter()
    for step in order:
        total.update(counts[step])
        print(_row(step, counts[step]))
    print(_row("lab", total))
    if by_operator:
        operators: dict[str, Counter] = defaultdict(Counter)
        for j in judged:
            operators[j.operator.rpartition("/")[2]][j.kind] += 1
        print(f"{'operator':>24} {header}")
        for name, c in operators.items():
            print(f"{name:>24}" + _row("", c)[8:])
    if seconds is not None:
        print(f"wall time {seconds:.0f} s")
    survivors = [j.survivor for j in judged if j.survivor]
    blamed = [j.blamed for j in judged if j.blamed]
    MUTATION.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# survivors of lab {lab} (generated by benchmarks/mutation_score.py; not committed)\n\n"
                   + "\n".join(survivors)
                   + ("\n# verdicts that blamed the course\n" + "\n".join(blamed) if blamed else ""))
    print(f"survivors: {out.relative_to(ROOT)} ({len(survivors)})" + (f"; BLAMED THE COURSE: {len(blamed)}" if blamed else ""))


# --- semantic mutants (benchmarks/semantic_mutants.py), judged like cosmic-ray's -------------------


def semantic_folder(lab: str, steps: list[str]) -> Path:
    base = workdir(lab, steps)
    return base.with_name(base.name + "-semantic")


def _key(mutant) -> str:
    return hashlib.sha256(mutant.source.encode()).hexdigest()[:16]


def run_semantic(lab: str, jobs: int, seed: int, steps: list[str], fresh: bool, run: bool) -> tuple[list, dict]:
    """Judge every semantic mutant of the reference (those of `steps` only, if given) with `judge`,
    `jobs` at a time, each worker with its own copy of the module. Each verdict is appended to
    results.jsonl at once, so a stopped run goes on where it stopped (a changed reference or seed,
    or `--fresh`, starts over). Returns (mutants, results by key)."""
    import threading

    import semantic_mutants

    pristine = reference(lab)
    source = pristine.read_text()
    folder = semantic_folder(lab, steps)
    stamp = {"reference": hashlib.sha256(pristine.read_bytes()).hexdigest(), "seed": seed}
    stamp_file, results_file = folder / "stamp.json", folder / "results.jsonl"
    if fresh or not stamp_file.is_file() or json.loads(stamp_file.read_text()) != stamp:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        stamp_file.write_text(json.dumps(stamp))
    mutants = [m for m in semantic_mutants.mutants(source)
               if not steps or step_of_line(source, m.line) in steps]
    results = {}
    if results_file.is_file():
        results = {r["key"]: r for r in map(json.loads, results_file.read_text().splitlines())}
    todo = [m for m in mutants if _key(m) not in results]
    lock = threading.Lock()

    def work(k: int) -> None:
        module = folder / f"worker-{k}" / pristine.name
        module.parent.mkdir(exist_ok=True)
        for mutant in todo[k::jobs]:
            module.write_text(mutant.source)
            kind, step, detail, blamed = judge(lab, source, mutant.source, module, seed)
            record = {"key": _key(mutant), "operator": mutant.operator, "line": mutant.line, "step": step,
                      "kind": kind, "detail": detail, "blamed": sorted(set(blamed))}
            with lock:
                results[record["key"]] = record
                with open(results_file, "a") as out:
                    out.write(json.dumps(record) + "\n")
                print(f"{len(results)}/{len(mutants)} {mutant.operator} line {mutant.line}: {kind}", flush=True)

    if run and todo:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(work, range(jobs)))
    return mutants, results


def semantic_report(lab: str, mutants: list, results: dict, seconds: float | None) -> int:
    """The table of the semantic mutants (per step and per operator), and their survivors in
    tests/mutation/survivors-<lab>-semantic.txt, written like cosmic-ray's."""
    import semantic_mutants

    source = reference(lab).read_text()
    known = equivalents(lab)
    judged, pending = [], 0
    name = f"solutions/{reference(lab).name}"
    for mutant in mutants:
        record = results.get(_key(mutant))
        if record is None:
            pending += 1
            continue
        diff = "\n".join(["--- mutation diff ---", *difflib.unified_diff(
            source.split("\n"), mutant.source.split("\n"), fromfile=f"a/{name}", tofile=f"b/{name}", lineterm="")])
        function = semantic_mutants.function_at(source, mutant.line)
        kind = record["kind"]
        if kind == "survived" and (function, mutant.operator, *diff_lines(diff)) in known:
            kind = "equivalent"
        where = f"{name}:{mutant.line}"
        judged.append(Judged(
            record["step"], kind, mutant.operator,
            f"{where} step {record['step']} {function} {mutant.operator}\n{diff}\n" if kind == "survived" else "",
            f"{where} {mutant.operator}: {', '.join(record['blamed'])}" if record["blamed"] else ""))
    notes = f" ({pending} still pending: run again to finish)" if pending else ""
    summarise(lab, f"semantic mutants of {name}{notes}", judged, seconds,
              MUTATION / f"survivors-{lab}-semantic.txt", by_operator=True)
    return 0


def _row(step: str, c: Counter) -> str:
    scored = c["killed"] + c["timed out"] + c["survived"]
    score = f"{100 * (c['killed'] + c['timed out']) / scored:6.1f}%" if scored else "     -"
    return (f"{step:>8} {c['killed']:>7} {c['survived']:>9} {c['equivalent']:>11} {c['incompetent']:>12} "
            f"{c['timed out']:>10} {c['no-op']:>6} {score:>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    test = sub.add_parser("test-mutant", help="(cosmic-ray's test command; not for people)")
    test.add_argument("--lab", required=True)
    test.add_argument("--module", type=Path, required=True)
    test.add_argument("--pristine", type=Path, required=True)
    test.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lab", choices=[lab for lab in labs.available() if lab != "start-here"])
    parser.add_argument("--jobs", type=int, default=2, help="parallel workers, each with its own copy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", nargs="*", default=[], help="only mutants of these steps (own work folder)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results and start over")
    parser.add_argument("--report-only", action="store_true", help="print what the sessions hold; run nothing")
    parser.add_argument("--operators", choices=["all", "syntactic", "semantic"], default="all",
                        help="cosmic-ray's operators, benchmarks/semantic_mutants.py's, or both")
    args = parser.parse_args(argv)
    if args.command == "test-mutant":
        return test_mutant(args.lab, args.module, args.pristine, args.seed)
    if not args.lab:
        parser.error("--lab is required")
    if args.lab not in labs.available():
        parser.error(f"lab {args.lab} is not in this checkout")
    jobs, steps = max(1, args.jobs), [str(s) for s in args.steps]
    if args.operators in ("all", "syntactic"):
        folders = prepare(args.lab, jobs, args.seed, steps, args.fresh)
        started = time.monotonic()
        if not args.report_only:
            execute(folders)
        report(args.lab, folders, None if args.report_only else time.monotonic() - started)
    if args.operators in ("all", "semantic"):
        started = time.monotonic()
        mutants, results = run_semantic(args.lab, jobs, args.seed, steps, args.fresh, not args.report_only)
        semantic_report(args.lab, mutants, results, None if args.report_only else time.monotonic() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
