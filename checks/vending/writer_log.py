"""Lab `vending`, steps 6 and 7: checks on what the child saw the student's code do with the writer and
the before_ack hook it was handed (the probe's log: writes, drains, closes, hooks, in order).
"""

from __future__ import annotations

from checks.vending.hints import ABORT_HINT, ACK_AFTER_COMMIT, CLOSE_HINT
from labkit.judge.expect import Miss
from labkit.values import decode, show


def seqs_text(seqs: list) -> str:
    """[0, 1, 2] as "0, 1 and 2"; [] as "none"."""
    items = [str(s) for s in seqs]
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def logged(record: dict) -> list[dict]:
    """What the child saw the code do with its writer, reader and hook, in order."""
    return record["observed"].get("log", [])


def written(record: dict) -> list[bytes]:
    """Every write, as the bytes the code wrote."""
    return [decode(e["data"]) for e in logged(record) if e["kind"] == "write"]


def closed(record: dict) -> Miss | None:
    """close(), then wait_closed() — on every path (the calls the writer saw, in the child)."""
    kinds = [e["kind"] for e in logged(record)]
    if "close" not in kinds:
        if record["observed"].get("closed"):
            return Miss("the socket was aborted, but writer.close() was never called", CLOSE_HINT,
                       clause="6.close-every-path")
        return Miss("the writer was never closed", CLOSE_HINT, clause="6.close-every-path")
    if "wait_closed" not in kinds[kinds.index("close"):]:
        return Miss("writer.close() was called, but wait_closed() was never awaited after it",
                   "After close(), await `asyncio.wait_for(writer.wait_closed(), timeout)`.",
                   clause="6.close-every-path")
    return None


def acks_after_commits(record: dict) -> Miss | None:
    """Each ACK written after its commit and after before_ack; each write drained (what the writer
    saw, in the child; for real TCP the judge also reads the store when each ACK arrives)."""
    log = logged(record)
    hooked_seqs: set[int] = set()
    for i, entry in enumerate(log):
        if entry["kind"] == "before_ack":
            seq = decode(entry["seq"])
            if entry.get("last_committed") is not None and entry["last_committed"] < seq:
                return Miss(f"before_ack({seq}) ran while another connection still saw last "
                           f"{entry['last_committed']}", "Call before_ack(seq) after consume_line returned.",
                           clause="6.commit-before-hook")
            hooked_seqs.add(seq)
        if entry["kind"] == "write":
            data = decode(entry["data"])
            if not (isinstance(data, bytes) and data.startswith(b"ACK ")):
                continue
            seq = int(data[4:].strip()) if data[4:].strip().isdigit() else None
            if seq is not None and entry.get("last_committed") is not None and entry["last_committed"] < seq:
                return Miss(f"{data!r} was written while another connection still saw last "
                           f"{entry['last_committed']}: the ACK went out before the commit", ACK_AFTER_COMMIT,
                           clause="6.hook-before-ack")
            if seq is not None and seq not in hooked_seqs:
                return Miss(f"{data!r} was written before before_ack({seq}) was called",
                           "Call before_ack(seq) after the commit and before writing the ACK.",
                           clause="6.hook-before-ack")
            following = [e["kind"] for e in log[i + 1:] if e["kind"] in ("drain", "write", "close")]
            if not following or following[0] != "drain":
                return Miss(f"{data!r} was written but not drained before going on",
                           "After each write, `await asyncio.wait_for(writer.drain(), timeout)`.",
                           clause="6.drain-bounded")
    return None


def wrote_acks(seqs: list[int], hint: str = "", clause: str = "6.hook-before-ack"):
    def check(record: dict) -> Miss | None:
        expected = [b"ACK %d\n" % s for s in seqs]
        got = written(record)
        if got != expected:
            text = ", ".join(show(w) for w in got) or "nothing"
            return Miss(f"wrote {text}; expected " + (", ".join(show(w) for w in expected) or "nothing"),
                       hint or "Write exactly one `ACK <seq>\\n` per committed line, nothing else.", clause=clause)
        return None

    return check


def hooked(seqs: list[int]):
    def check(record: dict) -> Miss | None:
        got = [decode(e["seq"]) for e in logged(record) if e["kind"] == "before_ack"]
        if got != seqs:
            return Miss(f"before_ack was called with {seqs_text(got)}; expected {seqs_text(seqs)}",
                       "After each committed line, call before_ack(seq) with that line's seq.",
                       clause="6.commit-before-hook")
        return None

    return check


def hooks_on_acked_lines(fails_at: int | None):
    """On every path, before_ack(seq) is called exactly for the lines that get an ACK, each right
    before its ACK (no await comes between them); only a hook that raised has no ACK after it."""

    def check(record: dict) -> Miss | None:
        hooked_seqs = [decode(e["seq"]) for e in logged(record) if e["kind"] == "before_ack"]
        acked = [int(w[4:-1]) for w in written(record)
                 if isinstance(w, bytes) and w.startswith(b"ACK ") and w[4:-1].isdigit()]
        if hooked_seqs in (acked, acked + [fails_at]):
            return None
        extra = next((seq for i, seq in enumerate(hooked_seqs) if i >= len(acked) or acked[i] != seq), None)
        return Miss(f"before_ack was called for seqs {hooked_seqs}, but ACKs went out for {acked}"
                   + (f": before_ack({extra}) ran for a line that failed" if extra is not None else ""),
                   "Call before_ack(seq) only after consume_line returned the line's ACK, right before writing "
                   "it: never in a `finally` or an `except`, never for a line that failed.",
                   clause="6.commit-before-hook")

    return check


def aborted(record: dict) -> Miss | None:
    kinds = [e["kind"] for e in logged(record)]
    if "abort" not in kinds:
        return Miss("wait_closed() never finished, and writer.transport.abort() was not called", ABORT_HINT,
                   clause="6.abort")
    return None
