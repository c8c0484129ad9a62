"""A job's DeMo settings, from what the chain pins (its spec) and its recipe: the same on every
member, the referee and the replay checks, and what `job submit` checks a job against before
it is created (`check_compression`, `fitted_topk`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from dtrain.models import Job, JobSpec
from dtrain.recipe import Recipe
from dtrain_node.errors import CompressionInvalid, RecipeInvalid
from dtrain_node.optim import aggregate, codec, dct
from dtrain_node.optim.compress import K_AUTO, CompressConfig
from dtrain_node.optim.optimizer import DeMoConfig, model_spec

if TYPE_CHECKING:
    import torch


class NodeDefaults(Protocol):
    """A node's outer step and inner lr, for a job without a recipe (`NodeConfig` has them)."""

    outer_lr: float
    beta: float
    inner_lr: float


def demo_config(cfg: NodeDefaults, job: Job, recipe: Recipe | None = None) -> DeMoConfig:
    """DeMo settings: K, top-k and quantization bits from the job spec; the token tensors'
    compression, the outer step and the inner AdamW from the job's recipe, or without one the
    recipe defaults and the node config (the same on every reference node). The recipe's
    `demo_mode` "paper" takes the DeMo paper's sign step of outer_lr; RecipeInvalid when the
    job's sync_interval is not the 1 it needs."""
    spec = job.spec
    compress = compress_config(spec, recipe)
    check_mode(spec, recipe)
    if recipe is None:
        return DeMoConfig(
            mode="local",
            sync_interval=spec.sync_interval,
            lr=cfg.outer_lr,
            beta=cfg.beta,
            inner_lr=cfg.inner_lr,
            compress=compress,
        )
    return DeMoConfig(
        mode="paper" if recipe.demo_mode == "paper" else "local",
        sync_interval=spec.sync_interval,
        sign=recipe.demo_mode == "paper",
        lr=recipe.outer_lr,
        beta=recipe.outer_momentum,
        weight_decay=recipe.outer_weight_decay,
        inner_lr=recipe.inner_lr,
        inner_betas=(recipe.inner_beta1, recipe.inner_beta2),
        inner_weight_decay=recipe.inner_weight_decay,
        shared_feedback=recipe.error_feedback == "shared",
        compress=compress,
    )


def check_mode(spec: JobSpec, recipe: Recipe | None) -> None:
    """RecipeInvalid when the recipe's DeMo mode cannot run the job: paper mode syncs every
    step, so it needs the job's sync_interval 1."""
    if recipe is not None and recipe.demo_mode == "paper" and spec.sync_interval != 1:
        raise RecipeInvalid(
            f"recipe demo_mode 'paper' syncs every step; the job syncs every {spec.sync_interval}"
            " steps (submit it with --sync 1)"
        )


def compress_config(spec: JobSpec, recipe: Recipe | None) -> CompressConfig:
    """The job's compression: top-k and bits from its spec, the token tensors' k and blocks
    from its recipe (or the defaults), the auto k's budget from its seats. ValueError when
    the numbers are out of range."""
    r = recipe or Recipe()
    return CompressConfig(
        k2d=spec.topk_per_chunk,
        k1d=1,
        bits=spec.quant_bits,
        k_token=r.token_topk or K_AUTO,
        token_rows=r.token_rows,
        ring=max(2, spec.max_operators),
        # paper mode's sign step per tensor would move every head row twice: no mean row
        k_mean=r.head_mean_topk if r.demo_mode == "local" else 0,
    )


def check_compression(
    spec: JobSpec, recipe: Recipe | None, model: torch.nn.Module, reach: int = 0
) -> codec.Spec:
    """The packet layout every member of the job builds for `model` (`DeMo.of_model`), or
    CompressionInvalid when no member could sync with it: settings out of range (more
    coefficients than a chunk holds), a packet over the gossip limit, or too many seats for
    an exact aggregate."""
    try:
        packet = model_spec(model, compress_config(spec, recipe), reach)
    except ValueError as exc:
        raise CompressionInvalid(f"the job's compression cannot be built: {exc}") from None
    if packet.packet_bytes > codec.MAX_BYTES:
        raise CompressionInvalid(
            f"a packet of {packet.packet_bytes} bytes is over the gossip limit of "
            f"{codec.MAX_BYTES} (top-k {spec.topk_per_chunk}, {packet.cfg.k_token or 0} "
            "for token tensors): choose fewer coefficients"
        )
    bmax = int(dct.basis_q(packet.cfg.chunk).abs().max())
    for k, dims in {(t[2], 2 if t[1] != packet.cfg.chunk else 1) for t in packet.layout}:
        try:
            aggregate.bound_shift(spec.max_operators, k, packet.cfg.max_level, bmax, dims)
        except ValueError as exc:
            raise CompressionInvalid(f"{spec.max_operators} seats: {exc}") from None
    return packet


def fitted_topk(
    spec: JobSpec, recipe: Recipe | None, model: torch.nn.Module, reach: int = 0
) -> int:
    """The largest top-k per chunk up to the job's whose packet fits the gossip limit (its
    bytes grow about linearly in k: a step or two down from the job's)."""
    k = spec.topk_per_chunk
    while k > 1:
        cfg = compress_config(replace(spec, topk_per_chunk=k), recipe)
        size = model_spec(model, cfg, reach).packet_bytes
        if size <= codec.MAX_BYTES:
            return k
        k = max(1, min(k - 1, k * codec.MAX_BYTES // size))
    return k
