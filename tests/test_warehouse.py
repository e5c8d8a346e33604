"""The warehouse server: ACKs, faults, the request log, receive mode and child-process mode.

Clients here are http.client (never follows redirects, never uses a proxy) or urllib with
ProxyHandler({}), as the field notes require.
"""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the plain `pytest` entry point does not add the repo root
    sys.path.insert(0, str(REPO))

from labkit.servers.warehouse import (  # noqa: E402
    FAULTS,
    EventFault,
    WarehouseStartError,
    read_log,
    refused,
    slow,
    spawn_warehouse,
    start_warehouse,
    unavailable,
)

EVENT = {"id": "snack-7", "sku": "snack", "qty": 7}


# --- helpers ---------------------------------------------------------------------------------


def post(url: str, payload: dict | bytes, timeout: float = 2.0, path: str | None = None,
         method: str = "POST", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    con = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        con.request(method, path or parts.path, body=body,
                    headers={"Content-Type": "application/json", **(headers or {})})
        resp = con.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        con.close()


def server_threads(port: int) -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(f"warehouse-{port}-") and t.is_alive()]


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def start(tmp_path):
    """start_warehouse with a fresh log; every server is closed and checked for leftovers."""
    started = []

    def _start(faults=(), **kwargs):
        wh = start_warehouse(tmp_path / f"log{len(started)}.jsonl", faults, **kwargs)
        started.append(wh)
        return wh

    yield _start
    for wh in started:
        wh.close()
        assert server_threads(wh.port) == []


def outcomes(wh) -> list[tuple[str, str, str]]:
    return [(r["fault"], r["outcome"], r["response"]) for r in wh.requests()]


# --- normal service --------------------------------------------------------------------------


def test_applied_then_duplicate_both_ack(start):
    wh = start()
    assert wh.url == f"http://127.0.0.1:{wh.port}/events"
    for _ in range(2):
        status, headers, body = post(wh.url, EVENT)
        assert (status, json.loads(body)) == (200, {"ack": "snack-7"})
        assert headers["Content-Type"] == "application/json"
        assert headers["Content-Length"] == str(len(body))
    log = wh.requests()
    assert [(r["n"], r["method"], r["path"], r["id"]) for r in log] == [
        (1, "POST", "/events", "snack-7"), (2, "POST", "/events", "snack-7")]
    assert outcomes(wh) == [("none", "applied", "ack"), ("none", "duplicate", "ack")]
    assert all(r["t_start"] <= r["t_end"] for r in log)


def test_same_id_different_body_is_conflict_409(start):
    wh = start()
    assert post(wh.url, EVENT)[0] == 200
    status, _, body = post(wh.url, {**EVENT, "qty": 8})
    assert (status, json.loads(body)) == (409, {"error": "conflict"})
    assert outcomes(wh)[-1] == ("none", "conflict", "409")


@pytest.mark.parametrize("payload", [b"{not json", b"[1, 2]", b'{"sku": "no-id"}', b"\xff\xfe"])
def test_bad_input_is_400_and_logged(start, payload):
    wh = start()
    status, _, _ = post(wh.url, payload)
    assert status == 400
    assert outcomes(wh) == [("none", "bad_request", "400")]


def test_other_paths_and_methods_are_404_405_and_logged(start, capfd):
    wh = start()
    assert post(wh.url, EVENT, path="/other")[0] == 404
    assert post(wh.url, b"", method="GET")[0] == 405
    assert post(wh.url, b"", method="BREW")[0] == 501  # rejected by the base class itself
    log = wh.requests()
    assert [(r["method"], r["path"], r["outcome"], r["response"]) for r in log] == [
        ("POST", "/other", "bad_request", "404"),
        ("GET", "/events", "bad_request", "405"),
        ("BREW", "/events", "bad_request", "501"),
    ]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # the server never prints


def test_body_over_64_kib_is_413(start):
    wh = start()
    status, _, _ = post(wh.url, b"x" * (64 * 1024 + 1))
    assert status == 413
    assert outcomes(wh) == [("none", "bad_request", "413")]


def test_unknown_fault_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="drop_before_commit"):
        start_warehouse(tmp_path / "log.jsonl", ["drop_before_commit"])
    assert "drop_after_commit" in FAULTS


# --- faults ----------------------------------------------------------------------------------


