"""Step 8 of lab `outbox`: send_http against the judge's scripted listeners."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.outbox import schema as stores
from checks.outbox.common import (
    NOT_SEEN,
    Check,
    drawn_after_fixed,
    event,
    name,
    outcome_text,
    seen_after,
)
from labkit.judge.expect import (
    Miss,
    Plan,
    both,
    is_module_exception,
    raises,
    returns,
    under,
)
from labkit.judge.run import StepContext, slices
from labkit.judge.verdict import Case
from labkit.judge.witness import Witness
from labkit.values import decode, encode, show

NETWORK_HINT = ("Network failures are not DeliveryError: let the OSError propagate "
                "(the row stays pending and is re-sent later).")
CLOSE_HINT = ("Close the response on every path before returning or raising: `with opener.open(...) as "
              "response:`, and `exc.close()` on an HTTPError (it holds the connection open).")
URL_HINTS = {
    "8.url-type": "url must be a str.",
    "8.url-scheme": "Only `http://`, in lower case: compare the URL's text, not only urlsplit's (lower-cased) scheme.",
    "8.url-host-localhost": "HOST `localhost` exactly: urlsplit's `.hostname` lower-cases it, so compare the URL's "
                            "own text.",
    "8.url-host-loopback": "HOST may be `localhost` or any address in 127.0.0.0/8.",
    "8.url-host-other": "Only localhost or 127.x.y.z: 0.0.0.0 is not in 127.0.0.0/8 (yet Linux connects it to this "
                        "machine), IPv6 and names are not allowed.",
    "8.url-host-spelling": "Only the dotted-decimal form: `ipaddress.ip_address(host)` refuses 127.1, hex, a bare "
                           "integer and leading zeros; `socket.inet_aton` accepts them all.",
    "8.url-port": "The URL must name a port from 1 to 65535, written in ASCII digits only.",
    "8.url-path": "The path must be exactly /events.",
    "8.url-userinfo": "No user info (user@host).",
    "8.url-query": "No query string, not even an empty `?`.",
    "8.url-fragment": "No fragment, not even an empty `#`.",
    "8.url-whitespace": "urlsplit silently removes tabs and newlines and strips leading control characters: check "
                        "that the URL is exactly `http://HOST:PORT/events`, character by character.",
}
CALLS_PER_CHILD = 30  # calls that talk to a listener, per child (see slices)
# A judge answers at once, within milliseconds; this late, it was the machine, and the shortest
# timeout a case gives a client that should get an answer is 0.5 s.
KEPT_WAITING = 0.1
# The client's timeout in the cases whose server stays silent (1.5 s): the step waits it out, so
# it is short; a busy machine can only make such a call time out sooner, which is its answer.
SLOW_SERVER_TIMEOUT = 0.1
TIMEOUT_HINT = "timeout is a positive finite int or float, not bool: anything else is ValueError."


def _ack_text(event_id: str | None) -> bytes:
    return ('{"ack":' + (f'"{event_id}"' if event_id is not None else "null") + "}").encode()


def _padded(size: int) -> Callable[[str | None], bytes]:
    """A valid ACK padded with JSON whitespace to exactly `size` bytes."""

    def body(event_id):
        text = _ack_text(event_id)
        return text + b" " * (size - len(text))

    return body


class SendHttp:
    """Step 8: every call of send_http gets its own listener (scripted replies), so what the
    listener saw — a connection, the request, how much of the answer was read, the close — is
    the judge's evidence for that call alone."""

    def __init__(self, ctx: StepContext):
        from checks.outbox.replies import Replier

        self.ctx = ctx
        self.replier = Replier()
        self.plans: list[Plan] = []
        self.specs: list[dict] = []
        self.listeners: dict[str, Any] = {}
        self.leak_seen = False
        self.silent: set[str] = set()  # cases refused before any connection
        self.drawn: set[str] = set()  # cases whose input the seed draws
        self.witness = Witness(self._look)
        self.proxy = self.replier.listen([self._reply(200, lambda i: json_ack(i))])

    @staticmethod
    def _reply(status, body=b"", **kw):
        from checks.outbox.replies import Reply

        return Reply(status, body, **kw)

    def _look(self, case: str, point: str, said: dict) -> tuple[dict, dict]:
        listener = self.listeners.get(case)
        if listener is None or point != "after" or not listener.visits:
            return {}, {}
        gone = listener.clients_gone(0.1 if self.leak_seen else 0.5)
        self.leak_seen = self.leak_seen or not gone
        return {"closed": gone}, {}

    def fresh(self, prefix: str, event_id: str | None = None) -> dict:
        rng = self.ctx.rng
        return event(event_id or name(rng, prefix), name(rng, "sku", 3), rng.randint(1, 1000))

    def add(self, label: str, called: str, expected: str, args: list, listener, rules: list[tuple[str, Check]],
            close_check: bool = True, silent: bool = False) -> None:
        if silent:
            self.silent.add(label)
        if listener is not None:
            self.listeners[label] = listener
        look = close_check and listener is not None
        if look:
            rules = [*rules, ("8.closes-connection", self._closed(label))]
        self.plans.append(Plan(label, called, expected, both(*(under(c, k) for c, k in rules)),
                               clauses=tuple(dict.fromkeys(c for c, _ in rules))))
        self.specs.append({"name": label, "fn": "send_http", "args": [encode(a) for a in args], "look": look})

    def _closed(self, case: str) -> Check:
        def check(record):
            listener = self.listeners[case]
            if not listener.visits:
                return None
            saw = seen_after(self.witness, case)
            if saw is None:
                return NOT_SEEN
            if saw.get("closed") is False:
                return Miss(f"{outcome_text(record['outcome'])}, but the connection was still open afterwards",
                            CLOSE_HINT)
            return None

        return check

    def run(self) -> list[Case]:
        url = f"http://127.0.0.1:{self.proxy.port}"
        env = {k: url for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}
        env.update(no_proxy="", NO_PROXY="")
        try:
            with self.witness:
                groups = [([self.plans[i] for i in group], {"calls": [self.specs[i] for i in group],
                                                            "witness": self.witness.url})
                          for group in self._children()]
                found = {c.name: c for c in self.ctx.side_by_side("sending", groups, env=env)}
                found.update(self._again_if_kept_waiting(found, env))
            return drawn_after_fixed([found[p.name] for p in self.plans], self.drawn)
        finally:
            self.replier.close()

    def _children(self) -> list[list[int]]:
        """Which calls each child makes (indexes into plans and specs): the calls refused before
        connecting in one, those that talk in runs of at most CALLS_PER_CHILD, and each call whose
        server is silent on purpose in a child of its own: it sleeps through its short timeout (SLOW_SERVER_TIMEOUT)
        while the others compute, instead of adding that wait to a talking child's run (step 8's
        longest child, and so the step's time)."""
        waits = {label for label, listener in self.listeners.items()
                 if any(reply.delay or reply.body_delay for reply in listener.replies)}
        silent = [i for i, spec in enumerate(self.specs) if spec["name"] in self.silent]
        talking = [i for i, spec in enumerate(self.specs) if spec["name"] not in self.silent | waits]
        slow = [[i] for i, spec in enumerate(self.specs) if spec["name"] in waits - self.silent]
        children = [talking[part] for part in slices(len(talking), CALLS_PER_CHILD)]
        return [group for group in (*slow, silent, *children) if group]

    def _again_if_kept_waiting(self, found: dict[str, Case], env: dict[str, str]) -> dict[str, Case]:
        """Run once more, in a fresh child, each failed case whose listener answered late: the
        judge's own thread, on a busy machine, kept the client waiting past a short timeout (seen
        in CI: "timeout 0.5 is accepted" failed with a TimeoutError under one seed of five). The
        second run's verdict is the case's, whatever it is: a bug fails it again."""
        late = [p for p in self.plans if not found[p.name].passed and p.name in self.listeners
                and self.listeners[p.name].kept_waiting() > KEPT_WAITING]
        if not late:
            return {}
        specs = {spec["name"]: spec for spec in self.specs}
        for plan in late:
            self.listeners[plan.name].forget()
        group = (late, {"calls": [specs[p.name] for p in late], "witness": self.witness.url})
        return {c.name: c for c in self.ctx.side_by_side("sending", [group], env=env)}


