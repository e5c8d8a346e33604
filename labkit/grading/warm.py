"""Imported once by the batch's forkserver, so every worker it forks starts warm.

Loading nbformat (jsonschema), nbclient, nbconvert, the HTML templates and the labs' checks
costs seconds per process; paid once here, each forked worker starts in milliseconds. The
judges' Hypothesis Unicode tables are built here too (once per machine), and the course's
code compiled: a sandbox can only read them. The feedback page's caches are filled with the
released notebook of each lab this batch grades (`WARM_LABS_ENV`): every page then renders only
what its student changed (0.04 s of CPU instead of 0.12 s a page, for 0.11 s once a lab).
"""

import os
import sys

# jsonschema (under nbformat) imports rfc3987_syntax for its `iri` formats, which builds ~35
# Earley parsers at import: 1.5 s here (jsonschema#1428). No notebook schema uses those formats.
sys.modules.setdefault("rfc3987_syntax", None)

import nbconvert.preprocessors.sanitize  # noqa: E402, F401
import nbformat  # noqa: E402

from labkit import labs  # noqa: E402
from labkit.grading import worker  # noqa: E402, F401  (nbclient, jupyter_client)
from labkit.grading.notebook_html import notebook_html  # noqa: E402
from labkit.grading.settings import WARM_LABS_ENV  # noqa: E402
from labkit.judge import differential  # noqa: E402
from labkit.sandbox import profiles  # noqa: E402

_WANTED = set(filter(None, os.environ.get(WARM_LABS_ENV, "").split(",")))  # the labs this batch grades

notebook_html(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]))
for _lab in labs.available():
    if not _WANTED or _lab in _WANTED:  # all when not said: lab 04's alone imports psycopg and valkey
        labs.load(_lab)
differential.warm_unicode_tables()
profiles.compile_course()


def _render_releases() -> None:
    from labkit.grading.settings import release_dir
    from labkit.grading.submissions import releases

    if not _WANTED:
        return
    for lab, release in releases(release_dir()).items():
        try:
            if lab in _WANTED:
                notebook_html(nbformat.from_dict(release.nb))
        except Exception:  # noqa: BLE001, S112 - a cold cache only costs time
            continue


_render_releases()
