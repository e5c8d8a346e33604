"""A step's failing cases folded by root cause: one row per cause, the mistake's own row first.

One mistake often fails many cases the same way: a `send_http` that honours `http_proxy`
makes every one of ~50 reply cases return True (the proxy answers them all), a `dispatch` that
marks before sending fails 22 cases with one message. Shown case by case, that is a wall of
red in which the row that names the mistake is one of many. `groups(step)` is the one place
that decides what folds together and in which order; the text, HTML and widget views all
render its result, so a terminal, an exported notebook, the grader's feedback page and the
live panel agree.

What folds: failing cases that ended alike (returned or raised where the contract says
otherwise count as one kind; a timeout, a death, a case that did not run are each their own)
with a `got` of the same *shape* (`shape`: quoted values, numbers, ids and bracketed values
replaced, so "returned 'a-1x'" and "returned 'b-9z'" are one shape), whatever clauses they are
about: a symptom such as "returned True" seen by cases about many rules is one cause seen many
times, not many mistakes. A `got` too short to say anything folds only with cases of its clauses and its hint. A
group is led by its first case about a single clause, shown in full with its specific hint;
the others are "N more fail the same way".

The order, so the group about the mistake comes first: groups of cases that did not run
(not judged, not reached) last; then a timeout or a death after the others (often the
consequence of an earlier wrong step); then a symptom shared by cases about SYMPTOM_CLAUSES or
more clauses after a group about one or two (the shared one follows from a cause); then the
check's own order (checks try the basic rules first). Measured on a quarter of the catalogue
of wrong solutions (84 files, seed 1, the promised step): 324 failing rows → 130 groups. Over
the whole catalogue, 309 of 337 files show at most 3 rows with the promised clause's first
(tests/test_grouping.py lists the 28 others as known misses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.judge.verdict import Case, Outcome, StepVerdict

# Cases that say nothing about the code by themselves: never the first row.
QUIET = (Outcome.NOT_REACHED, Outcome.NOT_IMPLEMENTED, Outcome.MISSING)
# Outcomes that often follow from another mistake (a hang after a wrong step, the process gone).
LATE = (Outcome.TIMED_OUT, Outcome.DIED, Outcome.MEMORY_LIMIT)

_QUOTED = re.compile(r"""b?'(?:[^'\\\n]|\\.)*'|b?"(?:[^"\\\n]|\\.)*\"""")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?(?:\d[\d_,]*(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)(?![A-Za-z_])")
# generated ids: ok-s91l10, c-buoeqo (a short prefix, a dash, six letters or digits), or any word-dash-word with a digit
_ID = re.compile(r"\b[a-z]{1,3}-[a-z0-9]{6}\b|\b[a-z]+-[a-z0-9]*\d[a-z0-9]*\b")
_SPACE = re.compile(r"\s+")
_BRACKETS = re.compile(r"[(\[{][^()\[\]{}]*[)\]}]")
# A group whose cases are about this many clauses shows a symptom that many rules share (every
# reply case "returned True" behind a proxy): it follows from the cause, and comes after it.
SYMPTOM_CLAUSES = 3
# A shape this short carries no cause of its own across clauses ("returned None" does; "" does not).
MIN_SHARED_SHAPE = 6


def shape(text: str) -> str:
    """`text` with its particulars replaced: quoted values → '…', numbers → #, ids → ID, and a
    bracketed value (a list, dict, tuple, of any length) → …"""
    text = _QUOTED.sub("'…'", text or "")
    text = _ID.sub("ID", text)
    text = _NUMBER.sub("#", text)
    while True:
        inner = _BRACKETS.sub("…", text)
        if inner == text:
            break
        text = inner
    return _SPACE.sub(" ", text).strip()


