"""The referee's refusals that need no chain: a transcript of another deployment, an attempt
the chain never started, an epoch after the first without its start checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from dtrain_node.errors import CheckpointInvalid, TranscriptInvalid
from dtrain_node.operator import referee
from dtrain_node.train import checkpoint
from dtrain_node.verify import evidence

CONTRACT = "0x" + "Cc" * 20


@dataclass
class _Chain:
    """What `referee.check` reads before re-executing anything: chain id, address, events."""

    chain_id: int = 31337
    address: str = evidence.EpochTranscript(1, CONTRACT, 1, 0, 1, ()).contract
    started: list[Any] = field(default_factory=list)

    def events(self, names: Any = None, job_id: Any = None, from_block: int = 0) -> list[Any]:
        return self.started


def _t(**kw: Any) -> evidence.EpochTranscript:
    args = {"chain_id": 31337, "contract": CONTRACT, "job_id": 1, "epoch": 0, "attempt": 1}
    return evidence.EpochTranscript(**{**args, **kw}, rounds=())


def test_a_transcript_of_another_deployment_is_refused() -> None:
    with pytest.raises(TranscriptInvalid, match="chain 5 contract"):
        referee.check(_Chain(), None, _t(chain_id=5), None)  # type: ignore[arg-type]
    with pytest.raises(TranscriptInvalid, match="not chain 31337"):
        other = "0x" + "dd" * 20
        referee.check(_Chain(), None, _t(contract=other), None)  # type: ignore[arg-type]


def test_an_attempt_the_chain_never_started_is_refused() -> None:
    with pytest.raises(TranscriptInvalid, match="never started attempt 1 of epoch 0"):
        referee.check(_Chain(), None, _t(), None)  # type: ignore[arg-type]


def test_a_later_epoch_needs_its_verified_start(tmp_path: Path) -> None:
    expected = bytes(range(32))
    with pytest.raises(CheckpointInvalid, match="--start"):
        referee._start(None, expected)
    tensors = {"w": torch.arange(4.0)}
    f = tmp_path / "start.safetensors"
    digest = checkpoint.save(f, tensors)
    assert torch.equal(referee._start(f, digest)["w"], tensors["w"])
    with pytest.raises(CheckpointInvalid):
        referee._start(f, expected)  # another checkpoint than the epoch started from
