"""Before joining a job: can we do it? A seat bonds our stake and an epoch we cannot do gets
us slashed (or, at best, voted UNWORKABLE with everyone), so a node joins only a job whose
dataset it reads, whose recipe it reads and whose start model it builds, each matching the hash
the job pins.

`check` first fetches what the job names remotely (p2p or https model, dataset and recipe, into
the node's cache, each verified against its hash: `operator.sources`), then builds the job's
backend exactly as training will (reading the dataset checks its sha256) and compares the start
model's pin with the job's `modelHash`. A job whose files cannot be had intact is never joined.
Results are kept per job, so `--auto` does not fetch or rebuild a job's model at every poll.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtrain_node.errors import CheckpointInvalid, DatasetError, ModelUnavailable, RecipeInvalid
from dtrain_node.operator.sources import Cache, fetch_job
from dtrain_node.train.backend import TrainJob, make_backend

if TYPE_CHECKING:
    from dtrain.models import Job

CANNOT = (DatasetError, ModelUnavailable, RecipeInvalid, CheckpointInvalid)


def check(job: Job, batch_size: int, cache: Cache | None = None) -> str | None:
    """None when we can train `job`; else why not, in one line. With a cache, the job's remote
    files are fetched into it first (else its references are read as they are)."""
    try:
        local = fetch_job(job, cache) if cache is not None else None
        backend = make_backend(TrainJob.from_job(job, batch_size, local))
        got = backend.start_pin
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

    def __init__(self, batch_size: int, cache: Cache | None = None) -> None:
        self.batch_size = batch_size
        self.cache = cache
        self._seen: dict[int, str | None] = {}

    def __call__(self, job: Job) -> str | None:
        if job.id not in self._seen:
            self._seen[job.id] = check(job, self.batch_size, self.cache)
        return self._seen[job.id]
