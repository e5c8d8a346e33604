"""labkit: what the course's notebooks and checks import.

Roles, one module each: `child` runs student code in a killable child process,
`reaper` finds what escaped, `warehouse` and `feed` are the servers the labs talk to,
`verdict` holds results as data, `render_*` draw them, `judge` runs a lab's checks,
`notebook` is the in-kernel side, `build` turns a lesson source into notebooks.
"""

__version__ = "0.1.0"
