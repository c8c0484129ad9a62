"""TestUSD on anvil through the SDK: the EIP-712 authorization the SDK signs is the one the
contract checks, and a forged or replayed one moves nothing."""

from __future__ import annotations

import time

import pytest

from dtrain.chain import DevAccount, LocalChain
from dtrain.client import load_key
from dtrain.devtoken import UNIT, TestUSD, TokenError


@pytest.fixture
def usd(chain: LocalChain, accounts: list[DevAccount], bsm) -> TestUSD:  # bsm: EVM snapshot
    token = TestUSD.deploy(chain.url, accounts[0].key)
    token.mint(accounts[1].address, 50 * UNIT)
    return token


def test_signed_authorization_moves_exactly_the_value(usd: TestUSD, accounts):
    payer, payee = load_key(accounts[1].key), accounts[2].address
    auth = usd.sign_authorization(payer, payee, 3 * UNIT, valid_before=int(time.time()) + 600)
    usd.transfer_with_authorization(auth)  # submitted by the deployer, who pays the gas
    assert usd.balance_of(payee) == 3 * UNIT
    assert usd.balance_of(payer.address) == 47 * UNIT
    assert usd.authorization_used(payer.address, auth.nonce)


def test_replayed_or_raised_authorization_moves_nothing(usd: TestUSD, accounts):
    payer, payee = load_key(accounts[1].key), accounts[2].address
    auth = usd.sign_authorization(payer, payee, UNIT, valid_before=int(time.time()) + 600)
    usd.transfer_with_authorization(auth)
    with pytest.raises(TokenError, match="AuthorizationUsedOrCanceled"):
        usd.transfer_with_authorization(auth)
    raised = usd.sign_authorization(payer, payee, UNIT, valid_before=int(time.time()) + 600)
    forged = type(raised)(**{**raised.__dict__, "value": 10 * UNIT})
    with pytest.raises(TokenError, match="InvalidAuthorizationSignature"):
        usd.transfer_with_authorization(forged)
    assert usd.balance_of(payee) == UNIT
