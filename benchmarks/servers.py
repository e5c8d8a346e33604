"""What the real servers (`labkit.servers.postgres`, `labkit.servers.valkey`) cost a judge run.

Prints, as medians over `--runs` runs on this machine: starting and stopping each server, a
fresh database and role (PostgreSQL: a spare made ahead and renamed, and a copy of
template1 when no spare is ready) and a fresh ACL user (Valkey) per step, a student's first
connection with its credentials, and a crash and restart of each (SIGKILL of every process,
PostgreSQL's immediate stop). One server of each kind serves a whole judge run, so a step
pays only its fresh database and user: target about 15 ms for the database.

    python benchmarks/servers.py [--runs 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from labkit.servers import postgres, valkey  # noqa: E402


def timed(times: dict, name: str, fn, *args):
    began = time.perf_counter()
    result = fn(*args)
    times[name].append(time.perf_counter() - began)
    return result


def wait_for_a_spare(server: postgres.PostgresServer) -> None:
    deadline = time.monotonic() + 30
    while not server._spares and time.monotonic() < deadline:
        time.sleep(0.005)


def run_postgres(base: Path, times: dict, steps: int) -> None:
    bare = postgres.start(base / "bare", spares=0)
    try:
        for step in range(steps):
            timed(times, "postgres: fresh database, template copied", postgres.fresh_database, bare, f"step_{step}")
    finally:
        postgres.stop(bare)
    server = timed(times, "postgres: start (initdb + ready)", postgres.start, base / "pg")
    try:
        for step in range(steps):
            wait_for_a_spare(server)  # the judge's steps start later than this loop does
            db = timed(times, "postgres: fresh database, a spare renamed", postgres.fresh_database, server, f"step_{step}")
        timed(times, "postgres: student's first connection", lambda: psycopg.connect(db.dsn).close())
        timed(times, "postgres: kill -9 + restart", lambda: (postgres.kill(server), postgres.restart(server)))
        timed(times, "postgres: immediate stop + restart",
              lambda: (postgres.stop_immediately(server), postgres.restart(server)))
    finally:
        timed(times, "postgres: stop (all removed)", postgres.stop, server)


def run_valkey(base: Path, times: dict, steps: int) -> None:
    server = timed(times, "valkey: start", valkey.start, base / "vk")
    try:
        for step in range(steps):
            user = timed(times, "valkey: fresh ACL user (saved)", valkey.fresh_user, server, f"lab:{step}:")
        timed(times, "valkey: student's first PING", lambda: valkey.Valkey(**user.client_kwargs()).ping())
        timed(times, "valkey: kill -9 + restart", lambda: (valkey.kill(server), valkey.restart(server)))
    finally:
        timed(times, "valkey: stop (all removed)", valkey.stop, server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="fresh databases and users per run")
    args = parser.parse_args()
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.runs):
        base = Path(tempfile.mkdtemp(prefix="labkit-bench-", dir="/tmp"))
        os.chmod(base, 0o711)  # as root the servers run as nobody, who must reach the folder
        try:
            run_postgres(base, times, args.steps)
            run_valkey(base, times, args.steps)
        finally:
            os.rmdir(base)
    print(f"medians over {args.runs} runs ({args.steps} steps each), load {os.getloadavg()[0]:.1f}:")
    for name, values in times.items():
        print(f"  {name:42s} {1000 * statistics.median(values):8.1f} ms   (n={len(values)})")


if __name__ == "__main__":
    main()