def test_drop_after_commit_applies_then_closes_without_response(start):
    wh = start(["drop_after_commit"])
    with pytest.raises(ConnectionError):  # http.client.RemoteDisconnected
        post(wh.url, EVENT)
    assert outcomes(wh) == [("drop_after_commit", "applied", "dropped")]
    # The commit really happened: the retry is a duplicate, and ACKed.
    assert post(wh.url, EVENT)[:1] == (200,)
    assert outcomes(wh)[-1] == ("none", "duplicate", "ack")


def test_wrong_id_applies_and_acks_another_id(start):
    wh = start(["wrong_id"])
    status, _, body = post(wh.url, EVENT)
    assert (status, json.loads(body)) == (200, {"ack": "snack-7-other"})
    assert outcomes(wh) == [("wrong_id", "applied", "wrong_id")]


def test_oversized_ack_is_valid_json_over_1024_bytes(start):
    wh = start(["oversized"])
    status, _, body = post(wh.url, EVENT)
    assert status == 200
    assert len(body) > 1024
    assert body.startswith(b'{"ack": "snack-7", "pad": "xxxx')
    assert json.loads(body)["ack"] == "snack-7"
    assert outcomes(wh) == [("oversized", "applied", "oversized")]


@pytest.mark.parametrize("fault", ["redirect_302", "redirect_307"])
def test_redirect_is_not_applied(start, fault):
    wh = start([fault])
    status, headers, _ = post(wh.url, EVENT)
    assert status == int(fault[-3:])
    assert headers["Location"] == "/events/elsewhere?id=snack-7"
    assert outcomes(wh) == [(fault, "not_applied", "redirect")]
    assert wh.requests()[0]["id"] == "snack-7"
    # Not applied: the next delivery of the same event is the first one to apply.
    assert post(wh.url, EVENT)[0] == 200
    assert outcomes(wh)[-1] == ("none", "applied", "ack")


