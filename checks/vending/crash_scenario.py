"""Lab `vending`, final check: the scenario as data — where client #1 dies, the recovery cases that
follow, and which feed connections and exits belong to which client process.
"""

from __future__ import annotations

KILL = 1  # the contract's scenario: client #1 dies after commit 1, before ACK 1

NOT_REACHED_KILL = (f"not checked: client #1 did not die between commit {KILL} and ACK {KILL} (see the first "
                   "case), so there was no crash to recover from")

RECOVERY = [
    (f"the commit of seq {KILL} survived the kill", "the judge reads the store file after client #1 died",
     f"every event up to seq {KILL} committed", "final.commit-survives"),
    ("client #2 resumes from the saved cursor", "run_client(...) again, in a new process, on the same file",
     f"the feed sees RESUME {KILL}", "final.resume-cursor"),
    (f"the resent seq {KILL} is ACKed and counted once", f"the feed resends seq {KILL} to client #2",
     f"ACK {KILL} from client #2; seq {KILL} counted once", "final.resent-once"),
    ("client #2 finishes with every delta counted exactly once", "run_client returns; the judge reads the store file",
     "the final state returned and stored", "final.all-once"),
]


def conns_during(journal: list[dict], run) -> set[int]:
    """The feed connections a child process opened: those that began while it ran."""
    return {e["conn"] for e in journal if e["kind"] == "connect" and run.started_at <= e["t"] <= run.ended_at}


def killed_by_judge(run, timeout: float) -> bool:
    """Timed out for real: it ran until the deadline. (`run.timed_out` alone can also be set for a
    process caught in the middle of exiting; and the exit code of a killed one may read 0.)"""
    return run.timed_out and run.seconds >= timeout - 0.05
