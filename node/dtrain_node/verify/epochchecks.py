"""The replay spot checks of one epoch attempt, as the epoch trainer runs them
(docs/protocol.md 4.6): `commit` at each round's start (the private state kept, served, and its
digest for our commitment), `after_round` once the round is applied (the round's checks are
assigned; ours go to the checker thread), `finish` once the transcript is agreed (the failed
checks that stand become signed claims).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from eth_account import Account

from dtrain_node.optim import reproduce, statefile
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.p2p import envelope as envmod
from dtrain_node.train import inner, shard
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.verify import claims, evidence, replaycheck, spotcheck
from dtrain_node.verify.replaycheck import Check, ClaimHead, Outcome

DRAIN_S = 120.0  # at the epoch's end: how long the last rounds' checks may still take


@dataclass(frozen=True)
class CheckSetup:
    """What the checks of an attempt need from the trainer."""

    job_dir: Path
    head: ClaimHead  # chain, contract, job, attempt
    epoch: int
    members: Sequence[str]
    me: str
    key: str  # our operator key: signs claims
    rate: float
    demo: DeMoConfig
    reach: int  # rows of the token tensors a token reaches (DeMo.of_model)
    train_job: TrainJob
    seed: int  # of the batch order (the trainer's)
    device: torch.device
    plan: inner.InnerPlan  # the job's inner steps, as the trainer takes them
    epoch_start_step: int  # the job's inner step at the epoch's start
    start: dict[str, torch.Tensor]  # the model's state at the attempt's start
    serve: Callable[[str, Path], None]  # (sha256 hex, path): serve a file to peers
    fetch: Callable[..., Path]  # (sha256 hex, member, dest, most bytes, seconds): a state
    metric: Callable[..., Any]


class EpochChecks:
    def __init__(self, s: CheckSetup) -> None:
        self.s = s
        self.ring = spotcheck.StateRing(s.job_dir, s.head.attempt, s.serve)
        self.claims: list[claims.Claim] = []
        self.assigned: dict[int, list[tuple[str, str]]] = {}  # round -> (checker, member)
        replica = replaycheck.demo_replica(self._build, s.demo, s.demo.sync_interval, s.reach)
        self.state_bound: int | None = None  # the most bytes a member's state file may have
        self.checker = replaycheck.Checker(
            replica, self._fetch, s.job_dir / "checks", self._report, self._within
        )

    def _build(self) -> tuple[Any, Callable[[Any, Sequence[Any]], None], Callable[[str], Any]]:
        """A second copy of the job's model and data (on the checker's thread)."""
        s = self.s
        backend = make_backend(s.train_job)
        backend.model.load_state_dict(s.start)
        backend.to(s.device)

        def run(opt: Any, batches: Sequence[Any]) -> None:
            inner.replay_round(opt, backend, batches, s.plan, s.epoch_start_step, s.device)

        def stream(member: str) -> Any:
            idx = shard.assign(backend.n_items(), s.head.job_id, s.epoch, list(s.members), member)
            return backend.batches(idx, s.train_job.batch_size, seed=s.seed)

        return backend.model, run, stream

    def commit(self, rnd: int, opt: DeMo) -> bytes:
        """At round `rnd`'s start: our private state kept and served; its digest (to sign)."""
        data = statefile.encode(reproduce.private_state(opt))
        if self.state_bound is None:
            self.state_bound = statefile.size_bound(opt)
        return bytes.fromhex(self.ring.put(rnd, data))

    def _within(self) -> float:
        """The time a member has to hand over its state (the referees give it the same)."""
        assert self.state_bound is not None  # checks follow our first commitment
        return replaycheck.state_deadline(self.state_bound)

    def _fetch(self, sha: str, member: str, dest: Path, within_s: float) -> Path:
        """A member's state, refused when it offers more bytes than a state of this job may
        have, within `within_s`: a member that serves it slowly holds up no later check."""
        return self.s.fetch(sha, member, dest, self.state_bound, within_s)

    def after_round(
        self,
        rnd: int,
        shared_before: Sequence[torch.Tensor],
        shared_after: Sequence[torch.Tensor],
        packets: Sequence[tuple[str, bytes]],
        commitments: Sequence[bytes],
    ) -> list[tuple[str, str]]:
        """The round's checks (from the shared state after it); ours are queued. Returns the
        assignment (checker, member)."""
        s = self.s
        pairs = spotcheck.assign(spotcheck.shared_digest(shared_after), s.members, rnd, s.rate)
        self.assigned[rnd] = pairs
        # a transport that signs nothing gives no commitments: nothing to check against
        pairs_held = zip(packets, commitments, strict=False)
        got = {str(sender).lower(): (p, c) for (sender, p), c in pairs_held}
        for checker, member in pairs:
            held = got.get(member.lower())
            if checker.lower() != s.me.lower() or held is None or not held[1]:
                continue  # not ours; the member is missing anyway; an unsigned transport
            self.checker.submit(Check(rnd, member, held[0], held[1], list(shared_before)))
        return pairs

    def _report(self, o: Outcome) -> None:
        s, c = self.s, o.check
        self.s.metric(
            "replay_checked",
            job=s.head.job_id,
            epoch=s.epoch,
            attempt=s.head.attempt,
            round=c.round,
            member=c.member,
            match=o.reason is None,
            reason=None if o.reason is None else claims.REASONS[o.reason],
            bytes=o.bytes,
            fetch_s=round(o.fetch_s, 4),
            replay_s=round(o.replay_s, 4),
        )

    def finish(
        self,
        first_diverged: int | None,
        canonical: Sequence[Sequence[tuple[str, str]]],
        budget_s: float = DRAIN_S,
    ) -> list[claims.Claim]:
        """Wait for the queued checks (up to DRAIN_S, and `budget_s`: the time the vote can
        spare), ask once more for each state a member withheld (a member that was restarting
        serves it now) while the budget lasts and the checker is idle, then sign, save and
        serve the claims that stand (`replaycheck.confirmed`); report each (`replay_claim`).
        A check still running is dropped, never claimed."""
        s = self.s
        wait = min(DRAIN_S, budget_s)
        ends = time.monotonic() + wait
        drained = self.checker.drain(wait)
        self.checker.stop()
        failed = [
            self.checker.again(o) if drained and time.monotonic() + self._within() < ends else o
            for o in self.checker.outcomes
            if o.reason is not None
        ]
        failed = [o for o in failed if o.reason is not None]
        standing = replaycheck.confirmed(failed, first_diverged, canonical)
        for o in standing:
            self._stand(o)
        if len(standing) < len(failed) or not drained:
            s.metric(
                "replay_claims_dropped",
                job=s.head.job_id,
                attempt=s.head.attempt,
                dropped=len(failed) - len(standing),
                drained=drained,
            )
        return self.claims

    def _stand(self, o: Outcome) -> None:
        """Sign, save and serve the claim of a failed check (with the member's state, when we
        kept it); report it."""
        s = self.s
        c = replaycheck.claim(o, s.head, Account.from_key(s.key))
        path = claims.save(s.job_dir / "claims", c)
        s.serve(statefile.commitment(path.read_bytes()).hex(), path)
        kept = replaycheck.state_path(self.checker.work, o.check, o.state)
        if kept.is_file():  # the member's state, for the referees of our claim
            s.serve(o.state.hex(), kept)
        self.claims.append(c)
        s.metric(
            "replay_claim",
            job=s.head.job_id,
            epoch=s.epoch,
            attempt=s.head.attempt,
            round=c.round,
            member=c.member,
            reason=c.reason_name,
            file_sha256=statefile.commitment(path.read_bytes()).hex(),
            claim=c.encode().hex(),
        )

    def forge_withheld(self, t: evidence.EpochTranscript) -> None:
        """Fault `forge-claim`: a "withheld" claim, signed with the product's own claim code,
        about another member's packet in the first round whose check of it was not ours;
        saved, served and reported as our claims are, so that our challenge names it."""
        me = self.s.me.lower()
        for r, packets in enumerate(t.rounds):
            ours = {m.lower() for c, m in self.assigned.get(r, []) if c.lower() == me}
            for p in packets:
                if p.sender.lower() != me and p.sender.lower() not in ours:
                    state = envmod.decode(p.commitment).state_digest or bytes(32)
                    check = Check(r, p.sender, p.payload, p.commitment, [])
                    self._stand(Outcome(check, claims.WITHHELD, state, bytes(32), 0, 0.0, 0.0))
                    return
