"""Lab `outbox` — the publisher that dies right after the ACK (contract: labs/outbox.md).

One check per contract step, then the crash check. Each check prepares real SQLite files
with the judge's own connections, lets a child process run the student's `worker.py`
(see `probes.py`), and decides from what the judge observes itself: the DB files
(read with its own connections, also *while* the student's code runs, through the witness
endpoint in `labkit/judge/witness.py`), its own servers' records, and exit codes. The child's
reports are evidence about return values only.

Every case is tagged with the contract clauses it tries (`contract.py`); every kind
of every near-miss (`inputs.py`) is tried in every run, and the seed only adds.
"""

from __future__ import annotations

from checks.outbox.calls import check_accept, check_mark_sent, check_pending, check_receive
from checks.outbox.contract import CLAUSES
from checks.outbox.crash import check_crash
from checks.outbox.dispatch import check_dispatch
from checks.outbox.send import check_send_http
from checks.outbox.stores import check_stores
from checks.outbox.validate import check_validate
from labkit.judge.run import lab_spec

# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_validate, 2: check_stores, 3: check_accept, 4: check_pending, 5: check_receive,
                 6: check_mark_sent, 7: check_dispatch, 8: check_send_http, "final": check_crash}, contract=CLAUSES)

