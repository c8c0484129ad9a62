"""Helpers shared by the chain tests."""

from __future__ import annotations

import time
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


def revert(w3: Web3, snapshot: str) -> None:
    """Back to `snapshot`, with the chain's clock on the wall clock again. Anvil's revert also
    rewinds its clock to the snapshot's block, so without the reset each test would start as
    far behind the wall clock as the tests before it took together, and a node (which reads
    the chain's deadlines against its own clock) would find an epoch over before it began
    once the suite ran longer than an epoch (a loaded machine)."""
    w3.provider.make_request("evm_revert", [snapshot])
    latest = w3.eth.get_block("latest")["timestamp"]
    # The system clock itself, not `time.time`: a test may have patched that one for the code
    # under test, and a patch still in place here would leave the next test's chain off.
    wall = int(time.clock_gettime(time.CLOCK_REALTIME))
    w3.provider.make_request("evm_setTime", [max(wall, latest)])


def advance(w3: Web3, seconds: int) -> None:
    w3.provider.make_request("evm_increaseTime", [seconds])
    w3.provider.make_request("evm_mine", [])
