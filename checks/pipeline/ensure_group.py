"""Lab `pipeline`, step 5: ensure_group — at id 0 on a stream with entries, on a missing stream,
on a group that exists, on a key that is not a stream."""

from __future__ import annotations

from checks.pipeline.common import call, raised_with, run, servers
from labkit.judge.expect import Miss, Plan, both, returns, under
from labkit.judge.run import StepContext
from labkit.judge.verdict import Case

ZERO_HINT = ("Create the group at id 0 (`xgroup_create(stream, group, id='0', mkstream=True)`): a group at `$` "
             "starts after the last entry, so the entries added before it are never delivered.")


def group_info(srv, key: str, group: str) -> dict | None:
    with srv.judge_valkey() as judge:
        if not judge.exists(key) or judge.type(key) != "stream":
            return None
        return next((g for g in judge.xinfo_groups(key) if g["name"] == group), None)


def check_group(ctx: StepContext) -> list[Case]:
    srv = servers(ctx)
    user = srv.user(ctx.step)
    before, missing, exists, wrong = (user.prefix + k for k in ("before", "missing", "exists", "wrong"))
    with srv.judge_valkey() as judge:
        judge.xadd(before, {"n": "1"})
        judge.xadd(before, {"n": "2"})
        judge.xadd(exists, {"n": "1"})
        judge.xadd(exists, {"n": "2"})
        judge.xgroup_create(exists, "g", id="0")
        judge.xreadgroup("g", "c1", {exists: ">"}, count=1)
        judge.set(wrong, "not a stream")
    kept = group_info(srv, exists, "g")

    def at_zero(record: dict) -> Miss | None:
        info = group_info(srv, before, "g")
        if info is None:
            return Miss("no group g on the stream", "Create the group with XGROUP CREATE.")
        if info["last-delivered-id"] != "0-0":
            return Miss(f"the group starts after {info['last-delivered-id']}: the two entries added before it "
                        "would never be delivered", ZERO_HINT)
        return None

    def made(record: dict) -> Miss | None:
        return None if group_info(srv, missing, "g") is not None else Miss(
            "no stream with a group g", "Pass mkstream=True: the stream may not exist yet.")

    def unchanged(record: dict) -> Miss | None:
        info = group_info(srv, exists, "g")
        if info is None or (info["last-delivered-id"], info["pending"]) != (kept["last-delivered-id"], kept["pending"]):
            return Miss(f"the group changed: {info}", "An existing group is left as it is: BUSYGROUP → False.")
        return None

    propagates = raised_with("WRONGTYPE", "Only BUSYGROUP means 'exists already'; let other errors "
                                          "(here WRONGTYPE) propagate.")

    plans = [
        Plan("a stream with entries added before the group", "ensure_group(r, stream, 'g') on a stream of 2 entries",
             "True; the group starts at 0-0", both(under("5.group-at-zero", returns(True)), at_zero),
             clauses=("5.group-at-zero",)),
        Plan("a stream that does not exist yet", "ensure_group(r, missing, 'g')", "True; stream and group made",
             both(under("5.mkstream", returns(True, "Pass mkstream=True: the stream may not exist yet.")), made), clauses=("5.mkstream",)),
        Plan("a group that exists already", "ensure_group(r, stream, 'g') where g exists with a pending entry",
             "False; the group unchanged", both(under("5.busygroup-false", returns(False, "BUSYGROUP → False.")),
                                                unchanged), clauses=("5.busygroup-false",)),
        Plan("a key that is not a stream", "ensure_group(r, key, 'g') where the key holds a string",
             "the error propagates", propagates, clauses=("5.busygroup-false",)),
    ]
    keys = [before, missing, exists, wrong]
    specs = [{"name": p.name, "valkey": user.kwargs, "ops": [call("ensure_group", "$r", k, "g")]}
             for p, k in zip(plans, keys, strict=True)]
    return run(ctx, plans, specs)
