"""What a job will take before it is paid for: how long at most, and what it costs.

Operators announce no training speed: on-chain an operator has only a free-form `hardware`
string ("cpu:2") and a price ask. So the time is bounded by the job's own deadlines and the
deployment's windows, which the contract enforces (docs/contract.md "Timing"): once
`min_operators` applied, the seats are drawn `seat_draw_window` later (0: first joiners); each
epoch then runs `start_grace`, at most `epoch_duration` of training, at most `reveal_window` of
reveals, and `challenge_window` after the last reveal (or after the reveal deadline) before it
can be finalized and the next one starts. An epoch whose members finish early ends early. Not
counted: the wait for operators to apply (up to `open_timeout`, then the caller may cancel), a
failed epoch's retry, a challenge.

Beside the bound, a typical time where this deployment has trained the same model before:
each past epoch's seconds per inner step, from its `EpochStarted` block to its members' last
`CheckpointCommitted` (the median over those epochs), times the job's steps, plus each epoch's
challenge window (`past_speed`).

The cost is in the job's unit: at most the escrow (price x max operators x epochs); what no
member earned is refunded, so a job that `min_operators` serve throughout costs price x min
operators x epochs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .models import JobSpec, Params
from .recipe import Recipe
from .units import format_span

if TYPE_CHECKING:
    from .client import BSM

BASIS = (
    "the job's deadlines and the deployment's windows: operators announce no training speed "
    "(on-chain only a free-form hardware string), so each epoch counts in full (it ends sooner "
    "when its members finish early); not counted: the wait for operators to apply, retried "
    "epochs, challenges"
)


@dataclass(frozen=True)
class Estimate:
    """The bound on a job's wall time (seconds; the windows are None when unknown, for a job
    bought through a gateway) and its cost range in the job's unit."""

    epochs: int
    epoch_duration: int
    seat_draw: int | None  # seat_draw_window, once
    per_epoch: int | None  # start grace + epoch duration + reveal window + challenge window
    time_bound: int  # seat draw + epochs x per epoch (without params: epochs x epoch duration)
    cost_max: int  # the escrow
    cost_min: int  # price x min operators x epochs
    basis: str = BASIS
    typical: int | None = None  # at the measured speed (None: no past epoch of the model here)
    step_s: float | None = None  # the measured seconds per inner step
    measured_epochs: int = 0  # the past epochs it is the median of

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Speed:
    """Seconds per inner step past epochs of a model took on a deployment (the median)."""

    step_s: float
    epochs: int


def past_speed(bsm: BSM, model_hash: bytes) -> Speed | None:
    """How fast past epochs of the model `model_hash` trained on `bsm`'s deployment: from each
    epoch attempt's `EpochStarted` to its members' last `CheckpointCommitted`, per inner step;
    None when no epoch of it got that far."""
    specs: dict[int, JobSpec] = {}
    started: dict[tuple[int, int], int] = {}
    committed: dict[tuple[int, int], int] = {}
    for e in bsm.events(names=["EpochStarted", "CheckpointCommitted"]):
        job = int(e.args["jobId"])
        if job not in specs:
            specs[job] = bsm.job(job).spec
        if specs[job].model_hash != model_hash:
            continue
        key = (job, int(e.args["epoch"]))
        if e.name == "EpochStarted":  # a retried attempt starts the clock again
            started[key] = e.block
            committed.pop(key, None)
        else:
            committed[key] = e.block
    blocks = {*started.values(), *committed.values()}
    stamp = {b: int(bsm.w3.eth.get_block(b)["timestamp"]) for b in blocks}
    per_step = [
        (stamp[end] - stamp[started[key]]) / specs[key[0]].steps_per_epoch
        for key, end in committed.items()
        if key in started
    ]
    return Speed(statistics.median(per_step), len(per_step)) if per_step else None


