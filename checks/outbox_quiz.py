"""Lab `outbox` — the quiz after the final check: what the crash test proved, and what it did not.

Each option explains itself once the student answers. Answers go to `work/quiz-outbox.json`.
"""

QUIZ = [
    {
        "id": "power-loss",
        "question": "The final check passed. Does that prove no order is lost if the machine loses power?",
        "options": [
            {"text": "Yes: the publisher was killed at the worst moment and nothing was lost.",
             "correct": False,
             "why": "The check killed a process. The operating system, its file cache and the disk kept "
                    "running, so every committed write still reached the file. A power cut can lose "
                    "writes the OS had not flushed; that fault was never injected."},
            {"text": "No: a process kill is not a power loss. Power cuts, a failing disk or restoring a "
                     "backup are different faults that this test never injected.",
             "correct": True,
             "why": "Right. The evidence reaches as far as the fault that was really injected: a process "
                    "dying with os._exit. Each other fault needs its own test."},
            {"text": "Yes: SQLite commits are atomic, so a power cut cannot hurt.",
             "correct": False,
             "why": "Atomic and durable are different promises. Whether a commit survives a power cut "
                    "depends on fsync, SQLite's synchronous setting and a disk that does not lie about "
                    "its cache. The lab showed atomicity against a process kill only."},
            {"text": "Only for the warehouse: its inbox protects it, the publisher has no inbox.",
             "correct": False,
             "why": "The inbox guards against applying a repeat, on either side of a power cut. It cannot "
                    "bring back a write the disk never stored, in the warehouse or in the outbox."},
        ],
    },
    {
        "id": "mark-after-send",
        "question": "Why does dispatch mark a row sent only after a verified ACK, knowing that a crash "
                    "can then make it send the same event twice?",
        "options": [
            {"text": "Because a crash between marking and sending would lose the event forever, while a "
                     "repeat can be recognised by the receiver.",
             "correct": True,
             "why": "Right. Mark first, die before the send: the row says sent, nothing was delivered, and "
                    "no later run will ever try again. A duplicate is visible and harmless once the "
                    "warehouse checks its inbox; a loss is silent."},
            {"text": "Because the ACK guarantees the event is sent exactly once.",
             "correct": False,
             "why": "No order of send and mark gives exactly-once delivery. You watched it: publisher #1 "
                    "got its ACK and died before the mark, so the event was delivered twice."},
            {"text": "Because it is faster: one transaction instead of two.",
             "correct": False,
             "why": "Speed has nothing to do with it; mark_sent is its own transaction either way. The "
                    "order decides which failure you get: a loss or a duplicate."},
            {"text": "Because SQLite cannot update a row while an HTTP request is open.",
             "correct": False,
             "why": "It can. dispatch finishes its read before sending so that another connection can "
                    "write meanwhile; that is about locks, not about the order of send and mark."},
        ],
    },
    {
        "id": "inbox",
        "question": "What exactly does the warehouse's inbox protect against?",
        "options": [
            {"text": "Losing an event the publisher never managed to send.",
             "correct": False,
             "why": "The inbox only sees what arrives. An event that was never sent is still pending in "
                    "the outbox, and the next dispatch sends it: that is the outbox's job."},
            {"text": "Applying the same event twice when its ID is delivered again, after a crash or a "
                     "lost response.",
             "correct": True,
             "why": "Right. The inbox records each applied ID in the same transaction as the stock change, "
                    "so a repeat with the identical body is answered with an ACK and changes nothing: "
                    "delivered twice, applied once."},
            {"text": "Events arriving in the wrong order.",
             "correct": False,
             "why": "The inbox recognises IDs; it does not reorder anything. Order comes from the outbox's "
                    "seq and from dispatch stopping at the first failure."},
            {"text": "A slow or unreachable warehouse.",
             "correct": False,
             "why": "When the warehouse is down, nothing reaches the inbox at all. The row stays pending "
                    "and the publisher's error says so; retries are the publisher's concern."},
        ],
    },
    {
        "id": "poison-event",
        "question": "One event at the head of the outbox is malformed for good, and every dispatch stops "
                    "at it. What does it need?",
        "options": [
            {"text": "Nothing special: retry it forever, it will go through eventually.",
             "correct": False,
             "why": "A permanent failure never clears. Every event behind it waits, and the age of the "
                    "oldest pending row grows without bound. Retrying only hides the problem."},
            {"text": "Skip it silently and carry on with the events behind it.",
             "correct": False,
             "why": "Silently skipping changes the delivery order this business relies on, and nobody "
                    "learns that an order is stuck. That is a loss with extra steps."},
            {"text": "An alert (on the oldest pending row's age), then quarantine it, fix it and re-drive "
                     "it — knowing that quarantine is not success.",
             "correct": True,
             "why": "Right. A human has to look at it. Moving it aside unblocks the rest, but the order "
                    "still has to reach the warehouse, and moving it changes the order of delivery."},
            {"text": "Mark it sent, so the rest can flow.",
             "correct": False,
             "why": "That writes the last rung of the ladder without the rung below it: no ACK ever came. "
                    "The outbox would now lie, and the order is lost."},
        ],
    },
    {
        "id": "twice-once",
        "question": "What does \"delivered twice, applied once\" say about the run you just watched?",
        "options": [
            {"text": "The event crossed the network exactly once.",
             "correct": False,
             "why": "The warehouse's log shows two POSTs for snack-7: the first applied, the second "
                    "recognised as a duplicate. Delivery was at least once."},
            {"text": "The warehouse received snack-7 twice and its stock changed once: the effect is "
                     "idempotent, the delivery is not.",
             "correct": True,
             "why": "Right. At-least-once delivery plus an idempotent receiver gives an effect that "
                    "happens once. That is all the phrase claims."},
            {"text": "The publisher will keep up just as well over a slow internet link.",
             "correct": False,
             "why": "Loopback HTTP answers in a fraction of a millisecond. Latency, packet loss and "
                    "throughput over the internet were never measured."},
            {"text": "It holds just as well with several publishers running at once.",
             "correct": False,
             "why": "The lab runs one dispatcher at a time, with no claims, leases or fencing. Two "
                    "concurrent publishers were never tested."},
        ],
    },
]
