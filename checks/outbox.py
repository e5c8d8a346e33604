"""Lab `outbox` — the publisher that dies right after the ACK (contract: labs/outbox.md).

One check per contract step, then the crash check. Each check prepares real SQLite files
with the judge's own connections, lets a child process run the student's `worker.py`
(see `outbox_probes.py`), and decides from what the judge observes itself: the DB files
(read with its own connections, also *while* the student's code runs, through the witness
endpoint in `outbox_witness.py`), its own servers' records, and exit codes. The child's
reports are evidence about return values only.

Every case is tagged with the contract clauses it tries (`outbox_contract.py`); every kind
of every near-miss (`outbox_inputs.py`) is tried in every run, and the seed only adds.
"""

from __future__ import annotations

from checks.outbox_calls import check_accept, check_mark_sent, check_pending, check_receive
from checks.outbox_contract import CLAUSES
from checks.outbox_crash import check_crash
from checks.outbox_dispatch import check_dispatch
from checks.outbox_send import check_send_http
from checks.outbox_stores import check_stores
from checks.outbox_validate import check_validate
from labkit.judge.run import LabSpec, StepSpec

LAB = LabSpec(
    name="outbox",
    module_name="worker",
    probes="checks.outbox_probes",
    steps=[
        StepSpec(1, "validate_event", 1, check_validate),
        StepSpec(2, "open_source / open_sink", 1, check_stores),
        StepSpec(3, "accept", 1, check_accept, requires=(1,)),
        StepSpec(4, "pending", 1, check_pending),
        StepSpec(5, "receive", 1, check_receive, requires=(1,)),
        StepSpec(6, "mark_sent", 1, check_mark_sent),
        StepSpec(7, "dispatch", 2, check_dispatch, requires=(4, 6)),
        StepSpec(8, "send_http", 2, check_send_http, requires=(1,)),
        StepSpec("final", "the crash after the ACK", 3, check_crash, requires=(2, 5, 7, 8)),
    ],
    contract=CLAUSES,
)

