"""The judge: runs a lab's checks with student code only in killable child processes.

`run` runs a lab (its steps in parallel), `child` runs one child process and kills it,
`reaper` finds what escaped, `expect` turns a child's report into cases, `verdict` holds
the results as data, `stores` is the judge's own view of the SQLite files.
"""
