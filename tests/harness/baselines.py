"""Dense baselines for the same harness: AdamW data-parallel and DiLoCo.

Both train N simulated workers on their own batches in one process. Communication is dense:
a ring all-reduce uploads 2 (N-1)/N x model bytes per worker (see ring_allreduce_bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def ring_allreduce_bytes(numel: int, bytes_per_elem: int, workers: int) -> float:
    """Upload per worker of one dense ring all-reduce (reduce-scatter + all-gather)."""
    return 2.0 * (workers - 1) / workers * numel * bytes_per_elem


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or not all(0 <= b < 1 for b in self.betas) or self.weight_decay < 0:
            raise ValueError(f"bad AdamW config: {self}")

    def make(self, params) -> torch.optim.AdamW:
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay
        )


class DDP:
    """Dense AdamW data-parallel: one shared model, gradient = exact mean over workers."""

    sync_interval = 1

    def __init__(self, model: nn.Module, cfg: AdamWConfig) -> None:
        self.model, self.opt = model, cfg.make(model.parameters())

    def step(self, batches: Sequence[Batch], loss_fn: LossFn) -> float:
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for b in batches:  # grads accumulate g_1/N + ... + g_N/N in worker order
            loss = loss_fn(self.model, b)
            (loss / len(batches)).backward()
            total += loss.item()
        self.opt.step()
        return total / len(batches)

    def eval_model(self) -> nn.Module:
        return self.model


@dataclass(frozen=True)
class DiLoCoConfig:
    inner: AdamWConfig = AdamWConfig()
    sync_interval: int = 32
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.sync_interval < 1 or self.outer_lr <= 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError(f"bad DiLoCo config: {self}")


class DiLoCo:
    """DiLoCo: N replicas with inner AdamW; every K steps the mean dense pseudo-gradient
    theta_sync - theta_i drives an outer Nesterov SGD step on theta_sync."""

    def __init__(self, models: Sequence[nn.Module], cfg: DiLoCoConfig) -> None:
        self.models, self.cfg = list(models), cfg
        self.sync_interval = cfg.sync_interval
        self.inner = [cfg.inner.make(m.parameters()) for m in self.models]
        self.shared = [p.detach().clone().requires_grad_(True) for p in self.models[0].parameters()]
        self.outer = torch.optim.SGD(
            self.shared,
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_momentum > 0,
        )
        self.t = 0
        self._broadcast()

    @torch.no_grad()
    def _broadcast(self) -> None:
        for m in self.models:
            for p, s in zip(m.parameters(), self.shared, strict=True):
                p.copy_(s)

    def step(self, batches: Sequence[Batch], loss_fn: LossFn) -> float:
        total = 0.0
        for m, opt, b in zip(self.models, self.inner, batches, strict=True):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(m, b)
            loss.backward()
            opt.step()
            total += loss.item()
        self.t += 1
        if self.t % self.cfg.sync_interval == 0:
            self.sync()
        return total / len(batches)

    @torch.no_grad()
    def sync(self) -> None:
        n = len(self.models)
        local = [list(m.parameters()) for m in self.models]
        for i, s in enumerate(self.shared):
            g = torch.zeros_like(s)
            for ps in local:
                g += s - ps[i]
            s.grad = g / n
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        self._broadcast()

    def eval_model(self) -> nn.Module:
        return self.models[0]
