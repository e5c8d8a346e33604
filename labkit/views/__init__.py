"""Verdicts rendered for people: plain text, static HTML, the SVG timeline, live widgets,
and `display`, which shows them in a kernel."""
