"""Failing cases folded by root cause (labkit.views.grouping), and hints that never contradict
how a case ended: on crafted verdicts, and over the catalogue of wrong solutions.

The catalogue test reads the verdicts tests/catalogue.py caches (seed 1, each file's promised
step): in a full run, tests/test_catalogue_seeds.py has computed them already, so it costs
next to nothing; alone it runs each file's promised step once (~1 s a file).
"""

from __future__ import annotations

import re

import pytest
from catalogue import every_wrong_file, promise, step_verdicts, wrong_file

from labkit.judge.differential import NOT_JUDGED
from labkit.judge.verdict import Case, Outcome, StepVerdict
from labkit.views import grouping, render_html, render_text
from labkit.views.grouping import groups, shape, title

# --- crafted verdicts -------------------------------------------------------------------


def case(name, outcome=Outcome.WRONG, got="returned True", clause="8.x", hint="", expected="DeliveryError", called="f()"):
    return Case(name, outcome, called, expected, got, hint, clauses=(clause,) if clause else ())


def proxy_like() -> StepVerdict:
    """A send_http behind a proxy: one case names the cause, 30 others (8 clauses) return True."""
    cases = [case("localhost is allowed", Outcome.PASSED, "", clause="8.host"),
             case("a 200 ACK", got="the request went to the proxy named in http_proxy", clause="8.no-proxy",
                  hint="Build the opener with `ProxyHandler({})`.", expected="True")]
    cases += [case(f"status {200 + i} is not an ACK", clause=f"8.rule-{i % 8}", hint=f"Rule {i % 8}.")
              for i in range(1, 31)]
    cases += [case("no reply within the timeout", got="returned True after the server's 1.5 s", clause="8.timeout"),
              case("generated addresses", Outcome.NOT_REACHED, NOT_JUDGED, clause="")]
    return StepVerdict(8, "send_http", 2, cases)


def test_shape_replaces_quoted_values_numbers_ids_and_bracketed_values():
    assert shape("returned 'a-1x'") == shape("returned 'b-9z'") == "returned '…'"
    assert shape("z-8txm5r was already sent = 1") == shape("c-buoeqo was already sent = 1")
    assert shape("returned [(92558, 1001), (92559, -144)]") == shape("returned [(1, 2)]") == "returned …"
    assert shape("returned True") != shape("returned False")


def test_one_cause_is_one_row_and_the_case_naming_it_comes_first():
    found = groups(proxy_like())
    assert [(g.lead.name, len(g.rest)) for g in found] == [
        ("a 200 ACK", 0), ("no reply within the timeout", 0), ("status 201 is not an ACK", 29),
        ("generated addresses", 0)]  # the symptom 8 clauses share comes after the rows about one
    assert found[2].shared and not found[0].shared and found[-1].quiet


def test_cases_of_one_clause_with_one_message_fold_and_other_messages_do_not():
    step = StepVerdict(7, "dispatch", 1, [
        case(f"limit {n}", got=f"z-{n}abcde was already sent = 1 while send was still running", clause="7.mark")
        for n in range(1, 6)] + [case("other", got="send was called 2 times", clause="7.mark")])
    assert [len(g.cases) for g in groups(step)] == [5, 1]


def test_a_case_that_did_not_run_is_never_first_and_a_hang_comes_after_a_wrong_value():
    step = StepVerdict(1, "f", 1, [
        case("first", Outcome.NOT_REACHED, "not run: an earlier case in this step hung", clause=""),
        case("slow", Outcome.TIMED_OUT, "no answer within 2 s; the process was killed", clause="1.a"),
        case("wrong", got="returned 3", clause="1.b")])
    assert [g.lead.name for g in groups(step)] == ["wrong", "slow", "first"]


def test_a_name_that_only_names_an_input_shows_what_is_asserted():
    assert title(case("limit 0", expected="ValueError, nothing read or changed")) == \
        "limit 0 → ValueError, nothing read or changed"
    assert title(case("owner of 1 character", expected="refused with ValueError")) == \
        "owner of 1 character → refused with ValueError"
    assert title(case("status 201 is not an ACK")) == "status 201 is not an ACK"
    long = "True; " + "x" * 80
    assert title(case("a 200 ACK", expected=long)) == "a 200 ACK → True"


