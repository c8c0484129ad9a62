"""Re-executing an epoch attempt from its canonical transcript (docs/protocol.md 4.7): the
referee's check of a certified vote (`recompute`) and the start of its re-run of a replay
claim (`verify.fraudcheck`). Nothing here fetches: the operator hands in the job's files
(`Attempt.tj`), so what one host could not fetch never reaches the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from web3 import Web3

from dtrain.models import Job
from dtrain_node.errors import CheckpointInvalid
from dtrain_node.optim.optimizer import DeMo
from dtrain_node.optim.settings import NodeDefaults, demo_config
from dtrain_node.train import checkpoint
from dtrain_node.train.backend import make_backend, token_reach
from dtrain_node.train.job import TrainJob
from dtrain_node.verify import evidence

REFEREE = "0x" + "00" * 20  # a replay sends no packet: its sender name is never seen


@dataclass(frozen=True)
class Attempt:
    """What re-executing an epoch attempt starts from: the job as the attempt began (its
    members and epoch), what its backend is given (the job's files as the operator fetched
    them), the node's outer step for a job without a recipe, and the epoch's start tensors
    (the previous epoch's verified checkpoint; None for the first epoch, whose start is the
    job's start model, checked against its model hash)."""

    job: Job
    tj: TrainJob
    defaults: NodeDefaults
    start: dict[str, Any] | None = None


def recompute(a: Attempt, t: evidence.EpochTranscript) -> tuple[bytes, list[int]]:
    """The referee's check: the checkpoint digest the attempt's canonical transcript `t` leads
    to from its start state, by aggregation alone (no training, nobody's private state, no
    network), and the participation vote it gives (rounds each of `job.members` was applied
    in, as the members count it). The caller checks `t` first (`evidence.verify`)."""
    job = a.job
    backend = make_backend(a.tj)
    model = backend.model
    if a.start is None:
        if backend.start_pin != job.spec.model_hash:
            raise CheckpointInvalid(
                f"start model pin {backend.start_pin.hex()[:16]}.. != job's model hash "
                f"{job.spec.model_hash.hex()[:16]}.."
            )
    else:
        model.load_state_dict(a.start)
    cfg = demo_config(a.defaults, job, a.tj.recipe)
    opt = DeMo.of_model(model, cfg, REFEREE, token_reach(backend))
    stats = opt.replay([x.clone() for x in opt.theta_sync], t.packets())
    rounds: dict[str, int] = {}
    for s in stats:
        for sender in s.applied:
            key = Web3.to_checksum_address(str(sender))
            rounds[key] = rounds.get(key, 0) + 1
    digest = checkpoint.canonical_hash({n: p.detach() for n, p in model.state_dict().items()})
    return digest, [rounds.get(m, 0) for m in job.members]
