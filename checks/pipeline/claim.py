"""Lab `pipeline`: not written yet."""

from labkit.judge.run import StepContext
from labkit.judge.verdict import Case, Outcome


def check_claim(ctx: StepContext) -> list[Case]:
    return [Case("not checked yet", Outcome.WRONG, got="this step's checks are not written yet",
                 hint="This is a gap in the course, not in your code.")]