def json_ack(event_id: str | None) -> bytes:
    import json

    return json.dumps({"ack": event_id}).encode()


def _two_seconds(record):
    outcome = record["outcome"]
    value = decode(outcome["value"]) if outcome["kind"] == "returned" else None
    if type(value) in (int, float) and value == 2:
        return None
    shown = "no default" if outcome["kind"] == "returned" and value is None else outcome_text(outcome)
    return Miss(f"timeout's default is {shown}" if outcome["kind"] == "returned" else shown,
                "The contract's signature is send_http(url, event, timeout=2.0): a caller that passes no timeout "
                "waits at most 2 s.")


def _no_connection(listener) -> Check:
    def check(record):
        if listener.connected():
            return Miss(f"{outcome_text(record['outcome'])}, after connecting to the server",
                        "Validate the URL and timeout before opening any connection.")
        return None

    return check


def _delivery_error(hint: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and outcome["type"] == "DeliveryError" and "OSError" not in outcome["mro"]:
            return is_module_exception("DeliveryError", hint)(record)
        return Miss(outcome_text(outcome), hint)

    return check


def _network_error(record):
    outcome = record["outcome"]
    if outcome["kind"] == "raised" and "OSError" in outcome["mro"] and "DeliveryError" not in outcome["mro"]:
        return None
    return Miss(outcome_text(outcome), NETWORK_HINT)


def _not_value_error(hint: str) -> Check:
    def check(record):
        outcome = record["outcome"]
        if outcome["kind"] == "raised" and "ValueError" in outcome.get("mro", []):
            return Miss(outcome_text(outcome), hint)
        return None

    return check


def _posted(listener, sent: dict) -> list[tuple[str, Check]]:
    def once(record):
        posts = [v for v in listener.visits if v.method]
        if len(posts) != 1:
            return Miss(f"the server saw {len(posts)} requests", "POST the event exactly once.")
        visit = posts[0]
        if visit.method != "POST" or visit.path != "/events":
            return Miss(f"the server saw {visit.method} {visit.path}", "POST to /events.")
        if visit.body != stores.canonical(sent).encode():
            return Miss(f"the body was {(visit.body or b'').decode('utf-8', 'replace')!r}",
                        "POST the canonical body: json.dumps(event, sort_keys=True, separators=(',', ':')).")
        return None

    def content_type(record):
        posts = [v for v in listener.visits if v.method]
        ctype = posts[0].headers.get("content-type") if posts else None
        if ctype is None:
            return Miss("the request had no Content-Type header", "Send `Content-Type: application/json`.")
        if ctype.split(";")[0].strip().lower() != "application/json":
            return Miss(f"Content-Type was {ctype!r}", "Send `Content-Type: application/json`.")
        return None

    return [("8.post-canonical", once), ("8.content-type", content_type)]


def check_send_http(ctx: StepContext) -> list[Case]:
    from checks.outbox.inputs import NOT_JSON, NOT_OBJECTS, OTHER_STATUSES, REDIRECTS, URL_REFUSED
    from checks.outbox.replies import ENDLESS

    h = SendHttp(ctx)
    rng = ctx.rng
    reply = h._reply
    listen = h.replier.listen
    true = "Return True (the object True) only for a verified ACK."

    def no_proxy(record):
        if h.proxy.visits:
            return Miss("the request went to the proxy named in http_proxy",
                        "urllib sends even 127.0.0.1 through http_proxy: build the opener with ProxyHandler({}).")
        return None

    ok = h.fresh("ok")
    good = listen([reply(200, json_ack)])
    h.add("a 200 ACK with the event's id", f"send_http(url, {show(ok)})", "True; one POST with the canonical JSON body",
          [good.url, ok], good,
          [("8.no-proxy", no_proxy), ("8.returns-true", returns(True, true)), *_posted(good, ok)])
    local = h.fresh("local")
    listener = listen([reply(200, json_ack)])
    h.add("localhost is allowed", "send_http('http://localhost:PORT/events', ...)", "True",
          [listener.url.replace("127.0.0.1", "localhost"), local], listener,
          [("8.url-host-localhost", returns(True, URL_HINTS["8.url-host-loopback"]))])
    drawn = f"127.{rng.randint(1, 254)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    for host, label in (("127.0.0.2", "127.0.0.2 is in 127.0.0.0/8"),
                        (drawn, "an address the seed draws in 127.0.0.0/8")):
        e = h.fresh("loop")
        listener = listen([reply(200, json_ack)], host=host)
        h.add(label, f"send_http('http://{host}:PORT/events', ...)", "True", [listener.url, e],
              listener, [("8.url-host-loopback", returns(True, URL_HINTS["8.url-host-loopback"]))])
    h.drawn.add("an address the seed draws in 127.0.0.0/8")
    for label, url, clause, hint in (
            ("127.255.255.255 is in 127.0.0.0/8", "http://127.255.255.255:9/events", "8.url-host-loopback",
             "127.255.255.255 is in 127.0.0.0/8: accept it (here the network then refuses: an OSError)."),
            ("port 65535 is a port", "http://127.0.0.1:65535/events", "8.url-port",
             "Ports run from 1 to 65535: 65535 is allowed.")):
        h.add(label, f"send_http({url!r}, ...)", "not ValueError: the URL is valid (an OSError, since nothing "
                                                  "answers there)", [url, h.fresh("edge")], None,
              [(clause, _not_value_error(hint)), ("8.network-error", _network_error)])
    for label, url, clause in URL_REFUSED:
        listener = listen([reply(200, json_ack)])
        target = url.format(p=listener.port)
        h.add(f"url: {label} is refused", f"send_http({target!r}, ...)", "ValueError before any connection",
              [target, h.fresh("url")], listener,
              [(clause, raises("ValueError", URL_HINTS[clause])), ("8.before-connect", _no_connection(listener))],
              close_check=False, silent=True)
    for label, value in (("bytes", b"http://127.0.0.1:PORT/events"), ("None", None)):
        listener = listen([reply(200, json_ack)])
        target = value.replace(b"PORT", str(listener.port).encode()) if value else value
        h.add(f"url as {label} is refused", f"send_http({show(target)}, ...)", "ValueError", [target, h.fresh("url")],
              listener, [("8.url-type", raises("ValueError", URL_HINTS["8.url-type"])),
                         ("8.before-connect", _no_connection(listener))], close_check=False, silent=True)
    for bad, clause in ((0, "8.timeout-positive"), (0.0, "8.timeout-positive"), (-0.0, "8.timeout-positive"),
                        (-1, "8.timeout-positive"), (True, "8.timeout-type"), (False, "8.timeout-type"),
                        ("2", "8.timeout-type"), (None, "8.timeout-type"), (float("nan"), "8.timeout-finite"),
                        (float("inf"), "8.timeout-finite"), (float("-inf"), "8.timeout-finite")):
        listener = listen([reply(200, json_ack)])
        h.add(f"timeout {bad!r} is refused", f"send_http(url, event, timeout={bad!r})", "ValueError before any "
              "connection", [listener.url, h.fresh("timeout"), bad], listener,
              [(clause, raises("ValueError", TIMEOUT_HINT)), ("8.before-connect", _no_connection(listener))],
              close_check=False, silent=True)
    h.plans.append(Plan("the default timeout is 2 seconds", "inspect.signature(send_http): timeout's default",
                        "2.0 (send_http(url, event, timeout=2.0))", under("8.timeout-default", _two_seconds),
                        clauses=("8.timeout-default",)))
    h.specs.append({"name": "the default timeout is 2 seconds", "default_of": "timeout", "args": []})
    h.silent.add("the default timeout is 2 seconds")
    for good_timeout in (2, 0.5):
        listener = listen([reply(200, json_ack)])
        h.add(f"timeout {good_timeout!r} is accepted", f"send_http(url, event, timeout={good_timeout!r})", "True",
              [listener.url, h.fresh("timeout"), good_timeout], listener,
              [("8.timeout-positive", returns(True, "A positive int or float is a valid timeout."))])
    for status in REDIRECTS:
        listener = listen([reply(status, b'{"moved": true}', headers=(("Location", "/events/elsewhere"),)),
                           reply(200, json_ack)])

        def not_followed(record, listener=listener):
            if len(listener.visits) > 1:
                follow = listener.visits[1]
                return Miss(f"the redirect was followed ({follow.method} {follow.path})",
                            "Never follow redirects: a redirect is an answer, not a delivery (an HTTPRedirectHandler "
                            "whose redirect_request returns None).")
            return None

        h.add(f"a {status} redirect is not an ACK", f"send_http(url, event) answered {status} with a Location",
              "DeliveryError; the redirect not followed", [listener.url, h.fresh("moved")], listener,
              [("8.no-redirect", not_followed),
               ("8.no-redirect", _delivery_error("A 3xx is not an ACK: raise DeliveryError (urllib turns a "
                                                 "redirected POST into a GET without the body)."))])
    for status in OTHER_STATUSES:
        body = b"" if status in (204, 304) else json_ack
        listener = listen([reply(status, body)])
        h.add(f"status {status} is not an ACK", f"send_http(url, event) answered {status} "
              + ("(no body)" if not body else "with a perfect ACK body"), "DeliveryError", [listener.url, h.fresh("st")],
              listener, [("8.status-200", _delivery_error(
                  "Only status 200 is success: check `response.status == 200` (urllib raises HTTPError only for "
                  "non-2xx; turn that into DeliveryError too)."))])
    accepted = [
        ("a compact ACK", _ack_text, "8.ack-exact"),
        ("an ACK with JSON whitespace around and inside", lambda i: b'\n { "ack" :\t"' + i.encode() + b'" } \n',
         "8.ack-exact"),
        ("an ACK whose id is written with a \\u escape", lambda i: b'{"ack": "\\u00' + f"{ord(i[0]):02x}".encode()
         + i[1:].encode() + b'"}', "8.ack-id"),
        ("a 1,024-byte ACK (with Content-Length)", _padded(1024), "8.ack-size"),
    ]
    for label, body, clause in accepted:
        listener = listen([reply(200, body)])
        h.add(f"{label} is an ACK", f"send_http(url, event) answered 200 with {label}", "True",
              [listener.url, h.fresh("ack")], listener, [(clause, returns(True, _ACK_RULE))])
    # the ACK is the status and the body: whatever the reply's headers say about its type
    for ctype, shown in ((None, "no Content-Type"), ("text/plain", "Content-Type: text/plain"),
                         ("application/json; charset=utf-8", "Content-Type: application/json; charset=utf-8")):
        listener = listen([reply(200, _ack_text, headers=(("Content-Type", ctype),))])
        h.add(f"an ACK with {shown} is an ACK", f"send_http(url, event) answered 200 with a perfect ACK and {shown}",
              "True", [listener.url, h.fresh("ack")], listener,
              [("8.ack-any-content-type", returns(True, "The ACK is the status and the body: don't check the reply's "
                                                        "Content-Type (a warehouse may send none, or text/plain)."))])
    for framing, shown in (("close", "without Content-Length"), ("chunked", "chunked")):
        listener = listen([reply(200, _padded(1024), framing=framing)])
        h.add(f"a 1,024-byte ACK ({shown}) is an ACK", f"send_http(url, event) answered 200 with a "
              f"1,024-byte ACK, {shown}", "True", [listener.url, h.fresh("ack")], listener,
              [("8.ack-size", returns(True, _ACK_RULE))])
    numeric = h.fresh("", event_id=str(rng.randint(100, 99999)))
    refused = [
        ("an extra key", lambda i: b'{"ack": "' + i.encode() + b'", "ok": true}', "8.ack-exact", None),
        ("no ack key", lambda i: b'{"id": "' + i.encode() + b'"}', "8.ack-exact", None),
        ("the key ACK in capitals", lambda i: b'{"ACK": "' + i.encode() + b'"}', "8.ack-exact", None),
        ("an empty object", b"{}", "8.ack-exact", None),
        ("another id", lambda i: _ack_text(i + "-other"), "8.ack-id", None),
        ("the id in other case", lambda i: _ack_text(i.upper()), "8.ack-id", None),
        ("a prefix of the id", lambda i: _ack_text(i[:-1]), "8.ack-id", None),
        ("the id with a space before it", lambda i: _ack_text(" " + i), "8.ack-id", None),
        ("the id as a number", lambda i: b'{"ack": ' + i.encode() + b"}", "8.ack-id", numeric),
        ("the id in a list", lambda i: b'{"ack": ["' + i.encode() + b'"]}', "8.ack-id", None),
        ("ack null", b'{"ack": null}', "8.ack-id", None),
        ("ack true", b'{"ack": true}', "8.ack-id", None),
        *[(f"JSON {text.decode()}", text, "8.ack-json-object", None) for text in NOT_OBJECTS],
        ("the id as a JSON string", lambda i: b'"' + i.encode() + b'"', "8.ack-json-object", None),
        ("the ACK inside a JSON list", lambda i: b"[" + _ack_text(i) + b"]", "8.ack-json-object", None),
        *[(f"not JSON: {text!r}", text, "8.ack-not-json", None) for text in NOT_JSON],
        ("an ACK followed by more text", lambda i: _ack_text(i) + b" x", "8.ack-not-json", None),
    ]
    for label, body, clause, e in refused:
        listener = listen([reply(200, body)])
        h.add(f"{label} is not an ACK", f"send_http(url, event) answered 200 with {label}", "DeliveryError",
              [listener.url, e or h.fresh("bad")], listener, [(clause, _delivery_error(_ACK_HINTS[clause]))])
    for framing, shown in (("length", "with Content-Length"), ("close", "without Content-Length"),
                           ("chunked", "chunked")):
        listener = listen([reply(200, _padded(1025), framing=framing)])
        h.add(f"a valid ACK padded past 1,024 bytes (a 1,025-byte reply, {shown}) is not an ACK", f"send_http(url, event) answered 200 with "
              f"{{\"ack\": id}} and spaces, 1,025 bytes, {shown}", "DeliveryError", [listener.url, h.fresh("big")],
              listener, [("8.ack-size", _delivery_error(_SIZE_RULE))])
    endless = listen([reply(200, _ack_text, framing="close", stream=ENDLESS)])

    def bounded(record):
        if endless.visits and endless.visits[0].sent >= ENDLESS // 2:
            return Miss(f"{outcome_text(record['outcome'])}, after reading {endless.visits[0].sent // 2**20} MB of the "
                        "reply", _SIZE_RULE)
        return None

    h.add("a reply that never ends is not an ACK", "send_http(url, event) answered 200 with an ACK followed by "
          "64 MB of spaces and no Content-Length", "DeliveryError, after reading at most 1,025 bytes",
          [endless.url, h.fresh("endless")], endless,
          [("8.ack-read-bounded", bounded), ("8.ack-size", _delivery_error(_SIZE_RULE))])
    refusing = h.replier.refusing_port()
    h.add("nothing listening", "send_http(url of a port where nothing listens, event)",
          "an OSError (connection refused)", [f"http://127.0.0.1:{refusing}/events", h.fresh("refused")], None,
          [("8.network-error", _network_error)])
    for label, hang_up in (("the server closes without a response", "close"),
                           ("the server resets the connection", "reset")):
        listener = listen([reply(200, json_ack, hang_up=hang_up)])
        h.add(label, f"send_http(url, event); {label.split(' ', 2)[2]}", "an OSError (not DeliveryError)",
              [listener.url, h.fresh("gone")], listener, [("8.network-error", _network_error)], close_check=False)
    for label, kw in (("no reply within the timeout", {"delay": 1.5}),
                      ("the body does not come within the timeout", {"body_delay": 1.5})):
        listener = listen([reply(200, json_ack, **kw)])

        def in_time(record, listener=listener):
            if record["outcome"]["kind"] == "returned":
                return Miss(f"{outcome_text(record['outcome'])} after the server's 1.5 s",
                            "Pass timeout to the connection (urlopen(..., timeout=timeout)): every wait is bounded.")
            return None

        h.add(label, f"send_http(url, event, timeout={SLOW_SERVER_TIMEOUT}); the server waits 1.5 s",
              f"an OSError (a timeout) after about {SLOW_SERVER_TIMEOUT} s",
              [listener.url, h.fresh("slow"), SLOW_SERVER_TIMEOUT], listener,
              [("8.timeout-honoured", in_time), ("8.network-error", _network_error)])
    return h.run()


