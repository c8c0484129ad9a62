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
    assert counts["dropped"] >= 3, counts
