"""The training backend of a job, built one at a time per process.

The built-in model is initialised from torch's global RNG seeded with the job id, so two
builds running at once in one process (nodes in threads, as in the operator tests) would
interleave their draws and get different weights: the lock keeps every build deterministic.
"""

from __future__ import annotations

import threading

from dtrain.models import Job
from dtrain_node.train.backend import Backend, TrainJob, make_backend

_BUILD = threading.Lock()


def backend_for(job: Job, batch_size: int = 8) -> Backend:
    """The backend of the chain's `job` (model from its seed, dataset verified by hash)."""
    with _BUILD:
        return make_backend(TrainJob.from_job(job, batch_size))