_ACK_RULE = ("Success is only status 200 and a body that parses (json.loads) to exactly the object "
             "{\"ack\": <this event's id>}: compare the parsed value, `reply == {\"ack\": event[\"id\"]}`, not "
             "the text, and don't convert or strip the id.")
_ACK_HINTS = {
    "8.ack-exact": ("The ACK is an object with exactly one key, `ack` (in lower case): a reply with another key, "
                    "an extra key or no key at all is not an ACK. Compare the whole parsed value, "
                    "`reply == {\"ack\": event[\"id\"]}`, rather than looking up one key."),
    "8.ack-id": ("The value under `ack` must be this event's id, the same string exactly: not another id, not "
                 "the id in other case, cut, padded, converted from a number or wrapped in a list, not null "
                 "or true. Compare it with `==` on the parsed value, without str(), strip() or lower()."),
    "8.ack-json-object": ("JSON that is not an object (true, null, a list, a string) is not an ACK: compare the whole "
                          "parsed value, `reply == {\"ack\": event[\"id\"]}`, which is simply False for any of "
                          "them, instead of indexing or calling .get on it."),
    "8.ack-not-json": ("A reply that is not JSON, or not UTF-8, is not an ACK: catch ValueError around decoding and "
                       "parsing (UnicodeDecodeError and JSONDecodeError are both ValueErrors) and raise "
                       "DeliveryError."),
}
_SIZE_RULE = ("Read at most 1,025 bytes (`response.read(1025)`) and refuse more than 1,024: a longer reply is not "
              "evidence (whatever its Content-Length says), and reading it all lets a server fill your memory.")



