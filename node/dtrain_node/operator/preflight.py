"""Before joining a job: can we do it? A seat bonds our stake and an epoch we cannot do gets
us slashed (or, at best, voted UNWORKABLE with everyone), so a node joins only a job whose
dataset it reads, whose recipe it reads and whose start model it builds, each matching the hash
the job pins, and whose compression its members can sync (`optim.settings.check_compression`).

`check` first fetches what the job names remotely (p2p or https model, dataset and recipe, into
the node's cache, each verified against its hash: `operator.sources`), then builds the job's
backend exactly as training will (reading the dataset checks its sha256) and compares the start
model's pin with the job's `modelHash`. A job whose files cannot be had intact is never joined.
It then times this machine on the job (`measure_step_s`: forward and backward of its batches,
as an inner step takes them) and refuses a job whose epoch this machine cannot finish in time
(`deadlines.epoch_seconds_needed`): a seat that would miss its commit deadline is a dropout.
Results are kept per job, so `--auto` does not fetch or rebuild a job's model at every poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from dtrain.models import Job
from dtrain_node.errors import (
    BackendUnavailable,
    CheckpointInvalid,
    CompressionInvalid,
    DatasetError,
    ModelUnavailable,
    RecipeInvalid,
)
from dtrain_node.operator.deadlines import epoch_seconds_needed
from dtrain_node.operator.sources import Cache, LocalSources, fetch_job
from dtrain_node.optim.settings import check_compression, check_mode
from dtrain_node.train.backend import TrainJob, make_backend, token_reach

# A job we cannot do: skipped, never joined (a backend we lack, e.g. the recipe asks for trl).
CANNOT = (
    DatasetError,
    ModelUnavailable,
    RecipeInvalid,
    CheckpointInvalid,
    CompressionInvalid,
    BackendUnavailable,
)


# What the job's own files, fetched intact, prove nobody can train: every honest node that
# builds the job reproduces it (a backend we lack or a file we cannot fetch proves nothing).
PROVES_UNWORKABLE = (
    DatasetError,
    ModelUnavailable,
    RecipeInvalid,
    CheckpointInvalid,
    CompressionInvalid,
)


TIMED_STEPS = 2  # inner steps timed before a seat is bonded (the first one warms up)


class TooSlow(Exception):
    """This machine cannot finish an epoch of the job before its commit deadline."""


def check(job: Job, batch_size: int, cache: Cache | None = None, step_s: float = 0.0) -> str | None:
    """None when we can train `job`; else why not, in one line. With a cache, the job's remote
    files are fetched into it first (else its references are read as they are). `step_s`: our
    seconds per inner step as the operator states them; the measured time counts when longer."""
    try:
        backend, tj = build(job, batch_size, fetch_job(job, cache) if cache is not None else None)
        accum = tj.recipe.grad_accum if tj.recipe is not None else 1
        fits(job, max(step_s, measure_step_s(backend, batch_size, accum)))
    except CANNOT as exc:
        return f"{type(exc).__name__}: {exc}"
    except TooSlow as exc:
        return f"too slow for this job: {exc}"
    return None


def fits(job: Job, step_s: float) -> None:
    """Raises TooSlow when an epoch at `step_s` seconds per inner step outlasts the job's."""
    s = job.spec
    need = epoch_seconds_needed(s.steps_per_epoch, s.sync_interval, step_s)
    if s.epoch_duration < need:
        raise TooSlow(
            f"an epoch of {s.epoch_duration} s needs {need:.0f} s here "
            f"at {step_s:.2f} s per inner step (the measured or the stated, the slower)"
        )


def measure_step_s(backend: Any, batch_size: int, grad_accum: int = 1) -> float:
    """Seconds one inner step of `backend` takes here: the forward and backward of one batch,
    timed after a warm-up batch, times the micro-batches a step accumulates."""
    n = backend.n_items()
    idx = torch.arange(min(n, batch_size * TIMED_STEPS))
    times = []
    for batch in backend.batches(idx, batch_size, seed=0):
        t0 = time.perf_counter()
        backend.loss(batch).backward()
        times.append(time.perf_counter() - t0)
        if len(times) == TIMED_STEPS:
            break
    backend.model.zero_grad(set_to_none=True)
    return (times[-1] if times else 0.0) * grad_accum


def build(job: Job, batch_size: int, local: LocalSources | None) -> tuple[Any, TrainJob]:
    """Builds `job`'s backend exactly as training will, from its fetched files `local`
    (reading the dataset checks its sha256), checks that its members can sync the model with
    the job's DeMo mode and compression and that the start model has the job's pin: raises
    what stops it."""
    tj = TrainJob.from_job(job, batch_size, local)
    backend = make_backend(tj)
    check_mode(job.spec, tj.recipe)
    check_compression(job.spec, tj.recipe, backend.model, token_reach(backend))
    got = backend.start_pin
    want = bytes(job.spec.model_hash)
    if got != want:
        raise CheckpointInvalid(
            f"the start model of {job.spec.model_uri!r} hashes to 0x{got.hex()}, "
            f"the job pins 0x{want.hex()}"
        )
    return backend, tj


class Preflight:
    """`check` once per job id; a failed check is tried again after `retry_s` (a caller whose
    data server was not up yet, a peer that was briefly unreachable), a passed one never."""

    def __init__(
        self,
        batch_size: int,
        cache: Cache | None = None,
        retry_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        step_s: float = 0.0,
    ) -> None:
        self.batch_size, self.step_s = batch_size, step_s
        self.cache = cache
        self.retry_s = retry_s
        self._clock = clock
        self._seen: dict[int, tuple[str | None, float]] = {}

    def __call__(self, job: Job) -> str | None:
        now = self._clock()
        seen = self._seen.get(job.id)
        if seen is None or (seen[0] is not None and now - seen[1] >= self.retry_s):
            self._seen[job.id] = (check(job, self.batch_size, self.cache, self.step_s), now)
        return self._seen[job.id][0]
