"""Lab `vending` — the quiz after the final check: what reconnecting recovers, and what it does not.

Each option explains itself once the student answers. Answers go to `work/quiz-vending.json`.


"""

QUIZ = [
    {
        "id": "reconnect",
        "question": "After the kill, client #2 opened a new TCP connection. What did that reconnect recover?",
        "options": [
            {"text": "A working socket to the feed, nothing more: the cursor and the total came from the "
                     "store file, and the resent event was made harmless by the ledger.",
             "correct": True,
             "why": "Right. A connection carries no business state. What was applied, and up to where, "
                    "lives only in the file; the new process read it and said RESUME with it."},
            {"text": "Everything: the feed remembers where each client was and continues from there.",
             "correct": False,
             "why": "The feed only knows which ACKs it received. It never got ACK k, so it sent k again; "
                    "only the client's own store could say that k was already applied."},
            {"text": "The unacknowledged event: the new connection delivers it exactly once.",
             "correct": False,
             "why": "The new connection delivered it a second time. It was applied once because the "
                    "ledger already held that seq with the same delta, not because of the connection."},
        ],
    },
    {
        "id": "one-transaction",
        "question": "Why must the cursor (last) and the total be committed in one transaction?",
        "options": [
            {"text": "Because a crash between two commits leaves them disagreeing: a cursor saved first "
                     "skips the event after a restart (lost); a total saved first counts it again "
                     "(twice).",
             "correct": True,
             "why": "Right. Any split creates a crash point where the file says one thing about progress "
                    "and another about the result. One transaction has no such point."},
            {"text": "For speed: one commit is faster than two.",
             "correct": False,
             "why": "It is faster, but that is not the reason. Two commits are wrong, not just slow: "
                    "a process killed between them leaves the cursor and the total inconsistent."},
            {"text": "It does not matter as long as the ACK is sent after both commits.",
             "correct": False,
             "why": "The ACK order protects the feed's view. A crash between the two commits still "
                    "leaves the store itself inconsistent, and the restart acts on that store."},
        ],
    },
    {
        "id": "resync",
        "question": "The feed's retained log starts at 10 and a client says RESUME 8. What does raising "
                    "ResyncRequired protect against?",
        "options": [
            {"text": "Against silently skipping event 9: sending 10, 11, … would look like a successful "
                     "catch-up while one change is missing for good.",
             "correct": True,
             "why": "Right. A cursor at 9 joins a log starting at 10; a cursor at 8 does not. Only a "
                    "resynchronisation (a snapshot with its cursor) can fill that hole."},
            {"text": "Against duplicates: the client would otherwise apply 10 twice.",
             "correct": False,
             "why": "Duplicates are handled by the ledger. The danger here is the opposite: an event "
                    "that is never delivered at all."},
            {"text": "Against a slow client: it must reconnect faster.",
             "correct": False,
             "why": "Speed is not the issue. Once the feed has dropped event 9, no reconnect can bring "
                    "it back; the client needs a full state, not a faster replay."},
        ],
    },
]
