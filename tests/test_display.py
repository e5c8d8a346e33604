"""The student's view without a browser: plain text under nbclient, static HTML in an export,
the crash timeline as SVG, progress and quiz files in the work folder."""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import kernels
import nbformat
import pytest

from labkit.judge.verdict import Case, Evidence, LabVerdict, Outcome, StepVerdict
from labkit.notebook import build, progress, quiz
from labkit.views import render_html, timeline_svg

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks" / "source"
OUTBOX = SOURCES / "01-outbox.md"
START = SOURCES / "00-start-here.md"
TEXT, HTML, WIDGET = "text/plain", "text/html", "application/vnd.jupyter.widget-view+json"

# A small lesson of our own: used when lab 01's source is not there (yet).
MINI_OUTBOX = '''# Mini outbox

```cell:setup
from labkit.notebook import Lab

lab = Lab("outbox")
```

```cell:step header
{header}
```
{steps}
```cell:check final
lab.check("final")
```

```cell:code
lab.ladder()
```

```cell:quiz
lab.quiz()
```
'''


def _solution_parts() -> dict[str, str]:
    """solutions/worker.py split back into its parts (the inverse of module_export.assemble)."""
    parts, current = {}, None
    for line in (ROOT / "solutions" / "worker.py").read_text().splitlines():
        if line.startswith("# --- "):
            label = line[6:].rstrip("- ").strip()
            current = "header" if label == "provided code" else label.split()[-1]
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    return {k: "\n".join(v).strip("\n") for k, v in parts.items()}


def lesson_for(source: Path, tmp: Path) -> build.Lesson:
    if source.exists():
        return build.parse(source)
    parts = _solution_parts()  # lab 01's source is being written: a mini lesson in a temp dir
    steps = "".join(f"\n```cell:step {n}\n### BEGIN SOLUTION\n{code}\n### END SOLUTION\n```\n\n"
                    f"```cell:check {n}\nlab.check({n})\n```\n"
                    for n, code in parts.items() if n != "header")
    mini = tmp / source.name
    mini.write_text(MINI_OUTBOX.format(header=parts["header"], steps=steps))
    return build.parse(mini)


def solved_notebook(source: Path, tmp: Path, wrong: dict[str, tuple[str, str]] | None = None):
    """The student notebook with each `%%step N` cell holding the reference solution;
    `wrong` = {part: (old, new)} breaks a step on purpose."""
    lesson = lesson_for(source, tmp)
    nb = build.student_notebook(lesson)
    solution = {b.arg: build.solution(b.text) for b in lesson.blocks if b.kind == "step"}
    for cell in nb.cells:
        part = cell.metadata.get("labkit", {}).get("part")
        if part is None:
            continue
        code = solution[part]
        if wrong and part in wrong:
            old, new = wrong[part]
            assert old in code, f"step {part} has no {old!r} to break"
            code = code.replace(old, new)
        cell.source = f"%%step {part}\n{code}"
    return nb


# Pending rows ordered by id instead of by seq: step 4 fails, and step 7 (which builds on it).
ORDER_BY_ID = {"4": ("ORDER BY seq", "ORDER BY id")}