def test_every_view_folds_the_same_way():
    from labkit.views import widgets

    step = proxy_like()
    html = render_html.render_step(step, with_style=False)
    assert html.count('<details class="lk-case"') == 4 and html.count(' open>') == 1
    assert '<details class="lk-same"><summary>29 more fail the same way</summary>' in html
    # the lead's specific hint is inline, with its code span, not behind "more help"
    assert "more help" not in html and "Build the opener with <code>ProxyHandler({})</code>." in html
    assert html.index("a 200 ACK") < html.index("no reply") < html.index("status 201") < html.index("generated addresses")
    text = render_text.render_step(step)
    assert "+ 29 more fail the same way" in text and text.count("✗") == 3
    assert "Build the opener with `ProxyHandler({})`." in text  # Markdown left as is in plain text
    rows = [w for w in widgets.verdict_panel(step).children if "lk-case-row" in w._dom_classes]
    assert len(rows) == 4
    assert len(rows[0].children) == 2 and rows[2].children[2].description == "▸ 29 more fail the same way"
    assert rows[0].children[1].layout.display != "none" and rows[2].children[1].layout.display == "none"
    rows[2].children[2].click()
    assert rows[2].children[3].layout.display != "none" and "status 230 is not an ACK" in rows[2].children[3].value


def test_whitespace_in_values_is_shown_and_never_collapses():
    spaces = render_html.visible("returned '   '")
    assert spaces.count('class="lk-ws"') == 3 and "␣" in spaces
    assert render_html.visible("'a b'").count("lk-ws") == 0  # one space inside a word: nothing to show
    assert render_html.visible("' x'").count("lk-ws") == 1 and render_html.visible("'x\t'").count("⇥") == 1
    assert render_html.visible("don't do it 'x'").count("lk-ws") == 0  # an apostrophe is no quote
    html = render_html.render_step(StepVerdict(1, "f", 1, [
        case("sku '   ' is refused", got="returned {'sku': '   '}", expected="ValueError")]), with_style=False)
    assert html.count('title="a space"') == 6 and render_html.LEGEND in html
    assert "white-space:pre-wrap" in render_html.STYLE.split(".lk-v{")[1].split("}")[0]


# --- hints that match how the case ended -----------------------------------------------


def contradictions(step: StepVerdict, one: Case) -> list[str]:
    """What the student is told about `one` (the generic nudge, and what did-not-run cases say)
    that its outcome contradicts. The rule table: outcome → phrases it forbids."""
    said = render_html.nudge(one) + " | " + (one.got if one.outcome is Outcome.NOT_REACHED else "")
    hung = any(c.outcome is Outcome.TIMED_OUT for c in step.cases)
    rules = []
    if one.outcome is not Outcome.TIMED_OUT and not (one.outcome is Outcome.NOT_REACHED and hung):
        rules += [r"\bhung\b", "did not answer in time"]
    if one.outcome is Outcome.NOT_REACHED and NOT_JUDGED in one.got:
        rules += [r"\bhung\b", "ended the process"]
    raised = re.search(r"\braised (\w+)", one.got)
    if one.outcome is Outcome.RAISED and raised and re.search(rf"\b{raised.group(1)}\b", one.expected):
        rules += ["does not call for"]
    if one.outcome is Outcome.WRONG:
        rules += ["Your code raised", "your traceback"]
    if one.outcome is not Outcome.DIED and not (one.outcome is Outcome.NOT_REACHED and "ended" in one.got):
        rules += ["ended before it could report"]
    return [f"{one.name}: [{one.outcome}] says {rule!r}: {said[:160]}" for rule in rules if re.search(rule, said)]


def test_a_not_judged_case_never_says_an_earlier_case_hung():
    step = proxy_like()
    assert contradictions(step, step.cases[-1]) == []
    assert render_html.nudge(step.cases[-1]) != render_html.HUNG_EARLIER


def test_raising_the_very_exception_the_contract_calls_for_is_not_called_uncalled_for():
    own = case("fault() raises", Outcome.RAISED, "raised OSError: boom (a new object)",
               expected="that same OSError object re-raised; the transaction rolled back")
    assert "does not call for" not in render_html.nudge(own) and "OSError" in render_html.nudge(own)
    other = case("x", Outcome.RAISED, "raised KeyError: 'a'", expected="ValueError")
    assert "where the contract calls for ValueError" in render_html.nudge(other)
    plain = case("x", Outcome.RAISED, "raised KeyError: 'a'", expected="True")
    assert render_html.nudge(plain) == render_html.NUDGE[Outcome.RAISED]


# --- over the catalogue of wrong solutions ------------------------------------------------

K = 3  # rows (causes) a wrong solution may show for its one mistake, besides cases that did not run
WRONG = every_wrong_file()
# Files whose first row is about a sibling clause of the same mistake, with why that is right.
SIBLING_FIRST = {
    "outbox:accept_body_as_given": "storing the body as given is caught first by the stored body itself "
                                   "(3.canonical-body: 'outbox.body is … not …', hint: store the canonical body); "
                                   "the repeat refused as a conflict (3.same-content) is its second row",
    "relay:redrive_sent_rows": "'a quarantined and a sent row' (7.all-or-nothing) returns 2 for the same reason "
                               "'a sent row' returns 1: one row, the check's first case, '1 more' is 7.never-sent",
}


