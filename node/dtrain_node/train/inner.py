"""The inner optimizer step as the job's recipe sets it, the same for every backend.

Every backend (built-in, TRL, torchtune) only computes a loss; the runner steps the inner AdamW
(operator/epoch.py), here. Per inner step, from the recipe (docs/methods.md "Recipe"):

- learning rate: `inner_lr` x `lr_factor(recipe, step, total)`, where `step` counts the job's
  inner steps from its first (epoch x steps per epoch + the step within the epoch, so a resumed
  or retried epoch sees the same rates) and `total` is epochs x steps per epoch. A linear
  warm-up over `warmup_steps` (step s gets (s + 1) / warmup_steps), then `constant`, or a
  `linear` or `cosine` decay to `inner_lr` x `min_lr_ratio` at the job's end;
- accumulation: `grad_accum` micro-batches of `batch_size` each, each loss divided by
  `grad_accum` and back-propagated in turn, so the step's gradient is their mean;
- clipping: the accumulated gradients scaled to a global 2-norm of at most `max_grad_norm`
  (`torch.nn.utils.clip_grad_norm_` over the trainable parameters) before the step;
- random draws (a model's dropout): each micro-batch's forward and backward run on the CPU
  generator seeded by `dropout_seed` (the step and the batch), so that a replay draws the
  member's masks; the generator's state outside is left as it was.

All of it is a function of the recipe, the job spec and the step index: every member applies the
same rates to its own shard, and the shared state (theta_sync) depends only on the packets as
before. A recipe leaving these fields at their defaults runs exactly the operations of the step
before they existed (no rate written, no clipping, one batch, an undivided loss).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dtrain.recipe import Recipe
from dtrain_node.train import devices
from dtrain_node.train.models import seeded


def lr_factor(recipe: Recipe, step: int, total: int) -> float:
    """The multiple of `inner_lr` that inner step `step` (0-based over the whole job) of a job
    of `total` inner steps uses."""
    warmup = recipe.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if recipe.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if recipe.lr_schedule == "linear":
        decay = 1.0 - progress
    else:  # cosine
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return recipe.min_lr_ratio + (1.0 - recipe.min_lr_ratio) * decay


def scheduled(recipe: Recipe | None) -> bool:
    """Whether the recipe moves the inner learning rate (else it stays the optimizer's)."""
    return recipe is not None and (recipe.lr_schedule != "constant" or recipe.warmup_steps > 0)


class Accumulated(tuple):  # type: ignore[type-arg]
    """One inner step's `grad_accum` micro-batches, as the backend's batch stream yields them."""


class Accumulating:
    """A backend whose batch stream yields `Accumulated` groups of `n` consecutive batches: one
    item per inner step, so the runner's resume (which skips K items a round) stays right."""

    def __init__(self, backend: Any, n: int) -> None:
        self.wrapped = backend
        self.n = n

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped backend's
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def batches(self, indices: torch.Tensor, batch_size: int, seed: int) -> Iterator[Any]:
        it = self.wrapped.batches(indices, batch_size, seed)
        while True:
            yield Accumulated(next(it) for _ in range(self.n))

    def loss(self, batch: Any) -> torch.Tensor:
        """One batch's loss; a whole group's is the mean of its micro-batches' losses in one
        graph (the gradient `InnerPlan.step` accumulates, holding every micro-batch's
        activations at once: for callers that take a step without the plan)."""
        if not isinstance(batch, Accumulated):
            return self.wrapped.loss(batch)  # type: ignore[no-any-return]
        return torch.stack([self.wrapped.loss(b) for b in batch]).mean()


def accumulating(backend: Any, recipe: Recipe | None) -> Any:
    """`backend` itself, or wrapped in `Accumulating` when the recipe accumulates."""
    n = recipe.grad_accum if recipe is not None else 1
    return Accumulating(backend, n) if n > 1 else backend


@dataclass
class StepResult:
    """What one inner step did: tokens trained, the mean loss of its micro-batches, the GRPO
    rewards its micro-batches sampled, the learning rate used and the gradient norm before
    clipping (None when the recipe does not clip)."""

    tokens: int
    loss: float
    rewards: list[float]
    lr: float
    grad_norm: float | None
    # per micro-batch: GRPO's share of full-reward samples, DPO's preference accuracy
    accuracies: list[float] = field(default_factory=list)


def dropout_seed(step: int, micro: int, part: Any) -> int:
    """The seed of the random draws (dropout) of micro-batch `micro` of inner step `step` on
    `part`: a function of the step and of the batch's tokens, so that a replay of a member's
    round (verify/replaycheck.py) draws the very masks the member drew, and members draw
    different ones on their different batches."""
    first = part[0] if isinstance(part, tuple | list) else part
    tokens = int(first.long().sum()) if isinstance(first, torch.Tensor) else 0
    return (step * 1_000_003 + micro * 7_919 + tokens) % (1 << 62)


@dataclass(frozen=True)
class InnerPlan:
    """The inner steps of one job: its recipe (None: the node's defaults) and its length."""

    recipe: Recipe | None
    total_steps: int  # epochs x steps per epoch

    def lr(self, base: float, step: int) -> float:
        """The learning rate of inner step `step` (0-based over the job) for base rate `base`."""
        if not scheduled(self.recipe):
            return base
        assert self.recipe is not None
        return self.recipe.inner_lr * lr_factor(self.recipe, step, self.total_steps)

    def step(
        self, opt: Any, backend: Any, batch: Any, step: int, device: torch.device
    ) -> StepResult:
        """One inner step of the DeMo optimizer `opt` on `batch` (an `Accumulated` group or one
        batch), as inner step `step` of the job. In paper mode (no inner optimizer) the step's
        clipped gradients stay for the round's packet; its rate is the outer step's."""
        recipe = self.recipe
        if opt.inner is None:
            lr = opt.cfg.lr
        else:
            lr = self.lr(opt.inner.param_groups[0]["lr"], step)
            if scheduled(recipe):
                for g in opt.inner.param_groups:
                    g["lr"] = lr
        parts: Sequence[Any] = batch if isinstance(batch, Accumulated) else (batch,)
        tokens, loss_sum, rewards, accuracies = 0, 0.0, [], []
        for i, part in enumerate(parts):
            with seeded(dropout_seed(step, i, part)):  # held against other threads' draws
                with devices.autocast(device, recipe):
                    loss = backend.loss(part)
                (loss / len(parts) if len(parts) > 1 else loss).backward()
            tokens += part[0].numel()
            loss_sum += float(loss.detach())
            reward = getattr(backend, "last_reward", None)
            if reward is not None:
                rewards.append(reward)
            accuracy = getattr(backend, "last_accuracy", None)
            if accuracy is not None:
                accuracies.append(accuracy)
        norm = None
        if recipe is not None and recipe.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(opt.params, recipe.max_grad_norm))
        opt.inner_step()
        return StepResult(tokens, loss_sum / len(parts), rewards, lr, norm, accuracies)


