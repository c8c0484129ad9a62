"""The referee's check of one epoch attempt (`dtrain node recompute`): does its transcript
file lead to the checkpoint the chain certified?

Everything comes from the chain and the file: the attempt's `EpochStarted` names its start
checkpoint and the block whose state lists its members; every packet of the file is checked
against its sender's signed commitment (`evidence.verify`); the epoch is re-executed from its
start state by aggregation alone (`verify.recompute`); the attempt's `EpochFinalized`, if any,
names what the chain certified. Nothing here needs a key, a stake or the job's private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain_node.errors import CheckpointInvalid, TranscriptInvalid
from dtrain_node.operator import preflight
from dtrain_node.operator.sources import fetch_job
from dtrain_node.train import checkpoint
from dtrain_node.train.job import TrainJob
from dtrain_node.verify import evidence
from dtrain_node.verify.recompute import Attempt, recompute

if TYPE_CHECKING:
    from dtrain.client import BSM
    from dtrain.models import Job
    from dtrain_node.operator.config import NodeConfig


@dataclass(frozen=True)
class Verdict:
    job_id: int
    epoch: int
    attempt: int
    recomputed: bytes
    certified: bytes | None  # None: the chain finalized no checkpoint for this attempt (yet)
    participation: tuple[int, ...] = ()  # the transcript's participation vote, members order

    @property
    def matches(self) -> bool:
        return self.certified == self.recomputed


def check(bsm: BSM, cfg: NodeConfig, t: evidence.EpochTranscript, start: Path | None) -> Verdict:
    """Recompute attempt `t.attempt` of epoch `t.epoch` from `t` and find what the chain
    certified for it. `start`: the epoch's start checkpoint (a safetensors file or a canonical
    stream), needed after a job's first epoch. Raises TranscriptInvalid for a file of another
    chain, contract or attempt, or holding a packet its sender did not commit."""
    if (t.chain_id, t.contract) != (bsm.chain_id, bsm.address):
        raise TranscriptInvalid(
            f"transcript of chain {t.chain_id} contract {t.contract}, not chain {bsm.chain_id} "
            f"contract {bsm.address}"
        )
    started = [
        e for e in bsm.events(names=["EpochStarted"], job_id=t.job_id) if e.args["epoch"] == t.epoch
    ]
    mine = [e for e in started if e.args["attempt"] == t.attempt]
    if not mine:
        raise TranscriptInvalid(
            f"job {t.job_id} never started attempt {t.attempt} of epoch {t.epoch}"
        )
    job = bsm.job(t.job_id, block=mine[0].block)  # members and start as the attempt began
    evidence.verify(t, job.members)
    tensors = None if t.epoch == 0 else _start(start, job.state.checkpoint)
    recomputed, participation = recompute(attempt(cfg, job, tensors), t)
    certified = _certified(bsm, t, mine[0], started)
    return Verdict(t.job_id, t.epoch, t.attempt, recomputed, certified, tuple(participation))


def attempt(cfg: NodeConfig, job: Job, start: dict[str, Any] | None = None) -> Attempt:
    """What re-executing an attempt of `job` (as it began) starts from, the job's files
    fetched into this node's cache (`verify.recompute.Attempt`)."""
    tj = TrainJob.from_job(job, cfg.batch_size, fetch_job(job, cfg.source_cache()))
    return Attempt(job, tj, cfg, start)


def unworkable(job: Job, cfg: NodeConfig) -> str | None:
    """Why nobody can train `job` (its model, dataset or recipe, fetched intact, fails to
    build, read or match its pin: what every honest node reproduces), or None. Raises
    DatasetError, ModelUnavailable or RecipeInvalid when a file cannot be fetched at all: that
    proves nothing either way (docs/contract.md, "Provable UNWORKABLE")."""
    local = fetch_job(job, cfg.source_cache())  # availability first: a failure is not evidence
    try:
        preflight.build(job, cfg.batch_size, local)
    except preflight.PROVES_UNWORKABLE as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def empty(
    job: Job, epoch: int, attempt: int, chain_id: int, contract: str
) -> evidence.EpochTranscript:
    """The transcript of an attempt nobody showed a packet of: every round empty."""
    rounds = tuple(() for _ in range(job.spec.steps_per_epoch // job.spec.sync_interval))
    return evidence.EpochTranscript(chain_id, contract, job.id, epoch, attempt, rounds)


def start_tensors(path: Path | None, expected: bytes) -> dict[str, Any]:
    """The epoch's start tensors from `path`, checked against the checkpoint hash `expected`."""
    return _start(path, expected)


def _start(path: Path | None, expected: bytes) -> dict[str, Any]:
    if path is None:
        raise CheckpointInvalid(
            f"an epoch after the first starts from checkpoint 0x{expected.hex()}: give it "
            f"with --start (`dtrain job fetch` exports checkpoints; members keep "
            f"jobs/<job>/epoch-<e>.stream)"
        )
    if path.suffix == ".stream":
        return checkpoint.from_stream(path.read_bytes(), expected)
    return checkpoint.load(path, expected)


def _certified(
    bsm: BSM, t: evidence.EpochTranscript, mine: Any, started: list[Any]
) -> bytes | None:
    """The checkpoint of the attempt's `EpochFinalized`: the first one of the epoch after the
    attempt began and before a later attempt of it began (a failed attempt has none)."""
    later = [e.block for e in started if e.args["attempt"] > t.attempt]
    for e in bsm.events(names=["EpochFinalized"], from_block=mine.block, job_id=t.job_id):
        if e.args["epoch"] == t.epoch and (not later or e.block <= min(later)):
            return bytes(e.args["checkpoint"])
    return None
