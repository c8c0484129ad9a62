"""Before joining a job: can we do it? A seat bonds our stake and an epoch we cannot do gets
us slashed (or, at best, voted UNWORKABLE with everyone), so a node joins only a job whose
dataset it reads, whose recipe it reads and whose start model it builds, each matching the hash
the job pins.

`check` builds the job's backend exactly as training will (reading the dataset checks its
sha256) and compares the start model's canonical hash with the job's `modelHash`. Results are
kept per job, so `--auto` does not rebuild a job's model at every poll.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtrain_node.errors import CheckpointInvalid, DatasetError, ModelUnavailable, RecipeInvalid
from dtrain_node.train import checkpoint
from dtrain_node.train.backend import TrainJob, make_backend

if TYPE_CHECKING:
    from dtrain.models import Job

CANNOT = (DatasetError, ModelUnavailable, RecipeInvalid, CheckpointInvalid)


def check(job: Job, batch_size: int) -> str | None:
    """None when we can train `job`; else why not, in one line."""
    try:
        backend = make_backend(TrainJob.from_job(job, batch_size))
        got = checkpoint.canonical_hash(dict(backend.model.state_dict()))
        want = bytes(job.spec.model_hash)
        if got != want:
            raise CheckpointInvalid(
                f"the start model of {job.spec.model_uri!r} hashes to 0x{got.hex()}, "
                f"the job pins 0x{want.hex()}"
            )
    except CANNOT as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class Preflight:
    """`check` once per job id."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._seen: dict[int, str | None] = {}

    def __call__(self, job: Job) -> str | None:
        if job.id not in self._seen:
            self._seen[job.id] = check(job, self.batch_size)
        return self._seen[job.id]
