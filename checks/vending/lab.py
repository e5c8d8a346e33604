"""Lab `vending` — the snack machine that stops before the ACK (contract: labs/vending.md).

One check per contract step, then the crash check, each in a module of its own beside this one.
Titles, points and what builds on what: manifest.toml.
"""

from checks.vending.apply import check_apply
from checks.vending.consume_line import check_consume_line
from checks.vending.contract import CLAUSES
from checks.vending.final import check_crash
from checks.vending.open_store import check_store
from checks.vending.parse import check_parse
from checks.vending.replay import check_replay
from checks.vending.run_client import check_run_client
from checks.vending.session import check_session
from labkit.judge.run import lab_spec

LAB = lab_spec(__package__, {1: check_parse, 2: check_store, 3: check_apply, 4: check_replay, 5: check_consume_line,
                 6: check_session, 7: check_run_client, "final": check_crash}, contract=CLAUSES)