def test_no_redirect_urllib_client_sees_302(start):
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    wh = start(["redirect_302"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    request = urllib.request.Request(wh.url, data=json.dumps(EVENT).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(request, timeout=2)
    assert info.value.code == 302
    info.value.close()
    assert len(wh.requests()) == 1


def test_naive_urllib_follows_302_and_seems_to_succeed(start):
    # The trap from FIELD-NOTES: the POST becomes a body-less GET whose 200 looks like an ACK.
    wh = start(["redirect_302"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(wh.url, data=json.dumps(EVENT).encode())
    with opener.open(request, timeout=2) as response:
        assert (response.status, json.loads(response.read())) == (200, {"ack": "snack-7"})
    log = wh.requests()
    assert [(r["method"], r["path"], r["outcome"], r["response"]) for r in log] == [
        ("POST", "/events", "not_applied", "redirect"),
        ("GET", "/events/elsewhere?id=snack-7", "not_applied", "ack_after_redirect")]


def test_other_gets_are_404(start):
    wh = start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(wh.url.replace("/events", "/elsewhere"), timeout=2)
    assert info.value.code == 404
    info.value.close()


def test_slow_applies_then_acks_late(start):
    wh = start(["slow", "slow"], slow_seconds=0.3)
    began = time.monotonic()
    status, _, body = post(wh.url, EVENT, timeout=2.0)
    assert (status, json.loads(body)) == (200, {"ack": "snack-7"})
    assert time.monotonic() - began >= 0.3
    with pytest.raises(TimeoutError):
        post(wh.url, EVENT, timeout=0.1)
    assert outcomes(wh)[0] == ("slow", "applied", "slow_ack")


def test_close_interrupts_a_slow_reply(start, tmp_path):
    entered = threading.Event()

    def receive(con, event):
        entered.set()  # the handler goes straight from here to its slow wait
        return True

    wh = start(["slow"], slow_seconds=30, receive=receive,
               open_sink=lambda path: sqlite3.connect(path), sink_path=tmp_path / "sink.db")
    errors = []

    def client():
        try:
            post(wh.url, EVENT, timeout=5.0)
        except OSError as exc:
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    assert entered.wait(timeout=2), "the request never reached receive"
    began = time.monotonic()
    wh.close()
    assert time.monotonic() - began < 1.0
    thread.join(timeout=2)
    assert len(errors) == 1  # the client got no ACK
    assert outcomes(wh) == [("slow", "applied", "dropped")]


@pytest.mark.parametrize(("fault", "status", "body", "outcome"), [
    ("status_500", 500, b'{"error": "internal"}', "not_applied"),
    ("conflict_409", 409, b'{"error": "conflict"}', "not_applied"),
    ("not_json", 200, b"ok", "applied"),
])
def test_status_faults(start, fault, status, body, outcome):
    wh = start([fault])
    assert post(wh.url, EVENT)[::2] == (status, body)
    assert [(r["fault"], r["outcome"]) for r in wh.requests()] == [(fault, outcome)]
    # Whether the event was applied shows in what the next delivery becomes.
    post(wh.url, EVENT)
    expected = "duplicate" if outcome == "applied" else "applied"
    assert wh.requests()[-1]["outcome"] == expected


def test_faults_are_consumed_one_per_post_in_order(start):
    wh = start(["wrong_id", "status_500"])
    answers = [post(wh.url, {**EVENT, "id": f"e{i}"})[::2] for i in range(3)]
    assert answers == [(200, b'{"ack": "e0-other"}'), (500, b'{"error": "internal"}'),
                       (200, b'{"ack": "e2"}')]
    assert [r["fault"] for r in wh.requests()] == ["wrong_id", "status_500", "none"]


# --- per-event faults and the fencing token (lab 03) -------------------------------------------

OTHER = {"id": "snack-8", "sku": "snack", "qty": 8}


def test_unavailable_refuses_only_the_first_n_deliveries_of_that_event(start):
    wh = start(event_faults={"snack-7": unavailable(2)})
    answers = [post(wh.url, e)[::2] for e in (EVENT, OTHER, EVENT, EVENT, EVENT)]
    assert answers == [(503, b'{"error": "unavailable"}'), (200, b'{"ack": "snack-8"}'),
                       (503, b'{"error": "unavailable"}'), (200, b'{"ack": "snack-7"}'),
                       (200, b'{"ack": "snack-7"}')]
    assert outcomes(wh) == [("unavailable_503", "not_applied", "503"), ("none", "applied", "ack"),
                            ("unavailable_503", "not_applied", "503"), ("none", "applied", "ack"),
                            ("none", "duplicate", "ack")]


def test_refused_is_a_422_with_its_reason_until_lifted(start):
    wh = start(event_faults={"snack-7": refused("sku snack is discontinued")})
    for _ in range(3):
        status, _, body = post(wh.url, EVENT)
        assert (status, json.loads(body)) == (422, {"error": "unprocessable",
                                                    "reason": "sku snack is discontinued"})
    assert post(wh.url, OTHER)[0] == 200  # only that event is refused
    wh.lift("snack-7")
    assert post(wh.url, EVENT)[::2] == (200, b'{"ack": "snack-7"}')
    log = wh.requests()
    assert [(r["fault"], r["outcome"], r["response"]) for r in log] == [
        ("refused_422", "not_applied", "422")] * 3 + [("none", "applied", "ack")] * 2
    assert log[0]["error"] == "sku snack is discontinued"


def test_slow_event_is_applied_then_acked_late_and_other_events_are_not_slowed(start):
    wh = start(event_faults={"snack-7": slow(0.3)})
    began = time.monotonic()
    assert post(wh.url, OTHER)[0] == 200
    assert time.monotonic() - began < 0.25
    began = time.monotonic()
    assert post(wh.url, EVENT, timeout=2.0)[::2] == (200, b'{"ack": "snack-7"}')
    assert time.monotonic() - began >= 0.3
    with pytest.raises(TimeoutError):  # still slow on a re-delivery: applied, answered late
        post(wh.url, EVENT, timeout=0.1)
    deadline = time.monotonic() + 2.0  # its log line is written when the late answer goes out
    while len(wh.requests()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert outcomes(wh) == [("none", "applied", "ack"), ("slow", "applied", "slow_ack"),
                            ("slow", "duplicate", "slow_ack")]


def test_a_positional_fault_wins_over_an_event_fault(start):
    wh = start(["status_500"], event_faults={"snack-7": unavailable(1)})
    assert post(wh.url, EVENT)[0] == 500  # the positional fault; the event's count is untouched
    assert post(wh.url, EVENT)[0] == 503
    assert post(wh.url, EVENT)[0] == 200


def test_the_log_records_the_fencing_token_each_request_carried(start):
    wh = start(event_faults={"snack-7": unavailable(1)})
    post(wh.url, EVENT, headers={"Fencing-Token": "41"})
    post(wh.url, EVENT, headers={"Fencing-Token": "42"})
    post(wh.url, EVENT)
    post(wh.url, EVENT, path="/other", headers={"Fencing-Token": "43"})
    log = wh.requests()
    assert [(r["token"], r["response"]) for r in log] == [("41", "503"), ("42", "ack"), (None, "ack"),
                                                           ("43", "404")]


@pytest.mark.parametrize(("fault", "match"), [
    (lambda: EventFault("flaky"), "unknown event fault"),
    (lambda: unavailable(0), "times >= 1"),
    (lambda: unavailable(True), "times >= 1"),
    (lambda: slow(float("nan")), "finite seconds"),
])
def test_bad_event_faults_are_refused(fault, match):
    with pytest.raises(ValueError, match=match):
        fault()


def test_event_faults_must_be_event_fault_values(tmp_path):
    with pytest.raises(TypeError, match="EventFault"):
        start_warehouse(tmp_path / "log.jsonl", event_faults={"snack-7": "unavailable"})


# --- receive / open_sink mode ------------------------------------------------------------


class Conflict(Exception):
    pass


class TrackedConnection(sqlite3.Connection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.created_in = threading.get_ident()
        self.was_closed = False

    def close(self):
        self.was_closed = True
        super().close()


def make_lab(opened: list, calls: list):
    """A tiny lab-contract receive on a real SQLite sink, recording threads and connections."""

    def open_sink(path):
        con = sqlite3.connect(path, isolation_level=None, timeout=1.0,
                              factory=TrackedConnection)
        con.execute("CREATE TABLE IF NOT EXISTS inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        con.execute("CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY, qty INT NOT NULL)")
        opened.append(con)
        return con

    def receive(con, event):
        calls.append((threading.get_ident(), con))
        if event.get("qty") == "boom":
            raise RuntimeError("disk on fire")
        if not isinstance(event.get("qty"), int):
            raise ValueError("qty must be an int")
        body = json.dumps(event, sort_keys=True, separators=(",", ":"))
        con.execute("BEGIN IMMEDIATE")
        try:
            row = con.execute("SELECT body FROM inbox WHERE id = ?", (event["id"],)).fetchone()
            if row is None:
                con.execute("INSERT INTO inbox VALUES (?, ?)", (event["id"], body))
                con.execute("INSERT INTO stock VALUES (?, ?) ON CONFLICT(sku) "
                            "DO UPDATE SET qty = qty + excluded.qty", (event["sku"], event["qty"]))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if row is None:
            return True
        if row[0] == body:
            return False
        raise Conflict(event["id"])

    return open_sink, receive


def test_receive_mode_uses_own_connection_per_request_in_handler_thread(start, tmp_path):
    opened, calls = [], []
    open_sink, receive = make_lab(opened, calls)
    sink = tmp_path / "sink.db"
    wh = start(receive=receive, open_sink=open_sink, sink_path=sink)
    replies = [post(wh.url, e)[::2] for e in (
        EVENT, EVENT, {**EVENT, "qty": 8}, {**EVENT, "id": "x", "qty": "7"},
        {**EVENT, "id": "y", "qty": "boom"})]
    assert replies == [(200, b'{"ack": "snack-7"}'), (200, b'{"ack": "snack-7"}'),
                       (409, b'{"error": "conflict"}'), (400, b'{"error": "bad_request"}'),
                       (500, b'{"error": "internal"}')]
    log = wh.requests()
    assert [r["outcome"] for r in log] == [
        "applied", "duplicate", "conflict", "bad_request", "error"]
    assert "disk on fire" in log[-1]["error"]

    main = threading.get_ident()
    assert len(calls) == len(opened) == 5
    for ident, con in calls:
        assert con.created_in == ident != main  # opened in the thread that called receive
        assert con.was_closed
    assert len({id(con) for _, con in calls}) == 5  # one connection per request
    with sqlite3.connect(sink) as con:
        assert con.execute("SELECT sku, qty FROM stock").fetchall() == [("snack", 7)]
        assert [r[0] for r in con.execute("SELECT id FROM inbox")] == ["snack-7"]


@pytest.mark.parametrize("result", [1, None, SystemExit(3)])
def test_receive_that_breaks_the_contract_is_an_error_and_serving_goes_on(start, tmp_path,
                                                                          result):
    def receive(con, event):
        if isinstance(result, BaseException):
            raise result
        return result

    wh = start(receive=receive, open_sink=lambda path: sqlite3.connect(path),
               sink_path=tmp_path / "sink.db")
    assert post(wh.url, EVENT)[0] == 500
    assert post(wh.url, EVENT)[0] == 500  # the server survived
    assert [r["outcome"] for r in wh.requests()] == ["error", "error"]


def test_receive_requires_open_sink_and_sink_path(tmp_path):
    with pytest.raises(ValueError, match="open_sink"):
        start_warehouse(tmp_path / "log.jsonl", receive=lambda con, e: True)
    with pytest.raises(ValueError, match="sink_path"):
        start_warehouse(tmp_path / "log.jsonl", receive=lambda con, e: True,
                        open_sink=sqlite3.connect)


# --- lifecycle and log -----------------------------------------------------------------------


def test_close_leaves_no_thread_and_port_refuses(tmp_path):
    wh = start_warehouse(tmp_path / "log.jsonl")
    assert post(wh.url, EVENT)[0] == 200
    assert server_threads(wh.port)  # the accept thread is running
    # A client that connects and never sends must not hold close() up.
    idle = socket.create_connection(("127.0.0.1", wh.port), timeout=2)
    time.sleep(0.05)
    began = time.monotonic()
    with wh:
        pass  # __exit__ closes
    assert time.monotonic() - began < 1.0
    wh.close()  # idempotent
    idle.close()
    assert server_threads(wh.port) == []
    assert refuses(wh.port)


def test_read_log_skips_a_torn_last_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3, "outc')
    assert read_log(log) == [{"n": 1}, {"n": 2}]
    log.write_bytes(b'{"n": 1}\nnot json\n{"n": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_log(log)


# --- child-process mode ----------------------------------------------------------------------

WORKER = textwrap.dedent('''
    import json, sqlite3
    print("students print things at import")

    class Conflict(Exception):
        pass

    def open_sink(path):
        con = sqlite3.connect(path, isolation_level=None, timeout=1.0)
        con.execute("CREATE TABLE IF NOT EXISTS inbox(id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        con.execute("CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY, qty INT NOT NULL)")
        return con

    def receive(con, event):
        body = json.dumps(event, sort_keys=True, separators=(",", ":"))
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT body FROM inbox WHERE id = ?", (event["id"],)).fetchone()
        if row is None:
            con.execute("INSERT INTO inbox VALUES (?, ?)", (event["id"], body))
            con.execute("INSERT INTO stock VALUES (?, ?)", (event["sku"], event["qty"]))
        con.execute("COMMIT")
        if row is not None and row[0] != body:
            raise Conflict(event["id"])
        return row is None
''')


def test_child_process_applies_with_the_students_receive(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    sink, log = tmp_path / "sink.db", tmp_path / "log.jsonl"
    wp = spawn_warehouse(tmp_path / "worker.py", sink, log, tmp_path, faults=["drop_after_commit"])
    try:
        with pytest.raises(ConnectionError):
            post(wp.url, EVENT)
        assert post(wp.url, EVENT)[::2] == (200, b'{"ack": "snack-7"}')
        assert post(wp.url, {**EVENT, "qty": 9})[0] == 409
    finally:
        wp.close()
    wp.close()  # idempotent
    assert wp.proc.returncode == -9  # the judge SIGKILLed its sandbox from outside: no student handler ran
    assert refuses(wp.port)
    assert [(r["fault"], r["outcome"], r["response"]) for r in wp.requests()] == [
        ("drop_after_commit", "applied", "dropped"), ("none", "duplicate", "ack"),
        ("none", "conflict", "409")]
    with sqlite3.connect(sink) as con:  # the judge's own connection
        assert con.execute("SELECT sku, qty FROM stock").fetchall() == [("snack", 7)]
        assert con.execute("SELECT id FROM inbox").fetchall() == [("snack-7",)]
    assert "students print" in wp.stdout  # the child's stdout, captured by the judge (not a file it left)


@pytest.mark.parametrize(("source", "expected"), [
    ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    ("def open_sink(path):\n    pass\n", "receive"),
])
def test_child_that_cannot_import_raises_start_error(tmp_path, source, expected):
    (tmp_path / "worker.py").write_text(source)
    began = time.monotonic()
    with pytest.raises(WarehouseStartError, match=expected):
        spawn_warehouse(tmp_path / "worker.py", tmp_path / "sink.db", tmp_path / "log.jsonl",
                        tmp_path)
    assert time.monotonic() - began < 3.0  # noticed the exit, did not wait for the timeout
    assert not (tmp_path / "__pycache__").exists()


def test_child_that_hangs_at_import_times_out_and_is_killed(tmp_path):
    (tmp_path / "worker.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(WarehouseStartError, match=r"(not ready|as far as loading your module) within 0\.3 s"):
        spawn_warehouse(tmp_path / "worker.py", tmp_path / "sink.db", tmp_path / "log.jsonl",
                        tmp_path, ready_timeout=0.3)
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp_path).encode() in cmdline.read_bytes():
                leftovers.append(cmdline.parent.name)
        except OSError:
            pass  # the process went away while we looked
    assert leftovers == []
