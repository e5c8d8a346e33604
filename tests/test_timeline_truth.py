"""Timelines that tell the truth (issue "The student's first two hours, part two", item 2).

A new student found lab 03's final timeline drawing "sent, saved under token 103" above the POST
that carried it (marking before sending, the bug lab 01 teaches), squeezing eight lanes to ~7 px
text and cutting `stale: 1` out of A's return value; and an untouched lab 01's final check, grey
"waiting for your steps", drawing a timeline and a ladder of a crash that never happened.

Built from the reference solution's real run of lab 03's final check (the catalogue's cached
verdict, `tests/catalogue.py`) and an untouched lab 01 notebook's module.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

import nbformat
import pytest
from catalogue import failures, step_verdicts

from labkit import labs
from labkit.judge.run import run_lab
from labkit.judge.verdict import Evidence, LabVerdict
from labkit.notebook import module_export
from labkit.notebook.lab import Lab
from labkit.views import render_html, render_text, timeline_order, timeline_svg
from labkit.views.standing import standing

ROOT = Path(__file__).resolve().parents[1]
RELAY = ROOT / "solutions" / "relay.py"
SEED = 1
POST = re.compile(r"POST (\S+) with token (\d+)")
SAVED = re.compile(r"(\S+): sent, saved under token (\d+)")


@pytest.fixture(scope="module")
def relay_final():
    final = step_verdicts("relay", RELAY, ["final"], SEED)["final"]
    assert final.passed, failures(final)
    assert final.evidence is not None and final.evidence.timeline
    return final


def deliveries(events) -> list[tuple[str, int, int]]:
    """(event id and token, row of its POST, row of the publisher's "sent, saved under token")."""
    posts = {m.groups(): i for i, e in enumerate(events) if (m := POST.match(e.text)) and e.actor == "warehouse"}
    saves = [(m.groups(), i) for i, e in enumerate(events) if (m := SAVED.match(e.text))]
    assert saves and all(key in posts for key, _ in saves), (saves, posts)
    return [(" ".join(key), posts[key], i) for key, i in saves]


def test_every_post_is_drawn_before_the_save_it_led_to(relay_final):
    events = timeline_svg.rows(relay_final.evidence.timeline)
    found = deliveries(events)
    assert len(found) == 7  # snack-1, snack-2, five pills (one after its redrive)
    for key, post, saved in found:
        assert post < saved, f"{key}: 'sent, saved' drawn in row {saved + 1}, its POST in row {post + 1}"
    # The picture and the table list the events in that same order.
    svg = timeline_svg.svg(relay_final.evidence.timeline)
    drawn = [ET.fromstring(f"<t>{t}</t>").text for t in re.findall(r'<g class="lk-event"[^>]*><title>([^<]*)',
                                                                           svg)]
    assert [d.split(": ", 1)[1] for d in drawn] == [e.text for e in events]


def test_the_order_rests_on_what_the_judge_observed_not_on_the_clocks(relay_final):
    """The audit stamps in whole milliseconds: put every save a little *before* its POST by the
    clock (what the old timeline sorted by) and the drawing must not change."""
    timeline = [dict(e) for e in relay_final.evidence.timeline]
    post_t = {m.groups(): e["t"] for e in timeline if (m := POST.match(e["text"])) and e["actor"] == "warehouse"}
    for e in timeline:
        if m := SAVED.match(e["text"]):
            e["t"] = post_t[m.groups()] - 0.0009
    events = timeline_svg.rows(timeline)
    for key, post, saved in deliveries(events):
        assert post < saved, key
    # Links, not luck: every POST names the first audit entry written after it arrived.
    posts = [e for e in relay_final.evidence.timeline if e["actor"] == "warehouse" and POST.match(e["text"])]
    assert posts and all(e.get("id") and e.get("before") for e in posts)


def test_without_links_a_save_stamped_before_its_post_is_drawn_where_the_clock_puts_it():
    """The rule claims nothing it was not told: a publisher that really marks before it sends is
    drawn that way (no link ⇒ the clock decides)."""
    timeline = [{"t": 1.0, "actor": "publisher #1", "kind": "start", "text": "process started"},
                {"t": 1.2, "actor": "outbox", "kind": "committed", "text": "e-1: sent, saved under token 3"},
                {"t": 1.3, "actor": "warehouse", "kind": "applied", "text": "POST e-1 with token 3 → applied"},
                {"t": 1.4, "actor": "publisher #1", "kind": "exit", "text": "exit code 0"}]
    assert [e.kind for e in timeline_svg.rows(timeline)] == ["start", "committed", "applied", "exit"]
    linked = [dict(e) for e in timeline]
    linked[2].update(id="post:1", before=["audit:1"])
    linked[1].update(id="audit:1")
    assert [e.kind for e in timeline_svg.rows(linked)] == ["start", "applied", "committed", "exit"]


def test_a_kill_precedes_the_restart_and_a_process_lane_runs_from_start_to_end():
    # Stamps from different clocks that disagree with what happened.
    timeline = [{"t": 2.00, "actor": "publisher #2", "kind": "start", "text": "process started"},
                {"t": 2.01, "actor": "publisher #1", "kind": "killed", "text": "SIGKILL"},
                {"t": 1.00, "actor": "publisher #1", "kind": "start", "text": "process started"},
                {"t": 0.90, "actor": "publisher #1", "kind": "hook", "text": "a note stamped by the child"},
                {"t": 2.50, "actor": "publisher #2", "kind": "exit", "text": "exit code 0"},
                {"t": 2.60, "actor": "publisher #2", "kind": "hook", "text": "a late stamp"}]
    order = [(e.actor, e.kind) for e in timeline_svg.rows(timeline)]
    assert order == [("publisher #1", "start"), ("publisher #1", "hook"), ("publisher #1", "killed"),
                     ("publisher #2", "start"), ("publisher #2", "hook"), ("publisher #2", "exit")]


def test_contradicting_links_still_give_every_event_once():
    timeline = [{"t": 1, "actor": "a", "kind": "x", "text": "1", "id": "1", "after": ["2"]},
                {"t": 2, "actor": "b", "kind": "x", "text": "2", "id": "2", "after": ["1"]},
                {"t": 3, "actor": "c", "kind": "x", "text": "3", "after": ["nobody"]}]
    assert sorted(timeline_order.order(timeline)) == [0, 1, 2]


def test_text_is_never_smaller_than_the_minimum_and_the_picture_is_never_squeezed(relay_final):
    timeline = relay_final.evidence.timeline
    root = ET.fromstring(timeline_svg.svg(timeline))
    sizes = [float(el.get("font-size")) for el in root.iter() if el.tag.endswith("text")]
    assert sizes and min(sizes) >= timeline_svg.MIN_FONT_SIZE >= 11
    assert "max-width:100%" not in root.get("style")  # scaled to its box, 8 lanes made ~7 px text
    assert float(root.get("width")) == float(root.get("viewBox").split()[2])
    lanes = timeline_svg.lanes(timeline)
    assert len(lanes) == 8 and float(root.get("width")) >= timeline_svg.LEFT + timeline_svg.LANE_WIDTH * len(lanes)
    figure = timeline_svg.render(timeline)
    assert '<div class="lk-timeline-scroll" style="overflow-x:auto;width:0;min-width:100%"' in figure
    html = render_html.render_evidence(relay_final.evidence)  # what the notebook and the exports show
    assert "lk-timeline-scroll" in html and "lk-timeline-table" in html


def test_return_values_are_whole_in_the_table_and_on_hover(relay_final):
    timeline = relay_final.evidence.timeline
    stale = next(e["text"] for e in timeline if e["actor"] == "publisher A #2" and e["kind"] == "exit")
    assert "'stale': 1" in stale
    table = timeline_svg.table(timeline)
    rows = re.findall(r'<tr class="lk-event-row">(.*?)</tr>', table)
    assert len(rows) == len(timeline)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    assert all(len(c) == 5 for c in cells)
    for event in timeline:  # every event's whole text, in the table
        assert any(c[4] == escape(event["text"]) and c[2] == escape(event["actor"]) for c in cells), event
    assert escape(stale) in table
    svg = timeline_svg.svg(timeline)
    assert escape(stale) in svg  # whole in the picture too (and in its tooltip)
    assert re.search(r"<title>[^<]*" + re.escape(escape(stale)) + "</title>", svg)
    # A label longer than the picture shows is cut there, never in the tooltip or the table.
    long = "returned " + "x" * (timeline_svg.LABEL_CHARS + 40)
    one = [{"t": 1, "actor": "p #1", "kind": "start", "text": "process started"},
           {"t": 2, "actor": "p #1", "kind": "exit", "text": long}]
    cut_svg, cut_table = timeline_svg.svg(one), timeline_svg.table(one)
    assert long not in re.sub(r"<title>.*?</title>", "", cut_svg) and f"{long}</title>" in cut_svg
    assert long in cut_table


# --- a final check that did not run ------------------------------------------------------


def skeleton_module(tmp_path: Path, notebook: str, module: str) -> Path:
    parts = module_export.parts_from_notebook(nbformat.read(ROOT / "notebooks" / notebook, as_version=4))
    path = tmp_path / module
    path.write_text(module_export.assemble(parts))
    return path


def test_an_untouched_lab01_final_check_draws_no_timeline_and_no_ladder(tmp_path, capsys):
    module = skeleton_module(tmp_path, "01-outbox.ipynb", "worker.py")
    verdict = run_lab(labs.load("outbox"), module, steps=["final"], seed=SEED)
    final = verdict.steps[0]
    assert final.waiting and standing(final).label == "waiting for your steps"
    assert final.evidence is None or (not final.evidence.timeline and not final.evidence.ladder)
    html = render_html.render_step(final)
    assert '<svg class="lk-timeline"' not in html and 'class="lk-ladder"' not in html
    assert "crash timeline" not in html.lower() and "evidence ladder" not in html.lower()
    text = render_text.render_step(final, brief_not_implemented=False)
    assert "crash timeline" not in text and "evidence ladder" not in text
    # lab.ladder() says there is nothing to show yet, and why.
    lab = Lab("outbox", workdir=tmp_path / "work")
    lab.last_final_path.write_text(json.dumps(verdict.to_json()))
    capsys.readouterr()
    lab.ladder()
    said = capsys.readouterr().out
    assert "Nothing to show yet" in said and "waiting for your steps" in said
    assert "in orders" not in said and "pending in outbox" not in said


def test_a_ladder_saved_before_the_fix_for_a_grey_final_is_not_shown(tmp_path, capsys):
    """A `last-final-outbox.json` from an older judge still carries the made-up rungs."""
    module = skeleton_module(tmp_path, "01-outbox.ipynb", "worker.py")
    verdict: LabVerdict = run_lab(labs.load("outbox"), module, steps=["final"], seed=SEED)
    verdict.steps[0].evidence = Evidence(
        timeline=[{"t": 1, "actor": "publisher #1", "kind": "start", "text": "process started"}],
        ladder=[{"rung": "pending in outbox", "observed": "yes", "when": "after publisher #1 died"}])
    lab = Lab("outbox", workdir=tmp_path / "work")
    lab.last_final_path.write_text(json.dumps(verdict.to_json()))
    capsys.readouterr()
    lab.ladder()
    said = capsys.readouterr().out
    assert "Nothing to show yet" in said and "after publisher #1 died" not in said
