"""The judge's witness endpoint: what it reads from a child, and `asker_holds`.

`asker_holds`: inside a witness's look, the descriptors the *asking* process holds on a file.

The asker is found from its TCP connection (/proc/net/tcp, then /proc/*/fd). Each process
here holds a different number of descriptors on the same file, so a look that found the wrong
process (another asker, the judge itself) would count wrong.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

from labkit.judge.witness import MAX_HEAD_LINE, Witness, asker_holds
from labkit.probe import see

ASK = textwrap.dedent("""
    import sys
    from labkit.probe import see
    held = [open(sys.argv[2]) for _ in range(int(sys.argv[3]))]
    print(see(sys.argv[1], "case", "raised", n=len(held)))
""")


def test_each_asker_is_counted_as_itself(tmp_path):
    path = tmp_path / "store.db"
    path.write_bytes(b"")
    mine = open(path)  # the judge's own descriptor on it: never the asker's
    try:
        with Witness(lambda case, point, said: ({"held": asker_holds(path)}, {})) as witness:
            for _warm_up in range(50):  # connections the table keeps in TIME_WAIT, as in a long run
                subprocess.run([sys.executable, "-c", ASK, witness.url, str(path), "0"], check=True,
                               capture_output=True, timeout=60)
            counts = [3, 1, 0, 2]
            procs = [subprocess.Popen([sys.executable, "-c", ASK, witness.url, str(path), str(n)],
                                      stdout=subprocess.PIPE, text=True) for n in counts]
            for proc in procs:
                proc.communicate(timeout=60)
            seen = [(s.said["n"], s.saw["held"]) for s in witness.sightings()[-len(counts):]]
    finally:
        mine.close()
    assert sorted(seen) == [(n, n) for n in sorted(counts)]


def _raw(url: str, data: bytes) -> bytes:
    host, port = url.split("//")[1].split("/")[0].split(":")
    reply = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(65536):
                reply += chunk
        except OSError:  # refused before all of it was read: a reset (or, after it, "not connected")
            return reply or b"reset"
    return reply


def test_whatever_a_child_sends_gets_an_answer_and_the_witness_goes_on():
    """A child shares the judge's network: it may send anything to the witness. Each bad request
    is answered 400 and leaves no sighting; a good one after them is seen as usual."""
    body = b'{"case": "c", "point": "after"}'
    bad = [b"", b"GET /see HTTP/1.0\r\n\r\n", b"garbage\r\n\r\n",
           b"POST /see HTTP/1.0\r\nContent-Length: 2\r\n\r\n[]",
           b"POST /see HTTP/1.0\r\nContent-Length: 5\r\n\r\n{nope",
           b"POST /see HTTP/1.0\r\nContent-Length: x\r\n\r\n" + body,
           b"POST /see HTTP/1.0\r\n" + b"X-A: b\r\n" * 100 + b"\r\n" + body,
           b"POST /see HTTP/1.0\r\nX-Long: " + b"a" * (4 * MAX_HEAD_LINE) + b"\r\n\r\n" + body]
    with Witness(lambda case, point, said: ({"saw": point}, {"ok": case})) as witness:
        answers = [_raw(witness.url, request) for request in bad]
        good = see(witness.url, "c", "after", extra=1)
        sightings = witness.sightings()
    assert all(a.startswith(b"HTTP/1.0 400 Bad Request\r\n") or a == b"reset" for a in answers), answers
    assert good == {"ok": "c"}
    assert [(s.case, s.point, s.said.get("extra"), s.saw) for s in sightings] == [("c", "after", 1, {"saw": "after"})]
