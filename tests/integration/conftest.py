"""A real anvil for the whole session; each test runs in an EVM snapshot reverted after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.chain import ETH

from dtrain.chain import DevAccount, LocalChain
from dtrain.client import BSM, NONCES
from dtrain.models import Params


@pytest.fixture(scope="session")
def chain() -> Iterator[LocalChain]:
    with LocalChain(accounts=12) as c:
        yield c


@pytest.fixture(scope="session")
def accounts(chain: LocalChain) -> list[DevAccount]:
    return chain.accounts


@pytest.fixture(scope="session")
def deployed(chain: LocalChain, accounts: list[DevAccount]) -> BSM:
    params = Params(
        treasury=accounts[10].address,
        developer=accounts[11].address,
        core=accounts[9].address,
        min_stake=ETH,
        unbonding_period=86400,
    )
    return BSM.deploy(chain.url, accounts[0].key, params)


@pytest.fixture
def bsm(deployed: BSM) -> Iterator[BSM]:
    w3 = deployed.w3
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    NONCES.forget()
    try:
        yield deployed
    finally:
        w3.provider.make_request("evm_revert", [snap])
        NONCES.forget()


@pytest.fixture
def as_account(bsm: BSM, accounts: list[DevAccount]):
    def _as(i: int) -> BSM:
        return bsm.with_account(accounts[i].key)

    return _as
