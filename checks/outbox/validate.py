"""Step 1 of lab `outbox`: validate_event, every rule of the event's grammar, every kind of near-miss."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from checks.outbox import schema as stores
from checks.outbox.common import (
    BOOL_HINT,
    INPUT_HINT,
    Check,
    event,
    listing,
    outcome_text,
)
from checks.outbox.inputs import (
    INT_LOOKALIKES,
    LETTERS_DIGITS,
    NAME_REST,
    NON_ASCII,
    NON_ASCII_SHOWN,
    PUNCTUATION,
    SPACES,
    char_name,
)
from labkit.judge.expect import (
    Miss,
    Plan,
    under,
)
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case
from labkit.values import decode, encode, same, show


@dataclass(frozen=True)
class Try:
    """One call inside a step-1 case: an input, whether the contract accepts it, what it is."""

    value: Any
    accept: bool
    note: str = ""
    wrap: str = ""  # the child passes `value` wrapped so (outbox_probes.WRAPS): a mapping that is not a dict


def _each_call(tries: list[Try], hint: str) -> Check:
    def check(record: dict) -> Miss | None:
        calls = record["observed"].get("calls", [])
        if len(calls) != len(tries):
            return Miss(f"only {len(calls)} of {len(tries)} calls came back", "Each call must return or raise.")
        for one, call in zip(tries, calls, strict=True):
            outcome = call["outcome"]
            shown = f"{one.wrap}({show(one.value, 90)})" if one.wrap else show(one.value, 100)
            label = f"validate_event({shown})" + (f" [{one.note}]" if one.note else "")
            if call.get("input_changed"):
                return Miss(f"{label} modified the dict passed in", INPUT_HINT, clause="1.input-unchanged")
            if one.accept:
                if outcome["kind"] != "returned" or not same(decode(outcome["value"]), one.value):
                    return Miss(f"{label} {outcome_text(outcome)}", hint)
                if call.get("returned_input"):
                    return Miss(f"{label} returned the very dict it was given",
                                "Return a *new* dict: the caller may change it later.", clause="1.returns-new")
            elif outcome["kind"] != "raised" or "ValueError" not in outcome.get("mro", []):
                return Miss(f"{label} {outcome_text(outcome)}", hint)
        return None

    return check


def _name_cases(field: str, longest: int, base: dict) -> list[tuple]:
    """Every rule of the id/sku grammar, both sides of every bound, every kind of near-miss."""

    def e(value):
        return {**base, field: value}

    def refuse(values, note=""):
        return [Try(e(v), False, note(v) if callable(note) else note) for v in values]

    def accept(values):
        return [Try(e(v), True) for v in values]

    full = ("Z._-" + LETTERS_DIGITS * 2)[:longest]  # allowed characters of every kind, the longest length
    grammar = f"{field}: an ASCII letter or digit first, then letters, digits, '.', '_' or '-'"
    return [
        (f"1.{field}-type", f"{field} of another type (int, bytes, None, list, float: 5 calls)",
         refuse([7, field.encode(), None, [base[field]], 7.5]), f"{field} must be a str: refuse anything else."),
        (f"1.{field}-min", f"{field} is empty (refused) or one character long (accepted): 2 calls",
         refuse([""]) + accept(["a"]),
         f"{field} has 1 to {longest} characters: '' is refused, one character is fine."),
        (f"1.{field}-max", f"{field} has {longest} characters (accepted); {field} has {longest + 1} characters or "
                           "more (refused): 5 calls",
         accept(["a" * longest, full]) + refuse(["a" * (longest + 1), full + "x", "a" * 10_000]),
         f"{field} has at most {longest} characters; exactly {longest} is fine."),
        (f"1.{field}-ascii", f"{field} with a letter or digit of another script, first or later "
                             f"({NON_ASCII_SHOWN}: {2 * len(NON_ASCII)} calls)",
         [t for c in NON_ASCII for t in refuse([c + "snack", "sn" + c + "ck"], char_name(c))],
         "`isalnum()`, `isdigit()`, `\\w` and `\\d` accept letters of every alphabet, and `[a-z]` with "
         "re.IGNORECASE matches the Kelvin sign: use ASCII ranges without IGNORECASE, or check `isascii()`."),
        (f"1.{field}-first", f"{field} starting with '.', '_' or '-' (refused), with each ASCII letter or digit "
                             f"(accepted): {3 + len(LETTERS_DIGITS)} calls",
         refuse([".snack", "_snack", "-snack"]) + accept([c + "x" for c in LETTERS_DIGITS]),
         f"The first character of {field} must be an ASCII letter or digit. {grammar}."),
        (f"1.{field}-rest", f"{field} with each allowed character after the first (accepted) and each other "
                            f"ASCII punctuation character (refused): {len(NAME_REST) + len(PUNCTUATION)} calls",
         accept(["x" + c for c in NAME_REST]) + refuse(["a" + c + "b" for c in PUNCTUATION], lambda v: repr(v[1])),
         f"Only letters, digits, '.', '_' and '-' after the first character: {grammar}. A class like "
         "`[.-_]` or `[A-z]` is a range that lets in more than it shows."),
        (f"1.{field}-space", f"{field} with whitespace or a control character at the start, in the middle or at "
                             f"the end ({len(SPACES)} kinds: {3 * len(SPACES)} calls)",
         [t for c in SPACES for t in refuse([c + "snack", "sn" + c + "ack", "snack" + c], char_name(c))],
         "No whitespace of any kind: `strip()`/`split()` remove more than spaces (\\x0b, \\x1c, \\x85, \\xa0, "
         "\\u2028…), and the contract refuses the value, it does not clean it."),
        (f"1.{field}-newline", f"{field} ending with a newline (1 call)", refuse(["snack\n"]),
         "`re.match(r'...$')` also matches before a final newline: use `re.fullmatch` or end the pattern with `\\Z`."),
    ]


def check_validate(ctx: StepContext) -> list[Case]:
    base = event("snack-7", "Snack", 7)  # a capital: a result that changes case shows
    pairs = [(k, v) for k, v in base.items()]
    groups: list[tuple] = [
        ("1.returns-equal", "a plain event (1 call)", [Try(base, True)],
         "A valid event comes back as a new dict with the same three keys and values."),
        ("1.event-dict", "not a dict (None, a list of pairs, a JSON string, a tuple, an int, a MappingProxyType "
                         "and a UserDict of a valid event: 7 calls)",
         [Try(v, False) for v in (None, pairs, stores.canonical(base), tuple(pairs), 7)]
         + [Try(base, False, "a mapping, not a dict", wrap) for wrap in ("MappingProxyType", "UserDict")],
         "An event must be a dict: test `type(event) is dict`; another Mapping (MappingProxyType, UserDict) is "
         "ValueError too."),
        ("1.keys-missing", "a key missing (no id, no sku, no qty, no keys: 4 calls)",
         [Try({k: v for k, v in base.items() if k != gone}, False, f"no {gone}") for gone in ("id", "sku", "qty")]
         + [Try({}, False)], "All three keys are required; a missing one is ValueError (not KeyError)."),
        ("1.keys-extra", "an extra key ('note', 'ID', the int 1: 3 calls)",
         [Try({**base, extra: "x"}, False) for extra in ("note", "ID", 1)],
         "Exactly the keys id, sku and qty: an extra key is an error, not something to drop "
         "(and keys need not be strings, so don't sort them)."),
    ]
    groups += _name_cases("id", 64, base)
    groups += _name_cases("sku", 32, base)
    groups += [
        ("1.qty-bool", "qty True and False (2 calls)", [Try({**base, "qty": b}, False) for b in (True, False)],
         BOOL_HINT),
        ("1.qty-type", f"qty as a float (5.0, 1000.0, 1.5, nan, inf, -0.0), as text ({listing(map(repr, INT_LOOKALIKES))}), "
                       f"None or a list: {6 + len(INT_LOOKALIKES) + 2} calls",
         [Try({**base, "qty": q}, False) for q in (5.0, 1000.0, 1.5, float("nan"), float("inf"), -0.0,
                                                   *INT_LOOKALIKES, None, [5])],
         "qty must be an int: don't convert (`int('٧')` is 7, `int(' 7')` too) and don't accept floats."),
        ("1.qty-min", "qty 1 (accepted), 0, -1 and -1000 (refused): 4 calls",
         [Try({**base, "qty": 1}, True)] + [Try({**base, "qty": q}, False) for q in (0, -1, -1000)],
         "qty ranges from 1 to 1000, both ends included."),
        ("1.qty-max", "qty 1000 (accepted), 1001, 10**6, 2**63 and 10**100 (refused): 5 calls",
         [Try({**base, "qty": 1000}, True)] + [Try({**base, "qty": q}, False) for q in (1001, 10**6, 2**63, 10**100)],
         "qty ranges from 1 to 1000, both ends included."),
    ]
    plans, specs = [], []
    for clause, label, tries, hint in groups:
        verb = "each accepted" if all(t.accept for t in tries) else "ValueError for each" if not any(
            t.accept for t in tries) else "accepted or ValueError as labelled"
        # one call per input, shown as separate calls: `validate_event(a); validate_event(b); …`
        called = "; ".join(f"validate_event({show(t.value, 60)})" for t in tries[:2]) + ("; …" if len(tries) > 2 else "")
        plans.append(Plan(label, called, verb, under(clause, _each_call(tries, hint)), hint, clauses=(clause,)))
        specs.append({"name": label, "inputs": [encode(t.value) for t in tries], "wraps": [t.wrap for t in tries]})
    for plan in plans:  # every call also checks these two: the case says so
        if plan.clauses[0] == "1.returns-equal":
            plan.clauses += ("1.returns-new", "1.input-unchanged")
    hints = {clause: hint for clause, _label, _tries, hint in groups}
    from labkit.judge.differential import after_fixed

    return after_fixed(lambda: ctx.cases("validating", plans, {"cases_spec": specs}), PROPERTY_NAME,
                       "validate_event on 150 generated events", lambda: _validate_property(ctx, hints))


PROPERTY_NAME = "validate_event agrees with the contract on 150 generated events"


def _validate_property(ctx: StepContext, hints: dict[str, str]) -> list[Case]:
    """Hypothesis draws events near every rule; the student's answer is compared with the
    judge-side oracle's, and a disagreement is shrunk to its smallest form."""
    from checks.outbox.oracle import validate_event as oracle
    from checks.outbox.oracle import violation
    from labkit.judge.differential import differential

    def clause_of(value) -> tuple[str, str]:
        clause = violation(value) or _nearest_bound(value)
        return clause, hints.get(clause, "A valid event comes back as a new dict with the same keys and values.")

    return differential(ctx, "validate_event", _event_strategy(), oracle, clause_of=clause_of,
                        clauses=tuple(hints), unchanged="1.input-unchanged", name=PROPERTY_NAME)