def execute(nb, folder: Path, allow_errors: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    # The kernel imports labkit and checks from this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    kernels.execute(nb, folder, timeout=240, allow_errors=allow_errors, env=env)
    nbformat.write(nb, folder / "executed.ipynb")
    return nb


def outputs_of(nb, cell_id: str) -> list[dict]:
    for cell in nb.cells:
        if cell.get("id") == cell_id:
            return cell.get("outputs", [])
    raise KeyError(cell_id)


def texts(nb, cell_id: str) -> str:
    return "\n".join(o.get("data", {}).get(TEXT, "") or o.get("text", "") for o in outputs_of(nb, cell_id))


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("solved")
    return execute(solved_notebook(OUTBOX, folder), folder), folder


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wrong")
    return execute(solved_notebook(OUTBOX, folder, ORDER_BY_ID), folder), folder


# --- the timeline SVG, on synthetic evidence ------------------------------------------

VENDING_TIMELINE = [
    {"t": 10.00, "actor": "client #1", "kind": "start", "text": "process started"},
    {"t": 10.05, "actor": "feed", "kind": "resume", "text": "RESUME -1"},
    {"t": 10.06, "actor": "store", "kind": "commit", "text": "seq 0 committed, total 5"},
    {"t": 10.07, "actor": "client #1", "kind": "killed", "text": "os._exit(73) before ACK 0"},
    {"t": 10.20, "actor": "client #2", "kind": "start", "text": "process started"},
    {"t": 10.25, "actor": "feed", "kind": "resume", "text": "RESUME 0"},
    {"t": 10.26, "actor": "store", "kind": "duplicate", "text": "seq 0 already in the ledger"},
    {"t": 10.30, "actor": "client #2", "kind": "exit", "text": "exit code 0"},
]


def test_lanes_come_from_the_data_with_numbered_actors_side_by_side():
    assert timeline_svg.lanes(VENDING_TIMELINE) == ["client #1", "client #2", "feed", "store"]
    outbox = [{"t": 1, "actor": a, "kind": "x", "text": ""}
              for a in ("publisher #1", "warehouse", "source DB", "sink DB", "publisher #2")]
    assert timeline_svg.lanes(outbox) == ["publisher #1", "publisher #2", "warehouse", "source DB", "sink DB"]


def test_timeline_svg_is_well_formed_and_draws_one_lane_per_actor():
    svg = timeline_svg.svg(VENDING_TIMELINE)
    root = ET.fromstring(svg)  # well-formed XML, one <svg> element
    assert root.tag.endswith("svg")
    labels = [el.text for el in root.iter() if el.tag.endswith("text")]
    for actor in ("client #1", "client #2", "feed", "store"):
        assert labels.count(actor) == 1, actor
    assert "publisher #1" not in svg and "warehouse" not in svg  # nothing of lab 01 hard-coded
    assert "<script" not in svg


def test_the_kill_is_marked_in_its_own_row_on_its_own_lane():
    svg = timeline_svg.svg(VENDING_TIMELINE)
    assert svg.count('class="lk-kill"') == 1
    assert "os._exit(73) before ACK 0" in svg
    events = timeline_svg.rows(VENDING_TIMELINE)
    kill_row = next(i for i, e in enumerate(events) if e.kind == "killed")
    y = timeline_svg.TOP + 20 + timeline_svg.ROW * kill_row
    x = timeline_svg.LEFT + timeline_svg.LANE_WIDTH * 0.5  # client #1 is the first lane
    assert f'x1="{x - 7}" y1="{y - 7}"' in svg


def test_a_recognised_duplicate_is_highlighted():
    svg = timeline_svg.svg(VENDING_TIMELINE)
    assert svg.count('class="lk-duplicate"') == 1
    plain = [e for e in VENDING_TIMELINE if e["kind"] != "duplicate"]
    assert 'class="lk-duplicate"' not in timeline_svg.svg(plain)


def test_time_runs_downwards_even_when_events_were_recorded_out_of_order():
    shuffled = [VENDING_TIMELINE[i] for i in (3, 0, 6, 1, 2, 4, 5, 7)]
    assert [e.text for e in timeline_svg.rows(shuffled)] == [e["text"] for e in VENDING_TIMELINE]
    assert timeline_svg.svg([]) == "" and timeline_svg.render([]) == ""


def test_an_event_on_a_server_lane_is_drawn_as_a_message_from_the_one_live_process():
    events = timeline_svg.rows(VENDING_TIMELINE)
    spans = timeline_svg.lifetimes(events)
    assert spans == {"client #1": (0, 3), "client #2": (4, 7)}
    assert timeline_svg._sender(events, 1, spans) == "client #1"
    assert timeline_svg._sender(events, 6, spans) == "client #2"


def test_a_message_the_server_sent_points_back_to_the_process():
    assert timeline_svg.outgoing("[client #1] → EVENT 2 -265") and timeline_svg.outgoing("→ EVENT 0 5")
    assert not timeline_svg.outgoing("[client #1] ← ACK 0") and not timeline_svg.outgoing("POST snack-7 → applied")
    sent = [VENDING_TIMELINE[0], {"t": 10.01, "actor": "feed", "kind": "sent", "text": "→ EVENT 0 5"},
            VENDING_TIMELINE[3]]
    svg = timeline_svg.svg(sent)
    feed_x = timeline_svg.LEFT + timeline_svg.LANE_WIDTH * 1.5
    assert f'<line x1="{feed_x}"' in svg  # the arrow starts on the feed's lane


def test_a_resume_is_labelled_along_its_arrow_from_the_client_to_the_feed():
    resume = [VENDING_TIMELINE[0], {"t": 10.05, "actor": "feed", "kind": "resume", "text": "[client #1] ← RESUME 2"},
              {"t": 10.30, "actor": "client #1", "kind": "exit", "text": "exit code 0"}]
    svg = timeline_svg.svg(resume)
    labels = [el.text for el in ET.fromstring(svg).iter() if el.tag.endswith("text")]
    assert "RESUME 2" in labels and not any("←" in (t or "") or "→" in (t or "") for t in labels)
    client_x, feed_x = (timeline_svg.LEFT + timeline_svg.LANE_WIDTH * k for k in (0.5, 1.5))
    assert f'<line x1="{client_x}" y1="{timeline_svg.TOP + 20 + timeline_svg.ROW}" x2="{feed_x - 8}"' in svg
    # Where the journal line names another process than the arrow's, the line is kept whole.
    assert timeline_svg.message_label("[client #2] ← ACK 1", "client #1") == "[client #2] ← ACK 1"


# --- hints, static HTML ------------------------------------------------------------------


def test_a_hint_of_several_sentences_gives_its_first_as_the_nudge():
    case = Case("c", Outcome.WRONG, hint="Check emptiness after stripping. `'  '.strip()` is empty.")
    assert render_html.hint_levels(case) == ("Check emptiness after stripping.", "`'  '.strip()` is empty.")


def test_a_one_sentence_hint_waits_behind_a_generic_nudge_for_its_outcome():
    case = Case("c", Outcome.TIMED_OUT, hint="Look for a wait without a timeout.")
    nudge, more = render_html.hint_levels(case)
    assert nudge == render_html.NUDGE[Outcome.TIMED_OUT] and more == "Look for a wait without a timeout."


def test_static_html_opens_the_first_failing_case_with_its_specific_hint():
    step = StepVerdict(4, "pending", 1, [
        Case("ok", Outcome.PASSED),
        Case("first", Outcome.WRONG, "pending(con, 16)", "[a, b]", "[b, a]", "Use `ORDER BY seq`, never by id."),
        Case("second", Outcome.WRONG, "pending(con, 2)", "[a]", "[b]", "Unsent rows only."),
    ])
    html = render_html.render_step(step)
    # Every failing cause is a <details>; only the first one is open; its specific hint is inline
    # (tests/test_grouping.py: how cases fold by cause).
    rows = re.findall(r'<details class="lk-case"( open)?><summary><span class="lk-bad">✗</span> (\w+)', html)
    assert rows == [(" open", "first"), ("", "second")]
    assert '<div class="lk-nudge">Use <code>ORDER BY seq</code>, never by id.</div>' in html


def test_the_live_panel_opens_the_first_failing_case_only():
    from labkit.views import widgets

    step = StepVerdict(4, "pending", 1, [
        Case("ok", Outcome.PASSED), Case("first", Outcome.WRONG, "pending(con, 16)", hint="Order by seq."),
        Case("second", Outcome.WRONG, "pending(con, 2)", hint="Unsent rows only.")])
    rows = [w for w in widgets.verdict_panel(step).children if "lk-case-row" in w._dom_classes]
    shown = [(row.children[0].description.split()[-1], row.children[1].layout.display != "none") for row in rows]
    assert shown == [("first", True), ("second", False)]


def test_not_implemented_is_calm_not_red():
    step = StepVerdict(1, "validate_event", 1, [Case("a", Outcome.NOT_IMPLEMENTED, hint="Replace it.")])
    html = render_html.render_step(step, with_style=False)
    assert "not implemented yet" in html and '"lk-bad"' not in html and "#c62828" not in html and 'class="lk-step not_implemented"' in html


MISSING_ACCEPT = StepVerdict(3, "accept", 1, [
    Case(f"case {i}", Outcome.MISSING, f"accept(con, {{'id': 'x{i}'}})", "True", "the function is not defined in your module")
    for i in range(24)])


def _red(html: str) -> bool:
    html = re.sub(r"<style>.*?</style>", "", html, flags=re.S)  # the shared CSS names every colour
    return '"lk-bad"' in html or "#c62828" in html or 'class="lk-step failed"' in html or "badge failed" in html


def test_a_check_before_its_step_cell_is_grey_with_the_cell_to_run_everywhere():
    from labkit.notebook import progress as progress_mod
    from labkit.views import render_text, widgets

    saved = {"header": "import json\n", "1": "def validate_event(e): ..."}
    html = render_html.render_step(MISSING_ACCEPT, saved=saved)
    assert not _red(html) and "Run the <code>%%step 3</code> cell above first" in html
    assert "case 0" not in html  # not 24 rows of "not defined"
    text = render_text.render_step(MISSING_ACCEPT, saved=saved)
    assert "FAILED" not in text and "✗" not in text and "next: Run the `%%step 3` cell above" in text
    panel = widgets.verdict_panel(MISSING_ACCEPT, 7, saved)
    assert "not_implemented" in panel._dom_classes and "failed" not in panel._dom_classes
    state = progress_mod.load(Path("/nonexistent"), "outbox")
    state.record(LabVerdict("outbox", 7, [MISSING_ACCEPT]), saved)
    assert "3·" in state.text() and "✗" not in state.text() and "#c62828" not in state.marks_html()
    assert "Next: step 1 (validate_event)" in state.next_action()


def test_a_missing_function_is_grey_on_the_feedback_page_and_in_the_terminal():
    from labkit.views import render_text
    from labkit.views.standing import MODULE

    page = render_html.render_lab(LabVerdict("outbox", 7, [MISSING_ACCEPT]))
    assert not _red(page) and "Your module has no <code>accept</code> yet" in page and "%%step 3" in page
    cli = render_text.render_lab(LabVerdict("outbox", 7, [MISSING_ACCEPT]), MODULE)
    assert "FAILED" not in cli and "Your module has no `accept` yet: write it (step 3 of the contract)" in cli
    wrong = StepVerdict(3, "accept", 1, [MISSING_ACCEPT.cases[0], Case("x", Outcome.WRONG, "accept(con, e)", "True", "False")])
    assert _red(render_html.render_step(wrong)) and "FAILED" in render_text.render_step(wrong)


def test_small_times_are_not_printed_as_zero_seconds():
    assert render_html.seconds_text(0.04) == "40 ms" and render_html.seconds_text(2.345) == "2.3 s"


def test_a_final_verdict_ends_with_its_faults_after_timeline_and_ladder():
    evidence = Evidence(VENDING_TIMELINE, [{"rung": "cursor saved", "observed": "yes", "when": "after #1"}],
                        ["client killed before ACK 0 — exit code 73 observed"])
    html = render_html.render_step(StepVerdict("final", "the kill", 3, [Case("x", Outcome.PASSED)], evidence=evidence))
    assert html.index("<svg") < html.index("cursor saved") < html.index("exit code 73 observed")


# --- progress and quiz files ---------------------------------------------------------------


def test_progress_survives_a_restart_and_a_later_failure_reopens_a_step(tmp_path):
    state = progress.load(tmp_path, "outbox")
    assert state.passed == 0 and [s.step for s in state.steps][-1] == "final"
    state.record(LabVerdict("outbox", 1, [StepVerdict(1, "v", 1, [Case("a", Outcome.PASSED)])]))
    progress.save(tmp_path, state)
    again = progress.load(tmp_path, "outbox")  # as after a kernel restart
    assert again.passed == 1 and again.points == 1 and "1 of 9 steps passed" in again.text()
    again.record(LabVerdict("outbox", 2, [StepVerdict(1, "v", 1, [Case("a", Outcome.WRONG)])]))
    assert again.passed == 0 and "1✗" in again.text()
    progress.path(tmp_path, "outbox").write_text("{not json")
    assert progress.load(tmp_path, "outbox").passed == 0


def test_the_outbox_quiz_explains_every_option_and_has_one_right_answer_each():
    questions = quiz.load("outbox")
    assert 4 <= len(questions) <= 5
    assert len({q["id"] for q in questions}) == len(questions)
    for q in questions:
        assert sum(o["correct"] for o in q["options"]) == 1
        assert all(len(o["why"]) > 40 for o in q["options"])
    words = json.dumps(questions).lower()
    for topic in ("power", "disk", "backup", "internet", "inbox", "quarantine", "ack"):
        assert topic in words, topic


def test_answers_are_recorded_with_first_choice_and_attempts(tmp_path):
    questions = quiz.load("outbox")
    first = questions[0]
    wrong = next(i for i, o in enumerate(first["options"]) if not o["correct"])
    right = next(i for i, o in enumerate(first["options"]) if o["correct"])
    quiz.record(tmp_path, "outbox", questions, first["id"], wrong)
    quiz.record(tmp_path, "outbox", questions, first["id"], "abcd"[right])
    data = json.loads(quiz.path(tmp_path, "outbox").read_text())
    entry = data["answers"][first["id"]]
    assert (entry["choice"], entry["correct"], entry["first_correct"], entry["attempts"]) == (right, True, False, 2)
    assert data["answered"] == 1 and data["questions"] == len(questions)
    with pytest.raises(quiz.QuizError):
        quiz.record(tmp_path, "outbox", questions, "no-such-question", 0)
    with pytest.raises(quiz.QuizError):
        quiz.record(tmp_path, "outbox", questions, first["id"], "z")


# --- notebooks executed headless -------------------------------------------------------


@pytest.mark.slow
def test_nbclient_run_of_the_solved_lab_reads_as_plain_text(solved):
    nb, folder = solved
    checks = [c for c in nb.cells if "check" in c.metadata.get("labkit", {})]
    assert checks
    for cell in checks:
        text = texts(nb, cell.id)
        assert ": passed (" in text and "FAILED" not in text, text
        # Each view is a static copy (text + HTML) and a widget view; the text copy comes first.
        kinds = [set(o.get("data", {})) for o in cell.outputs]
        assert {TEXT, HTML} <= kinds[0] and WIDGET in kinds[1], kinds
    final = texts(nb, checks[-1].id)
    assert "crash timeline" in final and "✕ KILLED" in final and "◆ DUPLICATE RECOGNISED" in final
    assert "evidence ladder" in final and "sent saved" in final
    assert final.rstrip().splitlines()[-2].startswith("    - ")  # the faults come last, then the seed
    setup = next(c for c in nb.cells if c.metadata.get("labkit", {}).get("setup"))
    total = len(checks)
    assert f"{total} of {total} steps passed" in texts(nb, setup.id)  # updated in place by each check
    saved = json.loads((folder / "work" / "progress-outbox.json").read_text())
    assert saved["passed"] == saved["total"] == total
    assert (folder / "work" / "last-final-outbox.json").exists()


@pytest.mark.slow
def test_nbclient_run_of_a_wrong_pending_shows_the_failing_case_and_its_hint(wrong):
    nb, _ = wrong
    text = texts(nb, "outbox-check-4")
    assert "Step 4 — pending: FAILED" in text
    assert "✗ limit 16 with 18 pending" in text and "ORDER BY seq" in text
    assert "note: This step builds on step 4" in texts(nb, "outbox-check-7")
    setup = next(c for c in nb.cells if c.metadata.get("labkit", {}).get("setup"))
    assert "7 of 9 steps passed" in texts(nb, setup.id)


@pytest.mark.slow
def test_html_export_shows_verdicts_and_timeline_without_a_kernel(solved):
    from nbconvert import HTMLExporter

    nb, _ = solved
    html, _ = HTMLExporter().from_notebook_node(nb)
    # nbclient saved the widget state, so nbconvert renders each widget view as a script for the
    # network's widget manager; the static copy next to it is what reads without JavaScript.
    assert "application/vnd.jupyter.widget-state+json" in html
    assert html.count('class="lk-static lk-pair"') >= 10
    static = html.split('class="lk-static lk-pair"', 1)[1]
    assert "Final check — the crash after the ACK" in static
    assert "killed by the judge at the hook (SIGKILL)" in static
    assert re.search(r"<svg[^>]*class=\"lk-timeline\"", static)  # attributes in any order
    assert "Faults injected and seen to take effect" in static
    assert html.count('<span class="lk-badge passed">passed</span>') >= 9


@pytest.mark.slow
def test_the_start_here_notebook_runs_its_warm_up(tmp_path):
    nb = execute(solved_notebook(START, tmp_path), tmp_path)
    text = texts(nb, "start-here-check-1")
    assert "Step 1 — normalize_sku: passed (1/1 points)" in text
    skeleton = execute(build.student_notebook(build.parse(START)), tmp_path / "skeleton", allow_errors=True)
    assert "not implemented yet" in texts(nb=skeleton, cell_id="start-here-check-1")
    scratch = next(c for c in skeleton.cells if c.cell_type == "code" and "normalize_sku(" in c.source
                   and "%%step" not in c.source)
    # The scratch cell says calmly that the function is still the skeleton: no red on Run All.
    assert not [o for o in scratch.outputs if o.output_type == "error"]
    assert "still the skeleton" in "".join(o.get("text", "") for o in scratch.outputs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
