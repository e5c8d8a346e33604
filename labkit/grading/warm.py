"""Imported once by the batch's forkserver, so every worker it forks starts warm.

Loading nbformat (jsonschema), nbclient, nbconvert, the HTML templates and the labs' checks
costs seconds per process; paid once here, each forked worker starts in milliseconds. The
judges' Hypothesis Unicode tables are built here too (once per machine): a judge's box can
only read them.
"""

import nbconvert.preprocessors.sanitize  # noqa: F401
import nbformat

from labkit import labs
from labkit.grading import feedback, worker  # noqa: F401  (nbclient, jupyter_client)
from labkit.judge import differential

feedback.notebook_html(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]))
for _lab in labs.available():
    labs.load(_lab)
differential.warm_unicode_tables()
