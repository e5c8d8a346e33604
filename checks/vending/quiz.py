"""Lab `vending` — the quiz after the final check: what reconnecting recovers, and what it does not.

Each option explains itself once the student answers. Answers go to `work/quiz-vending.json`.
The wrong options are misconceptions students really hold; options have comparable lengths and
the right one sits in a different place in each question (tests/test_quiz_data.py checks both).
"""

QUIZ = [
    {
        "id": "reconnect",
        "question": "After the kill, client #2 opened a new TCP connection. What did that reconnect recover?",
        "options": [
            {"text": "The whole session: the feed kept client #1's place and simply carried on from there.",
             "correct": False,
             "why": "The feed keeps no place for a client. It only knows which ACKs it received: it never "
                    "got ACK 1, so it sent 1 again. Where the machine stood came from its own store."},
            {"text": "A working socket, nothing more: the cursor and the total came from the store file.",
             "correct": True,
             "why": "Right. A connection carries no business state. What was applied, and up to where, lives "
                    "only in the file; the new process read it and said RESUME with it."},
            {"text": "The unacknowledged line, which a fresh connection is sure to deliver exactly once.",
             "correct": False,
             "why": "The new connection delivered line 1 a second time. It was applied once because the "
                    "ledger already held seq 1 with the same delta, not because of the connection."},
            {"text": "Nothing useful: after a kill the machine has to ask for the whole log from seq 0.",
             "correct": False,
             "why": "The cursor survived in the file, so the machine resumed from it. Asking for everything "
                    "again (RESUME -1) is what a store that resets itself on start does: reprocessing."},
        ],
    },
    {
        "id": "one-transaction",
        "question": "Why must the cursor (last) and the total be committed in one transaction?",
        "options": [
            {"text": "Two commits per line are slower, and the checks measure how fast lines are applied.",
             "correct": False,
             "why": "Two commits are slower, but that is not the reason, and no check times them. Two "
                    "commits are wrong: a kill between them leaves the file contradicting itself."},
            {"text": "Only the ACK's place matters: sent after both commits, two transactions are safe.",
             "correct": False,
             "why": "The ACK protects the feed's view, not the store's. A kill between the two commits "
                    "leaves a cursor and a total that disagree, and the restart trusts both."},
            {"text": "A kill between two commits leaves them disagreeing: the change is lost or doubled.",
             "correct": True,
             "why": "Right. Cursor first: the resent line looks done and is dropped (lost). Total first: "
                    "the cursor asks for the line again and it is counted twice. One commit has no gap."},
            {"text": "The ledger makes the order harmless: a resent seq is spotted whichever commit ran first.",
             "correct": False,
             "why": "The ledger can only recognise what was committed with it. With the cursor saved and "
                    "the ledger row lost, the resent line is dropped as done: the change is lost."},
        ],
    },
    {
        "id": "resync",
        "question": "The feed's retained log starts at 10 and a client says RESUME 8. What does raising "
                    "ResyncRequired protect against?",
        "options": [
            {"text": "Silently skipping event 9: sending 10, 11, … would look like a complete catch-up.",
             "correct": True,
             "why": "Right. A cursor at 9 joins a log starting at 10; a cursor at 8 needs 9, which the feed "
                    "no longer has. Only a resynchronisation (a snapshot with its cursor) fills that hole."},
            {"text": "Applying event 10 twice, since the client would receive it again in a later replay.",
             "correct": False,
             "why": "Duplicates are the ledger's job, and 10 was never applied. The danger is the opposite: "
                    "event 9 would never be delivered at all, and nothing would say so."},
            {"text": "A client that is too slow: it should reconnect sooner, and then replay would work.",
             "correct": False,
             "why": "Speed is not the issue. Once the feed has dropped event 9, no reconnect can bring it "
                    "back; the client needs the full state, not a faster replay."},
            {"text": "Nothing serious: one missing event out of many is a rounding error in a stock count.",
             "correct": False,
             "why": "Event 9 could be a delivery of 900 bags. A count that silently misses one change is "
                    "wrong from then on, and every later total builds on it."},
        ],
    },
    {
        "id": "ack-before-commit",
        "question": "What goes wrong if the machine sends ACK n first and commits n second?",
        "options": [
            {"text": "Nothing: the ACK only says the line arrived, and the commit follows a moment later.",
             "correct": False,
             "why": "An ACK is a promise that the change is saved; the feed forgets the line when it gets "
                    "one. A kill in that moment breaks the promise for good."},
            {"text": "The line is applied twice, because the feed resends it once the commit has landed.",
             "correct": False,
             "why": "That is the other order's risk (commit, then ACK), and the ledger handles it. After an "
                    "ACK the feed never resends the line at all."},
            {"text": "The ledger limits the harm: a line resent after the kill is recognised as a duplicate.",
             "correct": False,
             "why": "Nothing is resent: the feed saw the ACK and forgot the line. The ledger cannot "
                    "recognise a line that never comes back."},
            {"text": "A kill between them loses the change: the feed forgets it, and the store never had it.",
             "correct": True,
             "why": "Right. That is why consume_line returns the ACK only after the commit, and why the "
                    "check reads the store from another connection the moment the ACK exists."},
        ],
    },
    {
        "id": "duplicate-ack",
        "question": "The resent seq changed nothing in the store. Why does the machine still answer ACK?",
        "options": [
            {"text": "It should not: ACKing a duplicate tells the feed a change happened when none did.",
             "correct": False,
             "why": "An ACK says \"this seq is in my store\", not \"I changed something just now\". For the "
                    "duplicate that is true: it was applied before the kill."},
            {"text": "So the feed can forget the line: without an ACK it resends it on every reconnect.",
             "correct": True,
             "why": "Right. The feed resends whatever it never saw ACKed. Staying silent about a duplicate "
                    "turns one harmless repeat into a line that comes back forever."},
            {"text": "Only to keep the connection open: the feed hangs up on a machine that stays silent.",
             "correct": False,
             "why": "The feed waits for the answer, and a silent machine times out, but that is a symptom. "
                    "The reason is the resend rule: no ACK, and the line comes back."},
            {"text": "The feed checks the delta in the ACK against its log, and that is where it sees a repeat.",
             "correct": False,
             "why": "An ACK carries only the seq. Recognising the duplicate is the machine's job, in its "
                    "ledger; the feed only learns that it may forget the line."},
        ],
    },
]