# Measured over the whole catalogue (seed 1, the promised step): 309 of 337 files of labs 01-03
# meet every rule below; these 28 do not yet, nor 5 of lab 04's 60 (more than K rows, a first row
# about a neighbouring clause, or one "does not call for" hint on an expected error). Each is a strict xfail: when the grouping
# gets one right, its test fails until it is taken off this list.
KNOWN_MISSES = {
    "outbox:ack_subscripted",
    "outbox:connects_before_checking",
    "outbox:dispatch_claims_batch_first",
    "outbox:dispatch_marks_only_the_last",
    "outbox:id_class_range_bug",
    "outbox:network_error_as_delivery_error",
    "outbox:receive_body_as_given",
    "outbox:send_error_wrapped",
    "outbox:url_parts_only",
    "outbox:wrong_id_ack",
    # lab 04, measured when it joined the course: each fails several of its step's cases in
    # ways the grouping does not yet fold (a wrong body is also a wrong comparison; an ACK before
    # the commit fails the hook, dead-letter and failure cases; a save before XADD fails all four).
    "pipeline:accept_body_not_canonical",
    # an accept without validation fails the invalid events four ways (True, a type error, a
    # KeyError for the event without qty, a list index error), and shapes of `got` do not fold
    "pipeline:accept_skips_validation",
    "pipeline:claim_without_for_update",
    "pipeline:consume_acks_before_commit",
    "pipeline:publish_saves_before_xadd",
    "relay:claim_never_commits",
    "relay:claim_orders_by_id",
    "relay:claim_steals_live_leases",
    "relay:claim_takes_token_when_empty",
    "relay:claim_token_in_python",
    "relay:claim_token_per_row",
    "relay:complete_checks_the_clock",
    "relay:redrive_counts_one_attempt",
    "relay:relay_after_claim_after_send",
    "relay:relay_stops_at_permanent_error",
    "vending:ack_before_commit",
    "vending:connect_before_store",
    "vending:gap_is_a_value_error",
    "vending:int_checks_the_digits",
    "vending:limit_zero_accepted",
    "vending:timeout_checked_late",
    "vending:validates_what_it_returns",}


# Missed in one run and met in another (a relay race decides which case fails first).
VARIES = {"relay:relay_claims_at_wall_clock"}


def _params():
    for lab, path in WRONG:
        name = f"{lab}:{path.stem}"
        marks = [pytest.mark.xfail(strict=True, reason="a known miss of the grouping")] if name in KNOWN_MISSES else []
        if name in VARIES:
            marks = [pytest.mark.xfail(strict=False, reason="its first failing case depends on a race")]
        yield pytest.param(lab, path, id=name, marks=marks)


def about(group: grouping.Group, said: dict[str, str]) -> bool:
    """The group is the promised mistake's: its lead is tagged with the promised clause, or the
    group holds it and the lead already shows the promised message."""
    return said["clause"] in group.lead.clauses or (said["clause"] in group.clauses and said["message"] in group.lead.message)


@pytest.mark.parametrize(("lab", "path"), list(_params()))
def test_a_wrong_solution_shows_its_mistake_first_in_few_rows_with_fitting_hints(lab, path):
    said = promise(path)
    step = step_verdicts(lab, path, [said["step"]], seed=1)[said["step"]]
    assert not step.passed, f"{path.name} passes step {said['step']} (tests/test_catalogue_seeds.py says more)"
    found = groups(step)
    loud = [g for g in found if not g.quiet]
    rows = [f"{g.lead.name} {g.clauses} +{len(g.rest)}" for g in found]
    assert len(loud) <= K, f"{len(loud)} rows for one mistake: {rows}"
    name = f"{lab}:{path.stem}"
    if name in SIBLING_FIRST:
        assert any(said["clause"] in g.clauses for g in loud), rows
    else:
        assert about(found[0], said), f"first row is not about {said['clause']}: {rows}"
    bad = [problem for one in step.cases if not one.passed for problem in contradictions(step, one)]
    assert bad == [], bad


def test_every_sibling_first_file_exists():
    assert sorted(set(SIBLING_FIRST) - {f"{lab}:{p.stem}" for lab, p in WRONG}) == []
    assert sorted((KNOWN_MISSES | VARIES) - {f"{lab}:{p.stem}" for lab, p in WRONG}) == []


def test_validate_event_cases_show_each_call_as_a_call():
    path = wrong_file("outbox", "bool_qty")
    step = step_verdicts("outbox", path, ["1"], seed=1)["1"]
    several = [c.called for c in step.cases if "calls)" in c.name]
    assert several and all(re.fullmatch(r"validate_event\(.*\)(; validate_event\(.*\))+(; …)?", c) for c in several), several
    assert not [c for c in several if re.search(r"\}, \{", c)], several
