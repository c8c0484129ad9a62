"""`job submit`'s and `data check`'s dry run of a would-be job, through the node's own parts (the
`dtrain.job_check` entry point): the job's backend built exactly as a node builds it, and its
sync checked as every member will build it. It imports what a training backend needs and, for
a sync, the codec: not the operator, its sources or the gossip host (a CLI call pays for what it
checks, nothing more)."""

from __future__ import annotations

from dataclasses import replace

from dtrain.models import JobSpec
from dtrain.recipe import ZERO_HASH, Recipe
from dtrain_node.train.backend import make_backend, token_reach
from dtrain_node.train.job import TrainJob


def check_job(
    model_uri: str,
    dataset_uri: str,
    method: str,
    recipe: Recipe | None,
    compression: tuple[int, int, int] | None = None,
    fit_topk: bool = False,
) -> tuple[bytes, dict[str, int] | None]:
    """Builds the backend of a would-be job exactly as a node will (dataset unchecked by hash:
    the caller hashes it separately) and returns its start pin, the job's `modelHash`, and with
    `compression` (top-k per chunk, bits, seats) the sync it checked its members can run: the
    top-k, a member's packet bytes and the parameters synced. With `fit_topk` the top-k is
    first lowered to the largest whose packet fits the gossip limit (a default, not the
    caller's choice). Raises the node's error (DatasetError, ModelUnavailable, RecipeInvalid,
    CompressionInvalid, ...) when it cannot train. The `dtrain.job_check` entry point: `job
    submit` calls it before creating a job."""
    job = TrainJob(0, method, model_uri, dataset_uri, ZERO_HASH, recipe=recipe)
    backend = make_backend(job)
    if compression is None:
        return backend.start_pin, None
    # the codec's tables load only for a job's sync, not for `data check`
    from dtrain_node.optim.settings import check_compression, fitted_topk

    topk, bits, seats = compression
    spec = JobSpec(0, topk_per_chunk=topk, quant_bits=bits, max_operators=seats)
    model, reach = backend.model, token_reach(backend)
    if fit_topk:
        spec = replace(spec, topk_per_chunk=fitted_topk(spec, recipe, model, reach))
    packet = check_compression(spec, recipe, model, reach)
    synced = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sync = {"topk": spec.topk_per_chunk, "packet_bytes": packet.packet_bytes, "params": synced}
    return backend.start_pin, sync
