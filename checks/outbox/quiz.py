"""Lab `outbox` — the quiz after the final check: what the crash test proved, and what it did not.

Each option explains itself once the student answers. Answers go to `work/quiz-outbox.json`.
The wrong options are misconceptions students really hold; options have comparable lengths and
the right one sits in a different place in each question (tests/test_quiz_data.py checks both).
"""

QUIZ = [
    {
        "id": "power-loss",
        "question": "The final check passed. Does that prove no order is lost if the machine loses power?",
        "options": [
            {"text": "Yes: the publisher was killed at the very worst moment, and nothing was lost or doubled.",
             "correct": False,
             "why": "The check killed a process. The operating system, its file cache and the disk kept "
                    "running, so every committed write still reached the file. A power cut can lose "
                    "writes the OS had not flushed; that fault was never injected."},
            {"text": "Yes: SQLite commits are atomic, so a write either happened or not, power or no power.",
             "correct": False,
             "why": "Atomic and durable are different promises. Whether a commit survives a power cut "
                    "depends on fsync, SQLite's synchronous setting and a disk that does not lie about "
                    "its cache. The lab showed atomicity against a process kill only."},
            {"text": "No: a kill stops one process; a power cut can also lose writes the OS had not flushed.",
             "correct": True,
             "why": "Right. The evidence reaches as far as the fault that was really injected: a process "
                    "dying with os._exit. Power loss, a failing disk or restoring a backup each need a "
                    "test of their own."},
            {"text": "Only for the warehouse: its inbox protects it, while the publisher has no inbox.",
             "correct": False,
             "why": "The inbox guards against applying a repeat, on either side of a power cut. It cannot "
                    "bring back a write the disk never stored, in the warehouse or in the outbox."},
        ],
    },
    {
        "id": "mark-after-send",
        "question": "Why does dispatch mark a row sent only after a verified ACK, knowing that a crash "
                    "can then make it send the same order twice?",
        "options": [
            {"text": "Mark first and die before the send, and the order is lost; a repeat can be caught.",
             "correct": True,
             "why": "Right. Mark first, die before the send: the row says sent, nothing was delivered, and "
                    "no later run will ever try again. A duplicate is visible and harmless once the "
                    "warehouse checks its inbox; a loss is silent."},
            {"text": "The ACK makes delivery exactly-once, so marking after it can never cause a repeat.",
             "correct": False,
             "why": "No order of send and mark gives exactly-once delivery. You watched it: publisher #1 "
                    "got its ACK and died before the mark, so the order was delivered twice."},
            {"text": "It is faster: marking after the ACK takes one transaction, marking first takes two.",
             "correct": False,
             "why": "mark_sent is one transaction either way, and speed is not the point. The order of send "
                    "and mark decides which failure a crash causes: a loss or a duplicate."},
            {"text": "SQLite cannot change a row while the HTTP request for that row is still open.",
             "correct": False,
             "why": "It can. dispatch finishes its read before sending so that other connections may write "
                    "meanwhile; that is about locks, not about the order of send and mark."},
        ],
    },
    {
        "id": "inbox",
        "question": "What exactly does the warehouse's inbox protect against?",
        "options": [
            {"text": "Losing an order the publisher never managed to send because it crashed first.",
             "correct": False,
             "why": "The inbox only sees what arrives. An order that was never sent is still pending in the "
                    "outbox, and the next dispatch sends it: that is the outbox's job."},
            {"text": "Orders applied in the wrong order when a retry overtakes a later order on the way there.",
             "correct": False,
             "why": "The inbox recognises IDs; it does not reorder anything. Order comes from the outbox's "
                    "seq and from dispatch stopping at the first failure."},
            {"text": "A slow or unreachable warehouse, by holding orders until it can apply them again.",
             "correct": False,
             "why": "When the warehouse is down, nothing reaches the inbox at all. The row stays pending "
                    "and the publisher's error says so; retrying is the publisher's concern."},
            {"text": "Applying an order twice when its ID comes again, after a crash or a lost response.",
             "correct": True,
             "why": "Right. The inbox records each applied ID in the same transaction as the stock change, "
                    "so a repeat with the identical body is answered with an ACK and changes nothing: "
                    "delivered twice, applied once."},
        ],
    },
    {
        "id": "poison-event",
        "question": "One order at the head of the outbox is malformed for good, and every dispatch stops "
                    "at it. What does it need?",
        "options": [
            {"text": "Retries, forever if need be: a failure that keeps repeating clears up eventually.",
             "correct": False,
             "why": "A permanent failure never clears. Every order behind it waits, and the age of the "
                    "oldest pending row grows without bound. Retrying only hides the problem."},
            {"text": "An alert on the oldest pending row's age; then quarantine it, fix it and re-drive it.",
             "correct": True,
             "why": "Right. A human has to look at it. Moving it aside unblocks the rest, but the order "
                    "still has to reach the warehouse, and moving it changes the order of delivery: "
                    "quarantine is not success."},
            {"text": "Skip it and carry on with the orders behind it, so that the rest of the outbox can flow.",
             "correct": False,
             "why": "Skipping changes the delivery order this business relies on, and nobody learns that an "
                    "order is stuck. Without an alert, that is a loss with extra steps."},
            {"text": "Mark it sent so the rest can flow; the intake can enter the order again later on.",
             "correct": False,
             "why": "That writes the last rung of the ladder without the rung below it: no ACK ever came. "
                    "The outbox would now lie, and the order is lost."},
        ],
    },
    {
        "id": "twice-once",
        "question": "What does \"delivered twice, applied once\" say about the run you just watched?",
        "options": [
            {"text": "The order crossed the network once; the second POST was only a retry inside HTTP itself.",
             "correct": False,
             "why": "The warehouse's log shows two separate POSTs for snack-7, from two processes: the "
                    "first applied, the second recognised as a duplicate. Delivery was at least once."},
            {"text": "It would hold with several publishers running at once, as they share one inbox.",
             "correct": False,
             "why": "The lab runs one dispatcher at a time, with no claims, leases or fencing. Two "
                    "publishers at once were never tested; that needs its own protocol."},
            {"text": "snack-7 reached the warehouse twice and its stock moved once: the effect was single.",
             "correct": True,
             "why": "Right. At-least-once delivery plus an idempotent receiver gives an effect that "
                    "happens once. That is all the phrase claims."},
            {"text": "It holds over any network: loopback behaves like the internet, only faster.",
             "correct": False,
             "why": "Loopback never loses, reorders or delays a packet for long. Latency, loss and "
                    "throughput over the internet were never measured here."},
        ],
    },
]
