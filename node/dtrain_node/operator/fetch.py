"""A caller fetches a job's checkpoint from the operators that hold it: the final one of a
completed job (of a cancelled or failed one: its last paid epoch's), or any finalized epoch's, each
verified against its on-chain hash. After a verified fetch of the final checkpoint, the job's
caller hands the holders its signed receipt (p2p/receipts.py) so that they stop keeping it for
it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from dtrain.client import BSM
from dtrain.errors import DtrainError
from dtrain.models import Job
from dtrain_node.errors import CheckpointUnavailable, FinalCheckpointUnavailable
from dtrain_node.operator.checkpoints import export_final
from dtrain_node.operator.transport import peer_specs


def holders(bsm: BSM, job_id: int, epoch: int) -> list[str]:
    """Operators paid for chain epoch `epoch` or a later one: they voted for its checkpoint,
    or started an epoch from it."""
    paid = bsm.events(names=["OperatorPaid"], job_id=job_id)
    return sorted({e.args["operator"] for e in paid if e.args["epoch"] >= epoch})


def epoch_checkpoint(bsm: BSM, job_id: int, epoch: int) -> bytes:
    """The checkpoint the chain finalized for epoch `epoch` (counted from 0) of the job; a
    `DtrainError` when that epoch is not finalized (yet)."""
    job = bsm.job(job_id)
    if not 0 <= epoch < job.spec.total_epochs:
        raise DtrainError(f"job {job_id} has epochs 0..{job.spec.total_epochs - 1}, not {epoch}")
    done = bsm.events(names=["EpochFinalized"], job_id=job_id)
    got = [bytes(e.args["checkpoint"]) for e in done if e.args["epoch"] == epoch]
    if not got:
        raise DtrainError(f"job {job_id}: epoch {epoch} is not finalized yet: no checkpoint")
    return got[-1]


def _final_epoch(job: Job) -> int:
    """`job.final_epoch`, or a `DtrainError` that says why there is none."""
    if job.final_epoch is not None:
        return job.final_epoch
    status = job.state.status
    why = "no epoch of it was finalized" if status.is_ended else "it has not ended"
    raise DtrainError(f"job {job.id} is {status.name.lower()}: {why}, so no final checkpoint")


@dataclass(frozen=True)
class Fetched:
    path: Path  # the Hugging Face export
    checkpoint: bytes
    epoch: int  # counted from 0
    confirmed: int | None = None  # holders that took the caller's receipt (None: none sent)


def fetch_checkpoint(
    bsm: BSM,
    job_id: int,
    out: Path,
    work: Path,
    timeout: float,
    epoch: int | None = None,
    caller: LocalAccount | None = None,
) -> Fetched:
    """Epoch `epoch`'s checkpoint (counted from 0; None: the job's final one, an ended
    job's last paid epoch's), fetched from the first of its holders that serves it, verified
    and exported to `out`. With `caller` (the job's caller key) and the final checkpoint, the
    holders are handed its receipt. Raises `FinalCheckpointUnavailable` when none of them
    serves it."""
    from dtrain_node.p2p.host import GossipConfig, GossipNode
    from dtrain_node.p2p.receipts import sign_receipt

    job = bsm.job(job_id)
    e = epoch if epoch is not None else _final_epoch(job)
    digest = job.state.checkpoint if epoch is None else epoch_checkpoint(bsm, job_id, e)
    who = holders(bsm, job_id, e)
    peers = peer_specs(bsm, who)
    if not peers:
        raise FinalCheckpointUnavailable(job_id, digest, who, epoch)
    cfg = GossipConfig(
        data_dir=work,
        chain_id=bsm.chain_id,
        contract=bsm.address,
        job_id=job_id,
        file_timeout_s=timeout,
    )
    libp2p = logging.getLogger("libp2p")
    level = libp2p.level
    libp2p.setLevel(logging.CRITICAL)  # a dial error per try and peer: ours is one line
    g = GossipNode(cfg, Account.create())
    g.start()
    confirmed = None
    try:
        stream = g.fetch_file(digest.hex(), peers, work / "checkpoint.stream")
        # The model pack and recipe the export needs: from the caller's own peer if it still
        # serves them, else from the holders, which keep what they fetched.
        path = export_final(job, stream, out, mirrors=peers, expected=digest)
        mine = caller is not None and caller.address == job.state.caller
        if mine and e == job.final_epoch:  # the final checkpoint: kept for the caller
            receipt = sign_receipt(caller, bsm.chain_id, bsm.address, job_id, digest)
            confirmed = g.send_receipt(receipt, peers)
    except CheckpointUnavailable as exc:
        raise FinalCheckpointUnavailable(job_id, digest, who, epoch) from exc
    finally:
        g.stop()
        libp2p.setLevel(level)
    return Fetched(path, digest, e, confirmed)


def fetch_final(bsm: BSM, job_id: int, out: Path, work: Path, timeout: float) -> tuple[Path, bytes]:
    """The job's final checkpoint, fetched, verified and exported to `out` (see
    `fetch_checkpoint`); (export dir, checkpoint hash)."""
    got = fetch_checkpoint(bsm, job_id, out, work, timeout)
    return got.path, got.checkpoint