def estimate(spec: JobSpec, params: Params | None, speed: Speed | None = None) -> Estimate:
    """The estimate for a job of `spec` on a deployment of `params` (None: unknown), with a
    typical time at `speed` (see `past_speed`) when given."""
    per_epoch = seat_draw = None
    if params is not None:
        per_epoch = (
            params.start_grace
            + spec.epoch_duration
            + params.reveal_window
            + params.challenge_window
        )
        seat_draw = params.seat_draw_window
        bound = seat_draw + spec.total_epochs * per_epoch
    else:
        bound = spec.total_epochs * spec.epoch_duration
    price, epochs = spec.price_per_operator_epoch, spec.total_epochs
    typical = None
    if speed is not None and params is not None:
        train = min(round(spec.steps_per_epoch * speed.step_s), spec.epoch_duration)
        typical = (seat_draw or 0) + epochs * (train + params.challenge_window)
    return Estimate(
        epochs=epochs,
        epoch_duration=spec.epoch_duration,
        seat_draw=seat_draw,
        per_epoch=per_epoch,
        time_bound=bound,
        cost_max=spec.escrow,
        cost_min=price * spec.min_operators * epochs,
        typical=typical,
        step_s=speed.step_s if speed else None,
        measured_epochs=speed.epochs if speed else 0,
    )


def describe(est: Estimate, spec: JobSpec, params: Params | None, fmt: Callable[[int], str]) -> str:
    """The estimate as two summary lines (`time`, `cost`) and the basis, indented like the
    rest of `job submit`'s summary; `fmt` formats an amount in the job's unit."""
    span = format_span
    if params is None or est.per_epoch is None:
        time = (
            f"  time     at most {span(est.time_bound)} of training ({est.epochs} epoch(s) x "
            f"{span(spec.epoch_duration)}), plus the deployment's windows (not known here)"
        )
    else:
        windows = [
            f"start grace {span(params.start_grace)}",
            f"epoch {span(spec.epoch_duration)}",
            f"reveals {span(params.reveal_window)}",
        ]
        if params.challenge_window:
            windows.append(f"challenge window {span(params.challenge_window)}")
        draw = f"seat draw {span(est.seat_draw or 0)}, then " if est.seat_draw else ""
        time = (
            f"  time     at most {span(est.time_bound)} once {spec.min_operators} operators "
            f"applied: {draw}"
            f"{est.epochs} epoch(s) x at most {span(est.per_epoch)} ({' + '.join(windows)})"
        )
    if est.typical is not None and est.step_s is not None:
        time = (
            f"  typical  about {span(est.typical)} once {spec.min_operators} operators applied, "
            f"at the speed past epochs of this model trained here ({est.step_s:.3g} s per inner "
            f"step, the median of {est.measured_epochs} epoch(s)), challenge windows "
            f"included\n{time}"
        )
    cost = f"  cost     at most {fmt(est.cost_max)} (the escrow)"
    if est.cost_min != est.cost_max:
        lo = spec.min_operators
        cost += f"; {fmt(est.cost_min)} if {lo} operators serve every epoch (the rest refunded)"
    return f"{time}\n{cost}\n  (estimate from {est.basis})"


def schedule_note(recipe: Recipe | None, spec: JobSpec) -> str | None:
    """A summary line on the recipe's learning-rate schedule over the job's inner steps, or
    None when the recipe has none; it says when the warm-up outlasts the job."""
    if recipe is None or (recipe.lr_schedule == "constant" and not recipe.warmup_steps):
        return None
    total = spec.total_epochs * spec.steps_per_epoch
    line = (
        f"  schedule {recipe.lr_schedule} inner lr over {total} inner steps "
        f"({spec.total_epochs} epoch(s) x {spec.steps_per_epoch})"
    )
    if recipe.warmup_steps:
        line += f", after {recipe.warmup_steps} warm-up steps"
    if recipe.warmup_steps > total:
        line += (
            f"; the warm-up is longer than the job, so the rate peaks at "
            f"{total}/{recipe.warmup_steps} of inner_lr {recipe.inner_lr:g}"
        )
    return line
