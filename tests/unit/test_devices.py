"""Where a node trains: the device choice, batches moved there, bf16 autocast only on CUDA,
and the shared state on the CPU whatever the device."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dtrain.recipe import Recipe
from dtrain_node.errors import BackendUnavailable
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.train import devices


def test_pick_prefers_cuda_when_present_and_refuses_a_missing_one() -> None:
    assert devices.pick("auto", cuda_available=True).type == "cuda"
    assert devices.pick("auto", cuda_available=False).type == "cpu"
    assert devices.pick("cpu", cuda_available=True).type == "cpu"
    assert devices.pick("cuda", cuda_available=True).type == "cuda"
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        devices.pick("cuda", cuda_available=False)
    with pytest.raises(ValueError, match="one of auto, cpu, cuda"):
        devices.pick("tpu")


def test_to_device_moves_every_tensor_and_keeps_the_rest() -> None:
    batch = (torch.ones(2), [torch.zeros(1), "answer"], 7)
    moved = devices.to_device(batch, torch.device("cpu"))
    assert type(moved) is tuple and type(moved[1]) is list
    assert moved[1][1] == "answer" and moved[2] == 7
    assert torch.equal(moved[0], batch[0])


def test_autocast_is_bf16_on_cuda_only_when_the_recipe_allows() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert isinstance(devices.autocast(cpu, Recipe(bf16=True)), contextlib.nullcontext)
    assert isinstance(devices.autocast(cuda, Recipe(bf16=False)), contextlib.nullcontext)
    assert isinstance(devices.autocast(cuda, None), contextlib.nullcontext)
    assert isinstance(devices.autocast(cuda, Recipe(bf16=True)), torch.autocast)


def test_shared_state_and_error_feedback_live_on_the_cpu() -> None:
    model = torch.nn.Linear(8, 4)
    opt = DeMo(model.named_parameters(), DeMoConfig(mode="local", sync_interval=1))
    fb = opt.feedback
    assert all(t.device.type == "cpu" for t in [*opt.theta_sync, fb.mat, fb.vec])
    assert all(t is not p for t, p in zip(opt.theta_sync, opt.params, strict=True))
