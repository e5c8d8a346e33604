"""The warehouse's request log is the judge's: its front keeps it, the child only runs receive.

A hostile `receive` (run in a judged child, sandboxed where this machine sandboxes) looks for the
log everywhere it can — its cwd (the step folder), /tmp, its own descriptors — truncates or
rewrites what it finds, patches the warehouse's logging in its own process, and writes junk and
forged answers on its result pipe. What `requests()` returns stays exactly what the publisher
did; an answer the judge cannot read is a 500 and a log entry saying so, never an exception.
"""

from __future__ import annotations

import http.client
import json
import textwrap
from urllib.parse import urlsplit

from labkit.servers.warehouse import spawn_warehouse

HOSTILE = textwrap.dedent('''
    import json, os, sqlite3, sys

    def open_sink(path):
        con = sqlite3.connect(path, isolation_level=None, timeout=1.0)
        con.execute("CREATE TABLE IF NOT EXISTS inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        return con

    def _ruin(path):
        try:
            with open(path, "r+b") as fh:
                fh.truncate(0)
                fh.write(b'{"n": 1, "method": "POST", "outcome": "applied", "response": "ack", "status": 200}\\n')
            return "rewrote"
        except OSError:
            pass
        try:  # not writable: replace it under the same name
            os.unlink(path)
            with open(path, "w") as fh:
                fh.write("")
            return "replaced"
        except OSError as exc:
            return type(exc).__name__

    def _patch():
        patched = []
        for name in ("labkit.servers.warehouse", "labkit.judge.step_files"):
            try:
                module = __import__(name, fromlist=["x"])
            except ImportError:
                continue
            for attr in ("_append_line", "_open_log", "read_log", "emit"):
                if hasattr(module, attr):
                    setattr(module, attr, lambda *a, **k: None)
                    patched.append(f"{name}.{attr}")
        return patched

    def receive(con, event):
        # Looks everywhere it can, but writes ONLY inside its own step folder (its cwd): the test
        # may run without a sandbox, as a user who could otherwise ruin anyone's files in /tmp.
        here = os.path.realpath(os.getcwd())
        found = []
        for root, _dirs, files in os.walk(here):
            for f in files:
                if f.endswith(".jsonl") or "log" in f:
                    found.append((os.path.join(root, f), _ruin(os.path.join(root, f))))
        seen_tmp = sorted(os.listdir("/tmp"))[:50]  # looked at, never touched
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        patched = _patch()
        result_fd = int(os.environ["LABKIT_RESULT_FD"])
        os.write(result_fd, b"[" * 100000 + b"\\n")  # junk: dropped, never parsed deep
        os.write(result_fd, b"not json\\n")
        # Said before the forged replies: the judge answers at the first, and may end this process
        # before it says anything more (seen under load: the last line was never written).
        print("PAYLOAD", json.dumps({"found": found, "fds": fds, "patched": patched, "tmp": seen_tmp}), file=sys.stderr, flush=True)
        with open("payload-ran.txt", "a") as fh:
            fh.write(event["id"] + "\\n")
        if event["id"] == "forged":  # a reply for this request the judge cannot read: 500
            for n in range(1, 10):
                os.write(result_fd, json.dumps({"event": "reply", "id": n, "outcome": {"kind": "x" * 10}}).encode()
                         + b"\\n")
        body = json.dumps(event, sort_keys=True, separators=(",", ":"))
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT body FROM inbox WHERE id = ?", (event["id"],)).fetchone()
        if row is None:
            con.execute("INSERT INTO inbox VALUES (?, ?)", (event["id"], body))
        con.execute("COMMIT")
        return row is None
''')


def post(url: str, payload: dict, headers: dict[str, str] | None = None) -> int:
    parts = urlsplit(url)
    con = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        con.request("POST", parts.path, body=json.dumps(payload).encode(),
                    headers={"Content-Type": "application/json", **(headers or {})})
        return con.getresponse().status
    finally:
        con.close()


def test_a_receive_that_rewrites_the_log_and_patches_logging_changes_nothing_the_judge_reads(tmp_path):
    module = tmp_path / "worker.py"
    module.write_text(HOSTILE)
    log = tmp_path / "warehouse.jsonl"
    wp = spawn_warehouse(module, tmp_path / "sink.db", log, tmp_path, faults=["none", "wrong_id"],
                         ready_timeout=20.0)
    try:
        statuses = [post(wp.url, {"id": "a", "sku": "s", "qty": 1}, {"Fencing-Token": "7"}),
                    post(wp.url, {"id": "b", "sku": "s", "qty": 2}),
                    post(wp.url, {"id": "a", "sku": "s", "qty": 1}),
                    post(wp.url, {"id": "forged", "sku": "s", "qty": 3})]
        seen = wp.requests()
    finally:
        wp.close()
    # The payload really ran, each time, in the child:
    assert (tmp_path / "payload-ran.txt").read_text().split() == ["a", "b", "a", "forged"]
    payloads = [json.loads(line.split(" ", 1)[1]) for line in wp.stderr.splitlines() if line.startswith("PAYLOAD ")]
    assert len(payloads) == 4
    assert any(path == str(log) for path, _ in payloads[0]["found"])  # it found the log file and went at it
    assert not any(target == str(log) for p in payloads for target in p["fds"])  # no descriptor of it to inherit

    assert statuses == [200, 200, 200, 500]
    assert seen == wp.requests()  # after the kill too
    assert [(r["n"], r["method"], r["path"], r["id"], r["fault"], r["outcome"], r["response"], r["status"],
             r["token"], r["content_type"]) for r in seen] == [
        (1, "POST", "/events", "a", "none", "applied", "ack", 200, "7", "application/json"),
        (2, "POST", "/events", "b", "wrong_id", "applied", "wrong_id", 200, None, "application/json"),
        (3, "POST", "/events", "a", "none", "duplicate", "ack", 200, None, "application/json"),
        (4, "POST", "/events", "forged", "none", "error", "500", 500, None, "application/json")]
    assert json.loads(seen[0]["body"]) == {"id": "a", "sku": "s", "qty": 1}
    assert "answer the judge cannot read" in seen[3]["error"]
    assert all(r["t_start"] <= r["t_end"] for r in seen)
