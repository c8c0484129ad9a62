"""Our vote in an epoch attempt, kept on disk between its commit and its reveal.

The chain takes a vote in two steps: the commitment (a hash binding the job, the epoch, us,
the checkpoint hash, the participation counts, the sha256 of the transcript file the vote was
made from and a random salt) before the epoch's deadline,
then the vote itself once reveals open. The salt is drawn fresh for every attempt, and the
whole vote is written durably (temp file, fsync, rename) *before* the commit is sent, so a node
killed between the two can still reveal after a restart; a node that lost it could not (its
commitment would count as a dropout).

`UNWORKABLE` is the reserved vote for an epoch that cannot be done: the job's dataset or start
model is unavailable or fails its hash. Its participation is ignored by the contract; we send
zeros of the members' length.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dtrain import UNWORKABLE, commitment_hash

SALT_BYTES = 32


@dataclass(frozen=True)
class Vote:
    checkpoint: bytes  # the checkpoint hash, or UNWORKABLE
    participation: tuple[int, ...]  # sync rounds applied from each member, in members order
    salt: bytes
    # sha256 of our transcript file for the attempt (zero: none): a challenge's referees judge
    # the vote against this file, bound before we saw anyone's vote
    transcript: bytes = bytes(32)

    @classmethod
    def fresh(
        cls,
        checkpoint: bytes,
        participation: list[int] | tuple[int, ...],
        transcript: bytes = bytes(32),
    ) -> Vote:
        """A vote with a fresh random salt (never reuse one: a salt seen in a reveal would let
        anyone test guesses against our next commitment)."""
        parts = tuple(int(p) for p in participation)
        return cls(bytes(checkpoint), parts, os.urandom(SALT_BYTES), bytes(transcript))

    @classmethod
    def unworkable(cls, members: int) -> Vote:
        return cls.fresh(UNWORKABLE, [0] * members)

    @property
    def is_unworkable(self) -> bool:
        return self.checkpoint == UNWORKABLE

    def commitment(self, job_id: int, epoch: int, operator: str) -> bytes:
        """What we commit: keccak256(abi.encode(job, epoch, operator, checkpoint,
        participation, transcript, salt)), as the contract's `commitmentHash`."""
        return bytes(
            commitment_hash(
                job_id,
                epoch,
                operator,
                self.checkpoint,
                list(self.participation),
                self.transcript,
                self.salt,
            )
        )

    def to_json(self) -> dict[str, object]:
        return {
            "checkpoint": self.checkpoint.hex(),
            "participation": list(self.participation),
            "salt": self.salt.hex(),
            "transcript": self.transcript.hex(),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Vote:
        parts = d["participation"]
        if not isinstance(parts, list):
            raise ValueError("participation must be a list")
        return cls(
            bytes.fromhex(str(d["checkpoint"])),
            tuple(int(p) for p in parts),
            bytes.fromhex(str(d["salt"])),
            bytes.fromhex(str(d.get("transcript", "00" * 32))),
        )


def path(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"attempt-{attempt}.vote.json"


def save(p: Path, vote: Vote) -> None:
    """Writes `vote` to `p` durably: the data and the rename both reach the disk before we
    return (the commit that follows must never outlive the vote it commits to)."""
    tmp = p.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(vote.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    fd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(p: Path) -> Vote | None:
    """The vote saved at `p`; None when there is none."""
    if not p.is_file():
        return None
    return Vote.from_json(json.loads(p.read_text()))