def run_round(trainer: Any) -> tuple[int, float]:
    """The K inner steps of a round of the runner `trainer` (operator/epoch.py `EpochTrainer`:
    its job, train_job, backend, opt, batches, device and rewards); returns (tokens, summed
    loss) and appends the GRPO rewards sampled to `trainer.rewards` (and each step's accuracy
    to `trainer.accuracies`, when it keeps them)."""
    spec, opt = trainer.job.spec, trainer.opt
    plan = InnerPlan(trainer.train_job.recipe, spec.total_epochs * spec.steps_per_epoch)
    first = trainer.job.state.epoch * spec.steps_per_epoch + opt.steps
    tokens, loss_sum = 0, 0.0
    for k in range(spec.sync_interval):
        done = plan.step(opt, trainer.backend, next(trainer.batches), first + k, trainer.device)
        tokens += done.tokens
        loss_sum += done.loss
        trainer.rewards.extend(done.rewards)
        getattr(trainer, "accuracies", []).extend(done.accuracies)
    return tokens, loss_sum


def replay_round(
    opt: Any, backend: Any, batches: Iterable[Any], plan: InnerPlan, epoch_start: int, device: Any
) -> None:
    """A member's round again as `run_round` took it, for a replay of its packet: `opt` holds
    the member's private state at the round's start (its step count included), `batches` are
    the round's K items of the member's stream and `epoch_start` is the job's inner step at
    the epoch's start (epoch x steps per epoch)."""
    first = epoch_start + opt.steps
    for k, batch in enumerate(batches):
        plan.step(opt, backend, batch, first + k, device)
