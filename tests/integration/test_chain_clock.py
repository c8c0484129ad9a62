"""The session's anvil keeps the wall clock's time from test to test: each test's revert
(anvil rewinds its clock with the state) puts the clock back on the wall clock, so a node,
which reads the chain's deadlines against its own clock, never finds an epoch over before it
began however long the tests before it ran."""

from __future__ import annotations

import time

from harness.chain import revert


def _mined(w3) -> int:
    w3.provider.make_request("evm_mine", [])
    return int(w3.eth.get_block("latest")["timestamp"])


def test_a_revert_puts_the_chain_clock_back_on_the_wall_clock(bsm) -> None:
    w3 = bsm.w3
    behind = int(time.time()) - 700  # as after the tests before this one took 700 s
    w3.provider.make_request("evm_setTime", [behind])
    assert _mined(w3) < time.time() - 600
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    assert _mined(w3) < time.time() - 600  # anvil's own clock stays behind
    revert(w3, snap)
    before = int(time.time())
    assert _mined(w3) >= before


def test_a_revert_keeps_to_the_system_clock_while_a_test_patches_time(bsm, monkeypatch) -> None:
    """A test that moves `time.time` on for the code under test (an hour, as the CLI's
    finalize test does) and leaves the patch to its teardown does not start the next test's
    chain an hour ahead: an x402 payment signed for the next 5 minutes would be expired."""
    w3 = bsm.w3
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    real = time.time()
    monkeypatch.setattr("time.time", lambda: real + 3600)
    revert(w3, snap)
    assert _mined(w3) < real + 600
