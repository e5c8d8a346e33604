"""Lab `pipeline` — an outbox on PostgreSQL, a consumer group on a Valkey stream (contract:
labs/pipeline.md).

One check per contract step, each in the module named after the step's function; the final
check is in `final.py`. One PostgreSQL and one Valkey serve a whole judge run (`servers.Servers`,
the lab's session); each case gets a fresh database owned by a least-privilege role and a fresh
Valkey user confined to a key prefix. Children run the student's `pipeline.py` with those
credentials only (`probes.py`); the judge reads what happened through its own privileged
connections, the server's log and the stream's command log.
"""

from __future__ import annotations

from checks.pipeline.accept import check_accept
from checks.pipeline.claim import check_claim
from checks.pipeline.consume import check_consume
from checks.pipeline.contract import CLAUSES
from checks.pipeline.ensure_group import check_group
from checks.pipeline.final import check_final
from checks.pipeline.lag import check_lag
from checks.pipeline.open_db import check_open
from checks.pipeline.publish import check_publish
from checks.pipeline.reclaim import check_reclaim
from checks.pipeline.servers import Servers
from labkit.judge.run import lab_spec

# Titles, points and what builds on what: manifest.toml.
LAB = lab_spec(__package__, {1: check_open, 2: check_accept, 3: check_claim, 4: check_publish, 5: check_group,
                             6: check_consume, 7: check_reclaim, 8: check_lag, "final": check_final},
               contract=CLAUSES, session=Servers)
