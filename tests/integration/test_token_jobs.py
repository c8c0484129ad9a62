"""Jobs priced in TestUSD on a real anvil through the SDK: a gateway pays the escrow for an
owner, operators train two epochs (commit, reveal, finalize), and every account's TestUSD
after withdrawing is the 40/20/20/20 split; a cancelled token job refunds its owner, not the
gateway; the contract's refusals decode to their typed errors."""

from __future__ import annotations

import json

import pytest
from harness.chain import ETH, peer_key, spec
from web3 import Web3

from dtrain import errors
from dtrain.chain import DevAccount, LocalChain
from dtrain.client import BSM
from dtrain.devtoken import UNIT, TestUSD
from dtrain.erc20 import InsufficientTokenBalance
from dtrain.jobpage import JobPage
from dtrain.models import JobStatus

TREASURY, DEVELOPER = 10, 11


@pytest.fixture
def usd(chain: LocalChain, accounts: list[DevAccount], bsm: BSM) -> TestUSD:
    token = TestUSD.deploy(chain.url, accounts[0].key)
    bsm.with_account(accounts[DEVELOPER].key).set_payment_token(token.address)
    token.mint(accounts[7].address, 1_000 * UNIT)  # the gateway's balance
    return token


@pytest.fixture
def data_file(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("def f(x):\n    return x + 1\n" * 50)
    return str(path)


def register(bsm: BSM, i: int) -> str:
    bsm.register_operator(ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"], "cpu:2", 0)
    return bsm.sender


def test_token_job_trains_and_splits_40_20_20_20(bsm: BSM, as_account, accounts, usd, votes):
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i)
    staker = as_account(5)
    staker.delegate(ops[0].sender, 3 * ETH)  # op0's pool: 1 self + 3 delegated
    gateway, owner = as_account(7), accounts[4].address
    price = 2 * UNIT
    job_id = gateway.create_job_with_token(spec(price_per_operator_epoch=price), usd.address, owner)
    job = bsm.job(job_id)
    assert job.state.caller == owner
    assert bsm.job_token(job_id) == usd.address
    assert usd.balance_of(bsm.address) == job.state.escrow == 2 * 3 * price
    for op in ops:
        op.join_job(job_id)
    for epoch in range(2):
        ckpt = Web3.keccak(text=f"token-epoch-{epoch}")
        votes.cast(ops, job_id, epoch, ckpt, [4] * 3)
        bsm.finalize_epoch(job_id, epoch)
    assert bsm.job(job_id).state.status == JobStatus.COMPLETED
    page = JobPage(bsm, job_id).snapshot()  # the job page shows the job's amounts in TestUSD
    assert page["job"]["token"] == usd.address and page["job"]["price"]["text"] == "2 TUSD"
    assert page["payouts"]["total"]["total"] == {"wei": str(6 * price), "text": "12 TUSD"}
    assert page["payouts"]["total"]["stakers"]["text"] == "2.4 TUSD"

    paid = 2 * price  # two epochs per operator
    pool = paid * 20 // 100
    bounty = 3 * paid * 20 // 100 // 10  # the deployer finalized from outside the job
    expected = {
        bsm.sender: bounty,
        ops[0].sender: paid * 40 // 100 + pool // 4,
        ops[1].sender: paid * 40 // 100 + pool,
        ops[2].sender: paid * 40 // 100 + pool,
        staker.sender: pool * 3 // 4,
        accounts[TREASURY].address: 3 * paid * 20 // 100 - bounty,
        accounts[DEVELOPER].address: 3 * paid * 20 // 100,
    }
    ether_credit = {who: bsm.credit_of(who) for who in expected}
    for who, amount in expected.items():
        b = bsm.with_account(next(a.key for a in accounts if a.address == who))
        for op in ops:
            if b.pending_token_rewards(usd.address, op.sender, who):
                b.claim_rewards(op.sender)
        assert b.token_credit_of(usd.address, who) == amount, who
        b.withdraw_token(usd.address)
        assert usd.balance_of(who) == amount, who
    assert sum(expected.values()) == 3 * paid
    # Nothing of the job was paid in ether, and nothing of it is left in the contract.
    assert {who: bsm.credit_of(who) for who in expected} == ether_credit
    assert usd.balance_of(bsm.address) == 0
    assert bsm.token_accounting(usd.address).total == 0
    assert bsm.accounting().escrow == 0


def test_cancelled_token_job_refunds_the_owner(bsm: BSM, as_account, accounts, usd):
    gateway, owner = as_account(7), as_account(4)
    s = spec(price_per_operator_epoch=UNIT)
    job_id = gateway.create_job_with_token(s, usd.address, owner.sender)
    before = usd.balance_of(accounts[7].address)
    with pytest.raises(errors.NotJobCaller):
        gateway.cancel_job(job_id)
    owner.cancel_job(job_id)
    assert bsm.job(job_id).state.status == JobStatus.CANCELLED
    assert owner.token_credit_of(usd.address, owner.sender) == 3 * 2 * UNIT
    assert gateway.token_credit_of(usd.address, gateway.sender) == 0
    owner.withdraw_token(usd.address)
    assert usd.balance_of(owner.sender) == 3 * 2 * UNIT
    assert usd.balance_of(accounts[7].address) == before


def test_token_refusals_decode(bsm: BSM, as_account, accounts, usd):
    gateway = as_account(7)
    stranger = as_account(6)
    with pytest.raises(errors.NotDeveloper, match="only the blueprint developer"):
        stranger.set_payment_token(usd.address)
    other = TestUSD.deploy(bsm.w3, accounts[0].key)
    other.mint(gateway.sender, 100 * UNIT)
    with pytest.raises(errors.TokenNotAllowed, match="not an allowed payment token"):
        gateway.create_job_with_token(spec(price_per_operator_epoch=UNIT), other.address)
    with pytest.raises(InsufficientTokenBalance):
        stranger.create_job_with_token(spec(price_per_operator_epoch=UNIT), usd.address)
    with pytest.raises(errors.NothingToWithdraw):
        stranger.withdraw_token(usd.address)
    assert bsm.payment_tokens() == [usd.address]
    assert bsm.is_payment_token(usd.address) and not bsm.is_payment_token(other.address)


def test_cli_token_job_in_token_units(run, bsm, accounts, usd, data_file):
    """`job submit --token` reads --price in whole tokens and prints amounts in the token's
    units (6 decimals for TestUSD); cancel, status and `rewards --token` do too."""
    code, out, err = run(
        "job", "submit", "--token", usd.address, "--price", "2.5",
        "--dataset-uri", data_file, key=accounts[7].key,
    )  # fmt: skip
    assert code == 0, err
    assert "7.5 TUSD escrowed" in out  # 2.5 x 3 operators x 1 epoch
    job_id = bsm.next_job_id() - 1
    assert bsm.job(job_id).spec.price_per_operator_epoch == 2_500_000
    code, out, err = run("job", "status", str(job_id))
    assert "price       2.5 TUSD per operator-epoch" in out
    code, out, err = run("job", "cancel", str(job_id), key=accounts[7].key)
    assert code == 0, err
    assert "7.5 TUSD of escrow credited" in out
    code, out, err = run("job", "watch", str(job_id), "--no-follow")
    assert code == 0, err
    assert "JobCreated:" in out and "escrow 7.5 TUSD" in out, out
    assert "JobCancelled:" in out and "refund 7.5 TUSD" in out, out
    code, out, err = run("rewards", "show", "--token", usd.address, key=accounts[7].key)
    assert "credit   7.5 TUSD" in out, out
    code, out, err = run(
        "--json", "rewards", "withdraw", "--token", usd.address, key=accounts[7].key
    )
    assert code == 0, err
    assert json.loads(out)["amount"] == 7_500_000
    assert usd.balance_of(accounts[7].address) == 1_000 * UNIT
    code, out, err = run(
        "job", "submit", "--token", usd.address, "--price", "0.0000001",
        "--dataset-uri", data_file, key=accounts[7].key,
    )  # fmt: skip
    assert code != 0 and "more than 6 decimal places" in err + out
