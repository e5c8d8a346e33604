"""`python -m labkit grade`: grade submitted notebooks, in parallel, from outside the kernel.

Roles, one module each: `submissions` finds and identifies the notebooks (strictly: no
links, no FIFOs, capped reads), `restore` puts the released check cells back, `judge_box`
runs the judge in a box of its own and takes its verdict from a pipe, `kernel_box` starts the
kernel in its sandbox, `execute` runs the notebook with nbclient, `worker` grades one
submission in its own process, `answers` scores the quiz against the key, `feedback` renders
the (sanitized) page and the check cells, `record` writes one outcome, `gradebook` keeps the
result files and the CSV/JSON, `batch` runs them all in parallel, `warm` preloads the
workers' imports, and `settings` declares every limit once. The sandbox itself is
`labkit.sandbox`; `sweep` removes the empty groups a killed grader left.

Input from nbgrader: `nbgrader_layout` reads its `submitted/` and exchange `inbound/` folders;
`reveals` reads which steps a student revealed. A whole class: `report` counts what the class
got wrong from the grader's records, `report_html` and `charts` draw the page; `shards` says
which students `grade --shard I/N` takes, `manifest` records what a run was, and `merge`
combines the shards' folders into one.
"""
