"""The executed notebook as an HTML fragment for the feedback page: nbconvert's basic template,
with what every submission of a lab shares rendered once.

A class's notebooks carry the same lesson prose and mostly the same code, so a cell's
markdown, highlighted code and cleaned code are cached by their source: a page pays once for
each distinct cell. (The caches live in each grading worker; the forkserver fills them with
the released notebook of each lab the batch grades, `warm.py`, and every worker inherits them.)

nbconvert's own `HTMLExporter` then parses its whole output again with BeautifulSoup, to add
`tabindex` (which the page's sanitizer removes) and an `alt` text to pictures that have none:
a third of the page's cost. Here the `alt` is added by a pattern on the template's own `<img`
tags, and the notebook is validated once, not after every preprocessor.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import TYPE_CHECKING

from jinja2 import pass_context
from nbconvert import HTMLExporter
from nbconvert.exporters.templateexporter import TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.strings import clean_html
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

if TYPE_CHECKING:
    from nbformat import NotebookNode

NO_ALT = "No description has been provided for this image"  # nbconvert's own words
_IMG_WITHOUT_ALT = re.compile(r"<img\b(?![^>]*\balt=)", re.IGNORECASE)
CACHED = 4096  # distinct sources kept per cache: a lab's cells, with room for a class's edits


@functools.lru_cache(maxsize=CACHED)
def _cleaned(html: str) -> str:
    return clean_html(html)


class _CachedHighlight:
    """`highlight_code` with its answers kept: the same source, lexer and magics, the same HTML."""

    def __init__(self, highlight: Highlight2HTML):
        self.highlight = highlight

    def __call__(self, source: str, language: str | None = None, metadata=None) -> str:
        magics = metadata.get("magics_language") if metadata else None
        return _highlighted(self.highlight, source, language, magics)


@functools.lru_cache(maxsize=CACHED)
def _highlighted(highlight: Highlight2HTML, source: str, language: str | None, magics: str | None) -> str:
    return highlight(source, language, {"magics_language": magics} if magics else None)


class FeedbackExporter(HTMLExporter):
    @pass_context
    def markdown2html(self, context, source: str) -> str:
        if context.get("cell", {}).get("attachments"):  # the HTML then depends on the cell too
            return super().markdown2html(context, source)
        return _markdown(self, source)

    def default_filters(self):
        yield from super().default_filters()
        yield ("markdown2html", self.markdown2html)
        yield ("clean_html", _cleaned)

    def from_notebook_node(self, nb: NotebookNode, resources=None, **kw):
        """HTMLExporter's, without its second parse of the whole output (see the module)."""
        info = nb.metadata.get("language_info", {})
        lexer = info.get("pygments_lexer", info.get("name", None))
        self.register_filter("highlight_code", _highlighter(self, lexer))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return _IMG_WITHOUT_ALT.sub(f'<img alt="{NO_ALT}"', html), resources


@functools.lru_cache(maxsize=64)
def _highlighter(exporter: FeedbackExporter, lexer: str | None) -> _CachedHighlight:
    return _CachedHighlight(Highlight2HTML(pygments_lexer=lexer, parent=exporter))


@functools.lru_cache(maxsize=CACHED)
def _markdown(exporter: FeedbackExporter, source: str) -> str:
    return HTMLExporter.markdown2html(exporter, {}, source)


_exporter: FeedbackExporter | None = None


def notebook_html(nb: NotebookNode) -> str:
    """The notebook as an HTML fragment (nbconvert's basic template); the exporter is reused."""
    global _exporter
    if _exporter is None:
        _exporter = FeedbackExporter(template_name="basic", optimistic_validation=True)
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    body, _ = _exporter.from_notebook_node(nb)
    return body
