"""Lab `start-here`, child side: call the student's `normalize_sku` and report what happened."""

from __future__ import annotations

from labkit import probe
from labkit.values import decode


def calls(mod, args: dict) -> None:
    """One call per case, with arguments decoded from the judge's tagged values."""
    for spec in args["calls"]:
        probe.started(spec["name"])
        values = [decode(a) for a in spec["args"]]
        probe.report(spec["name"], probe.call(probe.function(mod, spec["fn"]), *values))
