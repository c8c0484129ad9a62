"""Long-running commands survive RPC failures: through a proxy that drops one request in five,
the SDK's reads and transactions all go through (the provider retries with backoff)."""

from __future__ import annotations

from harness.chain import ETH
from harness.flaky_rpc import flaky_rpc

from dtrain.client import BSM


def test_reads_and_transactions_survive_an_rpc_that_drops_one_request_in_five(
    chain, bsm, accounts
) -> None:
    with flaky_rpc(chain.url, drop_every=5) as (url, counts):
        flaky = BSM.attach(url, bsm.address, accounts[3].key)
        for _ in range(10):
            assert flaky.params().min_stake == ETH
        flaky.register_operator(ETH, b"\x01" * 32, [], "cpu", 0)
        flaky.stake(ETH // 2)
        assert flaky.operator(accounts[3].address).registered
        assert flaky.stake_of(accounts[3].address, accounts[3].address) == ETH + ETH // 2
    assert counts["drop"] >= 3, counts


def test_a_transaction_whose_answer_was_lost_is_not_reported_failed(chain, bsm, accounts) -> None:
    """Every second request is forwarded and its answer lost: a transaction is in, and its
    sender, sending it again, is told "nonce too low". The SDK finds it under its own hash and
    waits for its receipt: each call returns once, and the chain holds each effect once."""
    me = accounts[4]
    with flaky_rpc(chain.url, drop_every=2, faults=("lost",)) as (url, counts):
        lossy = BSM.attach(url, bsm.address, me.key)
        lossy.register_operator(ETH, b"\x02" * 32, [], "cpu", 0)
        for _ in range(3):
            lossy.stake(ETH // 4)
    assert counts["lost"] >= 4, counts
    assert bsm.stake_of(me.address, me.address) == ETH + 3 * (ETH // 4)


def test_late_answers_and_lost_ones_for_a_while_then_none(chain, bsm, accounts) -> None:
    """Drops, lost answers and 1 s delays in turn, one request in three, for 5 s: reads and
    transactions go on through them and after them."""
    me = accounts[5]
    with flaky_rpc(chain.url, 3, ("drop", "lost", "delay"), 1.0, lossy_s=5.0) as (url, counts):
        lossy = BSM.attach(url, bsm.address, me.key)
        lossy.register_operator(ETH, b"\x03" * 32, [], "cpu", 0)
        while counts["seen"] < 40:
            lossy.stake(ETH // 8)
            assert lossy.operator(me.address).registered
    assert min(counts["drop"], counts["lost"], counts["delay"]) >= 1, counts
    staked = bsm.stake_of(me.address, me.address)
    assert staked > ETH and (staked - ETH) % (ETH // 8) == 0
