"""Where a node trains: CUDA when present (or asked for), else the CPU.

Only the local inner steps run on the device. The shared state (theta_sync), the error feedback,
compression and the exact aggregation stay on the CPU (optim/optimizer.py), so a node on a GPU
and one on a CPU hold bitwise the same shared state; GRPO draws its samples on the CPU from the
seeded generator. bf16 autocast applies on CUDA when the recipe allows it (`bf16 = true`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dtrain_node.errors import BackendUnavailable

CHOICES = ("auto", "cpu", "cuda")


def pick(want: str = "auto", cuda_available: bool | None = None) -> torch.device:
    """The device for `want`: "cpu", "cuda" (an error without one) or "auto" (CUDA if any)."""
    if want not in CHOICES:
        raise ValueError(f"device {want!r}: one of {', '.join(CHOICES)}")
    has_cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if want == "cuda" and not has_cuda:
        raise BackendUnavailable("--device cuda: this machine has no CUDA device torch can use")
    return torch.device("cuda" if want != "cpu" and has_cuda else "cpu")


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor in it (nested tuples and lists) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def autocast(device: torch.device, recipe: Any) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA when the recipe allows it; nothing otherwise."""
    if device.type == "cuda" and getattr(recipe, "bf16", False):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
