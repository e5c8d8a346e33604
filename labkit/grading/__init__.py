"""`python -m labkit grade`: grade submitted notebooks, in parallel, from outside the kernel.

Roles, one module each: `submissions` finds and identifies the notebooks, `restore` puts the
released check cells back, `execute` runs a notebook with nbclient, `sandbox` contains its
kernel, `worker` grades one submission in its own process, `feedback` renders the page and
the check cells, `record` writes one outcome, `gradebook` keeps the result files and the
CSV/JSON, `batch` runs them all in parallel, `warm` preloads the workers' imports, and
`settings` declares every limit once.
"""
