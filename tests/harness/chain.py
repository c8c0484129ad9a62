"""Helpers shared by the chain tests."""

from __future__ import annotations

from typing import Any

from web3 import Web3

from dtrain.models import JobSpec

ETH = 10**18


def peer_key(i: int) -> bytes:
    return Web3.keccak(text=f"peer-{i}")


def spec(**kw: Any) -> JobSpec:
    base = dict(
        price_per_operator_epoch=ETH // 100,
        total_epochs=2,
        steps_per_epoch=20,
        sync_interval=5,
        min_operators=3,
        max_operators=3,
        epoch_duration=3600,
    )
    base.update(kw)
    return JobSpec(**base)


def advance(w3: Web3, seconds: int) -> None:
    w3.provider.make_request("evm_increaseTime", [seconds])
    w3.provider.make_request("evm_mine", [])
