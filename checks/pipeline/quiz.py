"""Lab `pipeline` — the quiz after the final check: what PostgreSQL and a Valkey consumer group
guarantee, and what stays the student's job.

Each option explains itself once the student answers. Answers go to `work/quiz-pipeline.json`.
Wrong options are misconceptions people really hold; the right answer is not always in the same place.
"""

QUIZ = [
    {
        "id": "second-xadd",
        "question": "Publisher #1 died after XADD and publisher #2 added snack-7 again. Which part of the "
                    "system made that harmless?",
        "options": [
            {"text": "Valkey: a stream refuses a second entry whose id field it has already stored.",
             "correct": False,
             "why": "A stream does not look inside entries. The judge's XRANGE showed two entries for "
                    "snack-7, with two fences: Valkey stored both without a word."},
            {"text": "The fence: publisher #2's larger token invalidated #1's entry in the stream.",
             "correct": False,
             "why": "The fence is checked in one place only, your UPDATE that saves 'published'. #1's "
                    "entry stays in the stream and is delivered like any other."},
            {"text": "The inbox: the event ID was applied already, so the second entry was a duplicate.",
             "correct": True,
             "why": "Right. Both entries were delivered and both reached consume; the inbox row made the "
                    "second one a duplicate, acknowledged without effect. Neither server deduplicates."},
            {"text": "The consumer group: it delivers each event ID to one consumer only, and never twice.",
             "correct": False,
             "why": "A group delivers each *entry* to one consumer at a time. Two entries with one event "
                    "inside are two deliveries, possibly to two consumers at once."},
        ],
    },
    {
        "id": "sequence-token",
        "question": "Why does claim take its token from nextval('fence_seq') and not from max(fence) + 1?",
        "options": [
            {"text": "Because max(fence) has to scan the whole outbox table, which is far too slow.",
             "correct": False,
             "why": "An index would make it fast. It would still be wrong: speed is not the point."},
            {"text": "Because two claims running at once can read the same max and hand out one number twice.",
             "correct": True,
             "why": "Right. Under SKIP LOCKED two publishers claim different rows at the same moment, and "
                    "neither sees the other's uncommitted fence. A sequence gives every caller a different "
                    "number, never goes backwards (not even on rollback) and survives restarts."},
            {"text": "Because a sequence restarts from 1 after a crash, which keeps the tokens small.",
             "correct": False,
             "why": "The opposite: a sequence never goes backwards. If it restarted, a new owner could get "
                    "a smaller token than a stale one, and the stale one would look current."},
            {"text": "Because nextval is only allowed in a transaction that already holds FOR UPDATE locks.",
             "correct": False,
             "why": "nextval works anywhere and never waits for other transactions. That is why it is "
                    "safe to call for many rows in parallel claims."},
        ],
    },
    {
        "id": "commit-then-ack",
        "question": "Why does consume commit its PostgreSQL transaction before XACK, and not the other "
                    "way round?",
        "options": [
            {"text": "Because an XACK sent inside an open transaction would be rolled back together with it.",
             "correct": False,
             "why": "Valkey knows nothing about PostgreSQL's transactions: an XACK is final the moment "
                    "it is answered, whatever the database does next. That is exactly the danger."},
            {"text": "Because a crash between them costs a redelivery the inbox absorbs, not a lost order.",
             "correct": True,
             "why": "Right. Ack first and die before the commit: the group forgot the entry and the "
                    "database never applied it. Commit first and die before the ack: the entry comes back, "
                    "and the inbox makes it a duplicate. Consumer A in the final check died exactly there."},
            {"text": "Because the group refuses XACK until the consumer's own database has committed it.",
             "correct": False,
             "why": "The group cannot see your database. It acknowledges whatever you tell it to, even an "
                    "entry that was never applied."},
            {"text": "It does not matter: the PEL keeps acknowledged entries, so nothing can be lost either way.",
             "correct": False,
             "why": "XACK removes the entry from the PEL. After that, no XREADGROUP and no XAUTOCLAIM "
                    "will ever hand it out again."},
        ],
    },
    {
        "id": "xautoclaim-cursor",
        "question": "Why must reclaim call XAUTOCLAIM again until the cursor comes back as 0-0?",
        "options": [
            {"text": "Because XAUTOCLAIM claims at most one pending entry per call, whatever COUNT says.",
             "correct": False,
             "why": "It claims up to COUNT entries per call. The limit that bites is on how many pending "
                    "entries it examines: at most ten times COUNT."},
            {"text": "Because a returned cursor of 0-0 tells the server to reset every delivery count.",
             "correct": False,
             "why": "The cursor only says where the next call starts; 0-0 in the answer means the walk "
                    "is complete. Delivery counts are never reset."},
            {"text": "Because one call looks at only part of the PEL, and may return nothing while more wait.",
             "correct": True,
             "why": "Right. A single call can come back empty with a cursor in the middle of the PEL. A "
                    "reclaim that stops there leaves a dead consumer's entries pending for ever."},
            {"text": "Because XAUTOCLAIM fails with an error whenever the PEL holds more entries than COUNT.",
             "correct": False,
             "why": "It does not fail: it returns a cursor and partial results, silently. That is what "
                    "makes stopping after one call a quiet bug."},
        ],
    },
    {
        "id": "appendfsync",
        "question": "Valkey runs with appendonly yes and appendfsync always. What does that buy you, and "
                    "what does it not?",
        "options": [
            {"text": "An answered XADD survives a server kill; an event added twice is still kept twice.",
             "correct": True,
             "why": "Right. Each write is on disk before it is answered, so the entries, the group and "
                    "its PEL came back after the SIGKILL. Durability is not deduplication: the two "
                    "snack-7 entries were both kept, faithfully."},
            {"text": "Exactly-once delivery: with every write on disk, no entry is ever delivered twice.",
             "correct": False,
             "why": "Durability keeps what was written; it does not decide how often it is handed out. "
                    "Redelivery after a consumer crash is the group working as designed."},
            {"text": "Nothing for streams: the AOF records string keys only, and streams live in memory.",
             "correct": False,
             "why": "The AOF records every write command, XADD, XGROUP and XACK included. That is how the "
                    "PEL's owners survived the kill in the final check."},
            {"text": "The same as everysec, only slower: either way no answered write is ever lost at all.",
             "correct": False,
             "why": "With everysec a crash can lose about the last second of writes that were already "
                    "answered: an entry ID your publisher saved could point at nothing."},
        ],
    },
]