def _nearest_bound(event: dict) -> str:
    """For a valid event the student refused: the rule whose edge it sits on."""
    for field, longest in (("id", 64), ("sku", 32)):
        if len(event[field]) == longest:
            return f"1.{field}-max"
        if len(event[field]) == 1:
            return f"1.{field}-min"
        if event[field][0] in string.digits + string.ascii_uppercase:
            return f"1.{field}-first"
        if any(c in "._-" for c in event[field]):
            return f"1.{field}-rest"
    return {1: "1.qty-min", 1000: "1.qty-max"}.get(event["qty"], "1.returns-equal")


def _event_strategy():
    """Valid events, and valid events with one field off by one rule (every rule reachable)."""
    from hypothesis import strategies as st

    def name(longest):
        return st.builds(lambda first, rest: first + rest, st.sampled_from(LETTERS_DIGITS),
                         st.text(alphabet=NAME_REST, max_size=longest - 1))

    odd = st.sampled_from(SPACES + NON_ASCII + PUNCTUATION + ["\n"])

    def broken_name(longest):
        return st.one_of(
            st.just(""),
            name(longest).map(lambda v: (v * (longest // len(v) + 2))[: longest + 1]),
            st.tuples(name(longest), odd, st.integers(0, longest)).map(lambda t: t[0][: t[2]] + t[1] + t[0][t[2]:]),
            st.tuples(st.sampled_from("._-"), name(longest - 1)).map("".join),
            st.one_of(st.integers(), st.binary(max_size=4), st.none(), st.lists(st.text(max_size=3), max_size=2)),
        )

    valid = st.fixed_dictionaries({"id": name(64), "sku": name(32), "qty": st.integers(1, 1000)})
    bad_qty = st.one_of(st.integers(max_value=0), st.integers(min_value=1001), st.booleans(),
                        st.floats(), st.text(max_size=4), st.none())
    events = st.one_of(
        valid,
        st.tuples(valid, broken_name(64)).map(lambda t: {**t[0], "id": t[1]}),
        st.tuples(valid, broken_name(32)).map(lambda t: {**t[0], "sku": t[1]}),
        st.tuples(valid, bad_qty).map(lambda t: {**t[0], "qty": t[1]}),
        st.tuples(valid, st.sampled_from(["id", "sku", "qty"])).map(lambda t: {k: v for k, v in t[0].items() if k != t[1]}),
        st.tuples(valid, st.one_of(st.text(min_size=1, max_size=5), st.integers())).map(
            lambda t: {**t[0], **({t[1]: 1} if t[1] not in t[0] else {"note": 1})}),
        st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3)),
    )
    return st.tuples(events)


