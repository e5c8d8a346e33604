"""Lab `relay` — two publishers, one outbox: leases, fencing tokens, quarantine (contract: labs/relay.md).

One check per contract step, each in the module named after the step's function (`claim.py`, the
judge of step 3); the final check is in `final.py`. Each check prepares real SQLite files with the
judge's own connections (`outbox.py`: the contract's schema plus an audit trigger that records every
change of a row, inside the student's own transaction), lets child processes run the student's
`relay.py` (see `probes.py`), and judges what it then observes itself: the files, the audit, exit
codes. A child's report counts for return values only. Time is the judge's clock (`now`): nothing
here sleeps.
"""

from __future__ import annotations

from checks.relay.backoff import check_backoff
from checks.relay.claim import check_claim
from checks.relay.complete import check_complete
from checks.relay.contract import CLAUSES
from checks.relay.enqueue import check_enqueue
from checks.relay.fail import check_fail
from checks.relay.final import check_final
from checks.relay.open_outbox import check_open
from checks.relay.redrive import check_redrive
from checks.relay.relay_once import check_relay_once
from labkit.judge.run import lab_spec

# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_open, 2: check_enqueue, 3: check_claim, 4: check_complete, 5: check_backoff, 6: check_fail,
                 7: check_redrive, 8: check_relay_once, "final": check_final}, contract=CLAUSES)
