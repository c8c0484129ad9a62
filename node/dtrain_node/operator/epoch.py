"""One epoch attempt of one operator: build the backend and the DeMo optimizer, load the start
state, run the sync rounds over the transport and save the checkpoint.

Per round: K inner AdamW steps on our deterministic shard, `DeMo.prepare()`, `collect_round`
over the transport, `DeMo.apply()` of the members' packets; the round state is saved after
every round so a restarted node resumes at the next one. The result is the checkpoint digest
and the participation vote, which the node commits and reveals. `prepare` (model, dataset,
start state) is separate from `train` so the node can tell an epoch nobody can do
(`UNWORKABLE_ERRORS`) from a failure of its own. Faults wrap the honest behaviour
(`Faults.before_round`, `.packet`, `.digest`); the honest run never looks at them otherwise
(it only keeps the `RoundContext` an attack packet is built from: the packet spec, our honest
packet and the packets collected in the previous round).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from web3 import Web3

from dtrain.models import Job, Method
from dtrain_node.errors import (
    CheckpointInvalid,
    CheckpointUnavailable,
    CompressionInvalid,
    DatasetError,
    ModelUnavailable,
    RecipeInvalid,
)
from dtrain_node.operator import roundstate
from dtrain_node.operator.checkpoints import Checkpoints
from dtrain_node.operator.deadlines import (
    VOTE_MARGIN_S,
    finish_needs_s,
    reconcile_deadline,
    round_deadline,
    round_patience,
)
from dtrain_node.operator.faults import AHEAD_WAIT_S, Faults, RoundContext
from dtrain_node.operator.sources import cached_job_files, fetch_job
from dtrain_node.operator.transport import Transport
from dtrain_node.optim import codec
from dtrain_node.optim.optimizer import DeMo, SyncStats
from dtrain_node.optim.settings import check_compression, demo_config
from dtrain_node.p2p.files import sha256_file
from dtrain_node.p2p.reconcile import Equivocation, Transcript
from dtrain_node.train import checkpoint, devices, inner, shard
from dtrain_node.train.backend import Backend, TrainJob, make_backend, token_reach
from dtrain_node.verify import evidence, spotcheck
from dtrain_node.verify.epochchecks import CheckSetup, EpochChecks
from dtrain_node.verify.replaycheck import ClaimHead

if TYPE_CHECKING:
    from dtrain_node.operator.config import NodeConfig


# What `EpochTrainer.prepare` raises when the epoch cannot be done by anyone honest: the
# dataset missing or failing its hash (or malformed), the model unknown, the recipe missing or
# failing its hash, a compression no member can sync, the start checkpoint failing its hash
# or served by no member. The node votes UNWORKABLE instead of training.
UNWORKABLE_ERRORS = (
    DatasetError,
    ModelUnavailable,
    RecipeInvalid,
    CompressionInvalid,
    CheckpointInvalid,
    CheckpointUnavailable,
)


class EpochLost(Exception):
    """At our pace the epoch's vote would come after its commit deadline, or our packets can
    no longer make the rounds a vote needs: we stopped training it, announced our leave and
    will not vote (docs/contract.md: unpaid, never slashed)."""


@dataclass(frozen=True)
class EpochEnv:
    """What an epoch attempt needs from the node running it."""

    cfg: NodeConfig
    me: str  # our checksum address
    transport: Transport
    checkpoints: Checkpoints
    job_dir: Path
    metric: Callable[..., Any]
    between_rounds: Callable[[Job], None]  # raises to stop now; announces a requested leave
    connect: Callable[[list[str]], None]  # dial these members' peers
    give_up: Callable[[Job, str], None]  # the epoch is lost to us (why): announce our leave
    chain_id: int = 0  # of the chain the job is on (names it in the epoch's evidence file)
    sync_threshold_bps: int = 0  # of the rounds a member's packets must make (the chain's)


class EpochTrainer:
    """Trains the epoch attempt `job.state.attempt` of `job` (a snapshot read at one block)."""

    def __init__(self, env: EpochEnv, job: Job, faults: Faults) -> None:
        self.env = env
        self.job = job
        self.faults = faults  # the ones active in this attempt
        self.members = list(job.members)
        self.rounds = job.spec.steps_per_epoch // job.spec.sync_interval
        self.state_path = roundstate.path(env.job_dir, job.state.attempt)
        self.train_job: TrainJob
        self.backend: Backend
        self.opt: DeMo
        self.reach: int  # rows of the token tensors its tokenizer reaches (DeMo.of_model)
        self.batches: Iterator[Any]
        self.first = 0
        self.participation: dict[str, int] = {}
        self.suspected: dict[str, dict[str, int]] = {}  # sender -> {what the rule saw: rounds}
        self.applied: list[list[tuple[str, str]]] = []  # per round: (sender, sha256) applied
        self.start_shared: list[Any] = []  # the shared state the epoch started from
        self.transcript_root: bytes | None = None  # of the canonical transcript, once agreed
        self.equivocations: list[Equivocation] = []  # members' proven equivocations
        self.context: RoundContext  # what the previous round left for `Faults.packet`
        self.checks: EpochChecks | None = None  # replay spot checks (docs/protocol.md 4.6)
        self.first_diverged: int | None = None  # first live round the transcript changed
        self.canonical: list[list[tuple[str, str]]] = []  # the transcript's (sender, sha)
        self.compute_s: list[float] = []  # our training seconds of each round we ran
        self.lost: str | None = None  # why the epoch is lost to us, once it is

    def run(self) -> tuple[bytes, list[int]]:
        """`prepare` then `train`."""
        self.prepare()
        return self.train()

    def prepare(self) -> None:
        """Builds the backend (the job's model and dataset) and loads the verified start state
        (and our round state, when resuming). Raises `UNWORKABLE_ERRORS` when the dataset or
        the start model is unavailable or fails its hash: the epoch cannot be done."""
        self._build()

    def train(self) -> tuple[bytes, list[int]]:
        """Train every round left, agree on the epoch's transcript with the members and, if
        our live rounds differed from it, replay it; returns (checkpoint digest, participation
        vote), both recomputed from the transcript."""
        self._begin()
        for r in range(self.first, self.rounds):
            self._round(r)
        self._reconcile()  # also when lost: the members we still follow do not wait for us
        self._give_up_if_the_transcript_lost_it()
        if self.lost is not None:
            raise EpochLost(self.lost)
        if self.checks is not None:
            # Checks never cost us the vote: a member that stalls its state holds us up
            # only until what the vote itself needs before the commit deadline.
            left = self.job.deadline - time.time() - VOTE_MARGIN_S
            self.checks.finish(self.first_diverged, self.canonical, max(0.0, left))
        return self._finish()

    def _build(self) -> None:
        env, job = self.env, self.job
        cache = env.cfg.source_cache()
        local = fetch_job(job, cache)  # cached by pre-flight: verified, no copy
        for sha, path in cached_job_files(job, cache):  # on to late joiners, by hash
            env.transport.serve_file(sha, path)
        self.train_job = tj = TrainJob.from_job(job, env.cfg.batch_size, local)
        self.backend = make_backend(tj)
        model = self.backend.model
        model.load_state_dict(env.checkpoints.start_state(job, self.backend.start_pin, model))
        self.device = devices.pick(env.cfg.device)
        self.backend.to(self.device)  # inner steps there; the shared state stays on the CPU
        self.reach = token_reach(self.backend)
        check_compression(job.spec, tj.recipe, model, self.reach)
        cfg = demo_config(env.cfg, job, tj.recipe)
        self.opt = DeMo.of_model(model, cfg, env.me.lower(), self.reach)
        self.context = RoundContext(self.opt.spec, env.me)
        self.start_shared = [t.clone() for t in self.opt.theta_sync]
        resume = roundstate.load(self.state_path, self.opt)
        if resume is not None:
            env.metric("resumed", job=job.id, attempt=job.state.attempt, round=resume["round"])
            self.first = resume["round"]
            self.participation = resume["participation"]
            self.applied = [[(s, d) for s, d in rnd] for rnd in resume["applied"]]
        else:
            self.participation = dict.fromkeys(self.members, 0)

    def _begin(self) -> None:
        env, job, st, opt = self.env, self.job, self.job.state, self.opt
        env.transport.set_epoch(
            st.attempt, self.members, lambda payload: codec.decode(opt.spec, payload)
        )
        env.connect(self.members)
        backend = self.backend
        idx = shard.assign(backend.n_items(), job.id, st.epoch, self.members, env.me)
        tj = self.train_job  # batch size and seed offset: the recipe's, else the node's
        seed = job.id * 1000 + st.attempt + tj.seed_offset
        batches = backend.batches(idx, tj.batch_size, seed=seed)
        self.batches = from_round(batches, self.first, job.spec.sync_interval)
        self.checks = self._spot_checks(seed)
        before = backend.evaluate()
        env.metric(
            "epoch_start",
            job=job.id,
            epoch=st.epoch,
            attempt=st.attempt,
            members=len(self.members),
            shard=len(idx),
            first_round=self.first,
            **before,
        )
        backend.model.train()

    def _spot_checks(self, seed: int) -> EpochChecks | None:
        """The attempt's replay spot checks (None: rate 0)."""
        env, job, st = self.env, self.job, self.job.state
        rate = spotcheck.rate_from_env()
        if rate == 0.0 or self.train_job.method == "grpo":
            return None  # GRPO samples completions: its rounds do not replay bit for bit
        contract = Web3.to_checksum_address(env.cfg.contract)
        peers = env.checkpoints.peers

        def fetch(sha: str, member: str, dest: Path, size: int, within_s: float) -> Path:
            """A member's state: capped at the most bytes a state has, within `within_s`."""
            return env.transport.fetch_file(
                sha, peers([member]), dest, timeout_s=within_s, max_bytes=size
            )

        model = self.backend.model
        return EpochChecks(
            CheckSetup(
                job_dir=env.job_dir,
                head=ClaimHead(env.chain_id, contract, job.id, st.attempt),
                epoch=st.epoch,
                members=self.members,
                me=env.me,
                key=env.cfg.key,
                rate=rate,
                demo=demo_config(env.cfg, job, self.train_job.recipe),
                reach=self.reach,
                train_job=self.train_job,
                seed=seed,
                device=self.device,
                plan=inner.InnerPlan(
                    self.train_job.recipe, job.spec.total_epochs * job.spec.steps_per_epoch
                ),
                epoch_start_step=st.epoch * job.spec.steps_per_epoch,
                start={n: t.detach().clone() for n, t in model.state_dict().items()},
                serve=env.transport.serve_file,
                fetch=fetch,
                metric=env.metric,
            )
        )

    def _inner_steps(self) -> tuple[int, float]:
        """K inner steps as the recipe sets them (train/inner.py); returns (tokens, summed
        loss). A GRPO backend's mean reward of the steps' sampled completions goes to
        `self.rewards`."""
        return inner.run_round(self)

    def _round(self, r: int) -> None:
        env, job, opt = self.env, self.job, self.opt
        env.between_rounds(job)
        self.faults.before_round(r, env.metric)
        self._give_up_if_lost(r)
        shared = [t.clone() for t in opt.theta_sync] if self.checks else []
        state = self.checks.commit(r, opt) if self.checks else b""
        t0 = time.perf_counter()
        self.rewards: list[float] = []
        self.accuracies: list[float] = []
        skip = self.lost is not None or self.faults.skips_compute(self.context)
        tokens, loss_sum = (0, 0.0) if skip else self._inner_steps()
        self.faults.throttle(time.perf_counter() - t0)
        compute_s = time.perf_counter() - t0
        self.compute_s.append(compute_s)
        t_sync = time.perf_counter()
        honest = opt.prepare()
        # lost: we only follow the rounds (no packet, so no commitment), applying the others'
        packet = b"" if self.lost is not None else self.faults.packet(r, honest, self.context)
        if packet:
            packet = roundstate.sent_packet(env.job_dir, job.state.attempt, r, packet)
        deadline, patience = self._deadlines(r)
        signed = {"state": state} if state else {}  # a transport without checks takes none
        res = env.transport.collect_round(r, packet, deadline, patience, **signed)
        stats = opt.apply(res.packets)
        if self.checks is not None:
            self.checks.after_round(r, shared, opt.theta_sync, res.packets, res.commitments)
        first = self.context.first_sent or packet or None
        self.context = RoundContext(opt.spec, env.me, honest, res.packets, first)
        sync_s = time.perf_counter() - t_sync
        self._count(stats.applied)
        self._suspect(stats)
        del self.applied[r:]
        self.applied += [[] for _ in range(r - len(self.applied))]  # saved without them
        self.applied.append(_digests(res.packets))
        roundstate.save(self.state_path, opt, r + 1, self.participation, self.applied)
        env.metric(
            "round",
            job=job.id,
            epoch=job.state.epoch,
            round=r,
            peers=len(self.members) - 1,
            loss=round(loss_sum / job.spec.sync_interval, 4),
            **({"reward": round(sum(self.rewards) / len(self.rewards), 4)} if self.rewards else {}),
            **self._accuracy(),
            tokens=tokens,
            step=job.state.epoch * job.spec.steps_per_epoch + (r + 1) * job.spec.sync_interval,
            attempt=job.state.attempt,
            tokens_per_s=round(tokens / max(compute_s, 1e-9), 1),
            bytes_out=len(packet),
            **_screened(stats),
            missing=len(res.missing),
            latency_s=round(res.latency_s, 3),
            bytes_gossip_out=res.bytes_out,
            sync_s=round(sync_s, 4),
            compress_s=round(stats.compress_s, 4),
            aggregate_s=round(stats.aggregate_s, 4),
            compute_s=round(compute_s, 4),
        )

    def _give_up_if_lost(self, r: int) -> None:
        """Before round `r`: when the rounds left, at the pace of our last two, end past what
        the commit deadline leaves, or our packets can no longer make the rounds a vote needs,
        stop training (and checking) for the rest of the epoch, say why and announce our
        leave. One slow round is no verdict."""
        if self.lost is not None or len(self.compute_s) < 2 or not self.faults.honest:
            return
        self.lost = self._too_slow(r) or self._too_absent(r)
        if self.lost is not None:
            self._lose(r)

    def _give_up_if_the_transcript_lost_it(self) -> None:
        """Once the transcript is agreed: our live rounds counted our packets, the transcript
        may not (they reached the others after the others closed the rounds). Below the share
        of the rounds a vote needs, voting is a sync failure and a leave announced before the
        deadline is not: give the epoch up."""
        if self.lost is None and self.faults.honest:
            self.lost = self._too_absent(self.rounds)
            if self.lost is not None:
                self._lose(self.rounds)

    def _lose(self, r: int) -> None:
        """The epoch is lost to us from round `r` on (`self.lost` says why): stop checking,
        say so and announce our leave while the commit deadline is ahead."""
        if self.checks is not None:
            self.checks.checker.abandon()
            self.checks = None
        env, st = self.env, self.job.state
        env.metric(
            "epoch_lost",
            job=self.job.id,
            epoch=st.epoch,
            attempt=st.attempt,
            round=r,
            why=self.lost,
        )
        env.give_up(self.job, self.lost)

    def _too_slow(self, r: int) -> str | None:
        """Why we cannot commit by the deadline at the pace of our last two rounds, if so."""
        pace = min(self.compute_s[-2:])
        need, left = finish_needs_s(self.rounds - r, pace), self.job.deadline - time.time()
        if need <= left:
            return None
        return (
            f"{self.rounds - r} rounds left at {pace:.1f} s of training each need {need:.0f} s, "
            f"the commit deadline is in {max(0.0, left):.0f} s"
        )

    def _too_absent(self, r: int) -> str | None:
        """Why our packets can no longer make the share of the rounds the chain requires (the
        others closed rounds without them: we were behind), if so: voting would be a sync
        failure."""
        need = math.ceil(self.rounds * self.env.sync_threshold_bps / 10_000)
        ours = self.participation.get(self.env.me, 0)
        if ours + self.rounds - r >= need:
            return None
        return (
            f"our packets made {ours} of {r} rounds, and the {self.rounds - r} left cannot "
            f"bring them to the {need} a vote needs"
        )

    def _accuracy(self) -> dict[str, float]:
        """The round's mean accuracy under the method's name for it (none: no record)."""
        if not self.accuracies:
            return {}
        name = "preference_accuracy" if self.job.spec.method == Method.DPO else "accuracy"
        return {name: round(sum(self.accuracies) / len(self.accuracies), 4)}

    def _deadlines(self, r: int) -> tuple[float, float]:
        """Round `r`'s deadline and patience (deadlines.py)."""
        env, job = self.env, self.job
        if self.faults.ahead:
            return AHEAD_WAIT_S, AHEAD_WAIT_S
        deadline = round_deadline(
            env.cfg.round_deadline_s,
            first=r == self.first,
            now=time.time(),
            epoch_deadline=job.deadline,
            rounds_left=self.rounds - r,
            settle_s=env.transport.settle_s,
        )
        patience = round_patience(
            now=time.time(),
            epoch_deadline=job.deadline,
            rounds_left=self.rounds - r,
            settle_s=env.transport.settle_s,
            compute_s=self.compute_s[-1] if self.compute_s else 0.0,
        )
        return deadline, patience

    def _reconcile(self) -> None:
        """The transcript decides: the rounds whose canonical packets differ from what we
        applied live (we were late, missed packets, or a member revealed to some peers only)
        are fixed by replaying the whole transcript from the epoch's start state."""
        env, job, st = self.env, self.job, self.job.state
        budget = reconcile_deadline(now=time.time(), epoch_deadline=job.deadline)
        t = env.transport.reconcile(self.rounds, budget)
        canonical = [_digests(packets) for packets in t.rounds]
        diverged = [
            r
            for r in range(self.rounds)
            if r >= len(self.applied) or sorted(self.applied[r]) != sorted(canonical[r])
        ]
        self.first_diverged = diverged[0] if diverged else None
        self.canonical = canonical
        record = self._evidence(t)
        self.transcript_root = record.root()
        file = evidence.save(env.job_dir, record)
        if self.checks is not None and self.faults.forge_claim:
            self.checks.forge_withheld(record)
        # to the referees of a challenge, by the file's sha256 (what `challenge` names)
        env.transport.serve_file(sha256_file(file).hex(), file)
        self.equivocations = list(t.equivocations)
        for e in t.equivocations:
            env.metric("equivocation", job=job.id, epoch=st.epoch, round=e.round, sender=e.sender)
        if diverged:
            stats = self.opt.replay(self.start_shared, t.rounds)
            self.participation, self.suspected = dict.fromkeys(self.members, 0), {}
            for s in stats:
                self._count(s.applied)
                self._suspect(s)
            self.applied = canonical
        env.metric(
            "transcript",
            job=job.id,
            epoch=st.epoch,
            attempt=st.attempt,
            settled=t.settled,
            waited_s=round(t.waited_s, 3),
            replayed=len(diverged),
            first_diverged=diverged[0] if diverged else None,
            peers_agreed=t.peers_agreed,
            peers_gone=t.peers_gone,
        )

    def _evidence(self, t: Transcript) -> evidence.EpochTranscript:
        """The canonical transcript as the epoch's evidence file records it: each round's
        packets by address (the gossip store lists them by checksum spelling, another order
        when two spellings differ in case where they first differ)."""
        job, st = self.job, self.job.state
        commitments = t.commitments or [[b""] * len(packets) for packets in t.rounds]
        rounds = tuple(
            tuple(
                sorted(
                    (
                        evidence.Packet(Web3.to_checksum_address(str(s)), p, c)
                        for (s, p), c in zip(packets, commits, strict=True)
                    ),
                    key=lambda packet: packet.sender.lower(),
                )
            )
            for packets, commits in zip(t.rounds, commitments, strict=True)
        )
        contract = Web3.to_checksum_address(self.env.cfg.contract)
        return evidence.EpochTranscript(
            self.env.chain_id, contract, job.id, st.epoch, st.attempt, rounds
        )

    def _count(self, applied: Iterable[object]) -> None:
        for s in applied:
            key = Web3.to_checksum_address(str(s))
            self.participation[key] = self.participation.get(key, 0) + 1

    def _suspect(self, stats: SyncStats) -> None:
        """Count, per sender, the rounds the robust rule excluded it, distrusted it or found it
        sending a near copy of another member's update: what a coalition looks like from here."""
        seen = {(s, "excluded") for s in stats.excluded}
        seen |= {(s, "distrusted") for s in stats.distrusted}
        seen |= {(s, "copies") for g in stats.copies for s in g}  # once, in however many groups
        for s, what in seen:
            mine = self.suspected.setdefault(Web3.to_checksum_address(str(s)), {})
            mine[what] = mine.get(what, 0) + 1

    def _finish(self) -> tuple[bytes, list[int]]:
        env, job, st = self.env, self.job, self.job.state
        after = self.backend.evaluate()
        tensors = {n: p.detach().clone() for n, p in self.backend.model.state_dict().items()}
        honest = checkpoint.save(env.job_dir / f"attempt-{st.attempt}.safetensors", tensors)
        digest = self.faults.digest(honest, env.me, st.attempt)
        vote = [self.participation.get(m, 0) for m in self.members]
        env.metric(
            "epoch_trained",
            job=job.id,
            epoch=st.epoch,
            checkpoint=digest.hex(),
            transcript_root=self.transcript_root.hex() if self.transcript_root else None,
            members=self.members,  # the order of `participation`
            participation=vote,
            **after,
        )
        if self.suspected:
            env.metric(
                "suspected", job=job.id, epoch=st.epoch, rounds=self.rounds, seen=self.suspected
            )
        return digest, vote


def from_round(batches: Iterator[Any], first: int, k: int) -> Iterator[Any]:
    """The epoch's batch stream from round `first` on (K batches a round): a node resumed at
    round r trains on the batches it would have reached without stopping, so each round's
    batches are a function of the shard, the seed and the round (optim/reproduce.py)."""
    return itertools.islice(batches, first * k, None)


def _screened(stats: SyncStats) -> dict[str, Any]:
    """What the robust rule did in a round, for its metric: senders applied (a count),
    excluded, clipped (by their largest shift), distrusted and sending near copies."""
    return dict(
        applied=len(stats.applied),
        excluded=sorted(str(s) for s in stats.excluded),
        clipped={str(s): x for s, x in sorted(stats.clipped.items(), key=str)},
        distrusted=sorted(str(s) for s in stats.distrusted),
        copies=[[str(s) for s in g] for g in stats.copies],
    )


def _digests(packets: Sequence[tuple[str, bytes]]) -> list[tuple[str, str]]:
    return [(Web3.to_checksum_address(s), hashlib.sha256(p).hexdigest()) for s, p in packets]
