"""Lab `relay` — the quiz after the final check: what leases, tokens and quarantine do, and what they cost.

Each option explains itself once the student answers. Answers go to `work/quiz-relay.json`.
Wrong options are misconceptions people really hold; the right answer is not always in the same place.
"""

QUIZ = [
    {
        "id": "lease-not-enough",
        "question": "Publisher A held a lease on snack-2. Why could A still act on snack-2 after B had taken "
                    "it over?",
        "options": [
            {"text": "Because two leases on one row can both be live when the publishers' clocks agree.",
             "correct": False,
             "why": "The claim is one transaction under the write lock: the file never holds two live leases "
                    "on a row. The problem is not two leases at once, it is a holder that no longer knows its "
                    "lease is gone."},
            {"text": "Because A's lease ran out while A was frozen, and on waking A still believed it held it.",
             "correct": True,
             "why": "Right. A process cannot notice its own pause. Only something checked at the moment it "
                    "acts can stop it: the token, compared by the outbox in complete."},
            {"text": "Because A did not renew its lease; a renewal every 0.1 s would have kept it safe.",
             "correct": False,
             "why": "A frozen process renews nothing. Any pause longer than the renewal interval ends the "
                    "same way, and pauses of seconds happen (garbage collection, a stalled VM, SIGSTOP)."},
            {"text": "Because SQLite stores lease_until as a REAL, which is far too imprecise for short leases.",
             "correct": False,
             "why": "A REAL holds the time to well under a microsecond. The lease ran out correctly; A simply "
                    "was not running to see it."},
        ],
    },
    {
        "id": "one-counter",
        "question": "Why must every token come from fence_counter in the file, and not from a counter each "
                    "publisher keeps in memory?",
        "options": [
            {"text": "Because Python integers cannot be shared between threads, and publishers use threads.",
             "correct": False,
             "why": "The publishers here are separate processes; no Python object is shared between them at "
                    "all. That is exactly why the counter must live in the one thing they share: the file."},
            {"text": "Because reading the counter from SQLite is faster than incrementing a Python variable.",
             "correct": False,
             "why": "It is slower, if anything. The counter is in the file for correctness: it is the only "
                    "place every publisher, and every restart of one, sees the same last value."},
            {"text": "Because every row of one claim must carry the same token, and only the file can ever do that.",
             "correct": False,
             "why": "Each claimed row takes its own new token (last + 1, stored back). The point is that no "
                    "token is ever handed out twice, on any row, by any process."},
            {"text": "Because a counter in memory restarts in each process: a new owner could get a smaller token.",
             "correct": True,
             "why": "Right. A new owner could get token 1 while the stale owner still holds 7, and the stale "
                    "one would look newer. A token is only useful if a later claim always has a larger one, "
                    "across processes, "
                    "restarts and crashes. One counter in the file, updated in the claim's transaction, "
                    "guarantees it."},
        ],
    },
    {
        "id": "quarantine-cost",
        "question": "The refused event was quarantined, and the events behind it went on. What did that cost?",
        "options": [
            {"text": "Order: later events reached the warehouse first, and the redriven one arrived after them.",
             "correct": True,
             "why": "Right. The judge printed the events delivered out of seq order. Quarantine trades the "
                    "order of delivery for progress, and that trade has to be visible and alarmed on."},
            {"text": "Nothing: a quarantined event is counted as handled, so the warehouse stays fully consistent.",
             "correct": False,
             "why": "Quarantined is not sent. The warehouse never saw that order until the redrive; counting "
                    "it as handled would hide an undelivered order from everyone."},
            {"text": "Speed: quarantined rows keep being retried in the background and slow the rest down.",
             "correct": False,
             "why": "A quarantined row is never claimed again until someone redrives it. That is the whole "
                    "difference from a retry: it waits for a human, not for a timer."},
            {"text": "Safety: quarantined rows leave the outbox, so a crash before the redrive loses them.",
             "correct": False,
             "why": "They stay in the outbox, committed, with their last error. A crash changes nothing; the "
                    "redrive later finds them exactly where they were."},
        ],
    },
    {
        "id": "full-jitter",
        "question": "Why does backoff draw the whole wait at random, from the Random it is given?",
        "options": [
            {"text": "Because a random wait is shorter on average than plain doubling, so retries finish sooner.",
             "correct": False,
             "why": "Speed is not the point: the average full-jitter wait is half the ceiling, but the aim is "
                    "to spread retries out, so that rows which failed together do not come back together."},
            {"text": "Because equal jitter needs two draws, and the Random may only be used once per call.",
             "correct": False,
             "why": "One draw each way would do. Equal jitter is refused because half of every wait is fixed, "
                    "so retries still bunch up; full jitter uses the whole range."},
            {"text": "Because spread-out waits keep failed rows apart, and the given Random replays them by seed.",
             "correct": True,
             "why": "Right. Full jitter breaks up a retry storm; drawing only from the Random you were given "
                    "makes every wait reproducible, so a test (and you, debugging) can replay them."},
            {"text": "Because the global random module is not safe to use from several publisher processes.",
             "correct": False,
             "why": "Each process has its own global random state; nothing breaks. It is simply not "
                    "replayable from outside, so no check could say which wait was right."},
        ],
    },
    {
        "id": "stale-send",
        "question": "After SIGCONT, the frozen publisher still sent snack-2 to the warehouse. Why did that do "
                    "no harm here, and when would it?",
        "options": [
            {"text": "It did no harm because its lease had run out, so the warehouse refused the late request.",
             "correct": False,
             "why": "The warehouse knows nothing about leases: it answered the late request with an ACK. "
                    "Only its inbox (a duplicate ID) and the outbox's token check stopped any damage."},
            {"text": "The inbox saw a duplicate ID; a receiver checking neither ID nor token would act twice.",
             "correct": True,
             "why": "Right. Fencing protects the store that checks the token. Every other side effect needs "
                    "its own protection: an idempotent receiver, or a receiver that checks tokens too."},
            {"text": "It can never do harm: StaleLease makes complete undo the send that came before it.",
             "correct": False,
             "why": "Nothing can take back a request the warehouse has answered. StaleLease only stops the "
                    "stale publisher from writing its story into the outbox."},
            {"text": "It did harm: snack-2 was applied twice, and the final check accepts that on purpose.",
             "correct": False,
             "why": "The warehouse's log shows one 'applied' and one 'duplicate' for snack-2, and the final "
                    "check requires exactly that: applied once."},
        ],
    },
]
