"""The course's IPython extension: `%%step` works from a kernel's start, before any setup cell.

`python -m labkit start` gives the workspace's JupyterLab a kernel spec of the course's own
(`workspace.kernel_spec`, named `python3` so the notebooks pick it): the usual ipykernel with
`--IPKernelApp.extra_extensions=labkit.notebook.kernel`. So a fresh or restarted kernel knows
`%%step`; the first step cell run before the setup cell finds the lab in its notebook's
metadata (the server tells the kernel its notebook in JPY_SESSION_NAME). Nothing is displayed
and nothing of the lab is imported until a `%%step` cell runs.

A kernel started without this (a plain `jupyter lab` elsewhere) has no hook for an unknown
cell magic: IPython says "UsageError: Cell magic `%%step` not found." (one line, no
traceback) until the setup cell has run.
"""

from __future__ import annotations


def load_ipython_extension(shell) -> None:
    from labkit.notebook import step_cell

    step_cell.register(None)
