"""The labs the judge knows: name → its checks module (imported only when asked for)."""

from __future__ import annotations

import importlib
import importlib.util

from labkit.judge.run import LabSpec

LABS = {"outbox": "checks.outbox", "vending": "checks.vending", "relay": "checks.relay",
        "start-here": "checks.warmup"}
MODULE_FILES = {"outbox": "worker.py", "vending": "client.py", "relay": "relay.py", "start-here": "warmup.py"}


def available() -> list[str]:
    out = []
    for lab, module in LABS.items():
        if importlib.util.find_spec(module) is not None:
            out.append(lab)
    return out


def load(lab: str) -> LabSpec:
    if lab not in LABS or lab not in available():
        raise KeyError(lab)
    return importlib.import_module(LABS[lab]).LAB
