"""Training jobs of the built-in tiny model for tests (what `TrainJob.from_job` gives a node)."""

from __future__ import annotations

from pathlib import Path

from dtrain_node.train.backend import TrainJob

UNCHECKED = b"\0" * 32  # an all-zero dataset hash skips the check (local runs only)


def tiny_job(
    method: str,
    dataset: Path | str,
    digest: bytes = UNCHECKED,
    batch_size: int = 8,
    job_id: int = 1,
) -> TrainJob:
    return TrainJob(
        job_id=job_id,
        method=method,
        model_uri="builtin:tiny",
        dataset_uri=str(dataset),
        dataset_hash=digest,
        batch_size=batch_size,
    )