@dataclass
class Group:
    """Failing cases with one cause: `lead` is shown in full, `rest` as "N more fail the same way"."""

    cases: list[Case]
    index: int  # the lead's position in the step's cases
    shared: bool = False  # its symptom is shown by cases about several clauses (downstream of a cause)

    @property
    def lead(self) -> Case:
        return self.cases[0]

    @property
    def rest(self) -> list[Case]:
        return self.cases[1:]

    @property
    def clauses(self) -> tuple[str, ...]:
        seen: list[str] = []
        for case in self.cases:
            seen += [c for c in case.clauses if c not in seen]
        return tuple(seen)

    @property
    def quiet(self) -> bool:
        return all(c.outcome in QUIET for c in self.cases)

    def more_text(self) -> str:
        """"3 more fail the same way" (or "" for a group of one)."""
        n = len(self.rest)
        return f"{n} more fail{'s' if n == 1 else ''} the same way" if n else ""


# A call that returned the wrong thing and one that raised where it should not can show the same
# `got` for the same cause (a row already marked while send ran): both are "ran and broke a rule".
_KIND = {Outcome.WRONG: "ran", Outcome.RAISED: "ran"}


def _key(case: Case) -> tuple:
    return _KIND.get(case.outcome, str(case.outcome)), shape(case.got)


def groups(step: StepVerdict) -> list[Group]:
    """The failing cases of `step`, folded by cause and ordered: the mistake's own group first."""
    failing = [(i, c) for i, c in enumerate(step.cases) if not c.passed]
    # 1. by (outcome, shape of got): what the student saw
    by_key: dict[tuple, list[tuple[int, Case]]] = {}
    for index, case in failing:
        key = _key(case)
        if case.outcome in QUIET or len(key[1]) >= MIN_SHARED_SHAPE:
            by_key.setdefault(key, []).append((index, case))
        else:  # nothing to compare: fold only with the same clauses and the same hint
            by_key.setdefault(key + (case.clauses, case.hint), []).append((index, case))
    found = []
    for members in by_key.values():
        clauses = {c for _, case in members for c in case.clauses}
        members.sort(key=lambda m: (_telling(m[1]), m[0]))
        found.append(Group([c for _, c in members], members[0][0], len(clauses) >= SYMPTOM_CLAUSES))
    found.sort(key=_rank)
    return found


def _telling(case: Case) -> int:
    """Within a group: a case of one clause before a case of several (its hint is the specific one)."""
    return 0 if len(case.clauses) <= 1 else 1


def _rank(group: Group) -> tuple:
    lead = group.lead
    return (group.quiet, lead.outcome in LATE, group.shared, group.index)


# Words that make a case name an assertion ("… is refused", "limit caps the answer"); a name
# without any only names an input ("limit 0", "same id, another qty").
_ASSERTS = re.compile(
    r"\b(is|are|was|were|isn't|aren't|not|no|never|only|accepted|refused|rejected|raises?|returns?|must|"
    r"keeps?|stays?|agrees?|gets?|comes?|goes?|fails?|sends?|marks?|claims?|applies|answers?|takes?|"
    r"ends?|holds?|left|closes?|closed|dies|survives?|waits?|reads?|writes?|commits?|rolls?|sees?|"
    r"counts?|caps?|wins?|loses?|skips?|still|each|every)\b|→", re.I)
TITLE_EXPECTED = 60  # characters of `expected` a title may carry


def title(case: Case) -> str:
    """The case's name, and what it asserts when the name only names an input:
    "limit 0" → "limit 0 → ValueError, nothing read or changed"."""
    name = case.name
    expected = " ".join((case.expected or "").split())
    if not expected or _ASSERTS.search(name) or "\n" in (case.expected or "").strip():
        return name
    if len(expected) > TITLE_EXPECTED:
        expected = expected.split(";")[0].strip()
    return name if len(expected) > TITLE_EXPECTED or not expected else f"{name} → {expected}"


def rule(case: Case) -> str:
    """The rule a failing case caught, by the name the lesson's "What the check tries" lists it under."""
    if case.passed or not case.clauses:
        return ""
    return ", ".join(case.clauses) + " (listed in the lesson under “What the check tries”)"


def summary(step: StepVerdict) -> list[tuple[Case, int]]:
    """(lead case, how many more) per group, in order: what every view shows."""
    return [(g.lead, len(g.rest)) for g in groups(step)]
