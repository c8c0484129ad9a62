"""The reference operator node: one process per operator, driven by the chain.

States (each a method of `Node`, logged as it is entered):

    REGISTER  ensure registration (peer key + multiaddrs on-chain) and self-stake
    JOIN      join the job (or pick one with --auto: open, price >= our ask)
    WAIT      wait until we are a member of a running epoch (joins apply at boundaries)
    START     read members, load the epoch's start checkpoint (verify its hash against the
              chain; fetch it from a peer when missing), connect to the members' peers
    TRAIN     K inner AdamW steps on our deterministic shard, then a DeMo sync over gossip;
              after each round the round state is saved so a restart resumes there
    SUBMIT    save the checkpoint (safetensors + canonical stream), submitCheckpoint with
              participation (skipped when the chain already has our vote: no double submit)
    FINALIZE  finalizeEpoch once everyone submitted or the deadline passed (anyone may)
    DONE      job ended: export the final checkpoint in Hugging Face format, claim and withdraw

Ctrl-C once: leave after this epoch. Twice: stop now.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from web3 import Web3

from dtrain.client import BSM
from dtrain.errors import ContractError, DtrainError, TransactionFailed
from dtrain.models import Job, JobStatus
from dtrain_node.errors import CheckpointInvalid, StopRequested
from dtrain_node.operator.faults import Faults
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.train import checkpoint, shard
from dtrain_node.train.backend import TrainJob, make_backend

log = logging.getLogger("dtrain.node")

FIRST_ROUND_FACTOR = 4
SUBMIT_MARGIN_S = 20.0  # time kept for saving, hashing and the submit transaction
MIN_ROUND_S = 1.0
FINALIZE_GAS = 6_000_000  # above finalizeEpoch at the 32-member cap (docs/gas.md)


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


class Node:
    def __init__(self, cfg: NodeConfig, transport_factory: Any = None) -> None:
        self.cfg = cfg
        self.bsm = BSM.attach(cfg.rpc_url, cfg.contract, cfg.key)
        self.me = self.bsm.sender
        self.dir = cfg.data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.leave_requested = threading.Event()
        self.stop_now = threading.Event()
        self.job_id: int | None = cfg.job_id
        self._transport_factory = transport_factory or _gossip_factory
        self.transport: Any = None
        self.metrics_path = self.dir / "metrics.jsonl"
        self._first_attempt: dict[int, int] = {}
        self.packet_spec: Any = None  # set once the model exists; gossip validates with it

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
            self.transport = self._transport_factory(self, job_id)
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
        min_stake = self.bsm.params().min_stake
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
        """--auto: the first open or running job with room that pays at least our ask."""
        ask = self.cfg.min_price
        while True:
            for j in self.bsm.jobs():
                room = len(j.members) + len(j.pending_joins) < j.spec.max_operators
                live = j.state.status in (JobStatus.OPEN, JobStatus.RUNNING)
                if live and room and j.spec.price_per_operator_epoch >= ask:
                    return j.id
            self._sleep()

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
                self._sleep()
                continue
            mine, _ = self.bsm.submission_of(job_id, self.me, job.block)
            if mine == b"\0" * 32:
                self.run_epoch(job)
            self.finalize(job_id, job.state.attempt)

    def run_epoch(self, job: Job) -> None:
        spec, st = job.spec, job.state
        members = list(job.members)
        retry = self._first_attempt.setdefault(st.epoch, st.attempt) != st.attempt
        faults = self.cfg.faults.active(st.epoch, retry)
        backend = make_backend(
            TrainJob(
                job_id=job.id,
                method=spec.method.name.lower(),
                model_uri=spec.model_uri,
                dataset_uri=spec.dataset_uri,
                dataset_hash=spec.dataset_hash,
                batch_size=self.cfg.batch_size,
            )
        )
        model = backend.model
        start = self.start_state(job, model)
        model.load_state_dict(start)
        opt = DeMo(
            model.named_parameters(),
            DeMoConfig(
                mode="local",
                sync_interval=spec.sync_interval,
                lr=self.cfg.outer_lr,
                beta=self.cfg.beta,
                inner_lr=self.cfg.inner_lr,
                compress=CompressConfig(k2d=spec.topk_per_chunk, k1d=1, bits=spec.quant_bits),
            ),
            sender=self.me.lower(),
        )
        self.packet_spec = opt.spec
        rounds = spec.steps_per_epoch // spec.sync_interval
        resume = self._load_round_state(job, opt)
        first = resume["round"] if resume else 0
        participation = resume["participation"] if resume else dict.fromkeys(members, 0)
        self.transport.set_epoch(st.attempt)
        self._connect(members)
        idx = shard.assign(backend.n_items(), job.id, st.epoch, members, self.me)
        batches = backend.batches(idx, self.cfg.batch_size, seed=job.id * 1000 + st.attempt)
        before = backend.evaluate()
        self._metric(
            "epoch_start",
            job=job.id,
            epoch=st.epoch,
            attempt=st.attempt,
            members=len(members),
            shard=len(idx),
            first_round=first,
            **before,
        )
        model.train()
        for r in range(first, rounds):
            self._check_stop()
            self._leave_if_asked(job)
            if faults.offline_at_round is not None and r >= faults.offline_at_round:
                self._metric("fault_offline", round=r)
                os._exit(3)  # vanish mid-epoch like a crashed machine
            t0 = time.perf_counter()
            tokens = 0
            loss_sum = 0.0
            for _ in range(spec.sync_interval):
                batch = next(batches)
                loss = backend.loss(batch)
                loss.backward()
                opt.inner_step()
                tokens += batch[0].numel()
                loss_sum += float(loss.detach())
            compute_s = time.perf_counter() - t0
            t_sync = time.perf_counter()
            packet = opt.prepare()
            if faults.stop_sync_at_round is not None and r >= faults.stop_sync_at_round:
                packet = b""  # publish nothing; keep training on our own
            if faults.garbage_packets:
                packet = os.urandom(len(packet))
            # Members reach the first round of an epoch at different times (fetching the start
            # checkpoint, building the model), so it gets a longer deadline; once everyone is
            # in, rounds end as soon as all packets arrived.
            deadline = self.cfg.round_deadline_s * (FIRST_ROUND_FACTOR if r == first else 1)
            # Missing members must not make us miss the epoch deadline: the rounds left share
            # the time left (less the gossip settle phase and a margin to submit).
            left = job.deadline - time.time() - SUBMIT_MARGIN_S
            share = left / (rounds - r) - self.transport.config.settle_s
            deadline = max(MIN_ROUND_S, min(deadline, share))
            res = self.transport.collect_round(r, packet, deadline)
            stats = opt.apply(res.packets)
            sync_s = time.perf_counter() - t_sync
            for s in stats.applied:
                key = Web3.to_checksum_address(str(s))
                participation[key] = participation.get(key, 0) + 1
            self._save_round_state(job, opt, r + 1, participation)
            self._metric(
                "round",
                job=job.id,
                epoch=st.epoch,
                round=r,
                peers=len(members) - 1,
                loss=round(loss_sum / spec.sync_interval, 4),
                tokens_per_s=round(tokens / max(compute_s, 1e-9), 1),
                bytes_out=len(packet),
                applied=len(stats.applied),
                missing=len(res.missing),
                latency_s=round(res.latency_s, 3),
                bytes_gossip_out=res.bytes_out,
                sync_s=round(sync_s, 4),
                compress_s=round(stats.compress_s, 4),
                aggregate_s=round(stats.aggregate_s, 4),
                compute_s=round(compute_s, 4),
            )
        after = backend.evaluate()
        tensors = {n: p.detach().clone() for n, p in model.state_dict().items()}
        d = self.job_dir(job.id)
        digest = checkpoint.save(d / f"attempt-{st.attempt}.safetensors", tensors)
        if faults.fabricate_checkpoint:
            digest = Web3.keccak(text=f"fabricated:{self.me}:{st.attempt}")
        vote = [participation.get(m, 0) for m in members]
        self._metric(
            "epoch_trained",
            job=job.id,
            epoch=st.epoch,
            checkpoint=digest.hex(),
            participation=vote,
            **after,
        )
        self._submit(job, digest, vote)

    def _leave_if_asked(self, job: Job) -> None:
        """Ctrl-C once: announce the leave now; it applies at the next boundary."""
        if self.leave_requested.is_set() and not self.bsm.is_leaving(job.id, self.me):
            self.bsm.leave_job(job.id)
            self._metric("leaving", job=job.id, epoch=job.state.epoch)

    def _submit(self, job: Job, digest: bytes, vote: list[int]) -> None:
        try:
            self.bsm.submit_checkpoint(job.id, job.state.epoch, digest, vote)
            self._metric("submitted", job=job.id, epoch=job.state.epoch, checkpoint=digest.hex())
        except ContractError as exc:
            # Already submitted (restart) or the epoch moved on: the chain has the last word.
            self._metric("submit_skipped", job=job.id, reason=str(exc))

    def finalize(self, job_id: int, attempt: int) -> None:
        while True:
            self._check_stop()
            job = self.bsm.job(job_id)
            if job.state.status != JobStatus.RUNNING or job.state.attempt != attempt:
                return
            # A chain that mines only on transactions (anvil) has a stale latest block; the
            # finalize transaction itself gets a fresh timestamp, so go by the wall clock too.
            block_ts = self.bsm.w3.eth.get_block("latest")["timestamp"]
            all_in = job.submitted == len(job.members)
            if all_in or max(block_ts, int(time.time())) > job.deadline:
                # Past the deadline by the wall clock only: skip gas estimation, which would
                # simulate at the stale block time; the mined block carries the real time.
                gas = None if all_in or block_ts > job.deadline else FINALIZE_GAS
                try:
                    rc = self.bsm.finalize_epoch(job_id, job.state.epoch, gas=gas)
                    self._metric(
                        "finalized",
                        job=job_id,
                        epoch=job.state.epoch,
                        events=[
                            e.name
                            for e in rc.events
                            if e.name in ("EpochFinalized", "EpochFailed", "Slashed")
                        ],
                    )
                except (ContractError, TransactionFailed):
                    # Someone else finalized first, or the chain's clock is not there yet.
                    self._sleep()
                continue
            self._sleep()

    # ------------------------------------------------------------------ checkpoints

    def start_state(self, job: Job, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The epoch's start state, verified against the chain."""
        e = job.state.epoch
        expected = job.state.checkpoint
        if e == 0:
            tensors = {n: p.detach().clone() for n, p in model.state_dict().items()}
            got = checkpoint.canonical_hash(tensors)
            if any(expected) and got != expected:
                raise DtrainError(
                    f"initial model hash {got.hex()[:16]}.. != job's model hash "
                    f"{expected.hex()[:16]}.."
                )
            self._serve(job.id, e, tensors, got)
            return tensors
        path = self.job_dir(job.id) / f"epoch-{e - 1}.stream"
        if not path.is_file():
            self._adopt_local(job, expected, path)
        if not path.is_file():
            peers = self._peers([m for m in job.members if m != self.me])
            self._metric("fetching_checkpoint", job=job.id, epoch=e - 1, peers=len(peers))
            self.transport.fetch_file(expected.hex(), peers, path)
        tensors = checkpoint.from_stream(path.read_bytes(), expected)
        self.transport.serve_file(expected.hex(), path)
        return tensors

    def _adopt_local(self, job: Job, expected: bytes, path: Path) -> None:
        """Our own checkpoint of the finished attempt, if it is the one the quorum chose."""
        for f in sorted(self.job_dir(job.id).glob("attempt-*.safetensors")):
            try:
                tensors = checkpoint.load(f, expected)
            except CheckpointInvalid:
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(checkpoint.to_stream(tensors))
            os.replace(tmp, path)
            return

    def _serve(
        self, job_id: int, epoch: int, tensors: dict[str, torch.Tensor], digest: bytes
    ) -> None:
        path = self.job_dir(job_id) / f"start-{epoch}.stream"
        if not path.is_file():
            path.write_bytes(checkpoint.to_stream(tensors))
        self.transport.serve_file(digest.hex(), path)

    def _round_state_path(self, job: Job) -> Path:
        return self.job_dir(job.id) / f"attempt-{job.state.attempt}.round.pt"

    def _save_round_state(self, job: Job, opt: DeMo, next_round: int, participation: dict) -> None:
        state = {
            "round": next_round,
            "participation": participation,
            "theta_sync": opt.theta_sync,
            "e": opt.e,
            "steps": opt.steps,
            "inner": opt.inner.state_dict() if opt.inner is not None else None,
        }
        path = self._round_state_path(job)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def _load_round_state(self, job: Job, opt: DeMo) -> dict[str, Any] | None:
        path = self._round_state_path(job)
        if not path.is_file():
            return None
        state = torch.load(path, weights_only=False)
        with torch.no_grad():
            for p, th, e, th_saved, e_saved in zip(
                opt.params, opt.theta_sync, opt.e, state["theta_sync"], state["e"], strict=True
            ):
                th.copy_(th_saved)
                p.copy_(th_saved)
                e.copy_(e_saved)
        opt.steps = state["steps"]
        if opt.inner is not None and state["inner"] is not None:
            opt.inner.load_state_dict(state["inner"])
        self._metric("resumed", job=job.id, attempt=job.state.attempt, round=state["round"])
        return state

    def _peers(self, members: list[str]) -> list[tuple[bytes, list[str]]]:
        out = []
        for m in members:
            op = self.bsm.operator(m)
            out.append((op.peer_key, list(op.multiaddrs)))
        return out

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
            out = self.export(job)
            if out is not None:
                result["export"] = str(out)
        self._metric("job_done", **result)
        return result

    def export(self, job: Job) -> Path | None:
        """The final checkpoint in Hugging Face format, if we hold the one the chain chose."""
        last = job.spec.total_epochs - 1
        path = self.job_dir(job.id) / f"epoch-{last}.stream"
        if not path.is_file():
            self._adopt_local(job, job.state.checkpoint, path)
        if not path.is_file():
            return None
        self.transport.serve_file(job.state.checkpoint.hex(), path)  # callers fetch it from us
        backend = make_backend(
            TrainJob(
                job.id,
                job.spec.method.name.lower(),
                job.spec.model_uri,
                job.spec.dataset_uri,
                job.spec.dataset_hash,
            )
        )
        tensors = checkpoint.from_stream(path.read_bytes(), job.state.checkpoint)
        backend.model.load_state_dict(tensors)
        out = backend.export(self.job_dir(job.id) / "final")
        (out / "CHECKPOINT_SHA256").write_text(job.state.checkpoint.hex() + "\n")
        return out

    def collect_earnings(self) -> None:
        if self.bsm.pending_rewards(self.me, self.me):
            self.bsm.claim_rewards(self.me)
        credit = self.bsm.credit_of(self.me)
        if credit:
            self.bsm.withdraw()
            self._metric("withdrew", amount=credit)


def _gossip_factory(node: Node, job_id: int) -> Any:
    from dtrain_node.optim import codec
    from dtrain_node.p2p.host import GossipConfig, GossipNode

    cfg = node.cfg
    gcfg = GossipConfig(
        data_dir=cfg.data_dir,
        chain_id=node.bsm.chain_id,
        contract=node.bsm.address,
        job_id=job_id,
        listen=cfg.listen,
        round_deadline_s=cfg.round_deadline_s,
    )

    def members(_job: int, _epoch: int) -> list[str]:
        return node.bsm.members(job_id)

    def validate(payload: bytes) -> None:
        # Malformed packets are dropped before they are forwarded. Until our model exists
        # (first epoch start) there is nothing to check against; DeMo.apply checks again.
        if node.packet_spec is not None:
            codec.decode(node.packet_spec, payload)

    g = GossipNode(gcfg, node.bsm.account, members, validate_payload=validate)
    g.start()
    return g
