"""The feedback a student gets: the verdict in each check cell, and one static HTML page.

The check cells of the executed notebook show the grader's verdict for their step (the
kernel never judged anything). The page is the verdict per step and case, then the executed
notebook (nbconvert's basic template). Every piece of the page that carries text the
student's code could choose — the verdict (values, messages) and the whole notebook — goes
through nh3 (Rust's ammonia) with an allow-list: no scripts, no styles, no event handlers, no
`javascript:` or `data:` URLs. Only the page's own frame and stylesheet are written here.

The page loads nothing from anywhere: a Content-Security-Policy (the first thing in its
<head>) allows only inline styles and `data:` images, and the sanitizer keeps no address
that points outside the page — an `<img>` keeps only a `data:` PNG, JPEG or GIF, a link only
a `#fragment`, an inline style nothing that could fetch (`url(…)`, `image-set(…)`, escapes).
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

import nh3

from labkit.grading.restore import check_step
from labkit.judge.verdict import LabVerdict
from labkit.views import render_html, render_text

if TYPE_CHECKING:  # nbformat and nbconvert are imported only where needed: they are slow to load
    from nbformat import NotebookNode

FLAG_WORDS = {
    "edited": "was edited; the original was put back",
    "deleted": "was deleted; the original was put back",
    "duplicated": "was copied; the copy was removed",
    "ignored": "is another notebook of this lab from you; this one was graded instead",
    "no-release": "could not be restored: the grader has no released notebook for this lab",
    "superseded": "is the time of an earlier submission of yours; the latest one was graded",
}

PAGE_STYLE = """
<style>
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em;line-height:1.45}
.lk-summary{background:#f5f5f7;border-radius:6px;padding:8px 14px}
.lk-flags{color:#8d2a00}.lk-problem{color:#c62828;font-weight:600}
.lk-notebook{margin-top:2em;border-top:2px solid #ccd;padding-top:1em}
.lk-notebook pre{background:#f7f7f9;padding:6px;overflow-x:auto;white-space:pre-wrap}
.lk-notebook .jp-InputPrompt,.lk-notebook .jp-OutputPrompt{color:#888;font-size:85%}
.lk-notebook .jp-RenderedText pre{background:#fff;border-left:3px solid #e0e0e0}
.lk-notebook .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"] pre{background:#fff5f5}
</style>
"""


# What the views (verdict panels, the SVG timeline) and nbconvert's basic template use.
SVG_TAGS = {"svg", "g", "line", "rect", "circle", "polygon", "polyline", "path", "text", "tspan", "title"}
SVG_ATTRIBUTES = {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "ry", "width", "height",
                  "points", "d", "fill", "stroke", "stroke-width", "stroke-dasharray", "stroke-linecap",
                  "stroke-linejoin", "opacity", "font-size", "font-family", "font-weight", "text-anchor",
                  "paint-order", "dominant-baseline", "role", "viewBox", "viewbox", "xmlns", "transform"}
ALLOWED_TAGS = set(nh3.ALLOWED_TAGS) | SVG_TAGS | {"details", "summary"}
ALLOWED_ATTRIBUTES = {
    "*": {"class", "title", "id", "style", "lang", "dir", "aria-label", "data-mime-type"},
    "a": {"href"}, "img": {"src", "alt", "width", "height"}, "details": {"open"},
    "td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan"}, "ol": {"type", "start"},
    **{tag: SVG_ATTRIBUTES for tag in SVG_TAGS},
}
# Inline styles keep only these properties (the views' layout and colours; nothing that loads).
STYLE_PROPERTIES = {"color", "background", "background-color", "overflow-x", "white-space", "margin",
                    "max-width", "height", "width", "font-size", "font-weight", "text-align"}


IMAGE_DATA = ("data:image/png;", "data:image/jpeg;", "data:image/gif;")
# Every page's first <head> element: nothing is fetched, nothing runs (the sanitizer's rules
# below say the same; this holds even where they would miss something).
CSP = ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
       "style-src 'unsafe-inline'; font-src 'none'; connect-src 'none'; media-src 'none'; object-src 'none'; "
       "frame-src 'none'; child-src 'none'; worker-src 'none'; manifest-src 'none'; base-uri 'none'; "
       'form-action \'none\'">')
# An inline style with any of these could fetch something (`url(`, `image-set(`, `@import`, a CSS
# escape spelling either): the whole attribute goes.
STYLE_FETCHES = ("(", "\\", "@", "url", "image", "&")


def _urls(tag: str, attribute: str, value: str) -> str | None:
    """Nothing that points outside the page: `src` only as an <img>'s `data:` picture (a
    notebook's plots), `href` only as a `#fragment` of the page, no style that can fetch."""
    if attribute == "src":
        plain = value.strip().lower()
        return value if tag == "img" and plain.startswith(IMAGE_DATA) and "base64," in plain else None
    if attribute == "href":
        return value if value.strip().startswith("#") else None
    if attribute == "style":
        plain = value.lower()
        return None if any(mark in plain for mark in STYLE_FETCHES) else value
    return value


def clean(html: str) -> str:
    """HTML from (or carrying text from) student code, made inert: nh3 with the allow-list."""
    return clean_with(html, ALLOWED_TAGS, ALLOWED_ATTRIBUTES)


def clean_with(html: str, tags: set[str], attributes: dict[str, set[str]]) -> str:
    """`clean` with another allow-list of tags and attributes (the class report's tables)."""
    return nh3.clean(html, tags=tags, attributes=attributes,
                     url_schemes={"data"}, attribute_filter=_urls,
                     filter_style_properties=STYLE_PROPERTIES, strip_comments=True,
                     link_rel="noopener noreferrer nofollow")


def verdict_outputs(verdict: LabVerdict | None, step: str) -> list[NotebookNode]:
    import nbformat

    found = [s for s in (verdict.steps if verdict else []) if str(s.step) == step]
    if not found:
        text = "This step was not graded."
        return [nbformat.v4.new_output("display_data", data={"text/plain": text,
                                                             "text/html": f"<p>{text}</p>"})]
    step_verdict = found[0]
    return [nbformat.v4.new_output("display_data", data={
        "text/plain": render_text.render_step(step_verdict),
        "text/html": render_html.render_step(step_verdict),
    })]


def fill_checks(nb: NotebookNode, verdict: LabVerdict | None, released_ids: set[str]) -> None:
    """Each released check cell shows the grader's verdict for its step."""
    for cell in nb.cells:
        step = check_step(cell)
        if cell.get("cell_type") == "code" and step is not None and cell.get("id") in released_ids:
            cell.outputs = verdict_outputs(verdict, step)
            cell.execution_count = None


SAFE_OUTPUT_KEYS = {"text/plain", "image/png", "image/jpeg", "text/latex", "application/json"}


def sanitize_student_cells(nb: NotebookNode, released_ids: set[str]) -> None:
    """Nothing from the kernel may script the feedback page.

    Outputs keep their plain-text and image forms; HTML is kept (sanitized) only when an
    output has no text form. Prose the student added is sanitized; the release's is trusted.
    """
    from nbconvert.preprocessors.sanitize import SanitizeHTML

    sanitizer = SanitizeHTML()
    for cell in nb.cells:
        if cell.get("cell_type") in ("markdown", "raw"):
            if cell.get("id") not in released_ids:
                cell.source = sanitizer.sanitize_html_tags(cell.source)
            continue
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not isinstance(data, dict):
                continue
            html = data.get("text/html") if "text/plain" not in data else None
            for key in [k for k in data if k not in SAFE_OUTPUT_KEYS]:
                del data[key]
            if isinstance(html, str):
                data["text/html"] = sanitizer.sanitize_html_tags(html)


def mark_death(nb: NotebookNode, index: int | None, message: str) -> None:
    """Show where the kernel died or was stopped, in the cell itself."""
    import nbformat

    if index is None or not 0 <= index < len(nb.cells) or nb.cells[index].get("cell_type") != "code":
        return
    nb.cells[index].setdefault("outputs", []).append(
        nbformat.v4.new_output("stream", name="stderr", text=f"\n[grader] {message}\n"))


def _flag_line(flag: str) -> str:
    kind, _, what = flag.partition(":")
    words = FLAG_WORDS.get(kind)
    if words is None:
        return escape(flag)
    return f"<code>{escape(what)}</code> {escape(words)}" if what else escape(words)


def page(row: dict, verdict: LabVerdict | None, nb: NotebookNode | None, notes: list[str]) -> str:
    """One student's feedback page for one lab."""
    student, lab = row["student"], row["lab"] or row["notebook"].replace("\\", "/").rsplit("/", 1)[-1]
    title = f"{student} — {lab}"
    summary = [f"<h1>{escape(title)}</h1>", '<div class="lk-summary">',
               f"<p><b>{row['total']}/{row['max']} points</b> · run status: {escape(row['status'])}"
               f" · graded in {row['seconds']:.1f} s</p>"]
    if row["status"] == "malformed":
        summary.append(f'<p class="lk-problem">{escape(row["message"])}</p>')
    elif row.get("seed") is not None:
        summary.append(f"<p>Hidden cases drawn with seed {row['seed']}. To replay this grade: "
                       f"<code>python -m labkit check {escape(row['lab'])} --solution YOUR_MODULE "
                       f"--seed {row['seed']}</code></p>")
    if row.get("submitted_at"):
        summary.append(f"<p>Graded submission: the one of {escape(row['submitted_at'])} (the latest).</p>")
    if row.get("revealed"):
        steps = ", ".join(escape(str(s)) for s in row["revealed"])
        summary.append(f"<p>You revealed the reference of step(s) {steps} (<code>lab.reveal</code>).</p>")
    for note in notes:
        summary.append(f"<p>{escape(note)}</p>")
    if row["flags"]:
        items = "".join(f"<li>{_flag_line(f)}</li>" for f in row["flags"])
        summary.append(f'<div class="lk-flags">Changes the grader undid or noticed:<ul>{items}</ul></div>')
    summary.append("</div>")
    parts = ["<!DOCTYPE html>", f'<html lang="en"><head>{CSP}<meta charset="utf-8">',
             f"<title>{escape(title)}</title>", PAGE_STYLE, render_html.STYLE, "</head><body>",
             *summary]
    if verdict is not None:
        parts.append(clean(render_html.render_lab(verdict)))
    if nb is not None:
        from labkit.grading.notebook_html import notebook_html

        parts += ['<div class="lk-notebook"><h2>Your notebook, as the grader ran it</h2>',
                  clean(notebook_html(nb)), "</div>"]
    parts.append("</body></html>")
    return "\n".join(parts)
