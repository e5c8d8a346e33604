"""`grade --shard I/N`: which students one of N graders takes.

A student belongs to shard `1 + H(name) mod N`, where H is the first 8 bytes of the SHA-256
of the student's name (as the gradebook names them). It depends on nothing else: not on the
order the folders are listed in, not on how many notebooks anyone submitted, not on the
machine or Python's per-process `hash()` salt. So every shard of a class agrees on who is
whose, a student's notebooks (all labs) land in one shard, and adding files to another
student's folder never moves anyone.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

SPEC = re.compile(r"\A\s*(\d+)\s*/\s*(\d+)\s*\Z")


class ShardError(ValueError):
    """A --shard value that is not `I/N` with 1 <= I <= N."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as Slurm's array ids and the docs count
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = SPEC.match(text or "")
        if not match:
            raise ShardError(f"--shard takes I/N (for example 2/4), not {text!r}")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 1 <= index <= count:
            raise ShardError(f"--shard {text}: I must be between 1 and N (N >= 1)")
        return cls(index, count)

    def holds(self, student: str) -> bool:
        return shard_of(student, self.count) == self.index

    def to_json(self) -> list[int]:
        return [self.index, self.count]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)


def shard_of(student: str, count: int) -> int:
    """The shard (1..count) that grades `student`."""
    digest = hashlib.sha256(student.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1
