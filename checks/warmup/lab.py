"""Lab `start-here` — the warm-up: one small function, one check, to learn how the course works.

Contract: `normalize_sku(s) -> str` returns a stock-keeping unit in canonical form: surrounding
whitespace removed, lower case, every run of inner whitespace replaced by one `-`. A value that
is not a `str`, or that is empty once stripped, is a `ValueError`.
"""

from __future__ import annotations

from labkit.judge.expect import Plan, raises, returns
from labkit.judge.run import StepContext, lab_spec
from labkit.judge.verdict import Case
from labkit.values import encode, show

WORDS = ["salted", "Caramel", "DARK", "chocolate", "Sea", "salt", "pretzel", "Oat", "bar", "MINT"]


def check_normalize(ctx: StepContext) -> list[Case]:
    words = ctx.rng.sample(WORDS, 3)
    messy = "\t" + "  ".join(words) + " \n"
    cases = [
        ("surrounding spaces and capitals", "  Snack  ", "snack",
         "Strip first, then lower-case: `s.strip().lower()`."),
        ("inner whitespace becomes one dash", messy, "-".join(w.lower() for w in words),
         "`s.replace(' ', '-')` turns two spaces into two dashes and leaves tabs alone. "
         "Split on any run of whitespace and join the words with one dash: `'-'.join(s.split())`."),
    ]
    plans = [Plan(label, f"normalize_sku({show(arg)})", show(want), returns(want, hint))
             for label, arg, want, hint in cases]
    args = [arg for _, arg, _, _ in cases]
    for label, arg, hint in [
        ("only whitespace", "   ",
         "Check for emptiness after stripping. `'   '` is not empty, but `'   '.strip()` is."),
        ("not a str", 7,
         "Test the type first, with `type(s) is str`. Calling `.strip()` on an int raises "
         "AttributeError, which is not what the contract says."),
    ]:
        plans.append(Plan(label, f"normalize_sku({show(arg)})", "ValueError", raises("ValueError", hint)))
        args.append(arg)
    specs = [{"name": p.name, "fn": "normalize_sku", "args": [encode(a)]} for p, a in zip(plans, args, strict=True)]
    return ctx.cases("calls", plans, {"calls": specs})


# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_normalize})
