"""The feedback page's notebook (`labkit.grading.notebook_html`) against nbconvert's own HTMLExporter.

The fast exporter caches cells by source and skips nbconvert's BeautifulSoup pass; the page a
student reads must not change: the same elements, attributes and text once sanitized, an `alt`
on every picture, and a changed cell never served from another's cache entry.
"""

from __future__ import annotations

import base64
from html.parser import HTMLParser

import nbformat
import pytest
from nbconvert import HTMLExporter

from labkit.grading import feedback
from labkit.grading.notebook_html import NO_ALT, notebook_html

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()
v4 = nbformat.v4


def _notebook() -> nbformat.NotebookNode:
    attached = v4.new_markdown_cell("An attachment: ![dot](attachment:dot.png)")
    attached.attachments = {"dot.png": {"image/png": PNG}}
    code = v4.new_code_cell("import json\nprint(json.dumps({'a': 1}))  # a comment", execution_count=3)
    code.outputs = [
        v4.new_output("stream", name="stdout", text="{\"a\": 1}\n"),
        v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
        v4.new_output("display_data", data={"image/png": PNG}, metadata={"alt": "a red dot"}),
        v4.new_output("execute_result", data={"text/markdown": "**bold** result", "text/plain": "x"},
                      execution_count=3),
        v4.new_output("error", ename="ValueError", evalue="no <b>", traceback=["ValueError: no <b>"]),
    ]
    magic = v4.new_code_cell("%%bash\necho hi")
    magic.metadata["magics_language"] = "bash"
    return v4.new_notebook(cells=[
        v4.new_markdown_cell("# Step 1\n\nSome *prose* with `code`, $x^2$ and a [link](#step-1).\n\n"
                             "```python\nprint('x')\n```"),
        code, attached, magic, v4.new_raw_cell("raw <text>"),
        v4.new_code_cell(""),
    ], metadata={"language_info": {"name": "python", "pygments_lexer": "ipython3"}})


class _Events(HTMLParser):
    """Elements, attributes (classes as sets of words) and non-blank text, in order."""

    def __init__(self, html: str):
        super().__init__()
        self.seen: list[tuple] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.seen.append(("<", tag, tuple(sorted(
            (k, " ".join(sorted((v or "").split())) if k == "class" else v) for k, v in attrs))))

    def handle_endtag(self, tag):
        self.seen.append((">", tag))

    def handle_data(self, data):
        if data.strip():
            self.seen.append(("text", " ".join(data.split())))


def _upstream(nb) -> str:
    return HTMLExporter(template_name="basic").from_notebook_node(nb)[0]


def test_the_page_shows_what_nbconvert_shows():
    nb = _notebook()
    ours, theirs = feedback.clean(notebook_html(nb)), feedback.clean(_upstream(nb))
    assert _Events(ours).seen == _Events(theirs).seen
    assert notebook_html(nb) == notebook_html(nb)  # from the caches, the same


def test_every_picture_has_an_alt_text_and_a_given_one_is_kept():
    html = notebook_html(_notebook())
    alts = [dict(e[2]).get("alt") for e in _Events(html).seen if e[:2] == ("<", "img")]
    assert len(alts) == 3  # two outputs and the attachment
    assert alts.count(NO_ALT) == 1 and "a red dot" in alts and "dot" in alts


@pytest.mark.parametrize("where", ["markdown", "code", "output"])
def test_a_changed_cell_is_never_served_from_the_cache(where):
    nb = _notebook()
    before = notebook_html(nb)
    changed = _notebook()
    if where == "markdown":
        changed.cells[0].source = changed.cells[0].source.replace("prose", "PROSE")
    elif where == "code":
        changed.cells[1].source = changed.cells[1].source.replace("a comment", "A COMMENT")
    else:
        changed.cells[1].outputs[3].data["text/markdown"] = "**BOLD** result"
    after = notebook_html(changed)
    assert after != before and ("PROSE" in after or "A COMMENT" in after or "BOLD" in after)
    assert feedback.clean(after) == feedback.clean(notebook_html(changed))
    assert _Events(feedback.clean(after)).seen == _Events(feedback.clean(_upstream(changed))).seen


def test_an_attachment_is_rendered_with_its_own_cell():
    """Two cells with the same markdown but different attachments: each shows its own picture."""
    first, second = _notebook(), _notebook()
    other = PNG[:-8] + "AAAAAAA="
    second.cells[2].attachments = {"dot.png": {"image/png": other}}
    assert other in notebook_html(second) and other not in notebook_html(first)
