"""The member's side of the challenge game, on a chain whose latest block is from before the
reveal deadline (it mines only on transactions): the node tallies the reveals itself, challenges
a certified vote that is not its own without estimating, and finalizes once the window passed."""

from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

from dtrain import vote_key
from dtrain.models import Challenge
from dtrain_node.operator import vote
from dtrain_node.operator.challenger import SETTLE_GAS, Challenger
from dtrain_node.verify import evidence

ZERO = "0x" + "00" * 20
MEMBERS = ["0x" + f"{i:02x}" * 20 for i in (1, 2, 3)]


class StaleChain:
    """What the challenger reads: the certified vote as a block before the reveal deadline
    shows it (none yet), each member's revealed vote key, no challenge."""

    def __init__(self, keys: list[bytes], block_ts: int) -> None:
        self.keys, self.block_ts, self.sent = keys, block_ts, []
        self.sender = MEMBERS[2]

    def certified_vote(self, job_id: int) -> tuple[bytes, int]:
        return bytes(32), 0

    def submission_of(self, job_id: int, member: str) -> SimpleNamespace:
        return SimpleNamespace(vote_key=self.keys[MEMBERS.index(member)])

    def challenge_of(self, attempt: int) -> Challenge:
        return Challenge(ZERO, 0, False, bytes(32), bytes(32), bytes(32), 0, 0, 0, 0, 0, ())

    def latest_block_timestamp(self) -> int:
        return self.block_ts

    def challenge(self, job_id: int, epoch: int, transcript: bytes, gas: int | None) -> None:
        self.sent.append((job_id, epoch, transcript, gas))


def _job(reveal_deadline: int) -> SimpleNamespace:
    return SimpleNamespace(
        id=1, members=MEMBERS, reveal_deadline=reveal_deadline, state=SimpleNamespace(epoch=0)
    )


def _ours(tmp_path, checkpoint: bytes) -> bytes:
    ours = vote.Vote.fresh(checkpoint, [2, 2, 2])
    vote.save(vote.path(tmp_path, 5), ours)
    t = evidence.EpochTranscript(31337, "0x" + "cc" * 20, 1, 0, 5, ((),))
    evidence.save(tmp_path, t)
    return vote_key(ours.checkpoint, ours.participation)


def test_a_fabricated_quorum_is_challenged_before_any_block_shows_the_reveals_closed(
    tmp_path,
) -> None:
    ours = _ours(tmp_path, b"\x11" * 32)
    fabricated = vote_key(b"\x22" * 32, [2, 2, 2])
    now = int(time.time())
    chain = StaleChain([fabricated, fabricated, ours], block_ts=now - 100)
    records = []
    c = Challenger(chain, tmp_path, lambda kind, **d: records.append(kind), window=60)  # type: ignore[arg-type]
    assert not c.ready(_job(reveal_deadline=now - 5), 5)
    ((job, epoch, sha, gas),) = chain.sent
    assert (job, epoch, gas) == (1, 0, SETTLE_GAS)
    assert sha == hashlib.sha256(evidence.path(tmp_path, 5).read_bytes()).digest()
    assert records == ["challenged"]


def test_an_agreed_vote_finalizes_once_the_window_passed_on_the_wall_clock(tmp_path) -> None:
    ours = _ours(tmp_path, b"\x11" * 32)
    now = int(time.time())
    chain = StaleChain([ours, ours, bytes(32)], block_ts=now - 1000)  # one member silent
    c = Challenger(chain, tmp_path, lambda *a, **d: None, window=60)  # type: ignore[arg-type]
    assert not c.ready(_job(reveal_deadline=now - 30), 5)  # the window runs until now + 30
    assert c.ready(_job(reveal_deadline=now - 61), 5)
    assert chain.sent == []


def test_an_attempt_without_a_quorum_is_taken_to_the_referees(tmp_path) -> None:
    """Two of three members reveal two other votes: nothing reaches 2/3. A member with a vote
    of its own disputes the attempt instead of working it again unpaid (no free veto)."""
    ours = _ours(tmp_path, b"\x11" * 32)
    now = int(time.time())
    chain = StaleChain([vote_key(b"\x22" * 32, [2, 2, 2]), ours, bytes(32)], block_ts=now - 100)
    chain.keys[2] = vote_key(b"\x33" * 32, [2, 2, 2])
    records = []
    c = Challenger(chain, tmp_path, lambda kind, **d: records.append(kind), window=60)  # type: ignore[arg-type]
    assert not c.ready(_job(reveal_deadline=now - 5), 5)
    assert len(chain.sent) == 1 and records == ["challenged"]


def test_a_member_that_withholds_its_vote_opens_no_challenge(tmp_path) -> None:
    """The `no-reveal` fault: a vetoer wants no verdict, so it leaves the attempt without a
    quorum undisputed (an honest member takes it to the referees) and waits out the window."""
    _ours(tmp_path, b"\x11" * 32)
    now = int(time.time())
    chain = StaleChain([bytes(32), bytes(32), bytes(32)], block_ts=now - 100)
    c = Challenger(chain, tmp_path, lambda *a, **d: None, window=60, quiet=True)  # type: ignore[arg-type]
    assert not c.ready(_job(reveal_deadline=now - 5), 5)
    assert chain.sent == []
