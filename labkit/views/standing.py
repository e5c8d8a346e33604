"""Where a step stands for the student, and the one thing to do next. Every view uses it.

Red is only for code that ran and is wrong. A step whose failing cases are all "calm" (still the
skeleton, a function not in the module yet, or cases not reached because of those) is grey,
with the next action in the student's own terms: in a notebook, the `%%step N` cell to run; in a
terminal, the function to write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.judge.verdict import Case, Outcome, StepVerdict

CALM_OUTCOMES = (Outcome.NOT_IMPLEMENTED, Outcome.MISSING, Outcome.NOT_REACHED)
NOTEBOOK, MODULE = "notebook", "module"  # where the student's code lives: cells, or one file


@dataclass(frozen=True)
class Standing:
    status: str  # "passed", "failed" (red) or "not_implemented" (grey: nothing wrong has run yet)
    label: str  # the badge: "passed", "failed", "not implemented yet", "not run yet", …
    next: str = ""  # the one next action ("" when passed)

    @property
    def calm(self) -> bool:
        return self.status == "not_implemented"


def is_calm(case: Case) -> bool:
    return case.outcome in CALM_OUTCOMES


def functions(cases: list[Case]) -> list[str]:
    """The functions the cases called (from `called`: `accept(con, …)` → `accept`), in order."""
    names: list[str] = []
    for case in cases:
        match = re.match(r"\s*(?:await\s+)?([A-Za-z_]\w*)\(", case.called or "")
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def _listing(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names[:3]]
    return " and ".join(quoted) if len(quoted) <= 2 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def standing(step: StepVerdict, saved: dict[str, str] | None = None, where: str = NOTEBOOK) -> Standing:
    """`saved`: the parts the kernel has saved (None where that is unknown, e.g. a feedback page)."""
    if step.passed:
        return Standing("passed", "passed")
    failing = [c for c in step.cases if not c.passed]
    if not failing or not all(is_calm(c) for c in failing) or all(c.outcome is Outcome.NOT_REACHED for c in failing):
        return Standing("failed", "failed", "Open the first ✗ case: compare expected with got, fix your code, "
                        + ("run the step's cell, then this check again." if where == NOTEBOOK else "check again."))
    number = str(step.step)
    if not number.isdigit():
        return Standing("not_implemented", "waiting for your steps",
                        "The final check runs all your steps together, in real processes: finish the steps "
                        "still marked · first (their own checks say what is missing), then run this one again.")
    skeleton = any(c.outcome is Outcome.NOT_IMPLEMENTED for c in failing)
    missing = functions([c for c in failing if c.outcome is Outcome.MISSING]) or functions(failing)
    if where == MODULE:
        if skeleton:
            return Standing("not_implemented", "not implemented yet",
                            f"Replace `raise NotImplementedError` in {_listing(functions(failing))} with your code "
                            "(step " + number + " of the contract), then check again.")
        return Standing("not_implemented", "not written yet",
                        f"Your module has no {_listing(missing)} yet: write it (step {number} of the contract), "
                        "then check again.")
    cell = f"`%%step {number}` cell"
    if saved is not None and number not in saved:
        also = "" if "header" in saved else " (and the provided-code cell, `%%step header`, near the top)"
        return Standing("not_implemented", "not run yet",
                        f"Run the {cell} above first{also}: it saves your code into your module. "
                        "Then run this check again.")
    if saved is not None and "header" not in saved:
        return Standing("not_implemented", "not run yet",
                        "Run the provided-code cell (`%%step header`, near the top) first: it holds the "
                        f"module's imports. Then the {cell}, then this check again.")
    if skeleton:
        own = None if saved is None else saved.get(number, "")
        if own is not None and "NotImplementedError" not in own:
            return Standing("not_implemented", "waiting for an earlier step",
                            f"Your step {number} code calls a function that is still the skeleton "
                            "(`raise NotImplementedError`): finish the earlier steps, then run this check again.")
        return Standing("not_implemented", "not implemented yet",
                        f"Replace `raise NotImplementedError` in the {cell} with your code, run that cell, "
                        "then this check again.")
    return Standing("not_implemented", "not written yet",
                    f"Your module has no {_listing(missing)} yet: write it in the {cell} (keep the name), "
                    "run that cell, then this check again.")
