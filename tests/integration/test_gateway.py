"""`dtrain gateway` on anvil: jobs bought over x402 with TestUSD, escrowed in the token by the
BSM for the payer. Attacks first: a spec the contract refuses costs nothing (400 before any
payment), a payment for a cheaper job or a replayed one buys nothing; then the round trip
(402, pay, job created for the payer, escrow held in the token, the split paid in the token
and withdrawn), the refund when creation fails after payment, and the CLI pair
(`dtrain gateway`, `dtrain job submit --x402`) as subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import default_sigint
from harness.chain import ETH, peer_key, spec
from harness.payments import payment_for
from harness.served import listening
from web3 import Web3
from x402.http.utils import decode_payment_required_header

from dtrain.chain import DevAccount, LocalChain
from dtrain.client import BSM, load_key
from dtrain.devtoken import UNIT, TestUSD
from dtrain.models import JobSpec, JobStatus
from dtrain.paidjobs import GatewayError, buy_job, spec_to_json
from dtrain.x402 import LocalFacilitator, Paywall, Token, install_multicall
from dtrain_node.gateway.app import Gateway, create_app

OPS, PAYER, GATEWAY, FACILITATOR, DEVELOPER, TREASURY = (1, 2, 3), 4, 7, 8, 11, 10
PRICE = 10_000  # 0.01 TestUSD per operator-epoch


@dataclass
class Shop:
    bsm: BSM
    usd: TestUSD
    gateway: Gateway
    url: str
    payer: DevAccount

    def job(self, **kw) -> JobSpec:
        return spec(price_per_operator_epoch=PRICE, seat_bond=self.bsm.params().min_seat_bond, **kw)

    def post(self, body: object, payment: str | None = None) -> httpx.Response:
        headers = {"PAYMENT-SIGNATURE": payment} if payment else {}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.url}/jobs", content=data, headers=headers, timeout=60)

    def balances(self) -> tuple[int, int, int]:
        """(payer, gateway, BSM) in TestUSD."""
        who = (self.payer.address, self.gateway.address, self.bsm.address)
        return tuple(self.usd.balance_of(a) for a in who)  # type: ignore[return-value]


def allow_token(bsm: BSM, developer: str, token: str, allowed: bool = True) -> None:
    bsm.with_account(developer).set_payment_token(token, allowed)


def make_gateway(
    bsm: BSM, chain: LocalChain, accounts: list[DevAccount], usd: TestUSD, cls=Gateway
):
    facilitator = LocalFacilitator(chain.url, accounts[FACILITATOR].key)
    paywall = Paywall(facilitator, Token.read(bsm.w3, usd.address), accounts[GATEWAY].address)
    return cls(bsm.with_account(accounts[GATEWAY].key), paywall)


@pytest.fixture
def usd(chain: LocalChain, accounts: list[DevAccount], bsm: BSM) -> TestUSD:
    install_multicall(bsm.w3)
    token = TestUSD.deploy(chain.url, accounts[0].key)
    token.mint(accounts[PAYER].address, 10 * UNIT)
    allow_token(bsm, accounts[DEVELOPER].key, token.address)
    return token


@pytest.fixture
def shop(chain: LocalChain, accounts: list[DevAccount], bsm: BSM, usd: TestUSD) -> Iterator[Shop]:
    gateway = make_gateway(bsm, chain, accounts, usd)
    with listening(create_app(gateway)) as url:
        yield Shop(bsm, usd, gateway, url, accounts[PAYER])


def requirements(r: httpx.Response):
    assert r.status_code == 402, r.text
    [req] = decode_payment_required_header(r.headers["payment-required"]).accepts
    return req


# ------------------------------------------------------------------------------------ attacks


def test_a_spec_the_contract_refuses_is_a_400_before_any_money_moves(shop: Shop) -> None:
    before, jobs = shop.balances(), shop.bsm.next_job_id()
    assert shop.post(b"{not json").json()["error"]["code"] == "invalid_json"
    r = shop.post({"price": 1})
    assert (
        r.status_code == 400 and "unknown job spec field(s): price" in r.json()["error"]["message"]
    )
    bad = shop.job(min_operators=1)
    # A valid payment for its escrow rides along: the spec is checked first, nothing is settled.
    req = requirements(shop.post(spec_to_json(shop.job())))
    r = shop.post(spec_to_json(bad), payment_for(shop.payer.key, req))
    assert r.status_code == 400 and r.json()["error"]["code"] == "InvalidOperatorRange", r.text
    for change, code in [
        ({"sync_interval": 0}, "InvalidSchedule"),
        ({"quant_bits": 3}, "InvalidCompression"),
        ({"epoch_duration": 1}, "InvalidEpochDuration"),
        ({"price_per_operator_epoch": 0}, "ZeroValue"),
        ({"seat_bond": 1}, "SeatBondTooLow"),
    ]:
        r = shop.post({**spec_to_json(shop.job()), **change})
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (change, r.text)
    r = shop.post({**spec_to_json(shop.job()), "total_epochs": 2**40})  # over its uint32
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_job_spec", r.text
    assert r.json()["error"]["message"] == (
        "total_epochs: 1099511627776 does not fit the contract's uint32"
    )
    assert shop.balances() == before and shop.bsm.next_job_id() == jobs


def test_a_payment_for_a_cheaper_job_or_a_replayed_one_buys_nothing(shop: Shop) -> None:
    cheap, dear = shop.job(total_epochs=1), shop.job(total_epochs=3)
    cheap_req = requirements(shop.post(spec_to_json(cheap)))
    assert int(cheap_req.amount) == cheap.escrow == 30_000
    r = shop.post(spec_to_json(dear), payment_for(shop.payer.key, cheap_req))
    assert r.status_code == 402 and r.json()["error"]["code"] == "payment_mismatch"
    assert shop.balances() == (10 * UNIT, 0, 0)
    paid = payment_for(shop.payer.key, cheap_req)
    first = shop.post(spec_to_json(cheap), paid)
    assert first.status_code == 201, first.text
    again = shop.post(spec_to_json(cheap), paid)
    assert again.status_code == 402 and again.json()["error"]["code"] == "payment_already_used"
    assert shop.balances() == (10 * UNIT - 30_000, 0, 30_000)
    assert shop.bsm.next_job_id() == first.json()["jobId"] + 1


# ---------------------------------------------------------------------------------- round trip


def test_a_job_bought_over_x402_is_the_payers_escrowed_in_the_token_and_pays_the_split(
    shop: Shop, as_account, accounts: list[DevAccount], votes
) -> None:
    job = shop.job(total_epochs=2)
    unpaid = shop.post(spec_to_json(job))
    req = requirements(unpaid)
    assert (int(req.amount), req.asset, req.pay_to) == (
        job.escrow,
        shop.usd.address,
        shop.gateway.address,
    )
    assert unpaid.json()["error"]["code"] == "payment_required"
    bought = buy_job(shop.url, job, load_key(shop.payer.key), job.escrow, shop.usd.address)
    escrow = job.escrow  # 10_000 x 3 operators x 2 epochs
    assert escrow == 60_000 and bought.escrow == escrow and bought.payer == shop.payer.address
    on_chain = shop.bsm.job(bought.job_id)
    assert on_chain.state.caller == shop.payer.address and on_chain.state.escrow == escrow
    assert shop.bsm.job_token(bought.job_id) == shop.usd.address
    assert shop.balances() == (10 * UNIT - escrow, 0, escrow)
    rc = shop.bsm.w3.eth.get_transaction_receipt(bought.create_tx)
    assert rc["from"] == shop.gateway.address and rc["status"] == 1

    ops = [as_account(i) for i in OPS]
    for i, op in enumerate(ops):
        op.register_operator(ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"], "cpu:2", 0)
        op.join_job(bought.job_id)
    for epoch in range(2):
        votes.cast(ops, bought.job_id, epoch, Web3.keccak(text=f"e{epoch}"), [4, 4, 4])
        shop.bsm.finalize_epoch(bought.job_id, epoch)
    assert shop.bsm.job(bought.job_id).state.status == JobStatus.COMPLETED
    paid = 2 * PRICE  # per operator
    credit = shop.bsm.token_credit_of
    assert credit(shop.usd.address, accounts[DEVELOPER].address) == 3 * paid * 20 // 100
    # shop.bsm (the deployer, outside the job) finalized: 10% of the protocol's fee, in the token
    bounty = 3 * paid * 20 // 100 // 10
    assert credit(shop.usd.address, shop.bsm.sender) == bounty
    assert credit(shop.usd.address, accounts[TREASURY].address) == 3 * paid * 20 // 100 - bounty
    assert credit(shop.usd.address, ops[0].sender) == paid * 40 // 100
    assert shop.bsm.token_accounting(shop.usd.address).escrow == 0  # all of it earned
    for who in (accounts[DEVELOPER], accounts[OPS[0]]):
        owed = credit(shop.usd.address, who.address)
        shop.bsm.with_account(who.key).withdraw_token(shop.usd.address)
        assert shop.usd.balance_of(who.address) == owed > 0
        assert credit(shop.usd.address, who.address) == 0


def test_when_creation_fails_after_payment_the_payer_is_refunded(
    chain: LocalChain, accounts: list[DevAccount], bsm: BSM, usd: TestUSD
) -> None:
    """The developer stops allowing the token between the payment and the creation."""

    class Racing(Gateway):
        def create(self, spec: JobSpec, owner: str) -> tuple[int, str]:
            allow_token(bsm, accounts[DEVELOPER].key, usd.address, allowed=False)
            return super().create(spec, owner)

    gateway = make_gateway(bsm, chain, accounts, usd, Racing)
    job = spec(price_per_operator_epoch=PRICE, seat_bond=bsm.params().min_seat_bond)
    jobs = bsm.next_job_id()
    with listening(create_app(gateway)) as url:
        with pytest.raises(GatewayError) as err:
            buy_job(url, job, load_key(accounts[PAYER].key), job.escrow, usd.address)
        r = httpx.post(f"{url}/jobs", json=spec_to_json(job), timeout=60)
    assert "job creation failed" in str(err.value) and "refunded" in str(err.value)
    assert r.status_code == 400 and r.json()["error"]["code"] == "TokenNotAllowed"
    assert usd.balance_of(accounts[PAYER].address) == 10 * UNIT
    assert usd.balance_of(gateway.address) == 0 and bsm.next_job_id() == jobs


# ------------------------------------------------------------------------------------ the CLI


def test_dtrain_gateway_and_job_submit_x402_as_subprocesses(
    chain: LocalChain, accounts: list[DevAccount], bsm: BSM, usd: TestUSD, tmp_path: Path
) -> None:
    base = [sys.executable, "-m", "dtrain.cli", "--rpc-url", chain.url, "--contract", bsm.address]
    gw = [*base, "--key", accounts[GATEWAY].key, "gateway", "--token", usd.address, "--port", "0"]
    log = tmp_path / "gateway.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*gw, "--facilitator-key", accounts[FACILITATOR].key],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=default_sigint,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("gateway for BSM"), (line, log.read_text())
            m = re.search(r" at (http://[0-9.]+:[0-9]+): ", line)
            assert m, line
            url = m.group(1)
            submit = [*base, "--key", accounts[PAYER].key, "--json", "job", "submit"]
            submit += ["--x402", url, "--price", "0.01", "--operators", "3:3", "--epochs", "2"]
            submit += ["--dataset", "corpus.txt", "--dataset-hash", "0x" + "11" * 32]
            submit += ["--model-hash", "0x" + "22" * 32, "--steps", "20", "--sync", "5"]
            r = subprocess.run(submit, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout.strip().splitlines()[-1])
            over = subprocess.run(
                [*submit, "--price", "10"],  # TestUSD per operator-epoch; the last --price wins
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            proc.send_signal(2)
            proc.communicate(timeout=30)
    assert out["escrow"] == PRICE * 3 * 2 and out["owner"] == accounts[PAYER].address
    assert bsm.job(out["job_id"]).state.caller == accounts[PAYER].address
    assert over.returncode == 1 and over.stderr.startswith("error: payment refused"), over.stderr
    assert usd.balance_of(accounts[PAYER].address) == 10 * UNIT - PRICE * 6
    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
