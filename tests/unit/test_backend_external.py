"""The external backends without an adapter (axolotl, unsloth): a one-line `BackendUnavailable`
from `make_backend`, which the node's pre-flight turns into a refusal before joining a job.
unsloth is refused first for want of a CUDA device, whatever is installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dtrain.errors import ConfigError
from dtrain.recipe import Recipe
from dtrain_node.errors import BackendUnavailable
from dtrain_node.train import backend
from dtrain_node.train.backend import TrainJob, make_backend


def sft_job() -> TrainJob:
    # never read: the external backends are refused before the model or data are touched
    return TrainJob(1, "sft", "/nonexistent/model", "/nonexistent/data", b"\0" * 32)


def absent(monkeypatch, *packages: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in packages else real(name, *a)
    )


def refusal(name: str) -> str:
    with pytest.raises(BackendUnavailable) as err:
        make_backend(sft_job(), name)
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_unsloth_without_cuda_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    msg = refusal("unsloth")
    assert msg == (
        "backend 'unsloth' needs a CUDA GPU and this node has none "
        "(use one of builtin, trl, torchtune on a CPU node)"
    )


def test_unsloth_on_cuda_names_the_install_or_the_missing_adapter(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    absent(monkeypatch, "unsloth")
    assert refusal("unsloth") == (
        "backend 'unsloth' needs the unsloth package, which is not installed: pip install unsloth"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert refusal("unsloth") == "backend 'unsloth' has no adapter in this version"


def test_axolotl_needs_no_cuda_to_be_named(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    absent(monkeypatch, "axolotl")
    assert "needs the axolotl package" in refusal("axolotl")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert refusal("axolotl") == "backend 'axolotl' has no adapter in this version"


def test_the_recipe_names_only_backends_with_an_adapter() -> None:
    from dtrain.recipe import BACKENDS

    assert BACKENDS == backend.ADAPTERS
    for name in backend.EXTERNAL:
        with pytest.raises(
            ConfigError, match=f"'backend' must be builtin, trl or torchtune, got '{name}'"
        ):
            Recipe(backend=name)
    with pytest.raises(
        ValueError,
        match="unknown backend 'deepspeed'; known: builtin, trl, torchtune, axolotl, unsloth",
    ):
        make_backend(sft_job(), "deepspeed")
