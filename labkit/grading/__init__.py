"""`python -m labkit grade`: grade submitted notebooks, in parallel, from outside the kernel.

Roles, one module each: `submissions` finds and identifies the notebooks, `restore` puts the
released check cells back, `execute` runs a notebook with nbclient, `sandbox` contains its
kernel, `worker` grades one submission in its own process, `feedback` renders the page and
the check cells, `record` writes one outcome, `gradebook` keeps the result files and the
CSV/JSON, `batch` runs them all in parallel, `warm` preloads the workers' imports, and
`settings` declares every limit once.
"""

from __future__ import annotations

import argparse


def cli_grade(args: argparse.Namespace) -> int:
    """Run the `grade` command; exit 0 when the batch completed, usage errors raise UsageError."""
    from labkit.cli import UsageError
    from labkit.grading.batch import BatchUsageError, run

    try:
        return run(list(args.paths), args.out, args.jobs, args.seed, args.force)
    except BatchUsageError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        print("interrupted: finished grades are kept; run the same command again to continue")
        return 130
