"""A member's side of the challenge game (docs/contract.md, "Challenges").

Once an epoch attempt's reveals are over, a quorum's vote is certified but not final: for the
deployment's `challenge_window` anyone registered may dispute it. A member whose own vote (the
checkpoint and participation its transcript led to) is not the certified one disputes it,
bonding `challenge_bond` and naming its transcript file by sha256 (the file it serves to the
referees). It then resolves the challenge once it is due (anyone may) and finalizes after: the
epoch settles on the referees' verdict. When someone else challenges, every member that voted
names its own transcript file (`postTranscript`): the referees re-execute the union of the
files, so a challenger cannot leave honest packets out. A member that voted UNWORKABLE, or has
no vote on disk, has nothing to show and does not challenge. An attempt whose reveals closed
without a quorum is taken to the referees the same way (a minority that blocks the quorum has
its own files judged: no free veto).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain import vote_key
from dtrain.client import BSM
from dtrain.errors import ContractError, TransactionFailed
from dtrain.models import Job
from dtrain_node.operator import vote
from dtrain_node.p2p import envelope
from dtrain_node.p2p.files import sha256_file
from dtrain_node.verify import evidence

log = logging.getLogger(__name__)

SETTLE_GAS = 3_000_000  # above resolveChallenge with 31 referees to slash


class Challenger:
    def __init__(
        self,
        bsm: BSM,
        job_dir: Path,
        metric: Callable[..., None],
        window: int,
        serve: Callable[[str, Path], None] | None = None,
        tamper: str = "",
        quiet: bool = False,
    ) -> None:
        self.bsm, self.job_dir, self.metric, self.window = bsm, job_dir, metric, window
        self.serve = serve  # (sha256 hex, path): serves a file to the referees
        # fault (docs/node.md): challenge with a tampered file, `doctor` (our own packets only)
        # or `inject` (one of our packets replaced by one signed after the epoch)
        self.tamper = tamper
        # fault (`no-reveal`): a member that withholds its vote opens no challenge either
        self.quiet = quiet
        self.posted: set[int] = set()  # attempts whose challenge we named our transcript for

    def ready(self, job: Job, attempt: int) -> bool:
        """Whether the attempt may be finalized now: its certified vote is past its challenge
        window, or its challenge is resolved. On the way, challenges a certified vote that is
        not ours and resolves a challenge that is due."""
        if self.window == 0:
            return True
        certified, closes = self.bsm.certified_vote(job.id)
        if closes == 0:
            # the latest block is from before the reveal deadline (a chain that mines only on
            # transactions): the reveals are over on the wall clock, so tally them ourselves
            certified, closes = self._tally(job), job.reveal_deadline + self.window
        ch = self.bsm.challenge_of(attempt)
        now = max(self.bsm.latest_block_timestamp(), int(time.time()))
        if int(ch.challenger, 16) == 0:
            # no quorum (`certified` zero) is disputed too: referees settle it, no free veto
            if now < closes and not self.quiet and self._disputes(certified, attempt):
                self._challenge(job, attempt, certified)
                return False
            return now >= closes
        if not ch.resolved:
            if now < ch.opened_at + self.window:
                self._post(job, attempt, ch.challenger == self.bsm.sender, bytes(ch.transcript))
            self._resolve(job, ch.opened_at, ch.referees, ch.revealed)
            return False
        return True

    def _post(self, job: Job, attempt: int, mine: bool, named_by_challenge: bytes) -> None:
        """Names our files to the referees of a challenge: our transcript, when someone else
        opened it, so that their re-execution holds every packet we saw (docs/contract.md,
        "Challenges"), and every replay claim of ours of the attempt that the challenge did
        not name (`named_by_challenge`), so that they replay every round we caught."""
        if attempt in self.posted or vote.load(vote.path(self.job_dir, attempt)) is None:
            return
        self.posted.add(attempt)
        file = evidence.path(self.job_dir, attempt)
        files = [] if mine or not file.is_file() else [file]
        named = 0
        for f in files + self._claims(attempt):
            sha = sha256_file(f)
            if sha == named_by_challenge:
                continue
            try:
                self.bsm.post_transcript(job.id, job.state.epoch, sha, gas=SETTLE_GAS)
            except (ContractError, TransactionFailed) as exc:
                log.info("file not posted: %s", exc)
                return
            named += 1
            self.metric(
                "transcript_posted", job=job.id, epoch=job.state.epoch, transcript=sha.hex()
            )
        # every file we had for the referees is named: nothing of ours is left for this phase
        self.metric("files_named", job=job.id, epoch=job.state.epoch, attempt=attempt, files=named)

    def _claims(self, attempt: int) -> list[Path]:
        """Our replay claims of `attempt` (docs/protocol.md 4.6), each served by its sha256."""
        folder = self.job_dir / "claims"
        return sorted(folder.glob(f"{attempt}-*.claim")) if folder.is_dir() else []

    def _tally(self, job: Job) -> bytes:
        """The vote key revealed by 2/3 of the members, as the contract counts it (zero bytes:
        no quorum)."""
        keys = [self.bsm.submission_of(job.id, m).vote_key for m in job.members]
        counts = Counter(k for k in keys if any(k))
        if not counts:
            return bytes(32)
        key, votes = counts.most_common(1)[0]
        return key if 3 * votes >= 2 * len(job.members) else bytes(32)

    def _dissents(self, certified: bytes, attempt: int) -> bool:
        ours = vote.load(vote.path(self.job_dir, attempt))
        return ours is not None and vote_key(ours.checkpoint, ours.participation) != certified

    def _disputes(self, certified: bytes, attempt: int) -> bool:
        if self.tamper or self._claims(attempt):
            return True  # a replay claim disputes a member's pay, whatever the vote
        ours = vote.load(vote.path(self.job_dir, attempt))
        return ours is not None and not ours.is_unworkable and self._dissents(certified, attempt)

    def _challenge(self, job: Job, attempt: int, certified: bytes) -> None:
        file = evidence.path(self.job_dir, attempt)
        claimed = self._claims(attempt)
        if self.tamper and file.is_file():
            file = self._tampered(file)
        elif claimed and not self._dissents(certified, attempt):
            file = claimed[0]  # our vote is the certified one: the dispute is the claim
        sha = sha256_file(file) if file.is_file() else bytes(32)
        try:
            # without estimation: the latest block may be from before the reveal deadline
            self.bsm.challenge(job.id, job.state.epoch, sha, gas=SETTLE_GAS)
        except (ContractError, TransactionFailed) as exc:
            log.info("challenge not taken: %s", exc)  # someone challenged first, or too late
            return
        self.metric(
            "challenged",
            job=job.id,
            epoch=job.state.epoch,
            certified=certified.hex(),
            transcript=sha.hex(),
        )

    def _tampered(self, file: Path) -> Path:
        """Faults `doctor` and `inject`: our transcript tampered with, served under its own
        sha256."""
        t = evidence.load(file)
        t = self._doctored(t) if self.tamper == "doctor" else self._injected(t)
        out = file.with_name(f"{self.tamper}-{t.attempt}.bin")
        out.write_bytes(t.encode())
        if self.serve is not None:
            self.serve(sha256_file(out).hex(), out)
        return out

    def _doctored(self, t: evidence.EpochTranscript) -> evidence.EpochTranscript:
        """Every other member's packets left out."""
        me = self.bsm.sender
        rounds = tuple(tuple(p for p in packets if p.sender == me) for packets in t.rounds)
        log.warning("fault: challenging with a transcript of our own packets only")
        return dataclasses.replace(t, rounds=rounds)

    def _injected(self, t: evidence.EpochTranscript) -> evidence.EpochTranscript:
        """Our packet of the first round we sent one replaced by the payload of our next one,
        under a commitment we sign now: a packet no member applied, valid by its signature."""
        me = self.bsm.sender
        ours = [(r, p) for r, packets in enumerate(t.rounds) for p in packets if p.sender == me]
        r, first = ours[0]
        later = next(p for _, p in ours[1:] if p.payload != first.payload)
        account = self.bsm.account
        chunks = envelope.seal(
            account,
            chain_id=t.chain_id,
            contract=t.contract,
            job_id=t.job_id,
            epoch=t.attempt,
            round=r,
            payload=later.payload,
        )
        forged = evidence.Packet(me, later.payload, envelope.commitment(account, chunks).encode())
        rounds = list(t.rounds)
        rounds[r] = tuple(forged if p is first else p for p in rounds[r])
        log.warning("fault: challenging with our round %d packet re-signed after the epoch", r)
        return dataclasses.replace(t, rounds=tuple(rounds))

    def _resolve(self, job: Job, opened_at: int, referees: Any, revealed: int) -> None:
        due = opened_at + 3 * self.window
        everyone = len(referees) > 0 and revealed == len(referees)
        if not everyone and max(self.bsm.latest_block_timestamp(), time.time()) < due:
            return
        try:
            # without estimation: a chain that mines only on transactions would estimate
            # against a block from before `due`
            rc = self.bsm.resolve_challenge(job.id, job.state.epoch, gas=SETTLE_GAS)
        except (ContractError, TransactionFailed):
            return  # resolved by someone else, or the chain's clock is not there yet
        for e in rc.events:
            if e.name == "ChallengeResolved":
                self.metric(
                    "challenge_resolved",
                    job=job.id,
                    epoch=job.state.epoch,
                    verdict=bytes(e.args["verdictKey"]).hex(),
                    overturned=bool(e.args["overturned"]),
                )
