"""The reference operator node: one process per operator, driven by the chain.

States (each a method of `Node`, logged as it is entered):

    REGISTER  ensure registration (peer key + multiaddrs on-chain) and self-stake
    JOIN      join the job (or pick one with --auto: open, price >= our ask, epochs long enough,
              seat bond within our free self-stake); joining bonds the job's seatBond
    WAIT      wait until we are a member of a running epoch (joins apply at boundaries); a job
              left Open past the open timeout is failed (the caller is refunded)
    START     read members, load the epoch's start checkpoint (verify its hash against the
              chain; fetch it from a peer when missing), connect to the members' peers
    TRAIN     K inner AdamW steps on our deterministic shard, then a DeMo sync over gossip;
              after each round the round state is saved so a restart resumes there
    COMMIT    save the checkpoint (safetensors + canonical stream), draw a fresh salt, persist
              (checkpoint, participation, salt), then commitCheckpoint(hash of it all) before
              the deadline (skipped when the chain already has our commitment). When the
              dataset or start model is unavailable or fails its hash, the vote is UNWORKABLE
    REVEAL    revealCheckpoint once every member committed or the deadline passed, before
              the reveal deadline (skipped when already revealed)
    FINALIZE  finalizeEpoch once everyone revealed or the reveal deadline passed (anyone may)
    DONE      job ended: export the final checkpoint in Hugging Face format, claim and withdraw

Ctrl-C once: leave after this epoch. Twice: stop now.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain.client import BSM
from dtrain.errors import ContractError, TransactionFailed
from dtrain.models import Job, JobState, JobStatus, Params
from dtrain_node.errors import StopRequested
from dtrain_node.operator import vote
from dtrain_node.operator.checkpoints import Checkpoints
from dtrain_node.operator.deadlines import epoch_seconds_needed, reveal_window_fits
from dtrain_node.operator.epoch import UNWORKABLE_ERRORS, EpochEnv, EpochTrainer
from dtrain_node.operator.faults import Faults
from dtrain_node.operator.transport import (
    PeerSpec,
    Transport,
    TransportFactory,
    gossip_transport,
    peer_specs,
)
from dtrain_node.operator.vote import Vote

log = logging.getLogger("dtrain.node")

FINALIZE_GAS = 6_000_000  # above finalizeEpoch at the 32-member cap (docs/gas.md)
REVEAL_GAS = 1_000_000  # above revealCheckpoint at the 32-member cap (first sight of a vote)
SETTLE_EVENTS = ("EpochFinalized", "EpochFailed", "Slashed", "JobAborted")


@dataclass(frozen=True)
class NodeConfig:
    key: str
    rpc_url: str
    contract: str
    data_dir: Path
    listen: str = "/ip4/127.0.0.1/tcp/0"
    job_id: int | None = None
    auto: bool = False
    stake: int = 10**18
    min_price: int = 0
    step_s: float = 0.5  # --auto: our expected seconds per inner step (epoch-length check)
    hardware: str = "cpu"
    batch_size: int = 8
    # Outer-step hyper-parameters are part of the protocol: every node of a job must use the
    # same ones or theta_sync (and the checkpoint hash) would differ.
    outer_lr: float = 1.0
    beta: float = 0.9
    inner_lr: float = 2e-3
    round_deadline_s: float = 20.0
    poll_s: float = 0.3
    withdraw: bool = True
    export: bool = True
    linger_s: float = 0.0  # keep serving checkpoints this long after the job ends
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.job_id is None and not self.auto:
            raise ValueError("give a job id or auto=True")
        if self.batch_size < 1 or self.round_deadline_s <= 0 or self.poll_s <= 0:
            raise ValueError("batch_size >= 1, round_deadline_s > 0 and poll_s > 0 required")
        if not self.step_s >= 0:
            raise ValueError(f"step_s must be >= 0, got {self.step_s}")


class Node:
    def __init__(self, cfg: NodeConfig, transport_factory: TransportFactory | None = None) -> None:
        self.cfg = cfg
        self.bsm = BSM.attach(cfg.rpc_url, cfg.contract, cfg.key)
        self.me = self.bsm.sender
        self.dir = cfg.data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.leave_requested = threading.Event()
        self.stop_now = threading.Event()
        self.job_id: int | None = cfg.job_id
        self._transport_factory = transport_factory or gossip_transport
        self.transport: Transport = None  # type: ignore[assignment]  # set by run()
        self.metrics_path = self.dir / "metrics.jsonl"
        self._first_attempt: dict[int, int] = {}
        self._params_cache: Params | None = None  # the deployed parameters never change

    # ------------------------------------------------------------------ plumbing

    def _metric(self, kind: str, **data: Any) -> None:
        rec = {"t": round(time.time(), 3), "kind": kind, "node": self.me, **data}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("%s %s", kind, " ".join(f"{k}={v}" for k, v in data.items()))

    def _check_stop(self) -> None:
        if self.stop_now.is_set():
            raise StopRequested()

    def _sleep(self) -> None:
        self._check_stop()
        time.sleep(self.cfg.poll_s)

    def install_signals(self) -> None:
        def on_int(*_: Any) -> None:
            if self.leave_requested.is_set():
                self.stop_now.set()
                log.warning("second Ctrl-C: stopping now")
            else:
                self.leave_requested.set()
                log.warning("Ctrl-C: leaving the job after this epoch (again to stop now)")

        signal.signal(signal.SIGINT, on_int)
        signal.signal(signal.SIGTERM, lambda *_: self.stop_now.set())

    def job_dir(self, job_id: int) -> Path:
        d = self.dir / "jobs" / str(job_id)
        d.mkdir(parents=True, exist_ok=True)
        return d

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> dict[str, Any]:
        try:
            job_id = self.cfg.job_id if self.cfg.job_id is not None else self._pick_job()
            self.job_id = job_id
            self.transport = self._transport_factory(self.cfg, self.bsm, job_id)
            self.register()
            self.join(job_id)
            result = self.train_job(job_id)
            if self.cfg.withdraw:
                self.collect_earnings()
            deadline = time.monotonic() + self.cfg.linger_s
            while time.monotonic() < deadline and not self.stop_now.is_set():
                time.sleep(0.2)  # callers fetch the final checkpoint from us meanwhile
            return result
        except StopRequested:
            self._metric("stopped")
            return {"stopped": True}
        finally:
            if self.transport is not None:
                self.transport.stop()

    def register(self) -> None:
        op = self.bsm.operator(self.me)
        addrs = [a.split("/p2p/")[0] for a in self.transport.listen_addrs]
        if not op.registered:
            self.bsm.register_operator(
                self.cfg.stake,
                self.transport.peer_key,
                addrs,
                self.cfg.hardware,
                self.cfg.min_price,
            )
            self._metric("registered", stake=self.cfg.stake, addrs=addrs)
        elif op.peer_key != self.transport.peer_key or list(op.multiaddrs) != addrs:
            # Restarted on another port: peers must dial the new address.
            self.bsm.update_operator(
                self.transport.peer_key, addrs, op.hardware, op.min_price_per_epoch
            )
            self._metric("addresses_updated", addrs=addrs)
        min_stake = self._params().min_stake
        have = self.bsm.stake_of(self.me, self.me)
        if have < min_stake:
            self.bsm.stake(min_stake - have)

    def join(self, job_id: int) -> None:
        job = self.bsm.job(job_id)
        if self.me in job.members or self.me in job.pending_joins:
            self._metric("rejoined", job=job_id)
        else:
            self.bsm.join_job(job_id)
            self._metric("joined", job=job_id)

    def _pick_job(self) -> int:
        """--auto: the first open or running job with room that pays at least our ask, whose
        epochs are long enough for us to finish them and whose seat bond our free self-stake
        covers."""
        while True:
            free = self._free_stake()
            for j in self.bsm.jobs():
                if self._acceptable(j, free):
                    return j.id
            self._sleep()

    def _acceptable(self, j: Job, free_stake: int) -> bool:
        s = j.spec
        room = len(j.members) + len(j.pending_joins) < s.max_operators
        live = j.state.status in (JobStatus.OPEN, JobStatus.RUNNING)
        need = epoch_seconds_needed(s.steps_per_epoch, s.sync_interval, self.cfg.step_s)
        return (
            live
            and room
            and s.price_per_operator_epoch >= self.cfg.min_price
            and s.epoch_duration >= need
            and s.seat_bond <= free_stake
            and reveal_window_fits(self._params().reveal_window)
        )

    def _free_stake(self) -> int:
        """Self-stake our seats have not bonded: what a new seat's bond must fit in. Before
        registering, the stake we will register with; `register` tops it up to the minimum."""
        registered = self.bsm.operator(self.me).registered
        have = self.bsm.stake_of(self.me, self.me) if registered else self.cfg.stake
        return max(have, self._params().min_stake) - self.bsm.bonded_of(self.me)

    def _params(self) -> Params:
        if self._params_cache is None:
            self._params_cache = self.bsm.params()
        return self._params_cache

    # ------------------------------------------------------------------ epochs

    def train_job(self, job_id: int) -> dict[str, Any]:
        while True:
            self._check_stop()
            job = self.bsm.job(job_id)
            if job.state.status.is_ended:
                return self.done(job)
            if job.state.status != JobStatus.RUNNING or self.me not in job.members:
                if self.me not in job.members and self.me not in job.pending_joins:
                    self._metric("not_a_member", job=job_id)
                    return {"left": True}
                self._fail_if_abandoned(job)
                self._sleep()
                continue
            if not any(self.bsm.submission_of(job_id, self.me, job.block).commitment):
                self.commit(job)
            self.reveal(job)
            self.finalize(job_id, job.state.attempt)

    def _faults(self, st: JobState) -> Faults:
        """The faults active in this epoch attempt (`once`: only in the first one we saw)."""
        retry = self._first_attempt.setdefault(st.epoch, st.attempt) != st.attempt
        return self.cfg.faults.active(st.epoch, retry)

    def commit(self, job: Job) -> None:
        """TRAIN the epoch attempt (or find it unworkable), persist the vote, COMMIT to it. A
        vote saved by an earlier run of this node (killed before its commit) is committed
        as it is: never trained again, never a second salt."""
        st = job.state
        path = vote.path(self.job_dir(job.id), st.attempt)
        mine = vote.load(path)
        if mine is None:
            if time.time() > job.deadline:
                self._metric("commit_missed", job=job.id, epoch=st.epoch, deadline=job.deadline)
                return
            mine = self._vote(job)
            vote.save(path, mine)  # before the commit: a restarted node must still reveal
        try:
            self.bsm.commit_checkpoint(job.id, st.epoch, mine.commitment(job.id, st.epoch, self.me))
            self._metric(
                "committed",
                job=job.id,
                epoch=st.epoch,
                checkpoint=mine.checkpoint.hex(),
                unworkable=mine.is_unworkable,
            )
        except ContractError as exc:
            # The deadline passed or the epoch moved on: the chain has the last word.
            self._metric("commit_skipped", job=job.id, reason=str(exc))

    def _vote(self, job: Job) -> Vote:
        """Our vote for the attempt: the trained checkpoint and participation, or UNWORKABLE
        when the job's dataset or start model is unavailable or fails its hash."""
        trainer = EpochTrainer(self._epoch_env(job.id), job, self._faults(job.state))
        try:
            trainer.prepare()
        except UNWORKABLE_ERRORS as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("job %s epoch %s cannot be done: %s", job.id, job.state.epoch, reason)
            self._metric("unworkable", job=job.id, epoch=job.state.epoch, reason=reason)
            return Vote.unworkable(len(job.members))
        digest, participation = trainer.train()
        return Vote.fresh(digest, participation)

    def reveal(self, job: Job) -> None:
        """REVEAL our committed vote once reveals open (every member committed, or the commit
        deadline passed), before the reveal deadline; nothing when we committed nothing or
        revealed already (restart)."""
        st = job.state
        if not self._faults(st).reveals:
            self._metric("fault_no_reveal", job=job.id, epoch=st.epoch)
            return
        mine = vote.load(vote.path(self.job_dir(job.id), st.attempt))
        while True:
            self._check_stop()
            now = self.bsm.job(job.id)
            if now.state.status != JobStatus.RUNNING or now.state.attempt != st.attempt:
                return
            sub = self.bsm.submission_of(job.id, self.me, now.block)
            if not any(sub.commitment) or any(sub.checkpoint):
                return
            if mine is None or mine.commitment(job.id, st.epoch, self.me) != bytes(sub.commitment):
                self._metric("reveal_impossible", job=job.id, epoch=st.epoch)
                return
            # A chain that mines only on transactions (anvil) has a stale latest block; the
            # reveal itself gets a fresh timestamp, so go by the wall clock too.
            block_ts = self.bsm.latest_block_timestamp()
            t = max(block_ts, int(time.time()))
            if t > now.reveal_deadline:
                self._metric("reveal_missed", job=job.id, epoch=st.epoch)
                return
            everyone = now.committed == len(now.members)
            if everyone or t > now.deadline:
                # Open by the wall clock only: skip gas estimation at the stale block time.
                gas = None if everyone or block_ts > now.deadline else REVEAL_GAS
                if self._send_reveal(now, mine, gas):
                    return
            self._sleep()

    def _send_reveal(self, job: Job, mine: Vote, gas: int | None) -> bool:
        epoch = job.state.epoch
        try:
            self.bsm.reveal_checkpoint(
                job.id, epoch, mine.checkpoint, list(mine.participation), mine.salt, gas=gas
            )
        except (ContractError, TransactionFailed) as exc:
            log.info("reveal not taken yet: %s", exc)  # reveals not open on chain yet
            return False
        self._metric("revealed", job=job.id, epoch=epoch, checkpoint=mine.checkpoint.hex())
        return True

    def _epoch_env(self, job_id: int) -> EpochEnv:
        return EpochEnv(
            cfg=self.cfg,
            me=self.me,
            transport=self.transport,
            checkpoints=self.checkpoints(job_id),
            job_dir=self.job_dir(job_id),
            metric=self._metric,
            between_rounds=self._between_rounds,
            connect=self._connect,
        )

    def _between_rounds(self, job: Job) -> None:
        self._check_stop()
        self._leave_if_asked(job)

    def _leave_if_asked(self, job: Job) -> None:
        """Ctrl-C once: announce the leave now; it applies at the next boundary."""
        if self.leave_requested.is_set() and not self.bsm.is_leaving(job.id, self.me):
            self.bsm.leave_job(job.id)
            self._metric("leaving", job=job.id, epoch=job.state.epoch)

    def _fail_if_abandoned(self, job: Job) -> None:
        """A job that ran and then lost members waits Open, unpaid, with our seat bond held;
        once it has waited the open timeout anyone may fail it (the caller gets the escrow
        back, our bond is released)."""
        st = job.state
        if st.status != JobStatus.OPEN or st.attempt == 0 or self.me not in job.members:
            return
        if time.time() <= st.epoch_start + self._params().open_timeout:
            return
        try:
            self.bsm.cancel_job(job.id)
            self._metric("failed_open_job", job=job.id, epoch=st.epoch)
        except (ContractError, TransactionFailed):
            pass  # failed by someone else, or the chain's clock is not there yet

    def finalize(self, job_id: int, attempt: int) -> None:
        """FINALIZE once every member revealed or the reveal deadline passed."""
        while True:
            self._check_stop()
            job = self.bsm.job(job_id)
            if job.state.status != JobStatus.RUNNING or job.state.attempt != attempt:
                return
            # As in `reveal`: the finalize transaction gets a fresh timestamp.
            block_ts = self.bsm.latest_block_timestamp()
            all_in = job.revealed == len(job.members)
            if all_in or max(block_ts, int(time.time())) > job.reveal_deadline:
                gas = None if all_in or block_ts > job.reveal_deadline else FINALIZE_GAS
                try:
                    rc = self.bsm.finalize_epoch(job_id, job.state.epoch, gas=gas)
                    self._metric(
                        "finalized",
                        job=job_id,
                        epoch=job.state.epoch,
                        events=[e.name for e in rc.events if e.name in SETTLE_EVENTS],
                    )
                except (ContractError, TransactionFailed):
                    # Someone else finalized first, or the chain's clock is not there yet.
                    self._sleep()
                continue
            self._sleep()

    # ------------------------------------------------------------------ checkpoints

    def checkpoints(self, job_id: int) -> Checkpoints:
        return Checkpoints(self.job_dir(job_id), self.me, self.transport, self._peers, self._metric)

    def _peers(self, members: Sequence[str]) -> list[PeerSpec]:
        return peer_specs(self.bsm, members)

    def _connect(self, members: list[str]) -> None:
        others = [m for m in members if m != self.me]
        self.transport.connect(self._peers(others))

    # ------------------------------------------------------------------ the end

    def done(self, job: Job) -> dict[str, Any]:
        result: dict[str, Any] = {
            "job": job.id,
            "status": job.state.status.name.lower(),
            "checkpoint": job.state.checkpoint.hex(),
        }
        if job.state.status == JobStatus.COMPLETED and self.cfg.export:
            out = self.checkpoints(job.id).export(job)
            if out is not None:
                result["export"] = str(out)
        self._metric("job_done", **result)
        return result

    def collect_earnings(self) -> None:
        if self.bsm.pending_rewards(self.me, self.me):
            self.bsm.claim_rewards(self.me)
        credit = self.bsm.credit_of(self.me)
        if credit:
            self.bsm.withdraw()
            self._metric("withdrew", amount=credit)
