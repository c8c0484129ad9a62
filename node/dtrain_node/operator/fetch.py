"""A caller fetches a completed job's final checkpoint from the operators that produced it."""

from __future__ import annotations

import logging
from pathlib import Path

from eth_account import Account

from dtrain.client import BSM
from dtrain.errors import DtrainError
from dtrain.models import JobStatus
from dtrain_node.errors import CheckpointUnavailable, FinalCheckpointUnavailable
from dtrain_node.operator.checkpoints import export_final
from dtrain_node.operator.transport import peer_specs


def final_holders(bsm: BSM, job_id: int) -> list[str]:
    """Operators paid for the last epoch: they voted for the final checkpoint."""
    job = bsm.job(job_id)
    last = job.spec.total_epochs - 1
    paid = bsm.events(names=["OperatorPaid"], job_id=job_id)
    return sorted({e.args["operator"] for e in paid if e.args["epoch"] == last})


def fetch_final(bsm: BSM, job_id: int, out: Path, work: Path, timeout: float) -> tuple[Path, bytes]:
    """The job's final checkpoint, fetched from the first of its holders that serves it,
    verified and exported to `out`; (export dir, checkpoint hash). Raises
    `FinalCheckpointUnavailable` when none of them serves it."""
    from dtrain_node.p2p.host import GossipConfig, GossipNode

    job = bsm.job(job_id)
    if job.state.status != JobStatus.COMPLETED:
        raise DtrainError(f"job {job_id} is {job.state.status.name.lower()}, not completed")
    digest = job.state.checkpoint
    holders = final_holders(bsm, job_id)
    peers = peer_specs(bsm, holders)
    if not peers:
        raise FinalCheckpointUnavailable(job_id, digest, holders)
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
    try:
        stream = g.fetch_file(digest.hex(), peers, work / "final.stream")
    except CheckpointUnavailable as exc:
        raise FinalCheckpointUnavailable(job_id, digest, holders) from exc
    finally:
        g.stop()
        libp2p.setLevel(level)
    # The model pack and recipe the export needs: from the caller's own peer if it still
    # serves them, else from the holders, which keep what they fetched.
    return export_final(job, stream, out, mirrors=peers), digest
